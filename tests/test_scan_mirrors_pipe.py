"""CPU mirrors of the warp-specialised pipelines (cuda/strided_pipe.cuh, cuda/row_pipe.cuh),
their roles interleaved at random. How the mirrors work: scan_mirror_common.py.
"""
from __future__ import annotations

import numpy as np

from scan_mirror_common import AGG, INC, INVALID, comb, ident, inputs, strided_mirror_ok


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
