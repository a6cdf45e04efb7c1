"""CPU mirrors of the register-tile kernels (cuda/scan_tile_kernels.cuh): tile_scan_kernel
(lookback_serial, lookback_warp, lookback_regs, blocked and striped) and strided_kernel, and the
look-back's canonical left fold. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from scan_mirror_common import (AGG, INC, Status, comb, ident, inputs, lookback_serial, lookback_warp,
                                reference, rel, tile_local_scan, warp_scan)


def tile_striped_scan(xa, xb, vec_width, broken=None):
    """striped_warp_scan + the block fold (TILE_STRIPED): thread j's items are nv = items /
    vec_width vectors; per vector index m a serial scan of the vector, a Kogge-Stone scan of
    the vector totals over the warp's lanes, then the segment totals folded in m order.
    Returns pre (threads, nv) pairs = (fold of segments < m) o (lane-exclusive value of m),
    the warp totals and the tile total."""
    threads, items = xa.shape
    nv = items // vec_width
    pre_a, pre_b = np.empty((threads, nv)), np.empty((threads, nv))
    s_warp = []
    for w in range(threads // 32):
        sl = slice(32 * w, 32 * w + 32)
        run = None
        for m in range(nv):
            c = slice(m * vec_width, (m + 1) * vec_width)
            va, vb = xa[sl, c], xb[sl, c]
            for e in range(1, vec_width):
                va[:, e], vb[:, e] = comb((va[:, e - 1], vb[:, e - 1]), (va[:, e], vb[:, e]))
            xa[sl, c], xb[sl, c] = va, vb
            ia, ib = warp_scan((va[:, -1].copy(), vb[:, -1].copy()))
            exa, exb = np.roll(ia, 1), np.roll(ib, 1)
            exa[0], exb[0] = 1.0, 0.0
            tot = (ia[31], ib[31])
            if run is None:
                pre_a[sl, m], pre_b[sl, m] = exa, exb
                run = tot
            else:
                pre_a[sl, m], pre_b[sl, m] = comb(run, (exa, exb))
                run = comb(tot, run) if broken == "swap_segments" else comb(run, tot)
        s_warp.append(run)
    t = s_warp[0]
    for q in range(1, len(s_warp)):
        t = comb(t, s_warp[q])
    return pre_a, pre_b, s_warp, t


# ----------------------------------------------------------------------------------------
# contiguous tile_scan_kernel (lookback_serial / lookback_warp / lookback_regs); the
# three-pass carry structure is mirrored by tiled_three_pass (test_scan_mirrors_tree.py)
def contiguous_mirror(a, b, h0, reverse, threads, items, vec_width, carry, rng, broken=None, striped=False):
    outer, L = a.shape
    tile = threads * items
    nchunks = -(-L // tile)
    nchains = outer
    vec = L % vec_width == 0 and items % vec_width == 0
    h = np.full(a.shape, np.nan)
    ap = np.full(a.shape, np.nan)
    st = Status(rng, lag=0.7)
    written = np.zeros(a.shape, int)
    for tid in range(nchains * nchunks):  # dynamic ids are handed out in start order
        chain, k = tid % nchains, tid // nchains
        idx = np.full((threads, items), -1)
        for j in range(threads):
            base = k * tile + j * items
            if striped:  # vector m of lane l: warp start + m * 32 * VEC + l * VEC
                w, l = divmod(j, 32)
                for m in range(items // vec_width):
                    p0 = k * tile + w * 32 * items + m * 32 * vec_width + l * vec_width
                    for e in range(vec_width):
                        if p0 + e < L:
                            if reverse and vec and broken == "reverse_vec_order":
                                idx[j, m * vec_width + e] = L - p0 - vec_width + e
                            else:
                                idx[j, m * vec_width + e] = L - 1 - (p0 + e) if reverse else p0 + e
            elif vec:
                nv = items // vec_width
                if not reverse:
                    for m in range(nv):
                        q = base + m * vec_width
                        if q < L:
                            for e in range(vec_width):
                                idx[j, m * vec_width + e] = q + e
                else:
                    q0 = L - base - items
                    for m in range(nv):
                        q = q0 + m * vec_width
                        if q >= 0:
                            for e in range(vec_width):
                                i = items - 1 - (m * vec_width + e)
                                if broken == "reverse_vec_order":
                                    i = m * vec_width + e
                                idx[j, i] = q + e
            else:
                for i in range(items):
                    p = base + i
                    if p < L:
                        idx[j, i] = L - 1 - p if reverse else p
        valid = idx >= 0
        xa = np.where(valid, a[chain, np.maximum(idx, 0)], 1.0)
        xb = np.where(valid, b[chain, np.maximum(idx, 0)], 0.0)
        if striped:
            pre_a, pre_b, s_warp, t = tile_striped_scan(xa, xb, vec_width, broken)
        else:
            wa, wb, exa, exb, s_warp, t = tile_local_scan(xa, xb, broken)
        h0p = (1.0, h0[chain])
        rec = lambda c: c * nchains + chain
        e = h0p
        if k > 0:
            st.publish(tid, AGG, t)
            e = (lookback_warp if carry == "warp" else lookback_serial)(st, k, rec, h0p, broken)
        st.publish(tid, INC, comb(e, t))
        if striped:
            _apply_striped(h, ap, chain, idx, valid, xa, xb, pre_a, pre_b, s_warp, e, vec_width, written)
        else:
            _apply(h, ap, chain, idx, valid, xa, xb, wa, wb, exa, exb, s_warp, e, threads, broken, written)
    assert written.max() <= 1, "an element was written twice"
    return h, ap, written


def _apply(h, ap, chain, idx, valid, xa, xb, wa, wb, exa, exb, s_warp, excl, threads, broken, written):
    for j in range(threads):
        w = j // 32
        wp = ident()
        for q in range(w):
            wp = comb(wp, s_warp[q])
        pre = comb(comb(excl, wp), (exa[j], exb[j]))
        for i in range(idx.shape[1]):
            if valid[j, i]:
                ya, yb = comb(pre, (xa[j, i], xb[j, i]))
                h[chain, idx[j, i]] = yb
                ap[chain, idx[j, i]] = ya
                written[chain, idx[j, i]] += 1


def _apply_striped(h, ap, chain, idx, valid, xa, xb, pre_a, pre_b, s_warp, excl, vec_width, written):
    for j in range(idx.shape[0]):
        w = j // 32
        wp = ident()
        for q in range(w):
            wp = comb(wp, s_warp[q])
        tw = comb(excl, wp)
        for i in range(idx.shape[1]):
            if valid[j, i]:
                m = i // vec_width
                ya, yb = comb(comb(tw, (pre_a[j, m], pre_b[j, m])), (xa[j, i], xb[j, i]))
                h[chain, idx[j, i]] = yb
                ap[chain, idx[j, i]] = ya
                written[chain, idx[j, i]] += 1


def check_contiguous(broken, carry, reverse, vec, seed=0, striped=False):
    rng = np.random.default_rng(seed)
    items = 8 if striped else 4  # striped: two vectors per thread
    L = 64 * items * 5 + (0 if vec else 3)
    a, b = inputs(rng, (3, L))
    h0 = rng.standard_normal(3)
    out = contiguous_mirror(a, b, h0, reverse, 64, items, 4, carry, rng, broken, striped)
    h, ap, written = out
    if not np.all(written == 1):
        return False
    rh, rp = reference(a[:, :, None], b[:, :, None], h0[:, None], reverse=reverse)
    return rel(h, rh[:, :, 0]) < 1e-12 and rel(ap, rp[:, :, 0]) < 1e-12


@pytest.mark.parametrize("carry", ["serial", "warp"])
def test_contiguous_lookback_mirror(carry):
    # first: each broken variant must be caught
    assert not check_contiguous("swap_warp", carry, False, True), "swapped warp-scan operands not caught"
    assert not check_contiguous("pred_off_by_one", carry, False, True, seed=1), "off-by-one predecessor not caught"
    assert not check_contiguous("reverse_vec_order", carry, True, True), "reversed vector order not caught"
    if carry == "warp":
        assert not check_contiguous("swap_fold", carry, False, True, seed=2), "swapped window fold not caught"
    # then the mirror itself, over reverse and vector / scalar paths
    for reverse in (False, True):
        for vec in (True, False):
            assert check_contiguous(None, carry, reverse, vec, seed=3)


def row_stage_slots(nw, items, vec, broken=None):
    """tile_stage_kernel's shared-memory slot of (warp, lane, vector m): sw + m * 32 * VEC with
    sw = warp * 32 * ITEMS + lane * VEC, element offsets into a TILE = nw * 32 * items array."""
    slots = {}
    for w in range(nw):
        for l in range(32):
            sw = (0 if broken == "no_warp_term" else w * 32 * items) + l * vec
            for m in range(items // vec):
                step = 32 * vec if broken != "lane_stride" else vec
                slots[(w, l, m)] = sw + m * step
    return slots


def test_row_stage_slots():
    """row_stage lands each lane's vectors in its own slots of the staged tile: every (warp,
    lane, vector) gets a distinct, 16-byte aligned, in-bounds slot, equal to the vector's tile
    position in the striped layout (so the lane reads back exactly what it copied; the global
    index arithmetic and combine order are the striped tile's, mirrored above)."""
    def ok(slots, nw, items, vec):
        offs = sorted(slots.values())
        tile = nw * 32 * items
        distinct = len(set(offs)) == len(offs) and all(0 <= o and o + vec <= tile for o in offs)
        striped = all(o == w * 32 * items + m * 32 * vec + l * vec for (w, l, m), o in slots.items())
        return distinct and striped and all(o % vec == 0 for o in offs)
    for nw, items, vec in ((8, 32, 4), (8, 64, 8), (4, 16, 2)):
        for bad in ("no_warp_term", "lane_stride"):
            assert not ok(row_stage_slots(nw, items, vec, bad), nw, items, vec), bad
        assert ok(row_stage_slots(nw, items, vec), nw, items, vec)


def test_striped_tile_mirror():
    """lookback_regs' striped register tile (TILE_STRIPED) with the warp look-back; row_stage
    runs the same arithmetic on its staged copy (test_row_stage_slots)."""
    for bad, rev in (("swap_segments", False), ("pred_off_by_one", False), ("reverse_vec_order", True)):
        assert not check_contiguous(bad, "warp", rev, True, seed=4, striped=True), f"{bad} not caught"
    for reverse in (False, True):
        for vec in (True, False):
            assert check_contiguous(None, "warp", reverse, vec, seed=5, striped=True)


# ----------------------------------------------------------------------------------------
# strided_kernel: (outer, L, inner), CW = 32*SVEC channels x LC = NW*TPT steps per tile
def strided_mirror(a, b, h0, reverse, svec, nw, tpt, rng, broken=None):
    outer, L, inner = a.shape
    cw, lc = 32 * svec, nw * tpt
    nct = -(-inner // cw)
    nchains, nchunks = outer * nct, -(-L // lc)
    flat_a, flat_b = a.ravel(), b.ravel()
    h = np.full(a.size, np.nan)
    written = np.zeros(a.size, int)
    st = Status(rng, lag=0.5)
    for tid in range(nchains * nchunks):
        chain, k = tid % nchains, tid // nchains
        o, ct = chain // nct, chain % nct
        xa = np.ones((nw, tpt, cw))
        xb = np.zeros((nw, tpt, cw))
        offs = np.full((nw, tpt, cw), -1)
        for w in range(nw):
            for i in range(tpt):
                p = k * lc + w * tpt + i
                q = L - 1 - p if reverse else p
                for lane in range(32):
                    c0 = ct * cw + lane * svec
                    for e in range(svec):
                        if p < L and c0 + e < inner:
                            off = (o * L + q) * inner + c0 + e
                            if broken == "stride_off_by_one":
                                off = (o * L + q) * (inner - 1) + c0 + e
                            offs[w, i, lane * svec + e] = off
                            xa[w, i, lane * svec + e] = flat_a[off]
                            xb[w, i, lane * svec + e] = flat_b[off]
        for i in range(1, tpt):
            xa[:, i], xb[:, i] = comb((xa[:, i - 1], xb[:, i - 1]), (xa[:, i], xb[:, i]))
        s_agg = [(xa[w, -1], xb[w, -1]) for w in range(nw)]
        t = s_agg[0]
        for q in range(1, nw):
            t = comb(t, s_agg[q])
        excl_a, excl_b = np.ones(cw), np.zeros(cw)
        for ch in range(cw):
            c = ct * cw + ch
            h0p = (1.0, h0[o, c]) if c < inner else ident()
            rec_id = tid * cw + ch
            tt = (t[0][ch], t[1][ch])
            e = h0p
            if k > 0:
                st.publish(rec_id, AGG, tt)
                if broken == "pred_off_by_one":
                    rec = lambda cc, ch=ch: (cc * nchains + chain) * cw + ch if cc < k - 1 else (max(cc - 1, 0) * nchains + chain) * cw + ch
                else:
                    rec = lambda cc, ch=ch: (cc * nchains + chain) * cw + ch
                e = lookback_serial(st, k, rec, h0p)
            st.publish(rec_id, INC, comb(e, tt))
            excl_a[ch], excl_b[ch] = e
        for w in range(nw):
            wp = (excl_a, excl_b)
            for q in range(w):
                wp = comb(s_agg[q], wp) if broken == "swap_block" else comb(wp, s_agg[q])
            for i in range(tpt):
                ya, yb = comb(wp, (xa[w, i], xb[w, i]))
                m = offs[w, i] >= 0
                h[offs[w, i][m]] = yb[m]
                written[offs[w, i][m]] += 1
    return h.reshape(a.shape), written.reshape(a.shape)


def check_strided(broken, reverse, seed=0, inner=70, svec=4):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, (2, 45, inner))
    h0 = rng.standard_normal((2, inner))
    h, written = strided_mirror(a, b, h0, reverse, svec, 2, 3, rng, broken)
    if not np.all(written == 1):
        return False
    rh, _ = reference(a, b, h0, reverse=reverse)
    return rel(h, rh) < 1e-12


def test_strided_mirror():
    assert not check_strided("swap_block", False), "swapped block-prefix operands not caught"
    assert not check_strided("pred_off_by_one", False, seed=1), "off-by-one predecessor not caught"
    assert not check_strided("stride_off_by_one", False), "wrong stride not caught"
    for reverse in (False, True):
        for inner, svec in ((70, 4), (130, 2), (3, 4)):
            assert check_strided(None, reverse, seed=4, inner=inner, svec=svec)


def test_lookback_is_canonical():
    """Whatever the visibility of the predecessors, the warp and serial look-backs return
    bit-for-bit the serial left fold inc[k-1]: the basis of the determinism guarantee."""
    rng = np.random.default_rng(11)
    n = 200
    aggs = [tuple(rng.uniform(0.5, 1.5, 2)) for _ in range(n)]
    h0p = (1.0, 0.3)
    inc = []
    acc = h0p
    for g in aggs:
        acc = comb(acc, g)
        inc.append(acc)
    for lag in (0.0, 0.5, 0.95, 1.0):
        for k in (1, 2, 33, 64, 65, 150, 199):
            st = Status(rng, lag)
            for m in range(k):
                st.publish(m, AGG, aggs[m])
                if rng.random() < 0.5:
                    st.publish(m, INC, inc[m])
            for fn in (lookback_serial, lookback_warp):
                got = fn(st, k, lambda c: c, h0p)
                assert got == inc[k - 1], (fn.__name__, lag, k)
    # the broken window (one lane off) is not canonical
    st = Status(rng, 1.0)
    for m in range(64):
        st.publish(m, AGG, aggs[m])
    assert lookback_warp(st, 64, lambda c: c, h0p, broken="pred_off_by_one") != inc[63]
