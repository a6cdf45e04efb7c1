"""CPU mirrors of the staged CUDA selective-scan kernels (cuda/selective_scan_staged*.cuh).

What is mirrored, with the kernels' index arithmetic: the 32-step tile windows (forward from
t = 0, reverse from t = L - 32 down, negative times as padding), shared memory in walking
order (slot = 31 - position in reverse), the lane split of the states (forward: q * NS + s;
backward: q + s * P; padded states), the reduce-scatter of per-lane partial sums over 8-step groups (which lane keeps
which half, which step it finally holds), the write-out through the slots; for the backward,
tiles and 8-step chunks walked last to first from the checkpoints, the adjoint in two halves
(steps 7..4, then 3..0) with the dB/dC sums over the block's rows after each half, and the
write-out of du, ddelta, dz; the L split of both (phase A on sub-chunks of whole tiles, the
carries folded over them upwards for the forward and downwards for the adjoint, phase C from
the entering values of a chunk's first / last sub-chunk, per-chunk partials). Rows share B and C, as in a block. Runs in CI without a GPU.
Every test first shows that a deliberately broken variant (no slot reversal, the forward's tile
windows in reverse, the reduce-scatter keeping the wrong half, the halves in the wrong order, a
carry adding before decaying or using another chunk's decay, a chunk entered from the wrong
sub-chunk, dh0 from the wrong chunk) is caught.
"""
from __future__ import annotations

import numpy as np
import pytest

try:
    from test_selective_scan_mirrors import LOG2E, dt_of, make, numeric_grads, sequential, silu
except ImportError:  # tests/ imported as a package
    from tests.test_selective_scan_mirrors import LOG2E, dt_of, make, numeric_grads, sequential, silu

T, G, CK = 32, 8, 8  # kST, kG, kCk


def reduce_scatter(parts, P, broken=None):
    """Mirror of reduce_store<P>: parts (P lanes, G steps) of one row -> {step: sum}."""
    v = [list(parts[q]) for q in range(P)]
    base = [0] * P
    m, o = G, P // 2
    while o >= 1:
        if m > 1:
            H = m // 2
            up = [((q & o) != 0) != (broken == "rs_half") for q in range(P)]
            send = [[v[q][i] if up[q] else v[q][i + H] for i in range(H)] for q in range(P)]
            v = [[(v[q][i + H] if up[q] else v[q][i]) + send[q ^ o][i] for i in range(H)] for q in range(P)]
            base = [base[q] + (H if (q & o) else 0) for q in range(P)]
            m = H
        else:
            v = [[v[q][0] + v[q ^ o][0]] for q in range(P)]
        o //= 2
    held = G // P if G // P > 1 else 1
    out = {}
    for q in range(P):
        for i in range(held):
            step = base[q] + i
            assert step not in out or out[step] == v[q][i]  # copies held by lane pairs agree
            out[step] = v[q][i]
    return out


