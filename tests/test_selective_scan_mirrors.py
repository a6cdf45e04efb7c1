"""CPU mirrors of the CUDA selective-scan kernels (cuda/selective_scan_kernels.cuh).

Each mirror re-does in NumPy what a kernel does, with the kernel's index arithmetic and
operand order: which lane holds which time step (forward and reverse), the per-lane chunk
scans, the warp scan with __shfl_up semantics, the exclusive prefix and the carry taken
from lane 31, the output correction through the running product of the kept
exponentials (fwd_tile_kernel); the checkpoint interval, the chunk recompute and the
adjoint recurrence with its gradient formulas (bwd_kernel). Runs in CI without a GPU.
Each mirror has deliberately broken variants (swapped combine operands, an off-by-one
lane in the exclusive prefix, the adjoint using the wrong step's exponential); every test
first proves the broken variant is caught, then trusts the mirror.
"""
from __future__ import annotations

import numpy as np
import pytest

LOG2E = 1.4426950408889634


def softplus(x):
    return np.logaddexp(x, 0.0)


def silu(x):
    return x / (1.0 + np.exp(-x))


def make(rng, L, N=16, softplus_on=True):
    dt_raw = rng.standard_normal(L) * 0.5 - 1.0
    bias = 0.3
    return dict(u=rng.standard_normal(L), draw=dt_raw, bias=bias,
                A=-np.exp(rng.standard_normal(N) * 0.5), B=rng.standard_normal((N, L)),
                C=rng.standard_normal((N, L)), Dd=0.7, z=rng.standard_normal(L),
                h0=rng.standard_normal(N), sp=softplus_on)


def dt_of(x):
    raw = x["draw"] + x["bias"]
    return softplus(raw) if x["sp"] else raw


def sequential(x, rev=False):
    """One row, float64, step by step: (out, last state)."""
    L = x["u"].shape[0]
    dt = dt_of(x)
    h = x["h0"].copy()
    out = np.empty(L)
    for s in range(L):
        t = L - 1 - s if rev else s
        h = np.exp(dt[t] * x["A"]) * h + dt[t] * x["u"][t] * x["B"][:, t]
        y = x["C"][:, t] @ h + x["Dd"] * x["u"][t]
        out[t] = y * silu(x["z"][t])
    return out, h


# --- fwd_tile_kernel -------------------------------------------------------------------------

def tile_kernel(x, rev=False, broken=None):
    """Mirror of fwd_tile_kernel for one row (one warp)."""
    L = x["u"].shape[0]
    N = x["A"].shape[0]
    a2 = x["A"] * LOG2E
    dt_all = dt_of(x)
    carry = x["h0"].copy()
    out = np.zeros(L)
    tmap = (lambda s: L - 1 - s) if rev else (lambda s: s)
    for st in range(0, L, 128):
        E = np.ones((32, 4, N))
        Pa = np.ones((32, N))
        Ha = np.zeros((32, N))
        y = np.zeros((32, 4))
        cnts = []
        for lane in range(32):
            s0 = st + 4 * lane
            cnt = max(0, min(4, L - s0))
            cnts.append(cnt)
            h = np.zeros(N)
            pr = np.ones(N)
            for k in range(4):
                if k < cnt:
                    t = tmap(s0 + k)
                    dt, u, Bq, Cq = dt_all[t], x["u"][t], x["B"][:, t], x["C"][:, t]
                else:  # identity steps past L: dt = 0, u = 0 (B, C loads give 0)
                    dt, u, Bq, Cq = 0.0, 0.0, np.zeros(N), np.zeros(N)
                E[lane, k] = np.exp2(dt * a2)
                h = E[lane, k] * h + (dt * u) * Bq
                pr = pr * E[lane, k]
                y[lane, k] = Cq @ h
            Pa[lane], Ha[lane] = pr, h
        # Inclusive scan over lanes, __shfl_up semantics: lane reads lane - off (if >= 0).
        for off in (1, 2, 4, 8, 16):
            pe = np.concatenate([Pa[:off], Pa[:-off]])      # lanes < off read themselves (unused)
            he = np.concatenate([Ha[:off], Ha[:-off]])
            act = (np.arange(32) >= off)[:, None]
            if broken == "swap":   # combine(later, earlier): the non-commutative mistake
                newH = np.where(act, pe * Ha + he, Ha)
            else:
                newH = np.where(act, Pa * he + Ha, Ha)
            Pa = np.where(act, Pa * pe, Pa)
            Ha = newH
        shift = 2 if broken == "off_by_one" else 1
        pe = np.concatenate([np.ones((shift, N)), Pa[:-shift]])
        he = np.concatenate([np.zeros((shift, N)), Ha[:-shift]])
        s_in = pe * carry + he
        carry = Pa[31] * carry + Ha[31]
        for lane in range(32):
            q = np.ones(N)
            for k in range(cnts[lane]):
                t = tmap(st + 4 * lane + k)
                q = q * E[lane, k]
                yk = y[lane, k] + (x["C"][:, t] * q) @ s_in[lane]
                out[t] = (yk + x["Dd"] * x["u"][t]) * silu(x["z"][t])
    return out, carry


@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("L", [1, 5, 127, 128, 300])
def test_tile_kernel_mirror(rev, L):
    rng = np.random.default_rng(L * 2 + rev)
    x = make(rng, L, N=16)
    want_out, want_last = sequential(x, rev)
    for broken in ("swap", "off_by_one"):
        got_out, got_last = tile_kernel(x, rev, broken)
        if L > 4:   # one chunk only: there is no lane scan to get wrong
            same = (np.allclose(got_out, want_out, rtol=1e-6, atol=1e-8)
                    and np.allclose(got_last, want_last, rtol=1e-6, atol=1e-8))
            assert not same, broken
    got_out, got_last = tile_kernel(x, rev)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got_last, want_last, rtol=1e-9, atol=1e-9)


