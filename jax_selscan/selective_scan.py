"""selective_scan: Mamba's selective scan (mamba_ssm's ``selective_scan_fn``) and its decode step.

    delta <- softplus(delta + delta_bias)            (bias and softplus optional)
    h[t]   = exp(delta[t] * A) * h[t-1] + delta[t] * B[t] * u[t]      per (batch, d, n)
    y[t]   = sum_n C[t, n] * h[t, n] + D * u[t]
    out[t] = y[t] * silu(z[t])                       (gate optional)

The public function is split in two so that a kernel primitive can slot in
behind the same checks: ``_validate`` normalises and checks every argument
(clear errors at trace time, naming the argument) and ``_compute`` evaluates a
validated call through the ``selective_scan_p`` primitive
(selective_scan_primitives.py): the fused kernels for float32/bfloat16/float16 inputs
(cpu_arm/selective_scan.h on CPU, cuda/selective_scan_kernels.cuh on GPU), otherwise
``_compute_jax``, where the (batch, D, N, L) tensors are materialised and the
recurrence runs through the package's ``linear_scan`` along L. Derivatives: a custom
JVP whose tangent map is a primitive; reverse mode transposes it into the fused
backward kernels on GPU and CPU (cpu_arm/selective_scan_bwd.h) and into the VJP of
``_compute_jax`` elsewhere (float64, no kernel).
"""
from __future__ import annotations

import functools
from typing import Literal, NamedTuple, Optional, Union, overload

import numpy as np
import jax
import jax.numpy as jnp
from jax import Array

from ._checks import ArrayInput, check_array, check_bool, state_dtype
from . import selective_scan_primitives as primitives
from .linear_scan import linear_scan

DIRECTIONS = primitives.SS_DIRECTIONS
# The last state: (batch, D, N), or (forward_last, reverse_last) for "bidirectional".
LastState = Union[Array, tuple[Array, Array]]

# Real floating dtypes accepted by selective_scan / selective_state_update.
_REAL = tuple(np.dtype(d) for d in (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16))
_REAL_NAMES = ", ".join(d.name for d in _REAL)


class ScanArgs(NamedTuple):
    """A validated selective_scan call (arrays keep their input dtypes).

    B and C are either (D, N) (time-invariant) or (batch, G, N, L) (a (batch, N, L)
    input becomes G = 1). Optional arrays are None when absent.
    """
    u: jax.Array
    delta: jax.Array
    A: jax.Array
    B: jax.Array
    C: jax.Array
    D: Optional[jax.Array]
    z: Optional[jax.Array]
    delta_bias: Optional[jax.Array]
    h0: Optional[jax.Array]
    delta_softplus: bool
    return_last_state: bool
    direction: str
    compute_dtype: np.dtype   # float32, or float64 when any input is float64
    out_dtype: np.dtype       # u's dtype


# --- argument checks ------------------------------------------------------------------

def _check_real(name: str, x) -> ArrayInput:
    """x as a jax array with a supported real floating dtype; TypeError naming it otherwise."""
    check_array(name, x)
    dtype = np.dtype(x.dtype)
    if np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"{name} has dtype {dtype.name}; complex inputs are not supported by "
                        f"selective_scan (supported dtypes are {_REAL_NAMES})")
    if dtype not in _REAL:
        raise TypeError(f"{name} has dtype {dtype.name}; supported dtypes are {_REAL_NAMES}")
    return jnp.asarray(x)


def _check_shape(name, x, expected, layout):
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected {tuple(expected)} {layout}")


def _check_rank(name, x, rank, layout):
    if x.ndim != rank:
        raise ValueError(f"{name} must have rank {rank} {layout}, got shape {tuple(x.shape)}")


