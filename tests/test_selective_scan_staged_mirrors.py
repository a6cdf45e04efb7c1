"""CPU mirrors of the staged CUDA selective-scan kernels (cuda/selective_scan_staged*.cuh).

What is mirrored, with the kernels' index arithmetic: the 32-step tile windows (forward from
t = 0, reverse from t = L - 32 down, negative times as padding), shared memory in walking
order (slot = 31 - position in reverse), the lane split of the states (q * NS + s, padded
states), the reduce-scatter of per-lane partial sums over 8-step groups (which lane keeps
which half, which step it finally holds), the write-out through the slots; for the backward,
tiles and 8-step chunks walked last to first from the checkpoints, the adjoint in two halves
(steps 7..4, then 3..0) with the dB/dC sums over the block's rows after each half, and the
write-out of du, ddelta, dz. Rows share B and C, as in a block. Runs in CI without a GPU.
Every test first shows that a deliberately broken variant (no slot reversal, the forward's tile
windows in reverse, the reduce-scatter keeping the wrong half, the halves in the wrong order) is caught.
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


def windows(L, k, rev, broken=None):
    t0 = L - (k + 1) * T if (rev and broken != "window") else k * T
    slot = (lambda i: T - 1 - i) if (rev and broken != "slot") else (lambda i: i)
    return t0, slot


def staged_forward(rows, B, C, P, rev=False, broken=None):
    """Mirror of fwd_staged_kernel (mode kFinal) for one block of rows sharing B and C."""
    R, (N, L) = len(rows), B.shape
    NS, NP = lanes(N, P)
    pad = lambda a: np.concatenate([a, np.zeros(NP - N)])
    Bp, Cp = np.vstack([B, np.zeros((NP - N, L))]), np.vstack([C, np.zeros((NP - N, L))])
    a2 = [pad(x["A"]) * LOG2E for x in rows]
    h = [pad(x["h0"]) for x in rows]
    dts = [dt_of(x) for x in rows]
    out = np.zeros((R, L))
    for k in range(-(-L // T)):
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
                    parts[:, gg] = (BC[j, :, 1] * h[r]).reshape(P, NS).sum(1)
                for jj, val in reduce_scatter(parts, P, broken).items():
                    Y[r, j0 + jj] = val
        for i in range(T):
            t = t0 + i
            if 0 <= t < L:
                for r in range(R):
                    out[r, t] = (Y[r, slot(i)] + X[r, slot(i), 2]) * X[r, slot(i), 3]
    return out, [hh[:N] for hh in h]


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


def staged_backward(rows, B, C, dout, dlast, P, rev=False, broken=None):
    """Mirror of the checkpoint sweep + bwd_staged_kernel (one direction, phase 0)."""
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
    g = [pad(d) for d in dlast]
    accA = [np.zeros(NP) for _ in rows]
    dB, dC = np.zeros((N, L)), np.zeros((N, L))
    du, ddr, dz = np.zeros((R, L)), np.zeros((R, L)), np.zeros((R, L))
    dD, dbias = np.zeros(R), np.zeros(R)
    for k in range(-(-L // T) - 1, -1, -1):
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
                    yp[r, :, jj] = (BC[j0 + jj, :, 1] * hs).reshape(P, NS).sum(1)
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
                        ddp[r, :, jj] = (gi * (Bv * x[3] + An[r] * eh)).reshape(P, NS).sum(1)
                        dup[r, :, jj] = (gi * x[0] * Bv).reshape(P, NS).sum(1)
                        accA[r] += gi * x[0] * eh
                        g[r] = E[r, jj] * gi
                        SB[jh, r], SC[jh, r] = gi * x[1], x[2] * H[r, jj]
                for jh in range(CK // 2):  # the block's rows summed in row order
                    st = k * T + j0 + hf * (CK // 2) + jh
                    if st < L:
                        t = tmap(st)
                        for n in range(N):
                            dB[n, t] += sum(SB[jh, r, n] for r in range(R))
                            dC[n, t] += sum(SC[jh, r, n] for r in range(R))
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
    per_row = [dict(u=du[r], draw=ddr[r], A=accA[r][:N], Dd=dD[r], z=dz[r], bias=dbias[r], h0=g[r][:N])
               for r in range(R)]
    return per_row, dB, dC


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
