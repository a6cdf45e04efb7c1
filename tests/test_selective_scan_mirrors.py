"""CPU mirror of the round-1 CUDA selective-scan backward (cuda/selective_scan_kernels.cuh),
and the float64 helpers the staged kernels' mirrors share (test_selective_scan_staged_mirrors.py).

The mirror re-does in NumPy, with the kernel's index arithmetic and operand order, the
checkpoint interval, the chunk recompute and the adjoint recurrence with its gradient
formulas (bwd_kernel), against central differences. Runs in CI without a GPU. A deliberately
broken variant (the adjoint using the wrong step's exponential) is shown to be caught first.
(The round-2 "tiles" forward and its mirror were removed with the kernel.)
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