def _check_bc(name, x, batch, dim, dstate, length):
    """B or C: (D, N), (batch, N, L) or (batch, G, N, L) with G dividing D -> (D, N) or 4-D."""
    if x.ndim == 2:
        _check_shape(name, x, (dim, dstate), "(D, N) for a time-invariant " + name)
        return x
    if x.ndim == 3:
        _check_shape(name, x, (batch, dstate, length), "(batch, N, L)")
        return x[:, None]
    if x.ndim == 4:
        groups = x.shape[1]
        _check_shape(name, x, (batch, groups, dstate, length), "(batch, G, N, L)")
        if groups < 1 or dim % groups:
            raise ValueError(f"{name} has G={groups} groups (shape {tuple(x.shape)}), which does "
                             f"not divide the D={dim} channels of u")
        return x
    raise ValueError(f"{name} must have shape (D, N), (batch, N, L) or (batch, G, N, L), "
                     f"got shape {tuple(x.shape)}")


def _check_direction(direction):
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return direction


def _compute_dtype(*arrays):
    """float32 state for bf16/f16/f32 inputs, float64 when any input is float64."""
    return state_dtype(jnp.result_type(*[x for x in arrays if x is not None]))


def _validate(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
              return_last_state=False, h0=None, direction="forward") -> ScanArgs:
    """Check and normalise a selective_scan call; every error names the argument."""
    u = _check_real("u", u)
    _check_rank("u", u, 3, "(batch, D, L)")
    batch, dim, length = u.shape
    delta = _check_real("delta", delta)
    _check_shape("delta", delta, u.shape, "(batch, D, L), the shape of u")
    A = _check_real("A", A)
    _check_rank("A", A, 2, "(D, N)")
    _check_shape("A", A, (dim, A.shape[1]), "(D, N) with D from u")
    dstate = A.shape[1]
    B = _check_bc("B", _check_real("B", B), batch, dim, dstate, length)
    C = _check_bc("C", _check_real("C", C), batch, dim, dstate, length)
    if D is not None:
        D = _check_real("D", D)
        _check_shape("D", D, (dim,), "(D,)")
    if z is not None:
        z = _check_real("z", z)
        _check_shape("z", z, u.shape, "(batch, D, L), the shape of u")
    if delta_bias is not None:
        delta_bias = _check_real("delta_bias", delta_bias)
        _check_shape("delta_bias", delta_bias, (dim,), "(D,)")
    if h0 is not None:
        h0 = _check_real("h0", h0)
        _check_shape("h0", h0, (batch, dim, dstate), "(batch, D, N)")
    delta_softplus = check_bool("delta_softplus", delta_softplus)
    return_last_state = check_bool("return_last_state", return_last_state)
    direction = _check_direction(direction)
    compute = _compute_dtype(u, delta, A, B, C, D, z, delta_bias, h0)
    out_dtype = jax.dtypes.canonicalize_dtype(u.dtype)
    return ScanArgs(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus,
                    return_last_state, direction, compute, out_dtype)


# --- the computation (pure JAX for now) --------------------------------------------------

