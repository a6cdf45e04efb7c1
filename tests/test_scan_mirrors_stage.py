"""CPU mirror of strided_stage (cuda/scan_stage_kernels.cuh): staged tiles, one flag per tile,
the per-channel fold. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np

from scan_mirror_common import AGG, INC, INVALID, Status, comb, ident, inputs, strided_mirror_ok


# strided_stage_kernel: tile id = k * nchains + chain (chain = o * nct + ct); a tile is
# CW = 32*V channels x LC = nw*spw steps; warp w walks steps k*LC + w*spw + i (i < spw,
# physical q = L-1-p in reverse), lane l owns channels ct*CW + l*V + e; the thread's first
# element is at (o*L + q0)*inner + c0 and each step moves the pointer by +-inner. One flag
# per tile; warp 0 looks at the window of flags hi-31+lane, takes the nearest inclusive
# one j, and each channel folds inc(j) o agg(j+1) o ... o agg(k-1) left to right.
def stage_mirror(a, b, h0, reverse, vw, nw, spw, rng, lag=0.6, broken=None):
    outer, L, inner = a.shape
    cw, lc = 32 * vw, nw * spw
    nct = -(-inner // cw)
    nchains, nchunks = outer * nct, -(-L // lc)
    fa, fb = a.ravel(), b.ravel()
    h, ap = np.full(a.size, np.nan), np.full(a.size, np.nan)
    written = np.zeros(a.size, int)
    st = Status(rng, lag)
    aggv, incv = {}, {}
    step = -inner if reverse else inner
    if broken == "step_sign":
        step = inner
    for tid in range(nchains * nchunks):
        chain, k = tid % nchains, tid // nchains
        if broken == "id_decode":
            chain, k = tid // nchunks, tid % nchunks
        o, ct = chain // nct, chain % nct
        ch = np.arange(cw)
        c = ct * cw + ch  # the tile's channels (lane l, element e: ch = l*vw + e)
        act = (c - ch % vw) < inner  # the lane's vector exists (inner % vw == 0: all or none)
        offs, sagg = [], []
        for w in range(nw):
            p0 = k * lc + w * spw
            n = max(0, min(spw, L - p0))
            q0 = L - 1 - p0 if reverse else p0
            base = (o * L + q0) * inner + c
            offs.append([base + i * step for i in range(n)])
            acc = ident(cw)
            for off in offs[-1]:
                o_ = np.where(act, off, 0)
                x = (np.where(act, fa[o_], 1.0), np.where(act, fb[o_], 0.0))
                acc = comb(acc, x)
            sagg.append(acc)
        t = sagg[0]
        for q in range(1, nw):
            t = comb(sagg[q], t) if broken == "swap_warp_fold" else comb(t, sagg[q])
        h0p = (np.ones(cw), np.where(c < inner, h0[o, np.minimum(c, inner - 1)], 0.0))
        rec = lambda cc: cc * nchains + chain
        if k == 0:
            excl = h0p
        else:
            st.publish(tid, AGG, True)
            aggv[tid] = t
            hi = k - 1
            while True:  # the window of 32 flags, nearest inclusive one
                cs = [hi - 31 + lane for lane in range(32)]
                fl = [INC if cc < 0 else st.load(rec(cc))[0] for cc in cs]
                assert INVALID not in fl
                incs = [lane for lane in range(32) if fl[lane] == INC]
                if incs:
                    j = cs[max(incs)]
                    break
                hi -= 32
            excl = h0p if j < 0 else incv[rec(j)]
            end = k - 1 if broken == "fold_end_off_by_one" else k
            for cc in range(j + 1, end):
                g = aggv[rec(cc)] if broken != "chain_index" else aggv.get(cc + chain * nchunks, ident(cw))
                excl = comb(g, excl) if broken == "swap_lookback" else comb(excl, g)
        incv[tid] = comb(excl, t)
        st.publish(tid, INC, True)
        for w in range(nw):
            pre = excl
            for q in range(nw):
                if q < w or (broken == "prefix_incl" and q == w):
                    pre = comb(pre, sagg[q])
            for off in offs[w]:
                o_ = np.where(act, off, 0)
                pre = comb(pre, (fa[o_], fb[o_]))
                h[o_[act]], ap[o_[act]] = pre[1][act], pre[0][act]
                written[o_[act]] += 1
    return h.reshape(a.shape), ap.reshape(a.shape), written.reshape(a.shape)


def check_stage(broken, reverse, shape=(2, 200, 72), vw=2, nw=2, spw=3, seed=0, lag=0.97):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, shape)
    h0 = rng.standard_normal((shape[0], shape[2]))
    return strided_mirror_ok(lambda: stage_mirror(a, b, h0, reverse, vw, nw, spw, rng, lag, broken),
                             a, b, h0, reverse)


def test_stage_mirror():
    # 200 steps in tiles of 6: 34 chunks per channel tile, so with the lag the window of 32
    # flags sometimes holds no inclusive prefix and the look-back moves back a window
    for bad in ("step_sign", "id_decode", "swap_warp_fold", "fold_end_off_by_one", "chain_index",
                "swap_lookback", "prefix_incl"):
        assert not check_stage(bad, True), f"broken variant {bad} not caught"
    for reverse in (False, True):
        assert check_stage(None, reverse)
        assert check_stage(None, reverse, shape=(1, 37, 136), vw=4, nw=3, spw=2, seed=3, lag=0.9)
        assert check_stage(None, reverse, shape=(3, 9, 8), vw=8, nw=2, spw=8, seed=4)


def test_stage_lookback_canonical():
    # whatever the lag (what the window sees), the exclusive prefixes are bit for bit the
    # left fold: two runs with different visibility give identical h
    rng = np.random.default_rng(9)
    a, b = inputs(rng, (1, 300, 64))
    h0 = rng.standard_normal((1, 64))
    outs = [stage_mirror(a, b, h0, False, 2, 2, 2, np.random.default_rng(s), lag)[0]
            for s, lag in ((1, 0.0), (2, 0.5), (3, 0.97))]
    assert all(np.array_equal(outs[0], x) for x in outs[1:])