def lanes(N, P):
    NS = max(2, -(-N // P))
    NS += NS % 2
    return NS, P * NS


def lane_sums(v, P, NS, interleaved=False):
    """Per-lane partial sums of v over the NP = P * NS (padded) states: lane q holds the states
    q * NS .. q * NS + NS - 1 (the forward) or q, q + P, ... (interleaved: the backward)."""
    return v.reshape(NS, P).sum(0) if interleaved else v.reshape(P, NS).sum(1)


def windows(L, k, rev, broken=None):
    t0 = L - (k + 1) * T if (rev and broken != "window") else k * T
    slot = (lambda i: T - 1 - i) if (rev and broken != "slot") else (lambda i: i)
    return t0, slot


def staged_forward(rows, B, C, P, rev=False, broken=None, tiles=None, h_init=None, chunk_end=False):
    """Mirror of fwd_staged_kernel for one block of rows sharing B and C: mode kFinal over the
    walking-order tiles [kb, ke) (all by default) from h_init (h0 by default); chunk_end: mode
    kChunkEnd, which also returns S, the sum of dt over the walked steps (0 for padding)."""
    R, (N, L) = len(rows), B.shape
    NS, NP = lanes(N, P)
    pad = lambda a: np.concatenate([a, np.zeros(NP - N)])
    Bp, Cp = np.vstack([B, np.zeros((NP - N, L))]), np.vstack([C, np.zeros((NP - N, L))])
    a2 = [pad(x["A"]) * LOG2E for x in rows]
    h = [pad(x["h0"] if h_init is None else h_init[r]) for r, x in enumerate(rows)]
    S = np.zeros(R)
    dts = [dt_of(x) for x in rows]
    out = np.zeros((R, L))
    kb, ke = tiles if tiles is not None else (0, -(-L // T))
    for k in range(kb, ke):
        t0, slot = windows(L, k, rev, broken)
        X, BC = np.zeros((R, T, 4)), np.zeros((T, NP, 2))
        for i in range(T):
            t = t0 + i
            if 0 <= t < L:
                BC[slot(i), :, 0], BC[slot(i), :, 1] = Bp[:, t], Cp[:, t]
                for r, x in enumerate(rows):
                    dt = dts[r][t]
                    X[r, slot(i)] = (dt, dt * x["u"][t], x["Dd"] * x["u"][t], silu(x["z"][t]))
        Y = np.zeros((R, T))
        for r in range(R):
            for j0 in range(0, T, G):
                parts = np.zeros((P, G))
                for gg in range(G):
                    j = j0 + gg
                    h[r] = np.exp2(X[r, j, 0] * a2[r]) * h[r] + X[r, j, 1] * BC[j, :, 0]
                    parts[:, gg] = lane_sums(BC[j, :, 1] * h[r], P, NS)
                    S[r] += X[r, j, 0]
                for jj, val in reduce_scatter(parts, P, broken).items():
                    Y[r, j0 + jj] = val
        for i in range(T):
            t = t0 + i
            if 0 <= t < L:
                for r in range(R):
                    out[r, t] = (Y[r, slot(i)] + X[r, slot(i), 2]) * X[r, slot(i), 3]
    if chunk_end:
        return out, [hh[:N] for hh in h], S
    return out, [hh[:N] for hh in h]


def chunk_tiles(L, nch, sub=1):
    """Host side of the L split (ss_plan's split): tiles per chunk, the chunk count actually
    used, tiles per sub-chunk of phase A and the sub-chunk count (`sub` per chunk)."""
    ntiles = -(-L // T)
    tpc = -(-ntiles // nch)
    sub = max(1, min(sub, tpc))
    st = -(-tpc // sub)
    tpc = st * sub
    return tpc, -(-ntiles // tpc), st, -(-ntiles // st)


def sub_windows(L, st, first, stop):
    """Tile windows of sub-chunks first .. stop-1."""
    return [(k * st, min((k + 1) * st, -(-L // T))) for k in range(first, stop)]


def chunked_forward(rows, B, C, P, nch, rev=False, broken=None, sub=1):
    """Mirror of the forward's L split: phase A (kChunkEnd) from zero on the sub-chunks of
    chunks 0 .. n-2, the carry kernel (chunk_carry) over those sub-chunks, phase C (kFinal) on
    every chunk from the state entering its first sub-chunk."""
    L = B.shape[1]
    tpc, nch, st, nsub = chunk_tiles(L, nch, sub)
    m = tpc // st
    tiles = lambda c: (c * tpc, min((c + 1) * tpc, -(-L // T)))
    zero = [np.zeros_like(x["h0"]) for x in rows]
    walked = (nch - 1) * m
    ends = [staged_forward(rows, B, C, P, rev, tiles=w, h_init=zero, chunk_end=True)
            for w in sub_windows(L, st, 0, walked)]
    slot, h = [], [x["h0"].copy() for x in rows]
    for k in range(walked + 1):
        slot.append([hh.copy() for hh in h])
        if k == walked:
            break
        ks = k + 1 if (broken == "carry_next" and k + 2 <= walked) else k  # another sub-chunk's decay
        for r, x in enumerate(rows):
            decay = np.exp2(x["A"] * LOG2E * ends[ks][2][r])
            h[r] = decay * (h[r] + ends[k][1][r]) if broken == "carry_order" else decay * h[r] + ends[k][1][r]
    out, last = np.zeros((len(rows), L)), None
    for c in range(nch):
        entry = min(c * m + m - 1, walked) if broken == "entry_last" else c * m
        o, last = staged_forward(rows, B, C, P, rev, tiles=tiles(c), h_init=slot[entry])
        out += o  # each time step belongs to exactly one chunk
    return out, last


def block(rng, R, L, N):
    rows = [make(rng, L, N=N) for _ in range(R)]
    B, C = rows[0]["B"], rows[0]["C"]
    for x in rows:  # one B/C group
        x["B"], x["C"] = B, C
    return rows, B, C


@pytest.mark.parametrize("P", [4, 8, 16])
@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("L", [1, 31, 32, 77])
def test_staged_forward_mirror(P, rev, L):
    rng = np.random.default_rng(7 * L + P + rev)
    rows, B, C = block(rng, 3, L, N=5)
    want = [sequential(x, rev) for x in rows]

    def close(res):
        out, last = res
        return all(np.allclose(out[r], want[r][0], rtol=1e-9, atol=1e-9) and
                   np.allclose(last[r], want[r][1], rtol=1e-9, atol=1e-9) for r in range(len(rows)))

    assert not close(staged_forward(rows, B, C, P, rev, broken="rs_half"))
    if rev and L > 1:
        assert not close(staged_forward(rows, B, C, P, rev, broken="slot"))
    if rev and L > T:  # the forward's windows walked in reverse (with one tile: the same)
        assert not close(staged_forward(rows, B, C, P, rev, broken="window"))
    assert close(staged_forward(rows, B, C, P, rev))


@pytest.mark.parametrize("nch, sub", [(2, 1), (3, 1), (5, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("L", [77, 200])
def test_chunked_forward_mirror(nch, sub, rev, L):
    rng = np.random.default_rng(11 * L + nch + rev + 17 * sub)
    rows, B, C = block(rng, 2, L, N=5)
    for x in rows:  # slow decay: a chunk's entering state still matters chunks later
        x["A"] = x["A"] * 0.02
    want = [sequential(x, rev) for x in rows]

    def close(res):
        out, last = res
        return all(np.allclose(out[r], want[r][0], rtol=1e-9, atol=1e-9) and
                   np.allclose(last[r], want[r][1], rtol=1e-9, atol=1e-9) for r in range(len(rows)))

    tpc, n, st, nsub = chunk_tiles(L, nch, sub)
    assert n > 1 and (sub == 1 or tpc > st)  # split, and into sub-chunks when asked
    assert not close(chunked_forward(rows, B, C, 4, nch, rev, broken="carry_order", sub=sub))
    if (n - 1) * (tpc // st) > 1:
        assert not close(chunked_forward(rows, B, C, 4, nch, rev, broken="carry_next", sub=sub))
    if tpc > st:
        assert not close(chunked_forward(rows, B, C, 4, nch, rev, broken="entry_last", sub=sub))
    assert close(chunked_forward(rows, B, C, 4, nch, rev, sub=sub))


def staged_backward(rows, B, C, dout, dlast, P, rev=False, broken=None, tiles=None, g_init=None,
                    chunk_end=False):
    """Mirror of the checkpoint sweep + bwd_staged_kernel (one direction, phase 0) over the
    walking-order tiles [kb, ke) (all by default), walked backwards from g_init (dlast by
    default); chunk_end: phase A of the L split, the adjoint alone, returning (g, S)."""
    R, (N, L) = len(rows), B.shape
    NS, NP = lanes(N, P)
    pad = lambda a: np.concatenate([a, np.zeros(NP - N)])
    Bp, Cp = np.vstack([B, np.zeros((NP - N, L))]), np.vstack([C, np.zeros((NP - N, L))])
    An = [pad(x["A"]) for x in rows]
    a2 = [a * LOG2E for a in An]
    dts = [dt_of(x) for x in rows]
    tmap = (lambda s: L - 1 - s) if rev else (lambda s: s)
    K = -(-L // CK)
    ck = np.zeros((R, K, NP))
    for r, x in enumerate(rows):  # the checkpoint sweep: the state entering every CK-th step
        h = pad(x["h0"])
        for s in range(L):
            if s % CK == 0:
                ck[r, s // CK] = h
            t = tmap(s)
            h = np.exp2(dts[r][t] * a2[r]) * h + dts[r][t] * x["u"][t] * Bp[:, t]
    g = [pad(d) for d in (dlast if g_init is None else g_init)]
    S = np.zeros(R)
    accA = [np.zeros(NP) for _ in rows]
    dB, dC = np.zeros((N, L)), np.zeros((N, L))
    du, ddr, dz = np.zeros((R, L)), np.zeros((R, L)), np.zeros((R, L))
    dD, dbias = np.zeros(R), np.zeros(R)
    kb, ke = tiles if tiles is not None else (0, -(-L // T))
    for k in range(ke - 1, kb - 1, -1):
        t0, slot = windows(L, k, rev)
        XA, XB, BC = np.zeros((R, T, 4)), np.zeros((R, T, 2)), np.zeros((T, NP, 2))
        for i in range(T):
            t = t0 + i
            if not 0 <= t < L:
                continue
            BC[slot(i), :, 0], BC[slot(i), :, 1] = Bp[:, t], Cp[:, t]
            for r, x in enumerate(rows):
                raw = x["draw"][t] + x["bias"]
                sg = 1.0 / (1.0 + np.exp(-raw)) if x["sp"] else 1.0
                zz = x["z"][t]
                s = 1.0 / (1.0 + np.exp(-zz))
                dt = dts[r][t]
                XA[r, slot(i)] = (dt, dt * x["u"][t], dout[r][t] * zz * s, x["u"][t])
                XB[r, slot(i)] = (sg, dout[r][t] * s * (1.0 + zz * (1.0 - s)))
        if chunk_end:
            for j in range(T - 1, -1, -1):
                for r in range(R):
                    x = XA[r, j]
                    g[r] = np.exp2(x[0] * a2[r]) * (g[r] + BC[j, :, 1] * x[2])
                    S[r] += x[0]
            continue
        HK = np.array([[ck[r, (k * T + c * CK) // CK] if k * T + c * CK < L else np.zeros(NP)
                        for c in range(T // CK)] for r in range(R)])
        RD, RU, RY = np.zeros((R, T)), np.zeros((R, T)), np.zeros((R, T))
        for c in range(T // CK - 1, -1, -1):
            j0 = c * CK
            H, E = np.zeros((R, CK, NP)), np.zeros((R, CK, NP))
            yp, ddp, dup = np.zeros((R, P, CK)), np.zeros((R, P, CK)), np.zeros((R, P, CK))
            for r in range(R):
                hs = HK[r, c].copy()
                for jj in range(CK):
                    x = XA[r, j0 + jj]
                    E[r, jj] = np.exp2(x[0] * a2[r])
                    hs = E[r, jj] * hs + x[1] * BC[j0 + jj, :, 0]
                    H[r, jj] = hs
                    yp[r, :, jj] = lane_sums(BC[j0 + jj, :, 1] * hs, P, NS, True)
            for hf in ((0, 1) if broken == "halves" else (1, 0)):
                SB, SC = np.zeros((CK // 2, R, NP)), np.zeros((CK // 2, R, NP))
                for jh in range(CK // 2 - 1, -1, -1):
                    jj = hf * (CK // 2) + jh
                    Bv, Cv = BC[j0 + jj, :, 0], BC[j0 + jj, :, 1]
                    for r in range(R):
                        x = XA[r, j0 + jj]
                        gi = g[r] + Cv * x[2]
                        hp = H[r, jj - 1] if jj > 0 else HK[r, c]
                        eh = E[r, jj] * hp
                        ddp[r, :, jj] = lane_sums(gi * (Bv * x[3] + An[r] * eh), P, NS, True)
                        dup[r, :, jj] = lane_sums(gi * x[0] * Bv, P, NS, True)
                        accA[r] += gi * x[0] * eh
                        g[r] = E[r, jj] * gi
                        SB[jh, r], SC[jh, r] = gi * x[1], x[2] * H[r, jj]
                for jh in range(CK // 2):  # rows g, g + 4, ... per group g, then (g0 + g1) + (g2 + g3)
                    st = k * T + j0 + hf * (CK // 2) + jh
                    if st < L:
                        t = tmap(st)
                        for n in range(N):
                            for dst, src in ((dB, SB), (dC, SC)):
                                grp = [sum(src[jh, r, n] for r in range(gq, R, 4)) for gq in range(4)]
                                dst[n, t] += (grp[0] + grp[1]) + (grp[2] + grp[3])
            for r in range(R):
                for dst, src in ((RD, ddp), (RU, dup), (RY, yp)):
                    for jj, val in reduce_scatter(src[r], P).items():
                        dst[r, j0 + jj] = val
        for i in range(T):
            t = t0 + i
            if not 0 <= t < L:
                continue
            sl = slot(i)
            for r, x in enumerate(rows):
                ddr[r, t] = RD[r, sl] * XB[r, sl, 0]
                du[r, t] = RU[r, sl] + x["Dd"] * XA[r, sl, 2]
                dz[r, t] = XB[r, sl, 1] * (RY[r, sl] + x["Dd"] * x["u"][t])
                dD[r] += XA[r, sl, 2] * x["u"][t]
                dbias[r] += ddr[r, t]
    if chunk_end:
        return [gg[:N] for gg in g], S
    per_row = [dict(u=du[r], draw=ddr[r], A=accA[r][:N], Dd=dD[r], z=dz[r], bias=dbias[r], h0=g[r][:N])
               for r in range(R)]
    return per_row, dB, dC


def chunked_backward(rows, B, C, dout, dlast, P, nch, rev=False, broken=None, sub=1):
    """Mirror of the staged backward's L split: phase A (the adjoint alone) from zero on the
    sub-chunks of chunks 1 .. n-1, the carries over them downwards from dlast (chunk_carry,
    descending), the backward on every chunk from the adjoint entering its last sub-chunk;
    per-row partials summed over chunks, dh0 from chunk 0."""
    L = B.shape[1]
    tpc, nch, st, nsub = chunk_tiles(L, nch, sub)
    m = tpc // st
    tiles = lambda c: (c * tpc, min((c + 1) * tpc, -(-L // T)))
    zero = [np.zeros_like(d) for d in dlast]
    ends = {k: staged_backward(rows, B, C, dout, dlast, P, rev, tiles=w, g_init=zero, chunk_end=True)
            for k, w in zip(range(m, nsub), sub_windows(L, st, m, nsub))}
    slot, g = {}, [d.copy() for d in dlast]
    for k in range(nsub - 1, m - 2, -1):
        slot[k] = [gg.copy() for gg in g]
        if k == m - 1:
            break
        for r, x in enumerate(rows):
            decay = np.exp2(x["A"] * LOG2E * ends[k][1][r])
            g[r] = decay * (g[r] + ends[k][0][r]) if broken == "carry_order" else decay * g[r] + ends[k][0][r]
    g_in = {c: slot[(c * m if broken == "entry_first" and c > 0 else min((c + 1) * m, nsub) - 1)]
            for c in range(nch)}
    total, dB, dC = None, 0.0, 0.0
    for c in range(nch):
        per_row, b, cc = staged_backward(rows, B, C, dout, dlast, P, rev, tiles=tiles(c), g_init=g_in[c])
        dB, dC = dB + b, dC + cc
        if total is None:
            total = per_row
            continue
        for r in range(len(rows)):
            for k in total[r]:
                if k == "h0":  # the adjoint at the walk's start: chunk 0's
                    total[r][k] = per_row[r][k] if broken == "dh0_last" else total[r][k]
                else:
                    total[r][k] = total[r][k] + per_row[r][k]
    return total, dB, dC


@pytest.mark.parametrize("nch, sub", [(2, 1), (3, 1), (2, 2), (2, 3)])
@pytest.mark.parametrize("rev", [False, True])
def test_chunked_backward_mirror(nch, sub, rev):
    # L = 200, 7 tiles: 2 chunks of 4 tiles (4 + 3), 3 of 3 (3 + 3 + 1); sub-chunks of 2 tiles,
    # 2 a chunk (the last one short) or 3 a chunk (the second chunk has only one).
    L = 200
    rng = np.random.default_rng(900 + nch + rev + 17 * sub)
    rows, B, C = block(rng, 2, L, N=3)
    for x in rows:  # slow decay: the carried adjoint matters
        x["A"] = x["A"] * 0.02
    dout = [rng.standard_normal(L) for _ in rows]
    dlast = [rng.standard_normal(3) for _ in rows]
    want = staged_backward(rows, B, C, dout, dlast, 4, rev)  # the unsplit mirror, checked below

    def close(res):
        per_row, dB, dC = res
        ok = np.allclose(dB, want[1], rtol=1e-9, atol=1e-9) and np.allclose(dC, want[2], rtol=1e-9, atol=1e-9)
        for r, got in enumerate(per_row):
            ok = ok and all(np.allclose(got[k], want[0][r][k], rtol=1e-9, atol=1e-9) for k in got)
        return ok

    tpc, n, st, nsub = chunk_tiles(L, nch, sub)
    assert n > 1 and (sub == 1 or tpc > st)
    run = lambda broken=None: chunked_backward(rows, B, C, dout, dlast, 4, nch, rev, broken, sub)
    assert not close(run("carry_order"))
    assert not close(run("dh0_last"))
    m = tpc // st
    if any(min((c + 1) * m, nsub) - 1 != c * m for c in range(1, n)):
        assert not close(run("entry_first"))
    assert close(run())


@pytest.mark.parametrize("P", [4, 8])
@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("L", [1, 13, 45])
def test_staged_backward_mirror(P, rev, L):
    rng = np.random.default_rng(300 + 5 * L + P + rev)
    rows, B, C = block(rng, 2, L, N=3)
    dout = [rng.standard_normal(L) for _ in rows]
    dlast = [rng.standard_normal(3) for _ in rows]
    num = [numeric_grads(x, dout[r], dlast[r], rev) for r, x in enumerate(rows)]
    wB, wC = sum(n["B"] for n in num), sum(n["C"] for n in num)

    def close(res):
        per_row, dB, dC = res
        ok = np.allclose(dB, wB, rtol=1e-5, atol=1e-6) and np.allclose(dC, wC, rtol=1e-5, atol=1e-6)
        for r, got in enumerate(per_row):
            ok = ok and all(np.allclose(got[k], num[r][k], rtol=1e-5, atol=1e-6) for k in got)
        return ok

    if L > 4:
        assert not close(staged_backward(rows, B, C, dout, dlast, P, rev, broken="halves"))
    assert close(staged_backward(rows, B, C, dout, dlast, P, rev))


# --- the staged forward's shared-memory layouts (bank conflicts) ------------------------------

def _cuda_source(name):
    """The text of cuda/<name>: the tests below read the kernels' own definitions from it."""
    import pathlib
    return (pathlib.Path(__file__).resolve().parents[1] / "cuda" / name).read_text()


def _forward_layouts():
    """The staging threads' (row, step) of vector v, yidx and the strides, read from
    cuda/selective_scan_staged.cuh (the C++ bodies are also Python expressions), so this checks
    what the kernel compiles."""
    import re
    src = _cuda_source("selective_scan_staged.cuh")
    const = {k: int(re.search(rf"constexpr int {k} = (\d+);", src).group(1)) for k in ("kSRows", "kST", "kYS")}
    assert re.search(r"constexpr int kSX = kST \+ 1;", src)
    const["kSX"] = const["kST"] + 1
    body = lambda name, args: re.search(rf"int {name}\({args}\) \{{ return (.+?); \}}", src).group(1)
    vr, vs, ys = body("vec_row", "int v"), body("vec_step", "int v"), body("yidx", "int r, int i")
    vec = lambda v: (eval(vr, {}, {"v": v}), eval(vs, {}, {"v": v}))
    return const, vec, (lambda r, i: eval(ys, dict(const), {"r": r, "i": i}))


def _wavefronts(addrs, width):
    """Shared-memory wavefronts of one warp access: byte addresses of 32 threads, `width`
    bytes each (4, 8, 16: processed in phases of 32, 16, 8 threads); distinct addresses in one
    bank (4-byte words mod 32) serialise, equal ones broadcast."""
    per = 128 // width
    total = 0
    for p0 in range(0, 32, per):
        banks = {}
        for a in set(addrs[p0:p0 + per]):
            for w in range(width // 4):
                banks.setdefault((a // 4 + w) % 32, set()).add(a // 4 + w)
        total += max(len(v) for v in banks.values())
    return total


def _forward_layout_cost(vec, yidx, c, bc_state_fastest=True):
    """Excess wavefronts over the ideal for the forward's tile accesses, P = 8 and P = 4 lanes;
    vec(v) = (row, first step) of the staging / write-out thread's vector v."""
    S, X, T = c["kSRows"], c["kSX"], c["kST"]
    excess = 0
    for warp in range(S * (T // 4) // 32):
        rows = [vec(v) for v in range(32 * warp, 32 * warp + 32)]
        for e in range(4):
            a = [16 * (rr * X + i0 + e) for rr, i0 in rows]
            excess += _wavefronts(a, 16) - 4  # staging X stores (STS.128)
            excess += _wavefronts([x + 8 for x in a], 8) - 4  # the write-out's LDS.64 of (add,
            # gate): 4 rows x 4 vectors per half warp over 8 bank groups, 2 wavefronts at best
            a = [4 * yidx(rr, i0 + e) for rr, i0 in rows]
            excess += _wavefronts(a, 4) - 1  # the write-out's y loads
    for P in (8, 4):  # the reduce-scatter's y stores: lane l (row l % RW, q = l / RW: rows fastest)
        held, RW = max(1, 8 // P), 32 // P  # holds steps j0 + (8 / P) q + i
        for w in range(S * P // 32):
            for j0 in range(0, T, 8):
                for i in range(held):
                    a = [4 * yidx(RW * w + l % RW, j0 + held * (l // RW) + i) for l in range(32)]
                    excess += _wavefronts(a, 4) - 1
    NP = 16  # (B, C) stores, float2 per (step, state): thread w -> state, 4 steps
    for w0 in range(0, NP * T // 4, 32):
        for e in range(4):
            ws = range(w0, w0 + 32)
            nq = [(w % NP, (w // NP) * 4) if bc_state_fastest else (w // (T // 4), (w % (T // 4)) * 4) for w in ws]
            a = [8 * ((i0 + e) * NP + n) for n, i0 in nq]
            excess += _wavefronts(a, 8) - 2
    return excess


def test_forward_shared_layouts():
    c, vec, yidx = _forward_layouts()
    S, X, T = c["kSRows"], c["kSX"], c["kST"]
    vs = [vec(v) for v in range(S * T // 4)]  # every vector of the tile exactly once, a warp's 4 whole rows
    assert sorted(vs) == [(r, 4 * k) for r in range(S) for k in range(T // 4)]
    assert all(len({vs[v][0] for v in range(w, w + 32)}) == 4 for w in range(0, S * T // 4, 32))
    ys = {yidx(r, i) for r in range(S) for i in range(T)}
    assert len(ys) == S * T and max(ys) < S * c["kYS"]  # injective, inside its rows
    for j0 in range(0, T, 8):  # a reduce-scatter group's 8 steps are contiguous
        assert all(yidx(3, j0 + m) == yidx(3, j0) + m for m in range(8))
    # the checker first catches the old layouts (row stride 33 for y, no swizzle, (B, C) by state)
    old = _forward_layout_cost(lambda v: (v // 8, 4 * (v % 8)), lambda r, i: r * X + i, c, bc_state_fastest=False)
    assert old > 0
    new = _forward_layout_cost(vec, yidx, c)
    # what is left: the 4-lane geometry's reduce-scatter stores, 2-way (16 banks of 32)
    p4 = (S * 4 // 32) * (T // 8) * 2
    assert new == p4 and old > 20 * p4, (new, p4, old)


# --- softplus_fast's polynomial (cuda/selective_scan_kernels.cuh) -----------------------------

def _softplus_coefficients():
    """The Horner coefficients of softplus_fast's q(t) = log1p(t) / t, highest degree first,
    read from the header, so this checks what the kernels compile."""
    import re
    src = _cuda_source("selective_scan_kernels.cuh")
    body = re.search(r"float softplus_fast\(float x, float& t_out\) \{(.+?)\n\}", src, re.S).group(1)
    first = re.search(r"float q = ([-0-9.e]+)f;", body).group(1)
    rest = re.findall(r"q = fmaf\(q, t, ([-0-9.e]+)f\);", body)
    return [np.float32(c) for c in [first, *rest]]


def _softplus_f32(x, coef):
    """softplus_fast in float32 arithmetic (the SFU's exp2 taken as exact: its ~2^-22 error
    enters through t only, where log1p(t) / t has a slope below 1/2)."""
    x = np.asarray(x, np.float32)
    t = np.exp(-np.abs(x).astype(np.float64)).astype(np.float32)
    q = np.full_like(t, coef[0])
    for c in coef[1:]:  # fmaf: one rounding per step
        q = (q.astype(np.float64) * t + c).astype(np.float32)
    return (np.maximum(x, np.float32(0)) + (q * t).astype(np.float32)).astype(np.float32)


def test_softplus_polynomial():
    coef = _softplus_coefficients()
    assert len(coef) == 9
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-30, 30, 600001), rng.normal(0, 5, 200000)]).astype(np.float32)
    ref = np.logaddexp(0.0, x.astype(np.float64))
    tol = 4e-7  # relative; the fit itself is 3.4e-8, the rest is float32 evaluation
    rel = lambda c: float(np.max(np.abs(_softplus_f32(x, c) - ref) / ref))
    assert rel(coef) <= tol, rel(coef)
    # the check can fail: one coefficient off by 1e-4 of its value
    bad = list(coef)
    bad[4] = np.float32(bad[4] * (1 + 1e-4))
    assert rel(bad) > tol


# --- the staged forward's walking lanes: rows fastest, shuffle partners in the same row -----------

def _walk_lanes(P, broken=None):
    """(row, q) of each thread of a block of 32 * P threads, from the kernel's own expression
    (cuda/selective_scan_staged.cuh), and the lane distance of q -> q + 1 that its reductions use."""
    import re
    src = _cuda_source("selective_scan_staged.cuh")
    m = re.search(r"const int r = (\(tid / 32\) \* RW \+ \(tid % 32\) % RW), q = (\(tid % 32\) / RW);", src)
    assert m, "the forward's walking-lane expression changed: update this mirror"
    assert re.search(r"constexpr int RW = 32 / P;", src) and "reduce_hold<P, RW>" in src
    RW = 32 // P
    r_of, q_of = m.group(1), m.group(2)
    if broken == "row_major":  # lanes row-major (the old layout) with the new shuffle distance
        r_of, q_of = "tid / P", "tid % P"
    env = lambda tid: {"tid": tid, "RW": RW, "P": P}
    lanes_ = [(eval(r_of.replace("/", "//"), {}, env(t)), eval(q_of.replace("/", "//"), {}, env(t))) for t in range(32 * P)]
    return lanes_, RW


@pytest.mark.parametrize("P", [4, 8, 16])
def test_walk_lanes_rows_fastest(P):
    """Every (row, q) once; a warp's lanes sharing a q (one (B, C) address) consecutive; and each
    xor partner at distance O * RW is lane q ^ O of the same row, so the y sums pair the same
    values as with row-major lanes (the same bits). The row-major map with that distance fails."""
    def ok(lanes_, RW):
        if sorted(lanes_) != [(r, q) for r in range(32) for q in range(P)]:
            return False
        for tid, (r, q) in enumerate(lanes_):
            w, l = divmod(tid, 32)
            if tid % RW and lanes_[tid - 1][1] != q:  # runs of RW consecutive lanes share q
                return False
            o = P // 2
            while o >= 1:
                if lanes_[32 * w + (l ^ (o * RW))] != (r, q ^ o):
                    return False
                o //= 2
        return True
    assert not ok(*_walk_lanes(P, broken="row_major"))
    assert ok(*_walk_lanes(P))