def _expand_bc(x, dim, dtype):
    """(D, N) -> (1, D, N, 1); (batch, G, N, L) -> (batch, D, N, L) (channel d uses group d // (D/G))."""
    x = x.astype(dtype)
    if x.ndim == 2:
        return x[None, :, :, None]
    return jnp.repeat(x, dim // x.shape[1], axis=1)


def discretize(args: ScanArgs):
    """The materialised recurrence: (u, delta, dA, dBu, C) in the compute dtype.

    u, delta: (batch, D, L); dA = exp(delta * A) and dBu = delta * B * u: (batch, D, N, L);
    C broadcastable to (batch, D, N, L).
    """
    cd = args.compute_dtype
    dim = args.u.shape[1]
    u = args.u.astype(cd)
    delta = args.delta.astype(cd)
    if args.delta_bias is not None:
        delta = delta + args.delta_bias.astype(cd)[:, None]
    if args.delta_softplus:
        delta = jax.nn.softplus(delta)
    dA = jnp.exp(delta[:, :, None, :] * args.A.astype(cd)[None, :, :, None])
    dBu = (delta * u)[:, :, None, :] * _expand_bc(args.B, dim, cd)
    dBu = jnp.broadcast_to(dBu, dA.shape)
    return u, delta, dA, dBu, _expand_bc(args.C, dim, cd)


def finish(args: ScanArgs, u, C, h):
    """y = sum_n C h + D u, gated by silu(z); in the compute dtype."""
    cd = args.compute_dtype
    y = jnp.sum(C * h, axis=2)
    if args.D is not None:
        y = y + args.D.astype(cd)[:, None] * u
    if args.z is not None:
        y = y * jax.nn.silu(args.z.astype(cd))
    return y


def run_directions(args: ScanArgs, scan):
    """Evaluate a validated call with `scan(dA, dBu, h0, reverse) -> h` ((batch, D, N, L)).

    Shared by the linear_scan path and the reference so that the directions, the
    last states and the output dtype follow one definition.
    """
    cd = args.compute_dtype
    u, _, dA, dBu, C = discretize(args)
    batch, dim, dstate, length = dA.shape
    h0 = (jnp.zeros((batch, dim, dstate), cd) if args.h0 is None else args.h0.astype(cd))
    reverses = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}
    outs, lasts = [], []
    for reverse in reverses[args.direction]:
        h = scan(dA, dBu, h0, reverse) if length else dA
        outs.append(finish(args, u, C, h))
        if not length:
            lasts.append(h0)
        else:
            lasts.append(h[..., 0] if reverse else h[..., -1])
    out = outs[0] if len(outs) == 1 else outs[0] + outs[1]
    out = out.astype(args.out_dtype)
    if not args.return_last_state:
        return out
    return out, (lasts[0] if len(lasts) == 1 else tuple(lasts))


def _linear_scan(dA, dBu, h0, reverse):
    return linear_scan(dA, dBu, axis=3, reverse=reverse, h0=h0)


def _compute_jax(args: ScanArgs):
    """The pure-JAX formulation: materialised tensors + linear_scan along L."""
    return run_directions(args, _linear_scan)


def _args_from(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, return_last_state,
               direction):
    compute = _compute_dtype(u, delta, A, B, C, D, z, delta_bias, h0)
    return ScanArgs(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, return_last_state,
                    direction, compute, jax.dtypes.canonicalize_dtype(u.dtype))


def _compute_jax_parts(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, direction):
    """(out, last_fwd, last_rev) by the pure-JAX formulation (None for a missing direction).

    The primitive's fallback lowering (float64, platforms without a kernel)."""
    args = _args_from(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, True, direction)
    out, last = _compute_jax(args)
    if direction == "forward":
        return out, last, None
    if direction == "reverse":
        return out, None, last
    return out, last[0], last[1]


def _assemble(outs, return_last_state, direction):
    out, last_f, last_r = outs
    if not return_last_state:
        return out
    last = {"forward": last_f, "reverse": last_r, "bidirectional": (last_f, last_r)}[direction]
    return out, last


@functools.partial(jax.custom_jvp, nondiff_argnums=(9, 10, 11))
def _scan_kernel(u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus, return_last_state,
                 direction):
    outs = primitives.selective_scan_bind(
        u, delta, A, B, C, D, z, delta_bias, h0, delta_softplus=delta_softplus,
        return_last_state=return_last_state, direction=direction)
    return _assemble(outs, return_last_state, direction)


@_scan_kernel.defjvp
def _scan_kernel_jvp(delta_softplus, return_last_state, direction, primals, tangents):
    # The tangent map is the primitive selective_scan_lin_p (selective_scan_primitives.py):
    # evaluated by the pure-JAX JVP in forward mode, and transposed in reverse mode into
    # selective_scan_bwd_p, the fused backward kernel on GPU and CPU.
    # On CPU the forward also saves the backward's checkpoints (ckpt_row > 0), a residual
    # that the linearisation carries to the backward kernel, which then skips its own
    # checkpoint sweep (a plain forward call never writes them). Forward mode ignores them.
    params = dict(delta_softplus=bool(delta_softplus), return_last_state=bool(return_last_state),
                  direction=direction)
    ckpt_row = primitives.ckpt_row_for(*primals, direction=direction)
    outs = primitives.selective_scan_bind(*primals, **params, ckpt_row=ckpt_row)
    ckpt = outs[3] if ckpt_row else None
    outs = outs[:3]
    ops, flags = primitives.operands(*primals)
    tops, _ = primitives.operands(*tangents, like=flags)
    touts = primitives.selective_scan_lin_bind(ops, tops, ckpt, **params, **flags)
    return (_assemble(outs, return_last_state, direction),
            _assemble(touts, return_last_state, direction))


