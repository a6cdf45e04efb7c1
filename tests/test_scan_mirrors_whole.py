"""CPU mirror of strided_whole (cuda/scan_whole_kernel.cuh): one block per channel tile through
the whole scanned axis, rounds of groups of steps, the groups scanned by shuffles NCV lanes apart
and by the warps' totals. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from scan_mirror_common import comb, ident, inputs, strided_mirror_ok


def whole_ncv(L, nvec, outer=1, threads=256, s=4):
    """whole_ncv(): the largest power of two NCV <= 32 whose round (threads / NCV * s steps)
    covers L, no more than nvec rounded up to a power of two, at least 2 where nvec >= 2 (whole
    32-byte sectors), and up to 4 while >= 128 blocks remain (docs/PERFORMANCE_CUDA.md sections
    22.6, 22.8)."""
    ncv = 2 if nvec >= 2 else 1
    while ncv < 32 and threads // (2 * ncv) * s >= L and ncv < nvec:
        ncv *= 2
    while ncv < 4 and ncv < nvec and outer * -(-nvec // (2 * ncv)) >= 128:
        ncv *= 2
    return ncv


# strided_whole_kernel: block = o * nvt + vector tile; thread t: vector cv = t % ncv (channels
# (tile*ncv + cv)*vw + e), group g = t // ncv, gl = (t % 32) // ncv in its warp; round r covers
# steps r*ng*s + g*s + i (i < s; physical L-1-p in reverse), the element at (o*L + q0)*inner + c0
# and +-inner per step. Kogge-Stone over the warp's groups (shfl_up by dd*ncv, taken where
# gl >= dd, the earlier value first), the warp totals (gl == gw - 1), then
# prefix = carry o warps before o the group before in the warp; carry o every warp in order.
def whole_mirror(a, b, h0, reverse, vw, ncv, threads=64, s=3, broken=None):
    outer, L, inner = a.shape
    nw, ng, gw = threads // 32, threads // ncv, 32 // ncv
    nvec = inner // vw
    nvt = -(-nvec // ncv)
    fa, fb = a.ravel(), b.ravel()
    h, ap = np.full(a.size, np.nan), np.full(a.size, np.nan)
    written = np.zeros(a.size, int)
    step = -inner if reverse else inner
    if broken == "step_sign":
        step = inner
    t = np.arange(threads)
    cv, g, gl, w = t % ncv, t // ncv, (t % 32) // ncv, t // 32
    if broken == "group_decode":
        cv, g = t // ng, t % ng
    e = np.arange(vw)
    for blk in range(outer * nvt):
        o, vt = blk // nvt, blk % nvt
        vg = vt * ncv + cv
        act = vg < nvec
        c = (vg * vw)[:, None] + e[None, :]  # (threads, vw) channels
        cc = np.minimum(c, inner - 1)
        carry = (np.ones((threads, vw)), np.where(act[:, None], h0[o, cc], 0.0))
        nround = -(-L // (ng * s))
        for r in range(nround):
            p0 = r * ng * s + g * s
            if broken == "round_base":
                p0 = r * ng + g * s
            n = np.where(act, np.clip(L - p0, 0, s), 0)
            q0 = L - 1 - p0 if reverse else p0
            off = (o * L + q0) * inner + vg * vw
            offs = [off[:, None] + i * step + e[None, :] for i in range(s)]
            x = ident((threads, vw))
            for i in range(s):
                m = (i < n)[:, None]
                idx = np.where(m, offs[i], 0)
                x = tuple(np.where(m, v, xv) for v, xv in zip(comb(x, (fa[idx], fb[idx])), x))
            dd = 1
            while dd < gw:
                src = t - dd * (1 if broken == "shfl_distance" else ncv)
                y = (x[0][src], x[1][src])
                take = (gl >= dd)[:, None]
                new = comb(x, y) if broken == "swap_shfl" else comb(y, x)
                x = tuple(np.where(take, nv, xv) for nv, xv in zip(new, x))
                dd *= 2
            tot_w = {}
            for q in range(nw):  # s_tot[q][cv]: the lane of the warp's last group
                for v in range(ncv):
                    lane = q * 32 + (gw - 1) * ncv + v
                    tot_w[q, v] = (x[0][lane], x[1][lane])
            src = t - ncv
            ex = (np.where((gl > 0)[:, None], x[0][src], 1.0), np.where((gl > 0)[:, None], x[1][src], 0.0))
            if broken == "excl_incl":
                ex = x
            pre_a, pre_b = carry[0].copy(), carry[1].copy()
            tot_a, tot_b = carry[0].copy(), carry[1].copy()
            for th in range(threads):
                pa, pb, ta, tb = pre_a[th], pre_b[th], tot_a[th], tot_b[th]
                for q in range(nw):
                    tq = tot_w[q, cv[th]]
                    if q < w[th] or (broken == "warp_prefix_incl" and q == w[th]):
                        pa, pb = comb((pa, pb), tq)
                    ta, tb = comb(tq, (ta, tb)) if broken == "carry_order" else comb((ta, tb), tq)
                pre_a[th], pre_b[th], tot_a[th], tot_b[th] = pa, pb, ta, tb
            cur = comb((pre_a, pre_b), ex)
            carry = (tot_a, tot_b)
            for i in range(s):
                m = (i < n)[:, None]
                o_ = np.where(m, offs[i], 0)
                cur = tuple(np.where(m, v, c_) for v, c_ in zip(comb(cur, (fa[o_], fb[o_])), cur))
                idx = offs[i][m[:, 0]]
                h[idx], ap[idx] = cur[1][m[:, 0]], cur[0][m[:, 0]]
                np.add.at(written, idx, 1)
    return h.reshape(a.shape), ap.reshape(a.shape), written.reshape(a.shape)


def check_whole(broken, reverse, shape=(2, 200, 24), vw=2, ncv=2, threads=64, s=3, seed=0):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, shape)
    h0 = rng.standard_normal((shape[0], shape[2]))
    return strided_mirror_ok(lambda: whole_mirror(a, b, h0, reverse, vw, ncv, threads, s, broken),
                             a, b, h0, reverse)


def test_whole_mirror_catches_broken_variants():
    # (2, 200, 24), vectors of 2 channels, 2 vectors a block: 6 blocks per outer index, a round
    # of 32 groups x 3 steps, so 3 rounds (the carry crosses rounds) and a partial last one
    for bad in ("step_sign", "group_decode", "round_base", "shfl_distance", "swap_shfl",
                "excl_incl", "warp_prefix_incl", "carry_order"):
        assert not check_whole(bad, True), f"broken variant {bad} not caught"


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape,vw,ncv", [((2, 200, 24), 2, 2), ((1, 37, 16), 4, 1), ((3, 9, 64), 8, 4),
                                          ((1, 50, 12), 4, 32), ((2, 7, 8), 2, 8)])
def test_whole_mirror(shape, vw, ncv, reverse):
    # ncv 32: no shuffles, the warps are the groups; (1, 50, 12) has 3 vectors of 32 (the rest idle)
    assert check_whole(None, reverse, shape=shape, vw=vw, ncv=ncv, seed=sum(shape))


def test_whole_ncv_rule():
    # the block's vectors: one round covers the axis where it can (256 threads, 4 steps each)
    assert whole_ncv(1024, 256) == 2 and whole_ncv(1025, 256) == 2 and whole_ncv(5000, 9) == 2
    assert whole_ncv(512, 256) == 2 and whole_ncv(513, 256) == 2 and whole_ncv(256, 256) == 4
    assert whole_ncv(1024, 1) == 1 and whole_ncv(5000, 2) == 2
    assert whole_ncv(32, 256) == 32 and whole_ncv(33, 256) == 16 and whole_ncv(1, 256) == 32
    assert whole_ncv(32, 3) == 4 and whole_ncv(32, 1) == 1  # no more than the vectors, a power of two
    # up to 4 vectors (more rounds) while >= 128 blocks remain
    assert whole_ncv(1024, 512) == 4 and whole_ncv(1024, 508) == 2 and whole_ncv(1024, 256, outer=2) == 4
    assert whole_ncv(1024, 4096) == 4 and whole_ncv(256, 2048) == 4 and whole_ncv(32, 4096) == 32
