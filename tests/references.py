"""Float64 NumPy reference loops shared by the tests (plain functions, no JAX), and inputs
with planted NaN / Inf.

Every function casts its inputs to float64 (pass the exact values the code under
test sees, e.g. bf16-rounded inputs converted with np.asarray(x, np.float64)).
"""
from __future__ import annotations

import numpy as np


def _f64(x):
    return None if x is None else np.asarray(x, dtype=np.float64)


def _softplus(x):
    return np.logaddexp(x, 0.0)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _bc_at(x, t, dim):
    """B or C at time t as (batch or 1, D, N): x is (D, N), (batch, N, L) or (batch, G, N, L)."""
    if x.ndim == 2:
        return x[None]
    if x.ndim == 3:
        return np.repeat(x[:, None, :, t], dim, axis=1)
    groups = x.shape[1]
    return np.repeat(x[:, :, :, t], dim // groups, axis=1)


def selective_scan_np(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      h0=None, direction="forward"):
    """mamba_ssm's selective scan in float64, one time step at a time.

    Returns (out, last_state); for direction="bidirectional", last_state is the pair
    (forward_last, reverse_last) and out the sum of both directions' outputs.
    """
    u, delta, A, B, C = map(_f64, (u, delta, A, B, C))
    D, z, delta_bias, h0 = map(_f64, (D, z, delta_bias, h0))
    batch, dim, length = u.shape
    dstate = A.shape[1]
    if delta_bias is not None:
        delta = delta + delta_bias[None, :, None]
    if delta_softplus:
        delta = _softplus(delta)
    init = np.zeros((batch, dim, dstate)) if h0 is None else h0

    def one(reverse):
        h = init.copy()
        out = np.zeros((batch, dim, length))
        order = range(length - 1, -1, -1) if reverse else range(length)
        for t in order:
            dt = delta[:, :, t][..., None]                                    # (batch, D, 1)
            h = np.exp(dt * A[None]) * h + dt * _bc_at(B, t, dim) * u[:, :, t][..., None]
            y = np.sum(_bc_at(C, t, dim) * h, axis=-1)
            if D is not None:
                y = y + D[None] * u[:, :, t]
            if z is not None:
                y = y * _silu(z[:, :, t])
            out[:, :, t] = y
        return out, h

    if direction == "bidirectional":
        (of, hf), (orv, hr) = one(False), one(True)
        return of + orv, (hf, hr)
    return one(direction == "reverse")


def selective_state_update_np(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                              dt_softplus=False):
    """One decoding step in float64: returns (y, new_state)."""
    state, x, dt, A, B, C = map(_f64, (state, x, dt, A, B, C))
    D, z, dt_bias = map(_f64, (D, z, dt_bias))
    dim = x.shape[1]
    if dt_bias is not None:
        dt = dt + dt_bias[None]
    if dt_softplus:
        dt = _softplus(dt)
    expand = lambda v: v[:, None, :] if v.ndim == 2 else np.repeat(v, dim // v.shape[1], axis=1)
    new_state = np.exp(dt[..., None] * A[None]) * state + (dt * x)[..., None] * expand(B)
    y = np.sum(expand(C) * new_state, axis=-1)
    if D is not None:
        y = y + D[None] * x
    if z is not None:
        y = y * _silu(z)
    return y, new_state


# --- inputs with planted NaN / Inf (linear_scan, CPU and GPU tests) ------------------------

def with_specials(shape, axis, a_range, seed):
    """float32 inputs with NaN and +-Inf planted along the scanned axis of different chains
    (all in one chain when there is only one): b NaN, b +Inf, b -Inf, a NaN."""
    rng = np.random.default_rng(seed)
    a = rng.uniform(*a_range, shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    L = shape[axis]
    av, bv = np.moveaxis(a, axis, 0).reshape(L, -1), np.moveaxis(b, axis, 0).reshape(L, -1)
    m = av.shape[1]
    for j, (arr, val, frac) in enumerate(((bv, np.nan, 0.3), (bv, np.inf, 0.1), (bv, -np.inf, 0.9),
                                          (av, np.nan, 0.8))):
        arr[int(frac * L), (j * 7) % m] = val
    back = lambda v: np.moveaxis(v.reshape((L,) + tuple(np.delete(shape, axis))), 0, axis)
    return back(av), back(bv)


# contiguous rows (several, one, many short), strided with an outer axis, strided long
SPECIAL_SHAPES = [((3, 5000), 1), ((20000,), 0), ((520, 64), 1), ((2, 700, 264), 1), ((1500, 264), 0)]