def _compute(args: ScanArgs):
    """A validated call through the selective_scan primitive (CPU kernel when the
    dtypes allow, pure JAX otherwise); differentiable through a custom JVP."""
    return _scan_kernel(args.u, args.delta, args.A, args.B, args.C, args.D, args.z,
                        args.delta_bias, args.h0, args.delta_softplus,
                        args.return_last_state, args.direction)


@overload
def selective_scan(u: ArrayInput, delta: ArrayInput, A: ArrayInput, B: ArrayInput, C: ArrayInput,
                   D: ArrayInput | None = None, z: ArrayInput | None = None,
                   delta_bias: ArrayInput | None = None, delta_softplus: bool = False,
                   return_last_state: Literal[False] = False, h0: ArrayInput | None = None,
                   direction: primitives.Direction = "forward") -> Array: ...
@overload
def selective_scan(u: ArrayInput, delta: ArrayInput, A: ArrayInput, B: ArrayInput, C: ArrayInput,
                   D: ArrayInput | None = None, z: ArrayInput | None = None,
                   delta_bias: ArrayInput | None = None, delta_softplus: bool = False, *,
                   return_last_state: Literal[True], h0: ArrayInput | None = None,
                   direction: primitives.Direction = "forward") -> tuple[Array, LastState]: ...


def selective_scan(u: ArrayInput, delta: ArrayInput, A: ArrayInput, B: ArrayInput, C: ArrayInput,
                   D: ArrayInput | None = None, z: ArrayInput | None = None,
                   delta_bias: ArrayInput | None = None, delta_softplus: bool = False,
                   return_last_state: bool = False, h0: ArrayInput | None = None,
                   direction: primitives.Direction = "forward") -> Array | tuple[Array, LastState]:
    """Mamba's selective scan, with mamba_ssm's ``selective_scan_fn`` semantics.

    Args:
      u, delta: (batch, D, L).
      A: (D, N), real.
      B, C: each (D, N) (time-invariant), (batch, N, L), or grouped (batch, G, N, L)
        with G dividing D (channel d uses group d // (D // G)).
      D, delta_bias: optional (D,).
      z: optional (batch, D, L); the output is multiplied by silu(z).
      delta_softplus: apply softplus to delta (after adding delta_bias).
      return_last_state: also return the final state.
      h0: optional (batch, D, N) initial state (zeros by default; mamba_ssm has none).
        For direction="reverse" it is the state entering at the end of the sequence.
      direction: "forward"; "reverse" (h[t] = exp(delta[t] A) h[t+1] + delta[t] B[t] u[t]);
        or "bidirectional", exactly the sum of the forward and the reverse outputs for
        the same arguments (same h0 for both; the sum is taken in the compute dtype
        before rounding to u's dtype, so D*u counts twice).

    Returns:
      out (batch, D, L) in u's dtype; with return_last_state, (out, last_state) where
      last_state is (batch, D, N) in the compute dtype: float32 for float32/bfloat16/
      float16 inputs, float64 when any input is float64. (mamba_ssm returns it in A's
      dtype, which its kernels require to be float32, so for the usual bf16/fp16
      activations with float32 A both give float32.) For "reverse" the last state is the state after position 0; for
      "bidirectional" it is the tuple (forward_last, reverse_last).

    dtypes: float32, float64, bfloat16, float16 (mixed allowed; computed in float32,
    or float64 when any input is float64). Complex A/B/C are not supported (TypeError).
    Flags and direction are static Python values. Jittable, vmappable, differentiable.
    """
    args = _validate(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                     return_last_state, h0, direction)
    return _compute(args)


