"""CPU mirrors of the walk kernels (cuda/scan_walk_kernels.cuh): row_walk and strided_walk.
How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np

from scan_mirror_common import comb, inputs, reference, rel, warp_scan


# ----------------------------------------------------------------------------------------
# row_walk_kernel: warp w walks rows [w*rpw, +rpw) (fewer in the last warp); sub-chunk j of a
# row covers logical [j*SUB, (j+1)*SUB), SUB = 32*VEC; lane l holds logical [j*SUB + l*VEC,
# +VEC): one 16-byte vector at physical p (forward) or L-p-VEC (reverse, items reversed), or
# scalars (L % VEC != 0). Vectors come through the warp's ring: an issue cursor (row ik,
# sub-chunk ij, count ni) runs STAGES-1 sub-chunks ahead of the scan across the warp's rows and
# loads into stage ni % STAGES; the scan's n-th sub-chunk reads stage n % STAGES, then issues.
# Serial scan in the lane, Kogge-Stone over lanes, y = (carry o lane-exclusive) o x, carry o=
# lane 31; the carry starts from h0 at each row.
def row_walk_mirror(a, b, h0, reverse, vec_width, vec, broken=None, rpw=1, stages=6):
    outer, L = a.shape
    sub = 32 * vec_width
    nsub = -(-L // sub)
    h = np.full(a.shape, np.nan)
    ap = np.full(a.shape, np.nan)
    written = np.zeros(a.shape, int)

    def lane_items(j):  # the lanes' physical positions for sub-chunk j (-1: none)
        idx = np.full((32, vec_width), -1)
        for lane in range(32):
            p = j * sub + lane * vec_width
            for e in range(vec_width):
                if vec:
                    if p < L:
                        q = L - p - vec_width if reverse else p
                        i = vec_width - 1 - e if reverse and broken != "reverse_vec_order" else e
                        idx[lane, i] = q + e
                elif p + e < L:
                    idx[lane, e] = L - 1 - (p + e) if reverse else p + e
        return idx

    for w in range(-(-outer // rpw)):
        r0 = w * rpw
        nrows = min(rpw, outer - r0)
        ring = [None] * stages
        cur = {"ik": 0, "ij": 0, "ni": 0}

        def issue():
            ik, ij = cur["ik"], cur["ij"]
            if ik < nrows:
                idx = lane_items(ij)
                r = r0 + ik
                ok = idx >= 0
                ring[cur["ni"] % stages] = (np.where(ok, a[r, np.maximum(idx, 0)], 1.0),
                                            np.where(ok, b[r, np.maximum(idx, 0)], 0.0))
            cur["ni"] += 1
            cur["ij"] += 1
            if cur["ij"] == nsub and broken != "cursor_no_row_wrap":
                cur["ij"], cur["ik"] = 0, cur["ik"] + 1

        for _ in range(stages - 1):
            issue()
        n = 0
        for k in range(nrows):
            r = r0 + k
            carry = (1.0, h0[r])
            for j in range(nsub):
                idx = lane_items(j)
                valid = idx >= 0
                slot = (n + 1) % stages if broken == "stage_off_by_one" else n % stages
                xa, xb = ring[slot] if ring[slot] is not None else (np.ones(idx.shape), np.zeros(idx.shape))
                xa, xb = np.where(valid, xa, 1.0), np.where(valid, xb, 0.0)
                ring[n % stages] = None  # read: the next issue may reuse it
                issue()
                for e in range(1, vec_width):
                    xa[:, e], xb[:, e] = comb((xa[:, e - 1], xb[:, e - 1]), (xa[:, e], xb[:, e]))
                wa, wb = warp_scan((xa[:, -1], xb[:, -1]), broken)
                exa, exb = np.roll(wa, 1), np.roll(wb, 1)
                exa[0], exb[0] = 1.0, 0.0
                pre = comb((np.full(32, carry[0]), np.full(32, carry[1])), (exa, exb))
                for e in range(vec_width):
                    ya, yb = comb(pre, (xa[:, e], xb[:, e]))
                    m = valid[:, e]
                    h[r, idx[m, e]] = yb[m]
                    ap[r, idx[m, e]] = ya[m]
                    written[r, idx[m, e]] += 1
                tot = (wa[31], wb[31])
                carry = comb(tot, carry) if broken == "swap_carry" else comb(carry, tot)
                n += 1
    return h, ap, written


def check_row_walk(broken, reverse, vec, seed=0, vec_width=4, rows=3, L=None, rpw=1):
    rng = np.random.default_rng(seed)
    L = L or 32 * vec_width * 3 + (0 if vec else 3)
    a, b = inputs(rng, (rows, L))
    h0 = rng.standard_normal(rows)
    h, ap, written = row_walk_mirror(a, b, h0, reverse, vec_width, vec, broken, rpw=rpw)
    if not np.all(written == 1):
        return False
    rh, rp = reference(a[:, :, None], b[:, :, None], h0[:, None], reverse=reverse)
    return rel(h, rh[:, :, 0]) < 1e-12 and rel(ap, rp[:, :, 0]) < 1e-12


def test_row_walk_mirror():
    assert not check_row_walk("swap_warp", False, True), "swapped warp-scan operands not caught"
    assert not check_row_walk("reverse_vec_order", True, True), "reversed vector order not caught"
    assert not check_row_walk("swap_carry", False, True, seed=1), "swapped carry operands not caught"
    for reverse in (False, True):
        for vec in (True, False):
            for vw in (4, 8, 2):
                assert check_row_walk(None, reverse, vec, seed=5, vec_width=vw)


def test_row_walk_mirror_rows_per_warp():
    """Several short rows per warp: the ring runs on from one row into the next."""
    short = 32 * 8  # one bf16 sub-chunk a row
    assert not check_row_walk("cursor_no_row_wrap", False, True, vec_width=8, rows=7, L=short, rpw=4), \
        "an issue cursor that stays in its first row not caught"
    assert not check_row_walk("stage_off_by_one", False, True, vec_width=8, rows=7, L=short, rpw=4), \
        "reading the wrong ring stage not caught"
    assert not check_row_walk("swap_carry", True, True, seed=2, vec_width=4, rows=5, L=3 * 128, rpw=2)
    for reverse in (False, True):
        # rows of 1, 2 and 3 sub-chunks (a partial last one), a partial last warp, rpw past the rows
        for vw, L, rows, rpw in ((8, short, 7, 4), (4, 256, 5, 3), (4, 300, 6, 4), (2, 40, 3, 8), (8, 2 * short, 9, 2)):
            vec = L % vw == 0
            assert check_row_walk(None, reverse, vec, seed=7, vec_width=vw, rows=rows, L=L, rpw=rpw), (vw, L, rows, rpw)


# strided_walk_kernel: one warp per CWW = 32*NCH channels, walking all of L; warp g: o =
# g // nct, cg = g % nct; lane l owns channels cg*CWW + l*NCH + e; offset (o*L + q)*inner + c.
def strided_walk_mirror(a, b, h0, reverse, nch, broken=None):
    outer, L, inner = a.shape
    cww = 32 * nch
    nct = -(-inner // cww)
    fa, fb = a.ravel(), b.ravel()
    h = np.full(a.size, np.nan)
    written = np.zeros(a.size, int)
    for g in range(outer * nct):
        o, cg = g // nct, g % nct
        c = cg * cww + np.arange(32)[:, None] * nch + np.arange(nch)[None, :]
        m = c < inner
        c = c[m]
        carry = (np.ones(c.size), h0[o, c].astype(float))
        for p in range(L):
            q = L - 1 - p if reverse else p
            stride = inner - 1 if broken == "stride_off_by_one" else inner
            off = (o * L + q) * stride + c
            x = (fa[off], fb[off])
            carry = comb(x, carry) if broken == "swap_carry" else comb(carry, x)
            h[off] = carry[1]
            written[off] += 1
    return h.reshape(a.shape), written.reshape(a.shape)


def check_strided_walk(broken, reverse, inner=70, nch=1, seed=0):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, (2, 9, inner))
    h0 = rng.standard_normal((2, inner))
    h, written = strided_walk_mirror(a, b, h0, reverse, nch, broken)
    if not np.all(written == 1):
        return False
    rh, _ = reference(a, b, h0, reverse=reverse)
    return rel(h, rh) < 1e-12


def test_strided_walk_mirror():
    assert not check_strided_walk("stride_off_by_one", False), "wrong stride not caught"
    assert not check_strided_walk("swap_carry", False), "swapped carry operands not caught"
    for reverse in (False, True):
        for inner, nch in ((70, 1), (130, 2), (3, 2), (64, 2)):
            assert check_strided_walk(None, reverse, inner, nch, seed=6)
