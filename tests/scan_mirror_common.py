"""Pieces shared by the CPU mirrors of the CUDA linear_scan kernels (tests/test_scan_mirrors*.py).

Each mirror re-does, in NumPy, what one kernel does: tile ids (chunk-major), which lane and
item holds which element (forward, reverse, 16-byte vectors or scalars), the warp shuffles,
the block prefix, the look-back windows and predecessors, the strided offsets, the Blelloch
sweeps, the Kogge-Stone steps, the segmented round folds (row_rounds), the three-pass carry
scan, and the operand order of every combine (the combine is not commutative). Runs in CI
without a GPU. Every mirror has deliberately broken variants (swapped operands, an
off-by-one predecessor, ...); each test first proves that the broken variant is caught by
the check, then trusts the mirror.
"""
from __future__ import annotations

import numpy as np

INC, AGG, INVALID = 2, 1, 0


def comb(e, l):
    """combine(earlier, later) = (a2*a1, a2*b1 + b2)."""
    return (l[0] * e[0], l[0] * e[1] + l[1])


def ident(shape=()):
    return (np.ones(shape), np.zeros(shape))


def reference(a, b, h0, axis_len_first=False, reverse=False):
    """a, b: (outer, L, inner); h0 (outer, inner). Sequential float64."""
    outer, L, inner = a.shape
    h = np.empty_like(a)
    p = np.empty_like(a)
    st, pr = h0.copy(), np.ones_like(h0)
    for s in range(L):
        t = L - 1 - s if reverse else s
        st = a[:, t] * st + b[:, t]
        pr = a[:, t] * pr
        h[:, t], p[:, t] = st, pr
    return h, p


class Status:
    """Tile status words with a visibility lag: a published inclusive prefix may still read
    as the older aggregate (what a relaxed load may see), to exercise every look-back path."""

    def __init__(self, rng, lag):
        self.agg, self.inc, self.rng, self.lag = {}, {}, rng, lag

    def publish(self, i, flag, pair):
        (self.inc if flag == INC else self.agg)[i] = pair

    def load(self, i):
        if i in self.inc and (i not in self.agg or self.rng.random() > self.lag):
            return INC, self.inc[i]
        if i in self.agg:
            return AGG, self.agg[i]
        return INVALID, None


def lookback_serial(st, k, rec, h0p, broken=None):
    c = k - 1
    p = None
    while c >= 0:
        f, p = st.load(rec(c))
        assert f != INVALID, "a predecessor that started earlier has not published"
        if f == INC:
            break
        c -= 1
    acc = h0p if c < 0 else p
    hi = k - 2 if broken == "pred_off_by_one" else k - 1
    for m in range(c + 1, hi + 1):
        f, p = st.load(rec(m))
        acc = p if f == INC else comb(acc, p)
    return acc


def fold_window(ps, s, broken=None):
    acc = ps[s]
    for l in range(1, 32):
        if l > s:
            acc = comb(ps[l], acc) if broken == "swap_fold" else comb(acc, ps[l])
    return acc


def lookback_warp(st, k, rec, h0p, broken=None):
    hi = k - 1
    shift = 32 if broken == "pred_off_by_one" else 31
    while True:  # phase 1
        fs, ps = [], []
        for lane in range(32):
            c = hi - shift + lane
            f, p = (INC, h0p) if c < 0 else st.load(rec(c))
            fs.append(f)
            ps.append(p)
        inc = [l for l in range(32) if fs[l] == INC]
        if inc:
            acc = fold_window(ps, max(inc), broken)
            break
        hi -= 32
    lo = hi + 1
    while lo <= k - 1:  # phase 2
        fs, ps = [], []
        for lane in range(32):
            c = lo + lane
            f, p = st.load(rec(c)) if c <= k - 1 else (AGG, ident())
            fs.append(f)
            ps.append(p)
        inc = [l for l in range(32) if c_ok(lo + l, k) and fs[l] == INC]
        first = 0
        if inc:
            acc = ps[max(inc)]
            first = max(inc) + 1
        for l in range(first, min(32, k - lo)):
            acc = comb(acc, ps[l])
        lo += 32
    return acc


def c_ok(c, k):
    return c <= k - 1


def warp_scan(w, broken=None):
    """Kogge-Stone inclusive scan over 32 lanes with shfl_up (lane >= o takes the lane o below)."""
    a, b = w[0].copy(), w[1].copy()
    o = 1
    while o < 32:
        ua, ub = np.roll(a, o, axis=0), np.roll(b, o, axis=0)
        m = np.arange(32) >= o
        m = m.reshape((32,) + (1,) * (a.ndim - 1))
        na, nb = comb((a, b), (ua, ub)) if broken == "swap_warp" else comb((ua, ub), (a, b))
        a, b = np.where(m, na, a), np.where(m, nb, b)
        o <<= 1
    return a, b


def tile_local_scan(xa, xb, broken=None):
    """thread_warp_scan + the block fold of tile_scan_kernel / row_rounds_kernel, in place
    on xa, xb (threads, items): the serial scan in each thread, Kogge-Stone over each warp's
    thread totals; returns the warp-inclusive (wa, wb) and warp-exclusive (exa, exb) values
    per thread, the warp totals and the tile total (their fold in warp order)."""
    threads, items = xa.shape
    for i in range(1, items):
        xa[:, i], xb[:, i] = comb((xa[:, i - 1], xb[:, i - 1]), (xa[:, i], xb[:, i]))
    wa, wb = np.empty(threads), np.empty(threads)
    exa, exb = np.empty(threads), np.empty(threads)
    s_warp = []
    for w in range(threads // 32):
        sl = slice(32 * w, 32 * w + 32)
        ia, ib = warp_scan((xa[sl, -1], xb[sl, -1]), broken)
        wa[sl], wb[sl] = ia, ib
        exa[sl], exb[sl] = np.roll(ia, 1), np.roll(ib, 1)
        exa[32 * w], exb[32 * w] = 1.0, 0.0
        s_warp.append((ia[31], ib[31]))
    t = s_warp[0]
    for q in range(1, len(s_warp)):
        t = comb(t, s_warp[q])
    return wa, wb, exa, exb, s_warp, t


def rel(x, y):
    return np.linalg.norm((x - y).ravel()) / np.linalg.norm(y.ravel())


def inputs(rng, shape):
    a = rng.uniform(0.6, 1.0, shape)
    b = rng.standard_normal(shape)
    return a, b


def strided_mirror_ok(run, a, b, h0, reverse):
    """run() -> (h, a_prod, written) of a strided mirror: every element written once and both
    results equal to the float64 recurrence. An index out of the arrays, an unpublished word
    read (a hang on the GPU) or a deadlock is a failure too."""
    try:
        h, ap, written = run()
    except (IndexError, KeyError, TypeError, AssertionError):
        return False
    if not np.all(written == 1):
        return False
    rh, rp = reference(a, b, h0, reverse=reverse)
    return rel(h, rh) < 1e-12 and rel(ap, rp) < 1e-12