# --- one decoding step -----------------------------------------------------------------

def selective_state_update(state: ArrayInput, x: ArrayInput, dt: ArrayInput, A: ArrayInput, B: ArrayInput,
                           C: ArrayInput, D: ArrayInput | None = None, z: ArrayInput | None = None,
                           dt_bias: ArrayInput | None = None, dt_softplus: bool = False
                           ) -> tuple[Array, Array]:
    """One decoding step of the selective scan (mamba_ssm's ``selective_state_update``).

    Args:
      state: (batch, D, N), the state after the previous token.
      x, dt: (batch, D); z optional (batch, D).
      A: (D, N); B, C: (batch, N) or grouped (batch, G, N) with G dividing D.
      D, dt_bias: optional (D,).
      dt_softplus: apply softplus to dt (after adding dt_bias).

    Returns:
      (y, new_state): y (batch, D) in x's dtype, new_state (batch, D, N) in state's
      dtype (mamba_ssm updates the state in place in its own dtype). Computed in
      float32 (float64 when any input is float64):
        new_state = exp(dt A) state + dt B x;  y = sum_n C new_state + D x;  y *= silu(z).
    """
    state = _check_real("state", state)
    _check_rank("state", state, 3, "(batch, D, N)")
    batch, dim, dstate = state.shape
    x = _check_real("x", x)
    _check_shape("x", x, (batch, dim), "(batch, D) with batch, D from state")
    dt = _check_real("dt", dt)
    _check_shape("dt", dt, (batch, dim), "(batch, D), the shape of x")
    A = _check_real("A", A)
    _check_shape("A", A, (dim, dstate), "(D, N) with D, N from state")

    def bc(name, v):
        v = _check_real(name, v)
        if v.ndim == 2:
            _check_shape(name, v, (batch, dstate), "(batch, N)")
            return v[:, None]
        if v.ndim == 3:
            groups = v.shape[1]
            _check_shape(name, v, (batch, groups, dstate), "(batch, G, N)")
            if groups < 1 or dim % groups:
                raise ValueError(f"{name} has G={groups} groups (shape {tuple(v.shape)}), which "
                                 f"does not divide the D={dim} channels of state")
            return v
        raise ValueError(f"{name} must have shape (batch, N) or (batch, G, N), "
                         f"got shape {tuple(v.shape)}")

    B, C = bc("B", B), bc("C", C)
    if D is not None:
        D = _check_real("D", D)
        _check_shape("D", D, (dim,), "(D,)")
    if z is not None:
        z = _check_real("z", z)
        _check_shape("z", z, (batch, dim), "(batch, D), the shape of x")
    if dt_bias is not None:
        dt_bias = _check_real("dt_bias", dt_bias)
        _check_shape("dt_bias", dt_bias, (dim,), "(D,)")
    dt_softplus = check_bool("dt_softplus", dt_softplus)

    cd = _compute_dtype(state, x, dt, A, B, C, D, z, dt_bias)
    expand = lambda v: jnp.repeat(v.astype(cd), dim // v.shape[1], axis=1)   # (batch, D, N)
    xc, dtc = x.astype(cd), dt.astype(cd)
    if dt_bias is not None:
        dtc = dtc + dt_bias.astype(cd)
    if dt_softplus:
        dtc = jax.nn.softplus(dtc)
    new_state = (jnp.exp(dtc[..., None] * A.astype(cd)) * state.astype(cd)
                 + (dtc * xc)[..., None] * expand(B))
    y = jnp.sum(expand(C) * new_state, axis=-1)
    if D is not None:
        y = y + D.astype(cd) * xc
    if z is not None:
        y = y * jax.nn.silu(z.astype(cd))
    return (y.astype(jax.dtypes.canonicalize_dtype(x.dtype)),
            new_state.astype(jax.dtypes.canonicalize_dtype(state.dtype)))
