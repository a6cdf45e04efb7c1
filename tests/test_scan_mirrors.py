"""CPU mirrors of the CUDA linear_scan kernels' index arithmetic (cuda/scan_*.cuh).

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
import pytest

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
# three-pass carry structure is mirrored by tiled_three_pass below
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


def rel(x, y):
    return np.linalg.norm((x - y).ravel()) / np.linalg.norm(y.ravel())


def inputs(rng, shape):
    a = rng.uniform(0.6, 1.0, shape)
    b = rng.standard_normal(shape)
    return a, b


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


# ----------------------------------------------------------------------------------------
# row_walk_kernel: one warp per row; sub-chunk j covers logical [j*SUB, (j+1)*SUB), SUB =
# 32*VEC; lane l holds logical [j*SUB + l*VEC, +VEC): one 16-byte vector at physical p
# (forward) or L-p-VEC (reverse, items reversed), or scalars (L % VEC != 0). Serial scan in
# the lane, Kogge-Stone over lanes, y = (carry o lane-exclusive) o x, carry o= lane 31.
def row_walk_mirror(a, b, h0, reverse, vec_width, vec, broken=None):
    outer, L = a.shape
    sub = 32 * vec_width
    nsub = -(-L // sub)
    h = np.full(a.shape, np.nan)
    ap = np.full(a.shape, np.nan)
    written = np.zeros(a.shape, int)
    for r in range(outer):
        carry = (1.0, h0[r])
        for j in range(nsub):
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
            valid = idx >= 0
            xa = np.where(valid, a[r, np.maximum(idx, 0)], 1.0)
            xb = np.where(valid, b[r, np.maximum(idx, 0)], 0.0)
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
    return h, ap, written


def check_row_walk(broken, reverse, vec, seed=0, vec_width=4):
    rng = np.random.default_rng(seed)
    L = 32 * vec_width * 3 + (0 if vec else 3)
    a, b = inputs(rng, (3, L))
    h0 = rng.standard_normal(3)
    h, ap, written = row_walk_mirror(a, b, h0, reverse, vec_width, vec, broken)
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


# ----------------------------------------------------------------------------------------
# strided_pipe_kernel (cuda/strided_pipe.cuh): strided_stage's tile ids, lanes and offsets
# (tile id = k * nchains + chain, CW = 32 * V channels, LC = 4 * SPW steps, warp w of a role
# owning steps w*SPW ..), run by persistent blocks of three roles joined by a ring of NSLOT
# slots: the producer claims the next id when slot i % NSLOT is free and lands the tile there;
# the aggregators take the slots in order and publish each channel's word (AGG, or INC =
# (1, h0) o t for a chain's first tile); the finishers take them in order, look back per
# channel (the PIPE_FIRST nearest words, or a whole window of W where that channel's last
# look-back reached past them; then windows of W further back, re-reading the later ones to
# fold them), publish INC, walk the slot with excl o (earlier warps' aggregates) and free it.
# The simulation interleaves the roles of all blocks at random; a word's publication becomes
# visible to other loads only after a random delay, so looks-back see empty words (spins),
# aggregates where inclusive prefixes are already published, and reach back several windows.
class PipeBlock:
    """One persistent block of the pipeline mirrors: its ring of slots ((id, data) landed by
    the producer), the three roles' positions, the slots the producer may refill."""

    def __init__(self, nslot):
        self.nslot, self.slots = nslot, [None] * nslot
        self.i_prod = self.i_agg = self.i_fin = 0
        self.freed = set(range(nslot))
        self.done_prod = False

    def claim(self, counter, broken):
        """The producer's next (slot, tile id) from the shared counter (a one-element list), or
        None while that slot is not free (broken "no_empty_wait": refill up to a use early)."""
        s = self.i_prod % self.nslot
        if self.done_prod or (s not in self.freed and broken != "no_empty_wait"):
            return None
        if broken == "no_empty_wait" and self.i_prod - self.i_fin >= self.nslot + 1:
            return None
        self.freed.discard(s)
        counter[0] += 1
        return s, counter[0] - 1


