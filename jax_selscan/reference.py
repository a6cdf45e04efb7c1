"""selective_scan_ref: a plain-JAX reference for selective_scan (no custom primitive).

Written independently of selective_scan's compute path (only the argument checks are
shared): it follows mamba_ssm's ``selective_scan_ref`` layout (batch, D, L, N) and
runs the recurrence with ``lax.associative_scan`` along L. Any dtype selective_scan
takes, float64 included; jittable, vmappable and differentiable.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array, lax

from ._checks import ArrayInput
from .selective_scan import LastState, _validate
from .selective_scan_primitives import Direction


def _combine(earlier, later):
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def _bc(x, dim, dtype):
    """B or C as validated ((D, N) or (batch, G, N, L)) -> broadcastable to (batch, D, L, N)."""
    x = x.astype(dtype)
    if x.ndim == 2:                                   # (D, N) -> (1, D, 1, N)
        return x[None, :, None, :]
    groups = x.shape[1]
    x = jnp.swapaxes(x, 2, 3)                         # (batch, G, L, N)
    return jnp.repeat(x, dim // groups, axis=1)       # (batch, D, L, N)


def selective_scan_ref(u: ArrayInput, delta: ArrayInput, A: ArrayInput, B: ArrayInput, C: ArrayInput,
                       D: ArrayInput | None = None, z: ArrayInput | None = None,
                       delta_bias: ArrayInput | None = None, delta_softplus: bool = False,
                       return_last_state: bool = False, h0: ArrayInput | None = None,
                       direction: Direction = "forward") -> Array | tuple[Array, LastState]:
    """Reference for :func:`jax_selscan.selective_scan.selective_scan` (same signature,
    semantics, dtypes and errors)."""
    args = _validate(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                     return_last_state, h0, direction)
    cd = args.compute_dtype
    batch, dim, length = args.u.shape
    dstate = args.A.shape[1]
    u = args.u.astype(cd)
    delta = args.delta.astype(cd)
    if args.delta_bias is not None:
        delta = delta + args.delta_bias.astype(cd)[None, :, None]
    if args.delta_softplus:
        delta = jnp.logaddexp(delta, jnp.zeros((), cd))
    a = jnp.exp(delta[..., None] * args.A.astype(cd)[None, :, None, :])       # (b, D, L, N)
    b = jnp.broadcast_to((delta * u)[..., None] * _bc(args.B, dim, cd), a.shape)
    Cm = _bc(args.C, dim, cd)
    h0 = jnp.zeros((batch, dim, dstate), cd) if args.h0 is None else args.h0.astype(cd)

    def one(reverse):
        if length == 0:
            return jnp.zeros((batch, dim, 0), cd), h0
        i = length - 1 if reverse else 0             # first position in scan order
        bb = b.at[:, :, i].add(a[:, :, i] * h0)
        _, h = lax.associative_scan(_combine, (a, bb), reverse=reverse, axis=2)
        y = jnp.sum(h * Cm, axis=-1)
        if args.D is not None:
            y = y + u * args.D.astype(cd)[None, :, None]
        if args.z is not None:
            zc = args.z.astype(cd)
            y = y * (zc * jax.nn.sigmoid(zc))
        return y, h[:, :, 0 if reverse else length - 1]

    if args.direction == "bidirectional":
        (yf, lf), (yr, lr) = one(False), one(True)
        out, last = yf + yr, (lf, lr)
    else:
        out, last = one(args.direction == "reverse")
    out = out.astype(args.out_dtype)
    return (out, last) if args.return_last_state else out
