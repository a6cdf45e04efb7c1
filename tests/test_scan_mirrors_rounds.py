"""CPU mirror of row_rounds (cuda/scan_rounds_kernel.cuh): the persistent grid's segmented
round folds. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np

from scan_mirror_common import comb, ident, inputs, reference, rel, tile_local_scan


# ----------------------------------------------------------------------------------------
# row_rounds_kernel: contiguous rows, tile = THREADS*ITEMS logical elements, tpr tiles per
# row, global tile g = row*tpr + k. A grid of G blocks (rounds_launch clamps G to ntiles)
# takes the tiles in rounds: in round r (r0 = r*G) block j owns tile g = r0 + j. A tile that
# starts a row (k == 0) publishes (1, h0[row]) o t flagged INC ("reset"), any other tile its
# aggregate t flagged AGG. Every block folds the round's nr slots the same way: lane l folds
# slots l*m .. l*m+m-1 (m = ceil(G/32)) left to right with seg_combine, part = lane jl's fold
# just before slot j (jl = j // m), a Kogge-Stone seg scan over the 32 lane folds, excl =
# shfl_up(incl, 1), mine = seg(excl[jl], part), total = incl[31]; block j's carry is h0p at a
# row start, else seg(carry, mine).p, and carry = seg(carry, total) enters the next round.
def seg_comb(e, l):
    """seg_combine(earlier, later): a later element that starts a row discards the earlier."""
    return l if l[2] else comb(e[:2], l[:2]) + (e[2],)


SEG_ID = (1.0, 0.0, False)


def rounds_fold(slots, nr, G, j, broken=None):
    """Warp 0 of block j: (mine, total) of the round whose slots are slots[:nr]."""
    m = -(-G // 32)
    jl = j // m
    accs, part = [], SEG_ID
    for lane in range(32):
        acc = SEG_ID
        for q in range(m):
            s = lane * m + q
            if s == j and broken != "part_after_own":
                part = acc
            if s < nr:
                acc = seg_comb(acc, slots[s])
            if s == j and broken == "part_after_own":
                part = acc
        accs.append(acc)
    incl = list(accs)
    o = 1
    while o < 32:
        up = list(incl)  # shfl_up reads the values before this step
        for lane in range(o, 32):
            incl[lane] = seg_comb(incl[lane], up[lane - o]) if broken == "swap_seg" else seg_comb(up[lane - o], incl[lane])
        o <<= 1
    excl = [SEG_ID] + incl[:31]
    mine = seg_comb(incl[jl] if broken == "lane_incl" else excl[jl], part)
    return mine, incl[31]


def rounds_mirror(a, b, h0, reverse, threads, items, G, broken=None):
    outer, L = a.shape
    tile = threads * items
    nw = threads // 32
    tpr = -(-L // tile)
    ntiles = outer * tpr
    G = min(G, ntiles)
    h = np.full(a.shape, np.nan)
    ap = np.full(a.shape, np.nan)
    written = np.zeros(a.shape, int)
    carry = [SEG_ID] * G  # per block (warp 0's registers)
    for r0 in range(0, ntiles, G):
        nr = min(G, ntiles - r0)
        slots, tiles = [], []
        for j in range(nr):  # 1. every block's local scan and its published slot
            g = r0 + j
            row, k = g // tpr, g % tpr
            p = k * tile + np.arange(threads)[:, None] * items + np.arange(items)[None, :]
            valid = p < L
            idx = np.where(valid, L - 1 - p if reverse else p, -1)
            xa = np.where(valid, a[row, np.maximum(idx, 0)], 1.0)
            xb = np.where(valid, b[row, np.maximum(idx, 0)], 0.0)
            _, _, exa, exb, s_warp, t = tile_local_scan(xa, xb)
            h0p = (1.0, h0[row])
            if k == 0 and broken != "no_reset":
                slots.append(comb(h0p, t) + (True,))
            else:
                slots.append(tuple(t) + (False,))
            tiles.append((row, k, idx, valid, xa, xb, exa, exb, s_warp, h0p))
        totals = []
        for j in range(nr):  # 3. the round's fold in every block, 4. apply and store
            row, k, idx, valid, xa, xb, exa, exb, s_warp, h0p = tiles[j]
            mine, total = rounds_fold(slots, nr, G, j, broken)
            cin = h0p if k == 0 else seg_comb(carry[j], mine)[:2]
            if broken != "stale_carry":
                carry[j] = seg_comb(carry[j], total)
            totals.append(total)
            wpa, wpb = np.ones(threads), np.zeros(threads)
            for w in range(nw):
                wp = ident()
                for q in range(w):
                    wp = comb(wp, s_warp[q])
                wpa[32 * w:32 * w + 32], wpb[32 * w:32 * w + 32] = wp
            pa, pb = comb(comb(cin, (wpa, wpb)), (exa, exb))
            ya, yb = comb((pa[:, None], pb[:, None]), (xa, xb))
            h[row, idx[valid]] = yb[valid]
            ap[row, idx[valid]] = ya[valid]
            np.add.at(written[row], idx[valid], 1)
        assert all(x == totals[0] for x in totals), "blocks disagree on the round total"
    return h, ap, written


def check_rounds(broken, reverse, shape, G, seed=0, threads=64, items=4, a_lo=None):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, shape)
    if a_lo is not None:
        a = rng.uniform(a_lo, 1.0, shape)
    h0 = rng.standard_normal(shape[0])
    h, ap, written = rounds_mirror(a, b, h0, reverse, threads, items, G, broken)
    if not np.all(written == 1):
        return False
    rh, rp = reference(a[:, :, None], b[:, :, None], h0[:, None], reverse=reverse)
    return rel(h, rh[:, :, 0]) < 1e-12 and rel(ap, rp[:, :, 0]) < 1e-12


# TILE = 256. (shape, G): m = 1, 2, 3; rows of 8, 21, 41 tiles (L not a multiple of TILE)
# start mid-round; the last round is partial (G = 70: lanes 23.. hold 1 or no slots); rows
# shorter than one tile (every tile resets, nothing crosses a tile: no broken variant shows)
ROUNDS_CASES = [((3, 256 * 7 + 37), 5), ((5, 256 * 20 + 100), 40), ((4, 256 * 40 + 1), 70),
                ((9, 100), 5), ((150, 70), 70)]


def test_rounds_mirror():
    # a in [0.97, 1): a whole tile's product (~0.02) keeps h0 and the previous row's carry
    # visible past a tile (with a in [0.6, 1) it is ~1e-25 and "no_reset" would pass)
    for bad in ("part_after_own", "swap_seg", "no_reset", "lane_incl", "stale_carry"):
        for shape, G in ROUNDS_CASES[:3]:
            for reverse in (False, True):
                assert not check_rounds(bad, reverse, shape, G, a_lo=0.97), \
                    f"broken variant {bad} not caught ({shape}, G={G}, reverse={reverse})"
    for shape, G in ROUNDS_CASES:
        for reverse in (False, True):
            assert check_rounds(None, reverse, shape, G, seed=1)
            assert check_rounds(None, reverse, shape, G, seed=2, a_lo=0.97)