def run_roles(blocks, roles, clock, rng):
    """The pipelines' scheduler: one step of a random role of a random block per clock tick,
    until every block's finisher has met its end marker (bl.i_fin is None)."""
    idle = 0
    while any(bl.i_fin is not None for bl in blocks):
        clock[0] += 1
        bl = blocks[int(rng.integers(0, len(blocks)))]
        if bl.i_fin is None:
            continue
        moved = roles[int(rng.integers(0, len(roles)))](bl)
        idle = 0 if moved else idle + 1
        assert idle < 20000, "no role can move: deadlock"


def pipe_mirror(a, b, h0, reverse, vw, spw, nslot, nblocks, rng, W=2, FIRST=1, broken=None):
    outer, L, inner = a.shape
    cw, lc = 32 * vw, 4 * spw
    nct = -(-inner // cw)
    nchains, nchunks = outer * nct, -(-L // lc)
    ntiles = nchains * nchunks
    fa, fb = a.ravel(), b.ravel()
    h, ap = np.full(a.size, np.nan), np.full(a.size, np.nan)
    written = np.zeros(a.size, int)
    step = -inner if reverse else inner
    clock = [0]
    words = {}  # (tile, channel) -> list of (visible from, flag, pair), newest last

    def publish(tid, ch, flag, pair):
        words.setdefault((tid, ch), []).append((clock[0] + int(rng.integers(0, 6)), flag, pair))

    def load(tid, ch):
        seen = [w for w in words.get((tid, ch), []) if w[0] <= clock[0]]
        return (seen[-1][1], seen[-1][2]) if seen else (INVALID, None)

    def where(tid, w):  # lane-major offsets of warp w's steps, per channel of the tile
        chain, k = tid % nchains, tid // nchains
        o, ct = chain // nct, chain % nct
        c = ct * cw + np.arange(cw)
        p0 = k * lc + w * spw
        n = max(0, min(spw, L - p0))
        q0 = L - 1 - p0 if reverse else p0
        return [(o * L + q0) * inner + c + i * step for i in range(n)], c < inner

    def h0_of(tid, ch):
        chain = tid % nchains
        o, c = chain // nct, (chain % nct) * cw + ch
        return (1.0, h0[o, c]) if c < inner else (1.0, 0.0)

    stats = {"windows back": 0, "spins": 0}

    def lookback(tid, ch, wide):
        """(exclusive prefix, wide) of one channel, or None to spin (an empty word)."""
        chain, k = tid % nchains, tid // nchains
        rec = lambda c: c * nchains + chain

        def window(hi, m):
            fs, vs = [], []
            for u in range(W):
                if u >= m:
                    fs.append("unread"), vs.append(None)
                elif hi - u < 0:
                    fs.append("unread" if broken == "h0_at_unread" else "h0"), vs.append(None)
                else:
                    f, v = load(rec(hi - u), ch)
                    fs.append(f), vs.append(v)
            if broken == "h0_at_unread":
                fs = ["h0" if f == "unread" else f for f in fs]
            near = next((u for u in range(W) if fs[u] in (INC, "h0")), None)
            bad = next((u for u in range(W) if fs[u] in (INVALID, "unread")), None)
            if near is None or (bad is not None and bad < near):
                return ("spin" if bad is not None and fs[bad] == INVALID else "more"), None, near
            acc = h0_of(tid, ch) if fs[near] == "h0" else vs[near]
            lo = 1 if broken == "near_off_by_one" else 0
            for u in range(near - 1, lo - 1, -1):
                acc = comb(vs[u], acc) if broken == "swap_fold" else comb(acc, vs[u])
            return "found", acc, near

        r, acc, near = window(k - 1, W if wide else FIRST)
        wide = r != "found" or near >= FIRST
        if r == "found":
            return acc, wide
        hi = k - 1
        while True:
            r, acc, _ = window(hi, W)
            if r == "found":
                break
            if r == "spin":
                return None
            hi -= W
            stats["windows back"] += 1
        if broken != "skip_refold":
            for c in range(hi + 1, k):
                f, v = load(rec(c), ch)
                acc = v if f == INC else comb(acc, v)
        return acc, wide

    def tile_total(sub):  # the 4 warps' aggregates folded in warp order
        t = sub[0]
        for q in range(1, 4):
            t = comb(t, sub[q])
        return t

    counter = [0]
    blocks = [PipeBlock(nslot) for _ in range(nblocks)]
    for bl in blocks:
        bl.wide, bl.sagg = {}, {}

    def produce(bl):
        got = bl.claim(counter, broken)
        if got is None:
            return False
        s, tid = got
        if tid >= ntiles:
            bl.slots[s] = (tid, None)
            bl.done_prod = True
        else:  # the landed copy of the tile (what the slot holds)
            data = []
            for w in range(4):
                offs, act = where(tid, w)
                data.append([(np.where(act, fa[np.where(act, o, 0)], 1.0),
                              np.where(act, fb[np.where(act, o, 0)], 0.0)) for o in offs])
            bl.slots[s] = (tid, data)
        bl.i_prod += 1
        return True

    def aggregate(bl):
        if bl.i_agg >= bl.i_prod:
            return False
        s = bl.i_agg % nslot
        tid, data = bl.slots[s]
        if data is None:
            bl.i_agg += 1
            return True
        sub = []
        for w in range(4):
            acc = ident(cw)
            for x in data[w]:
                acc = comb(acc, x)
            sub.append(acc)
        bl.sagg[bl.i_agg] = (tid, sub)
        t = tile_total(sub)
        k = tid // nchains
        for ch in range(cw):
            tc = (t[0][ch], t[1][ch])
            if k == 0:
                first = tc if broken == "first_no_h0" else comb(h0_of(tid, ch), tc)
                publish(tid, ch, INC, first)
            else:
                publish(tid, ch, AGG, tc)
        bl.i_agg += 1
        return True

    def finish(bl):
        if bl.i_fin >= bl.i_agg:
            return False
        s = bl.i_fin % nslot
        tid, data = bl.slots[s]
        if data is None:
            bl.i_fin = None  # the end marker
            return True
        _, sub = bl.sagg[bl.i_fin]
        k = tid // nchains
        excl, wide = [], {}
        for ch in range(cw):
            if k == 0:
                excl.append(h0_of(tid, ch))
                continue
            r = lookback(tid, ch, bl.wide.get(ch, False))
            if r is None:
                stats["spins"] += 1
                return False  # spin: come back later (words published meanwhile)
            excl.append(r[0])
            wide[ch] = r[1]
        bl.wide.update(wide)
        t = tile_total(sub)
        for ch in range(cw):
            if k > 0:
                publish(tid, ch, INC, comb(excl[ch], (t[0][ch], t[1][ch])))
        ex = (np.array([e[0] for e in excl]), np.array([e[1] for e in excl]))
        for w in range(4):
            pre = ex
            for q in range(4):
                if q < w or (broken == "prefix_incl" and q == w):
                    pre = comb(pre, sub[q])
            offs, act = where(tid, w)
            for x, off in zip(data[w], offs):
                pre = comb(pre, x)
                h[off[act]], ap[off[act]] = pre[1][act], pre[0][act]
                written[off[act]] += 1
        bl.freed.add(s)
        bl.i_fin += 1
        return True

    run_roles(blocks, (produce, aggregate, finish), clock, rng)
    pipe_mirror.stats = stats
    return h.reshape(a.shape), ap.reshape(a.shape), written.reshape(a.shape)


def check_pipe(broken, reverse, shape=(1, 150, 40), vw=1, spw=2, nslot=3, nblocks=6, seed=0, W=2):
    rng = np.random.default_rng(seed)
    a, b = inputs(rng, shape)
    a = rng.uniform(0.97, 1.0, shape)  # a tile's product stays near 1: every carry matters
    h0 = rng.standard_normal((shape[0], shape[2]))
    return strided_mirror_ok(lambda: pipe_mirror(a, b, h0, reverse, vw, spw, nslot, nblocks, rng, W=W,
                                                 broken=broken), a, b, h0, reverse)


def test_pipe_mirror():
    # 150 steps in tiles of 8: 19 chunks on each of 2 chains (channel tiles of 32, the second
    # partial), 6 blocks of 3 slots: up to 18 tiles in flight, so looks-back (the nearest word,
    # then windows of 2) reach several windows back, spin on empty words and see stale
    # aggregates (a few hundred windows back and tens of spins per run)
    for bad in ("swap_fold", "near_off_by_one", "skip_refold", "first_no_h0", "prefix_incl",
                "no_empty_wait", "h0_at_unread"):
        assert not any(check_pipe(bad, rev, seed=s) for rev in (False, True) for s in range(2)), \
            f"broken variant {bad} not caught"
    for reverse in (False, True):
        for seed in range(3):
            assert check_pipe(None, reverse, seed=seed)
        assert check_pipe(None, reverse, shape=(1, 37, 136), vw=4, spw=1, nslot=2, nblocks=3, seed=4)
        assert check_pipe(None, reverse, shape=(3, 9, 8), vw=8, spw=4, nslot=4, nblocks=2, seed=5, W=8)


# ----------------------------------------------------------------------------------------
# row_pipe_kernel (cuda/row_pipe.cuh): contiguous tiles in the warp-specialised pipeline.
# `lanes` stands for the warp's 32 lanes (a power of two); na aggregator warps (8 on the GPU)
# and 4 finisher warps; the look-back window is one word per finisher thread (4 * lanes). nv: a
# multiple of 8 on the GPU (the swizzle's groups); here any nv with swz_bits <= log2(nv).
# rewalk=False: fp32, the slot scanned in place by the aggregators; rewalk=True: 16-bit types,
# the aggregators leave the slot as landed and keep each run's tile-local exclusive prefix, and
# finisher thread f re-walks the runs f, f + win, ... from the carry, writing h over the slot.
# bulk=True (fp32): h leaves through the staging region (vector v of the tile at nval - 1 - v in
# the reverse direction) and one copy of nval vectors to the tile's physical start (a_prod, which
# the kernel does not take that path with, still by the per-vector stores).
def row_pipe_mirror(a, b, h0, reverse, lanes, nv, vec, nslot, nblocks, rng, lag=8, swz_bits=0,
                    broken=None, na=4, rewalk=False, bulk=False):
    outer, L, inner = a.shape
    assert inner == 1
    G = na
    tile, win = G * lanes * nv * vec, 4 * lanes
    assert (G * lanes) % win == 0
    rpt = G * lanes // win  # runs per finisher thread (re-walk)
    nvt = tile // vec
    nchains, nchunks = outer, -(-L // tile)
    ntiles = nchains * nchunks
    fa, fb = a[:, :, 0], b[:, :, 0]
    h, ap = np.full((outer, L), np.nan), np.full((outer, L), np.nan)
    written = np.zeros((outer, L), int)
    clock = [0]
    words = {}  # tile -> list of (visible from, flag, pair), newest last
    stats = {"spins": 0, "far": 0}
    mask = (1 << swz_bits) - 1

    def swz(v):  # rp_swz: the low bits of v XOR-ed with (v // nv)'s
        return (v | ((v // nv) & mask)) if broken == "swz_or" else v ^ ((v // nv) & mask)

    def publish(tid, flag, pair):
        words.setdefault(tid, []).append((clock[0] + int(rng.integers(0, lag)), flag, pair))

    def load(tid):
        seen = [w for w in words.get(tid, []) if w[0] <= clock[0]]
        return (seen[-1][1], seen[-1][2]) if seen else (INVALID, None)

    def land(tid):  # the producer's copy: vector v (row order) at slot position swz(v)
        chain, k = tid % nchains, tid // nchains
        sa, sb = np.full((nvt, vec), np.nan), np.full((nvt, vec), np.nan)
        for v in range(nvt):
            p0 = k * tile + v * vec
            if p0 < L:
                q = L - p0 - vec if reverse else p0
                sa[swz(v)], sb[swz(v)] = fa[chain, q:q + vec], fb[chain, q:q + vec]
        return [sa, sb]

    def order():  # a vector's elements in logical order
        return range(vec - 1, -1, -1) if reverse and broken != "no_reverse" else range(vec)

    def scan_in_place(tid, slot):
        """The aggregators: each lane folds its run of nv vectors, a Kogge-Stone scan of the
        lane totals per warp, the warps folded in order; the tile-local inclusive prefixes
        written over the slot (rewalk: each run's exclusive prefix kept instead). Returns the
        tile total and the runs' prefixes."""
        sa, sb = slot
        k = tid // nchains
        valid = lambda v: k * tile + v * vec < L

        def run_of(w, lane):
            return [(w * lanes + lane) * nv + j for j in range(nv)]

        tot_w, ex = [], {}
        for w in range(G):
            lt = []
            for lane in range(lanes):
                run = (1.0, 0.0)
                for v in run_of(w, lane):
                    if valid(v):
                        for e in order():
                            run = comb(run, (sa[swz(v), e], sb[swz(v), e]))
                lt.append(run)
            incl = list(lt)
            o = 1
            while o < lanes:  # every lane reads the value before this round
                old = list(incl)
                for lane in range(o, lanes):
                    incl[lane] = comb(old[lane], old[lane - o]) if broken == "ks_swap" else comb(old[lane - o], old[lane])
                o *= 2
            for lane in range(lanes):
                if broken == "lex_incl":
                    ex[w, lane] = incl[lane]
                else:
                    ex[w, lane] = (1.0, 0.0) if lane == 0 else incl[lane - 1]
            tot_w.append(incl[-1])
        tot = tot_w[0]
        for q in range(1, G):
            tot = comb(tot, tot_w[q])
        lex = {}
        for w in range(G):
            pre = (1.0, 0.0)
            for q in range(G):
                if q < w or (broken == "prefix_incl" and q == w):
                    pre = comb(pre, tot_w[q])
            for lane in range(lanes):
                run = comb(pre, ex[w, lane])
                lex[w * lanes + lane] = run
                if rewalk:
                    continue
                for v in run_of(w, lane):
                    if valid(v):
                        for e in order():
                            run = comb(run, (sa[swz(v), e], sb[swz(v), e]))
                            sa[swz(v), e], sb[swz(v), e] = run
        return tot, lex

    def rewalk_runs(tid, slot, excl, lex):
        """The 16-bit finisher: thread f walks its runs f + m * win from excl o lex[run], h over
        the slot's a and the a-product over its b."""
        sa, sb = slot
        k = tid // nchains
        for f in range(win):
            for m in range(rpt):
                r = f + m * win
                vr = f * rpt + m if broken == "rewalk_lex_index" else r  # the run whose vectors it walks
                y = lex[r] if broken == "rewalk_no_carry" else comb(excl, lex[r])
                for j in range(nv):
                    v = vr * nv + j
                    if k * tile + v * vec < L:
                        for e in order():
                            y = comb(y, (sa[swz(v), e], sb[swz(v), e]))
                            sa[swz(v), e], sb[swz(v), e] = y[1], y[0]

    def exclusive(tid):  # the window, then the fold; None: spin
        chain, k = tid % nchains, tid // nchains
        hp = (1.0, h0[chain, 0])
        if k == 0:
            return hp
        fs, vs = [], []
        for ftid in range(win):
            c = k - ftid if broken == "window_off_by_one" else k - 1 - ftid
            if c >= 0:
                f, v = load(c * nchains + chain)
            else:
                f, v = INC, (hp if c == -1 else (1.0, 0.0))
            fs.append(f), vs.append(v)
        incs = [u for u in range(win) if fs[u] == INC]
        emps = [u for u in range(win) if fs[u] == INVALID]
        ni = (max(incs) if broken == "farthest_inc" else min(incs)) if incs else None
        ne = min(emps) if emps and broken != "ignore_empty" else None
        if ni is not None and (ne is None or ne > ni):
            acc = vs[ni]
            for u in range(ni - 1, -1, -1):
                acc = comb(vs[u], acc) if broken == "swap_fold" else comb(acc, vs[u])
            return acc
        if ne is not None:
            return None
        # all aggregates: lookback_warp from scratch (walk back to an inclusive word, fold on)
        stats["far"] += 1
        c = k - 1
        while c >= 0:
            f, v = load(c * nchains + chain)
            if f == INVALID:
                return None
            if f == INC:
                break
            c -= 1
        acc = hp if c < 0 else load(c * nchains + chain)[1]
        for j in range(max(c, -1) + 1, k):
            f, v = load(j * nchains + chain)
            acc = v if f == INC else comb(acc, v)
        return acc

    counter = [0]
    blocks = [PipeBlock(nslot) for _ in range(nblocks)]
    for bl in blocks:
        bl.tot, bl.lex = {}, {}

    def produce(bl):
        got = bl.claim(counter, broken)
        if got is None:
            return False
        s, tid = got
        bl.slots[s] = (tid, None if tid >= ntiles else land(tid))
        bl.done_prod = tid >= ntiles
        bl.i_prod += 1
        return True

    def aggregate(bl):
        if bl.i_agg >= bl.i_prod:
            return False
        tid, slot = bl.slots[bl.i_agg % nslot]
        if slot is not None:
            t, bl.lex[bl.i_agg] = scan_in_place(tid, slot)
            bl.tot[bl.i_agg] = t
            chain, k = tid % nchains, tid // nchains
            if k == 0:
                publish(tid, INC, t if broken == "first_no_h0" else comb((1.0, h0[chain, 0]), t))
            else:
                publish(tid, AGG, t)
        bl.i_agg += 1
        return True

    def finish(bl):
        if bl.i_fin >= bl.i_agg:
            return False
        s = bl.i_fin % nslot
        tid, _ = bl.slots[s]
        if tid >= ntiles:
            bl.i_fin = None  # the end marker
            return True
        excl = exclusive(tid)
        if excl is None:
            stats["spins"] += 1
            return False
        sa, sb = bl.slots[s][1]  # what the slot holds now (a refill would have replaced it)
        chain, k = tid % nchains, tid // nchains
        if k > 0:
            publish(tid, INC, comb(excl, bl.tot[bl.i_fin]))
        if rewalk:
            rewalk_runs(tid, (sa, sb), excl, bl.lex[bl.i_fin])
        if bulk:
            assert L % vec == 0 and not rewalk  # the kernel's 16-byte vectors; fp32 only
            nval = min(nvt, (L - k * tile) // vec)
            stg = np.full((nval, vec), np.nan)
            for v in range(nval):
                val = [comb(excl, (sa[swz(v), e], sb[swz(v), e]))[1] for e in range(vec)]
                stg[nval - 1 - v if reverse and broken != "bulk_order" else v] = val
            span = (nvt if broken == "bulk_start" else nval) * vec
            idx = (L - k * tile - span if reverse else k * tile) + np.arange(nval * vec)
            if idx.min() < 0 or idx.max() >= L:
                raise IndexError("bulk copy outside the row")
            h[chain, idx] = stg.ravel()
        for v in range(nvt):  # row order; the elements already at their physical places
            p0 = k * tile + v * vec
            if p0 >= L:
                break
            q0 = L - p0 - vec if reverse else p0
            for e in range(vec):
                if rewalk:  # stored as re-walked
                    hv, av = sa[swz(v), e], sb[swz(v), e]
                else:
                    y = comb(excl, (sa[swz(v), e], sb[swz(v), e]))
                    hv, av = y[1], y[0]
                ap[chain, q0 + e] = av
                if not bulk:
                    h[chain, q0 + e] = hv
                written[chain, q0 + e] += 1
        bl.freed.add(s)
        bl.i_fin += 1
        return True

    run_roles(blocks, (produce, aggregate, finish), clock, rng)
    row_pipe_mirror.stats = stats
    return h[:, :, None], ap[:, :, None], written[:, :, None]


def check_row_pipe(broken, reverse, shape=(2, 1500, 1), lanes=4, nv=4, vec=2, nslot=3, nblocks=6, seed=0, lag=8,
                   swz_bits=2, na=4, rewalk=False, bulk=False):
    rng = np.random.default_rng(seed)
    _, b = inputs(rng, shape)
    a = rng.uniform(0.97, 1.0, shape)  # a tile's product stays near 1: every carry matters
    h0 = rng.standard_normal((shape[0], 1))
    return strided_mirror_ok(lambda: row_pipe_mirror(a, b, h0, reverse, lanes, nv, vec, nslot, nblocks, rng,
                                                     lag=lag, swz_bits=swz_bits, broken=broken, na=na,
                                                     rewalk=rewalk, bulk=bulk), a, b, h0, reverse)


def test_row_pipe_mirror():
    # 1500 steps in tiles of 128 (4 warps x 4 lanes x 4 vectors of 2): 12 chunks on each of 2
    # rows, 6 blocks of 3 slots (up to 18 tiles in flight) against a 16-word window: looks-back
    # spin on empty words and see stale aggregates; the swizzle XORs 2 bits inside each run of 4
    for bad in ("swap_fold", "window_off_by_one", "farthest_inc", "ignore_empty", "ks_swap",
                "first_no_h0", "prefix_incl", "no_reverse", "no_empty_wait", "swz_or"):
        dirs = (True,) if bad == "no_reverse" else (False, True)
        assert not any(check_row_pipe(bad, rev, seed=s) for rev in dirs for s in range(2)), \
            f"broken variant {bad} not caught"
    for bad in ("bulk_order", "bulk_start"):  # the bulk copy's placement (a partial last tile)
        assert not check_row_pipe(bad, True, bulk=True), f"broken variant {bad} not caught"
    far = spins = 0
    for reverse in (False, True):
        runs = [dict(seed=seed) for seed in range(3)] + [dict(seed=8, bulk=True)] + [
            # one row of 61 tiles (a partial last one) on 8 blocks; 2 slots; 8 lanes, 1 vector of 4
            dict(shape=(1, 3900, 1), lanes=8, nv=1, vec=4, nslot=2, nblocks=8, seed=4, swz_bits=0),
            dict(shape=(5, 100, 1), lanes=2, nv=4, vec=4, nslot=4, nblocks=3, seed=5),
            # an 8-word window against up to 24 tiles in flight, inclusive words seen late: the
            # lookback_warp path
            dict(shape=(1, 1200, 1), lanes=2, nv=2, vec=2, nslot=3, nblocks=8, seed=6, lag=200, swz_bits=1)]
        for kw in runs:
            assert check_row_pipe(None, reverse, **kw), kw
            far += row_pipe_mirror.stats["far"]
            spins += row_pipe_mirror.stats["spins"]
    assert far > 0 and spins > 0, (far, spins)  # both paths exercised


def test_row_pipe_rewalk_mirror():
    # the 16-bit path: 8 aggregator warps of 4 lanes (two runs per finisher thread, as on the
    # GPU), the slot re-walked by the finishers; tiles of 8 x 4 x 2 x 4 = 256 steps
    kw0 = dict(na=8, vec=4, nv=2, swz_bits=1, rewalk=True)
    for bad in ("lex_incl", "rewalk_lex_index", "rewalk_no_carry", "prefix_incl", "no_reverse", "swz_or"):
        dirs = (True,) if bad == "no_reverse" else (False, True)
        assert not any(check_row_pipe(bad, rev, seed=s, **kw0) for rev in dirs for s in range(2)), \
            f"broken variant {bad} not caught"
    far = spins = 0
    for reverse in (False, True):
        runs = [dict(kw0, seed=seed) for seed in range(3)] + [
            # one row of 40 tiles (a partial last one) on 8 blocks, 2 slots
            dict(kw0, shape=(1, 10100, 1), nslot=2, nblocks=8, seed=4),
            # the 4-warp geometry (one run per finisher thread) and the lookback_warp path
            dict(shape=(1, 1200, 1), lanes=2, nv=2, vec=2, nslot=3, nblocks=8, seed=6, lag=200, swz_bits=1,
                 rewalk=True)]
        for kw in runs:
            assert check_row_pipe(None, reverse, **kw), kw
            far += row_pipe_mirror.stats["far"]
            spins += row_pipe_mirror.stats["spins"]
    assert far > 0 and spins > 0, (far, spins)