def test_tile_kernel_mirror_padding_states():
    # N < 16: the padding states have A = 0 and B = C = 0, i.e. dA = 1 and no input.
    rng = np.random.default_rng(3)
    x = make(rng, 200, N=5)
    pad = 16 - 5
    xp = dict(x, A=np.concatenate([x["A"], np.zeros(pad)]), B=np.vstack([x["B"], np.zeros((pad, 200))]),
              C=np.vstack([x["C"], np.zeros((pad, 200))]), h0=np.concatenate([x["h0"], np.zeros(pad)]))
    got, last = tile_kernel(xp)
    want, wlast = sequential(x)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(last[:5], wlast, rtol=1e-9, atol=1e-9)


# --- bwd_kernel ------------------------------------------------------------------------------

CK = 8


def backward_kernel(x, dout, dlast, rev=False, broken=None):
    """Mirror of the checkpoint sweep + bwd_kernel for one row: returns the gradients of
    sum(out * dout) + sum(last * dlast) w.r.t. u, draw, A, B, C, Dd, z, bias, h0."""
    L = x["u"].shape[0]
    N = x["A"].shape[0]
    a2 = x["A"] * LOG2E
    raw = x["draw"] + x["bias"]
    dt_all = dt_of(x)
    sg_all = 1.0 / (1.0 + np.exp(-raw)) if x["sp"] else np.ones(L)
    tmap = (lambda s: L - 1 - s) if rev else (lambda s: s)
    K = (L + CK - 1) // CK
    ckpt = np.zeros((K, N))
    h = x["h0"].copy()
    for s in range(L):                       # checkpoint sweep (mode kCheckpoint)
        if s % CK == 0:
            ckpt[s // CK] = h
        t = tmap(s)
        h = np.exp2(dt_all[t] * a2) * h + dt_all[t] * x["u"][t] * x["B"][:, t]
    g = dlast.copy()
    du, ddr, dz = np.zeros(L), np.zeros(L), np.zeros(L)
    dA, dB, dC = np.zeros(N), np.zeros((N, L)), np.zeros((N, L))
    dD = dbias = 0.0
    for kc in range(K - 1, -1, -1):
        sb = kc * CK
        cnt = min(CK, L - sb)
        hs = ckpt[kc].copy()
        H, E, Y = np.zeros((CK, N)), np.zeros((CK, N)), np.zeros(CK)
        for k in range(cnt):
            t = tmap(sb + k)
            E[k] = np.exp2(dt_all[t] * a2)
            hs = E[k] * hs + dt_all[t] * x["u"][t] * x["B"][:, t]
            H[k] = hs
            Y[k] = x["C"][:, t] @ hs
        for k in range(cnt - 1, -1, -1):
            t = tmap(sb + k)
            zz = x["z"][t]
            s = 1.0 / (1.0 + np.exp(-zz))
            gate, dgate = zz * s, s * (1.0 + zz * (1.0 - s))
            dy = dout[t] * gate
            gi = g + x["C"][:, t] * dy
            hp = H[k - 1] if k > 0 else ckpt[kc]
            Ek = E[k - 1] if (broken == "wrong_step" and k > 0) else E[k]
            gdt = gi * dt_all[t]
            eh = Ek * hp
            dB[:, t] = gdt * x["u"][t]
            dC[:, t] = dy * H[k]
            ddt = np.sum(gi * (x["B"][:, t] * x["u"][t] + x["A"] * eh))
            du[t] = np.sum(gdt * x["B"][:, t]) + x["Dd"] * dy
            dA += gdt * eh
            g = Ek * gi
            ddr[t] = ddt * sg_all[t]
            dz[t] = dout[t] * (Y[k] + x["Dd"] * x["u"][t]) * dgate
            dD += dy * x["u"][t]
            dbias += ddr[t]
    return dict(u=du, draw=ddr, A=dA, B=dB, C=dC, Dd=dD, z=dz, bias=dbias, h0=g)


def numeric_grads(x, dout, dlast, rev, eps=1e-6):
    def loss(xx):
        out, last = sequential(xx, rev)
        return np.sum(out * dout) + np.sum(last * dlast)
    grads = {}
    for k in ("u", "draw", "A", "B", "C", "Dd", "z", "bias", "h0"):
        v = np.asarray(x[k], np.float64)
        gk = np.zeros_like(v)
        flat = v.reshape(-1)
        for i in range(flat.size):
            plus = flat.copy(); plus[i] += eps
            minus = flat.copy(); minus[i] -= eps
            xp = dict(x, **{k: plus.reshape(v.shape) if v.ndim else plus[0]})
            xm = dict(x, **{k: minus.reshape(v.shape) if v.ndim else minus[0]})
            gk.reshape(-1)[i] = (loss(xp) - loss(xm)) / (2 * eps)
        grads[k] = gk
    return grads


@pytest.mark.parametrize("rev", [False, True])
@pytest.mark.parametrize("L", [1, 7, 8, 19])
def test_backward_kernel_mirror(rev, L):
    rng = np.random.default_rng(100 + L * 2 + rev)
    x = make(rng, L, N=4)
    dout = rng.standard_normal(L)
    dlast = rng.standard_normal(4)
    want = numeric_grads(x, dout, dlast, rev)
    if L > 1:
        bad = backward_kernel(x, dout, dlast, rev, broken="wrong_step")
        assert not all(np.allclose(bad[k], want[k], rtol=1e-5, atol=1e-6) for k in want)
    got = backward_kernel(x, dout, dlast, rev)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
