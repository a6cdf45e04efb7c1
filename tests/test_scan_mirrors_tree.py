"""CPU mirrors of the tree scans (cuda/scan_tree_kernels.cuh): blelloch and hillis_steele tiles
under the three-pass carry structure. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from scan_mirror_common import comb, ident, inputs, reference, rel, warp_scan


# ----------------------------------------------------------------------------------------
# blelloch_kernel: up-sweep / down-sweep over N = 2*THREADS in shared memory
def blelloch_tile(xa, xb, broken=None):
    n = len(xa)
    s = [(xa[i], xb[i]) for i in range(n)]
    x = list(s)
    off = 1
    d = n >> 1
    while d > 0:
        for tid in range(d):
            ai, bi = off * (2 * tid + 1) - 1, off * (2 * tid + 2) - 1
            s[bi] = comb(s[ai], s[bi])
        off <<= 1
        d >>= 1
    s[n - 1] = (1.0, 0.0)
    d = 1
    while d < n:
        off >>= 1
        for tid in range(d):
            ai, bi = off * (2 * tid + 1) - 1, off * (2 * tid + 2) - 1
            t = s[ai]
            s[ai] = s[bi]
            s[bi] = comb(t, s[bi]) if broken == "swap_down" else comb(s[bi], t)
        d <<= 1
    return [comb(s[i], x[i]) for i in range(n)]


# hillis_steele_kernel: shuffles in the warp, Kogge-Stone over warp totals (double buffer)
def hillis_tile(xa, xb, broken=None):
    threads = len(xa)
    nw = threads // 32
    out = []
    tots = []
    lanes = []
    for w in range(nw):
        ia, ib = warp_scan((xa[32 * w:32 * w + 32], xb[32 * w:32 * w + 32]))
        lanes.append((ia, ib))
        tots.append((ia[31], ib[31]))
    cur = list(tots)
    o = 1
    while o < nw:
        nxt = []
        for tid in range(nw):
            if tid >= o:
                nxt.append(comb(cur[tid], cur[tid - o]) if broken == "swap_ks" else comb(cur[tid - o], cur[tid]))
            else:
                nxt.append(cur[tid])
        cur = nxt
        o <<= 1
    for w in range(nw):
        for l in range(32):
            y = (lanes[w][0][l], lanes[w][1][l])
            if w > 0:
                y = comb(cur[w - 1], y)
            out.append(y)
    return out


def tiled_three_pass(a, b, h0, tile, tile_scan, broken=None, carry_broken=None):
    """Contiguous three-pass structure: reduce per tile, carry_scan (segments of the chain),
    then the tile scan with its carry. Rows of a (outer, L)."""
    outer, L = a.shape
    nchunks = -(-L // tile)
    h = np.empty_like(a)
    for r in range(outer):
        aggs = []
        for k in range(nchunks):
            acc = ident()
            for p in range(k * tile, min(L, (k + 1) * tile)):
                acc = comb(acc, (a[r, p], b[r, p]))
            aggs.append(acc)
        # carry_scan_kernel with THREADS segments
        threads = 4
        seg = -(-nchunks // threads)
        segs = []
        for t in range(threads):
            acc = ident()
            for m in range(t * seg, min(nchunks, t * seg + seg)):
                acc = comb(acc, aggs[m])
            segs.append(acc)
        pre = []
        acc = (1.0, h0[r])
        for t in range(threads):
            pre.append(acc)
            acc = comb(acc, segs[t]) if carry_broken != "swap_carry" else comb(segs[t], acc)
        carries = [None] * nchunks
        for t in range(threads):
            acc = pre[t]
            for m in range(t * seg, min(nchunks, t * seg + seg)):
                carries[m] = acc
                acc = comb(acc, aggs[m])
        for k in range(nchunks):
            lo, hi = k * tile, min(L, (k + 1) * tile)
            xa = np.ones(tile)
            xb = np.zeros(tile)
            xa[: hi - lo], xb[: hi - lo] = a[r, lo:hi], b[r, lo:hi]
            ys = tile_scan(xa, xb, broken)
            for i in range(hi - lo):
                h[r, lo + i] = comb(carries[k], ys[i])[1]
    return h


@pytest.mark.parametrize("which", ["blelloch", "hillis_steele"])
def test_tree_mirrors(which):
    rng = np.random.default_rng(7)
    a, b = inputs(rng, (2, 1000))
    h0 = rng.standard_normal(2)
    rh, _ = reference(a[:, :, None], b[:, :, None], h0[:, None])
    rh = rh[:, :, 0]
    fn, tile, bad = (blelloch_tile, 128, "swap_down") if which == "blelloch" else (hillis_tile, 128, "swap_ks")
    assert rel(tiled_three_pass(a, b, h0, tile, fn, broken=bad), rh) > 1e-6, "swapped operands not caught"
    assert rel(tiled_three_pass(a, b, h0, tile, fn, carry_broken="swap_carry"), rh) > 1e-6
    assert rel(tiled_three_pass(a, b, h0, tile, fn), rh) < 1e-12
