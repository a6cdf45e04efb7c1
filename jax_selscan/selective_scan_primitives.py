"""selective_scan's primitives and every JAX rule for them, kept in this one module.

Three primitives, all with the same nine operands and the same static parameters:

* ``selective_scan_p``: the forward scan -> [out, last_fwd, last_rev] (+ the checkpoints
  when bound with ``ckpt_row`` > 0).
* ``selective_scan_lin_p``: its linearisation (nine primals, the checkpoints, nine
  tangents) -> the tangents of [out, last_fwd, last_rev]. Evaluated (forward mode) by
  the pure-JAX JVP; transposed (reverse mode) into ``selective_scan_bwd_p``.
* ``selective_scan_bwd_p``: the vector-Jacobian product (nine primals, the cotangents
  of out, last_fwd, last_rev, the checkpoints) -> the nine gradients. The fused CUDA
  backward kernel on GPU (cuda/selective_scan_kernels.cuh), the fused CPU backward kernel
  on CPU (cpu_arm/selective_scan_bwd.h); elsewhere (float64, no kernel) the pure-JAX VJP.

The checkpoints: under differentiation on CPU, the forward (``ckpt_row`` > 0) also
returns the state entering every block of the backward's `lanes` steps, (batch, D,
ckpt_row) float32 (layout: SsParams::ckpt in cpu_arm/selective_scan_api.h), a
non-differentiable residual that selective_scan_lin_p carries to selective_scan_bwd_p,
whose CPU kernel then skips its own checkpoint sweep. A (0,) placeholder (or rows
flagged unwritten) means none: the backward sweeps. CUDA and the pure-JAX paths ignore
it.

selective_scan.py wraps the forward in a jax.custom_jvp whose rule binds
``selective_scan_lin_p``, so jvp, grad, vjp, jit and vmap all work and reverse mode
reaches the fused backward kernel. Batching folds the vmapped axis into the channels
(no loop). Only public JAX APIs are used (jax.extend, jax.interpreters, jax.ffi);
partitioning rules belong here too.
"""
from __future__ import annotations

import functools
import importlib
import os
from typing import Literal, get_args

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _ffi, _partitioning
from ._checks import state_dtype


def _ss_module():
    # selective_scan imports this module (and the package re-exports a function of
    # that name), so its pure-JAX formulation is looked up lazily.
    return importlib.import_module(__package__ + ".selective_scan")

# =====================================================================================
# selective_scan_p: the forward scan
# =====================================================================================
#
# Operands (always nine; an absent optional one is a placeholder array of shape (0,)
# with its has_* parameter False):
#   u, delta (batch, D, L); A (D, N); B, C (D, N) or (batch, G, N, L); D (D,);
#   z (batch, D, L); delta_bias (D,); h0 (batch, D, N).
# Results: [out (batch, D, L) in u's dtype, last_fwd, last_rev], the last states
# (batch, D, N) in the compute dtype when return_last_state and the direction has
# them, else placeholders of shape (0,); with ckpt_row > 0 (only bound by the JVP rule,
# see ckpt_row_for) a fourth, the checkpoints (batch, D, ckpt_row) float32.
# Lowering: the CPU / CUDA FFI kernels when every operand is float32/bfloat16/float16
# (CUDA: also 1 <= N <= 128 and no empty axis); otherwise (float64, other platforms)
# the pure-JAX formulation (selective_scan._compute_jax). Differentiation is not defined
# on the primitive: selective_scan wraps it in a jax.custom_jvp (see selective_scan.py).

# The kernels take a direction by its index in SS_DIRECTIONS: keep the order.
Direction = Literal["forward", "reverse", "bidirectional"]
SS_DIRECTIONS: tuple[str, ...] = get_args(Direction)
_SS_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(jnp.bfloat16), np.dtype(np.float16))

selective_scan_p = Primitive("jax_selscan_selective_scan")
selective_scan_p.multiple_results = True


def _ss_last_shapes(u, A, direction, return_last_state):
    full = (u.shape[0], u.shape[1], A.shape[1])
    want_f = return_last_state and direction in ("forward", "bidirectional")
    want_r = return_last_state and direction in ("reverse", "bidirectional")
    return (full if want_f else (0,)), (full if want_r else (0,))


def operands(u, delta, A, B, C, D, z, delta_bias, h0, like=None):
    """The nine operands with (0,) placeholders for absent ones, and the has_* flags.

    like: flags to follow instead (tangents of absent operands are None too)."""
    opt = (D, z, delta_bias, h0)
    has = ([x is not None for x in opt] if like is None else
           [like[k] for k in ("has_D", "has_z", "has_delta_bias", "has_h0")])
    ph = lambda: jnp.zeros((0,), jnp.float32)
    ops = [u, delta, A, B, C] + [x if h else ph() for x, h in zip(opt, has)]
    flags = dict(has_D=has[0], has_z=has[1], has_delta_bias=has[2], has_h0=has[3])
    return ops, flags


def selective_scan_bind(u, delta, A, B, C, D, z, delta_bias, h0, *, delta_softplus,
                        return_last_state, direction, ckpt_row=0):
    """Bind the primitive; None for absent optional arrays. Returns (out, last_fwd, last_rev)
    (and the checkpoints when ckpt_row > 0)."""
    ops, flags = operands(u, delta, A, B, C, D, z, delta_bias, h0)
    extra = dict(ckpt_row=int(ckpt_row)) if ckpt_row else {}
    return selective_scan_p.bind(
        *ops, delta_softplus=bool(delta_softplus), return_last_state=bool(return_last_state),
        direction=direction, **flags, **extra)


def no_ckpt():
    """The checkpoints placeholder: none (the backward runs its own sweep)."""
    return jnp.zeros((0,), jnp.float32)


def ckpt_row_for(u, delta, A, B, C, D, z, delta_bias, h0, *, direction):
    """ckpt_row for a forward whose backward will run: floats per (batch, channel) of the
    CPU kernel's checkpoints (cpu_arm/selective_scan_api.h, ss_ckpt_row), or 0 (none)
    unless that forward lowers to the CPU kernel: the CPU extension is built, the
    default backend is the CPU (decided at trace time: lowering such a trace for CUDA
    gives the CUDA forward an all-zero, "unwritten" residual), the dtypes are the
    kernel's and no axis is empty."""
    if _ffi.HAS_CUDA and jax.default_backend() == "gpu" and os.environ.get("JAX_SELSCAN_SS_FWD_CKPT") != "0":
        # The CUDA forward saving them (JAX_SELSCAN_SS_FWD_CKPT=0: the backward's own sweep
        # instead, for comparisons; docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md 5.4).
        ops, flags = operands(u, delta, A, B, C, D, z, delta_bias, h0)
        return _cuda_ckpt_row(u, A, direction) if _ss_cuda_supports(ops, _has(flags)) else 0
    if not _ffi.HAS_CPU or jax.default_backend() != "cpu":
        return 0
    ops, flags = operands(u, delta, A, B, C, D, z, delta_bias, h0)
    if not _ss_kernel_supports(ops, _has(flags)) or any(s == 0 for s in u.shape + A.shape):
        return 0
    lanes = _ffi.ss_lanes()
    if lanes <= 0:
        return 0
    blocks = -(-u.shape[2] // lanes)
    return 1 + (2 if direction == "bidirectional" else 1) * blocks * A.shape[1]


def _cuda_ckpt_row(u, A, direction):
    """Floats per (batch, channel) of the CUDA kernels' checkpoints (cuda/selective_scan.h,
    ss_ckpt_row): the state entering every 8-step chunk, per direction."""
    return (2 if direction == "bidirectional" else 1) * (-(-u.shape[2] // 8)) * A.shape[1]


def _ckpt_out(u, ckpt_row):
    return [jnp.zeros((u.shape[0], u.shape[1], ckpt_row), jnp.float32)] if ckpt_row else []


@functools.lru_cache(maxsize=None)
def _ss_jitted(**params):
    return jax.jit(lambda *ops: selective_scan_p.bind(*ops, **params))


def _ss_impl(*ops, **params):
    # Eager calls the kernel does not take (float64, no CPU kernel) run the pure-JAX
    # formulation op by op, as before the primitive existed, instead of compiling a
    # program per combination of options.
    has = (params["has_D"], params["has_z"], params["has_delta_bias"], params["has_h0"])
    if not ((_ffi.HAS_CPU or _ffi.HAS_CUDA) and _ss_kernel_supports(ops, has)):
        return _ss_fallback(*ops, **params)
    return _ss_jitted(**params)(*ops)


selective_scan_p.def_impl(_ss_impl)


def _ss_compute_dtype(ops, has):
    present = [x for x, h in zip(ops, (True,) * 5 + has) if h]
    return state_dtype(jnp.result_type(*[x.dtype for x in present]))


def _ss_abstract_eval(u, delta, A, B, C, D, z, delta_bias, h0, *, delta_softplus,
                      return_last_state, direction, has_D, has_z, has_delta_bias, has_h0,
                      ckpt_row=0):
    if direction not in SS_DIRECTIONS:
        raise ValueError(f"selective_scan: direction must be one of {SS_DIRECTIONS}")
    if u.ndim != 3 or delta.shape != u.shape or A.ndim != 2 or A.shape[0] != u.shape[1]:
        raise ValueError("selective_scan: u, delta must be (batch, D, L) and A (D, N)")
    cd = _ss_compute_dtype((u, delta, A, B, C, D, z, delta_bias, h0),
                           (has_D, has_z, has_delta_bias, has_h0))
    sf, sr = _ss_last_shapes(u, A, direction, return_last_state)
    ck = ([jax.core.ShapedArray((u.shape[0], u.shape[1], ckpt_row), np.float32)]
          if ckpt_row else [])
    return [jax.core.ShapedArray(u.shape, u.dtype), jax.core.ShapedArray(sf, cd),
            jax.core.ShapedArray(sr, cd)] + ck


selective_scan_p.def_abstract_eval(_ss_abstract_eval)


def _ss_batch(args, dims, *, direction, return_last_state, has_D, has_z, has_delta_bias,
              has_h0, **params):
    """Fold the vmapped axis into batch when the per-channel operands are shared,
    otherwise into the channels (D becomes V*D, G becomes V*G). No loop either way."""
    u, delta, A, B, C, D, z, delta_bias, h0 = args
    has = dict(D=has_D, z=has_z, delta_bias=has_delta_bias, h0=has_h0)
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
    present = {n: (True if n in "u delta A B C".split() else has[n]) for n in names}
    moved = {}
    for n, x, d in zip(names, args, dims):
        if not present[n]:
            moved[n] = x
        elif d is None:
            moved[n] = jnp.broadcast_to(x, (size,) + x.shape)
        else:
            moved[n] = jnp.moveaxis(x, d, 0)
    shared = all(dims[names.index(n)] is None or not present[n] for n in ("A", "D", "delta_bias"))
    bc_invariant_batched = any(
        dims[names.index(n)] is not None and args[names.index(n)].ndim == 3 for n in ("B", "C"))
    V = size
    kw = dict(direction=direction, return_last_state=return_last_state, has_D=has_D, has_z=has_z,
              has_delta_bias=has_delta_bias, has_h0=has_h0, **params)
    if shared and not bc_invariant_batched:
        # (V, batch, ...) -> (V * batch, ...); per-channel operands unchanged.
        ops = []
        for n, x, d in zip(names, args, dims):
            if not present[n] or n in ("A", "D", "delta_bias") or (n in ("B", "C") and x.ndim == 2 and d is None):
                ops.append(x)
            else:
                m = moved[n]
                ops.append(m.reshape((V * m.shape[1],) + m.shape[2:]))
        outs = selective_scan_p.bind(*ops, **kw)
        res = [o.reshape((V, o.shape[0] // V) + o.shape[1:]) if o.ndim > 1 else
               jnp.zeros((V,) + o.shape, o.dtype) for o in outs]
        return res, [0] * len(res)
    # Channels: (V, batch, D, ...) -> (batch, V * D, ...); (V, D, ...) -> (V * D, ...).
    ops = []
    for n in names:
        m = moved[n]
        if not present[n]:
            ops.append(args[names.index(n)])
        elif n in ("A", "D", "delta_bias") or (n in ("B", "C") and m.ndim == 3):
            ops.append(m.reshape((V * m.shape[1],) + m.shape[2:]))
        else:  # (V, batch, D or G, ...)
            m = jnp.swapaxes(m, 0, 1)
            ops.append(m.reshape((m.shape[0], V * m.shape[2]) + m.shape[3:]))
    outs = selective_scan_p.bind(*ops, **kw)
    res = []
    for o in outs:
        if o.ndim == 1:
            res.append(jnp.zeros((V,) + o.shape, o.dtype))
        else:
            o = o.reshape((o.shape[0], V, o.shape[1] // V) + o.shape[2:])
            res.append(jnp.swapaxes(o, 0, 1))
    return res, [0] * len(res)


batching.primitive_batchers[selective_scan_p] = _ss_batch


def _ss_fallback(u, delta, A, B, C, D, z, delta_bias, h0, *, delta_softplus, return_last_state,
                 direction, has_D, has_z, has_delta_bias, has_h0, ckpt_row=0):
    """Pure-JAX lowering (float64 or no kernel): the materialised formulation."""
    opt = lambda x, h: x if h else None
    outs = _ss_module()._compute_jax_parts(
        u, delta, A, B, C, opt(D, has_D), opt(z, has_z), opt(delta_bias, has_delta_bias),
        opt(h0, has_h0), delta_softplus, direction)
    out, last_f, last_r = outs
    sf, sr = _ss_last_shapes(u, A, direction, return_last_state)
    cd = _ss_compute_dtype((u, delta, A, B, C, D, z, delta_bias, h0),
                           (has_D, has_z, has_delta_bias, has_h0))
    fix = lambda x, s: x.astype(cd) if s != (0,) else jnp.zeros((0,), cd)
    return [out, fix(last_f, sf), fix(last_r, sr)] + _ckpt_out(u, ckpt_row)  # unwritten


_ss_fallback_rule = mlir.lower_fun(_ss_fallback, multiple_results=True)
mlir.register_lowering(selective_scan_p, _ss_fallback_rule)


def _ss_kernel_supports(avals, has):
    present = [a for a, h in zip(avals, (True,) * 5 + has) if h]
    return all(np.dtype(a.dtype) in _SS_KERNEL_DTYPES for a in present)


def _ss_cpu_rule(ctx, *ops, delta_softplus, return_last_state, direction, has_D, has_z,
                 has_delta_bias, has_h0, ckpt_row=0):
    params = dict(delta_softplus=delta_softplus, return_last_state=return_last_state,
                  direction=direction, has_D=has_D, has_z=has_z, has_delta_bias=has_delta_bias,
                  has_h0=has_h0, ckpt_row=ckpt_row)
    if not _ss_kernel_supports(ctx.avals_in, (has_D, has_z, has_delta_bias, has_h0)):
        return _ss_fallback_rule(ctx, *ops, **params)
    # With checkpoints: the same kernel with a fourth result (the FFI target
    # jax_selscan_selective_scan_ckpt); a plain forward never writes them.
    target = _ffi.SELECTIVE_SCAN_CKPT if ckpt_row else _ffi.SELECTIVE_SCAN
    return jax.ffi.ffi_lowering(target)(
        ctx, *ops, delta_softplus=np.bool_(delta_softplus),
        direction=np.int64(SS_DIRECTIONS.index(direction)), has_D=np.bool_(has_D),
        has_z=np.bool_(has_z), has_delta_bias=np.bool_(has_delta_bias), has_h0=np.bool_(has_h0))


if _ffi.HAS_CPU:
    mlir.register_lowering(selective_scan_p, _ss_cpu_rule, platform="cpu")


# --- CUDA lowering of the forward ---------------------------------------------------------

_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
_CUDA_MAX_N = 128


def _has(params):
    return (params["has_D"], params["has_z"], params["has_delta_bias"], params["has_h0"])


def _ss_cuda_supports(avals, has):
    u, A = avals[0], avals[2]
    return (_ss_kernel_supports(avals, has) and 1 <= A.shape[1] <= _CUDA_MAX_N
            and all(s > 0 for s in u.shape))


def _cuda_operands(ops, has):
    """Cast the operands to what the CUDA handlers take: the activations (u, delta, z,
    varying B/C) in one dtype (u's when they all share it, else float32, which is exact
    for bf16/f16), everything else float32."""
    u, delta, A, B, C, D, z, bias, h0 = ops
    has_D, has_z, has_bias, has_h0 = has
    acts = [u, delta] + ([z] if has_z else []) + [x for x in (B, C) if x.ndim == 4]
    act = u.dtype if all(x.dtype == u.dtype for x in acts) else np.dtype(np.float32)
    f32 = lambda x: x.astype(jnp.float32)
    cast = lambda x: x.astype(act)
    bc = lambda x: cast(x) if x.ndim == 4 else f32(x)
    return act, [cast(u), cast(delta), f32(A), bc(B), bc(C), f32(D) if has_D else D,
                 cast(z) if has_z else z, f32(bias) if has_bias else bias,
                 f32(h0) if has_h0 else h0]


def _attrs(params):
    return dict(delta_softplus=np.bool_(params["delta_softplus"]),
                direction=np.int64(SS_DIRECTIONS.index(params["direction"])),
                has_D=np.bool_(params["has_D"]), has_z=np.bool_(params["has_z"]),
                has_delta_bias=np.bool_(params["has_delta_bias"]),
                has_h0=np.bool_(params["has_h0"]))


def cuda_scratch_bytes(ops, params, *, backward, saved_ckpt=False):
    """Size of the uint8 scratch result the CUDA selective-scan handlers take (the L split's
    carries, the bidirectional y, the backward's dB / dC partials and checkpoint sweep).

    Requested from XLA at trace time, not allocated in the call, so that the handlers can be
    captured into command buffers (CUDA graphs) and XLA's memory analysis counts it. The plan
    reads the current GPU's SM count and the JAX_SELSCAN_SS_* variables now; the handler
    re-plans when it runs and fails with a clear error if the buffer is then too small.
    Includes 256 bytes of alignment slack; at least 1.
    """
    from . import _cuda
    u, A, B, C = ops[0], ops[2], ops[3], ops[4]
    groups = lambda x: x.shape[1] if x.ndim == 4 else 0
    n = _cuda.selective_scan_scratch_bytes(
        bool(backward), u.shape[0], u.shape[1], u.shape[2], A.shape[1], groups(B), groups(C),
        SS_DIRECTIONS.index(params["direction"]), bool(params["has_h0"]), bool(saved_ckpt))
    return n + _cuda.linear_scan_scratch_align() if n else 1


def _scratch_type(ops, params, **kw):
    return jax.ShapeDtypeStruct((cuda_scratch_bytes(ops, params, **kw),), jnp.uint8)


def _ss_cuda_forward(*ops, **params):
    act, cops = _cuda_operands(ops, _has(params))
    u, A = ops[0], ops[2]
    sf, sr = _ss_last_shapes(u, A, params["direction"], params["return_last_state"])
    types = [jax.ShapeDtypeStruct(u.shape, act), jax.ShapeDtypeStruct(sf, jnp.float32),
             jax.ShapeDtypeStruct(sr, jnp.float32)]
    scratch = _scratch_type(ops, params, backward=False)  # a last result, dropped
    ckpt_row = params.get("ckpt_row", 0)
    if ckpt_row and ckpt_row == _cuda_ckpt_row(u, A, params["direction"]):
        # checkpoints in the CUDA layout: the forward writes them, the CUDA backward reads them
        types.append(jax.ShapeDtypeStruct((u.shape[0], u.shape[1], ckpt_row), jnp.float32))
        out, lf, lr, ck, _ = jax.ffi.ffi_call(_ffi.SELECTIVE_SCAN_FWD_CKPT_CUDA, [*types, scratch])(
            *cops, **_attrs(params))
        return [out.astype(u.dtype), lf, lr, ck]
    out, lf, lr, _ = jax.ffi.ffi_call(_ffi.SELECTIVE_SCAN_FWD_CUDA, [*types, scratch])(*cops, **_attrs(params))
    # Any other ckpt_row (a CPU-traced grad lowered for CUDA) gets zeros, i.e. every row
    # "unwritten"; the CUDA backward then runs its own checkpoint sweep.
    return [out.astype(u.dtype), lf, lr] + _ckpt_out(u, ckpt_row)


_ss_cuda_forward_rule = mlir.lower_fun(_ss_cuda_forward, multiple_results=True)


def _ss_cuda_rule(ctx, *ops, **params):
    if not _ss_cuda_supports(ctx.avals_in, _has(params)):
        return _ss_fallback_rule(ctx, *ops, **params)
    return _ss_cuda_forward_rule(ctx, *ops, **params)


if _ffi.HAS_CUDA:
    mlir.register_lowering(selective_scan_p, _ss_cuda_rule, platform="cuda")


# --- batching by folding the vmapped axis into the channels ----------------------------------
#
# Operand kinds: "bdl" (batch, D, L); "bdn" (batch, D, N); "dn" (D, N); "d" (D,); "bc" B or C,
# (D, N) or (batch, G, N, L). (V, batch, D, ...) becomes (batch, V*D, ...), (V, D, ...)
# becomes (V*D, ...), (V, batch, G, N, L) becomes (batch, V*G, N, L): channel v*D + d of
# the folded call is channel d of batch member v, and it still reads group v*G + d // (D/G).
# A size-0 placeholder (an absent operand) stays a placeholder.

_PRIMAL_KINDS = ("bdl", "bdl", "dn", "bc", "bc", "d", "bdl", "d", "bdn")
_OUT_KINDS = ("bdl", "bdn", "bdn")


def _fold(x, kind, dim, V):
    if x.size == 0:
        return jnp.zeros((0,), x.dtype)
    x = jnp.broadcast_to(x, (V,) + x.shape) if dim is None else jnp.moveaxis(x, dim, 0)
    if kind in ("dn", "d") or (kind == "bc" and x.ndim == 3):
        return x.reshape((V * x.shape[1],) + x.shape[2:])
    x = jnp.swapaxes(x, 0, 1)                      # (batch, V, D or G, ...)
    return x.reshape((x.shape[0], V * x.shape[2]) + x.shape[3:])


def _unfold(y, kind, V):
    if y.size == 0 and y.ndim == 1:
        return jnp.zeros((V, 0), y.dtype)
    if kind in ("dn", "d") or (kind == "bc" and y.ndim == 2):
        return y.reshape((V, y.shape[0] // V) + y.shape[1:])
    y = y.reshape((y.shape[0], V, y.shape[1] // V) + y.shape[2:])
    return jnp.swapaxes(y, 0, 1)


def _fold_batcher(prim, in_kinds, out_kinds):
    def rule(args, dims, **params):
        V = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
        folded = [_fold(x, k, d, V) for x, k, d in zip(args, in_kinds, dims)]
        outs = prim.bind(*folded, **params)
        return [_unfold(y, k, V) for y, k in zip(outs, out_kinds)], [0] * len(outs)
    return rule


# --- pure-JAX derivatives (the fallback of both derivative primitives) -----------------------

def _present_fn(has, params):
    """f(*present operands) -> (out, last_fwd, last_rev) by the pure-JAX formulation."""
    present = (True,) * 5 + tuple(has)

    def f(*xs):
        it = iter(xs)
        full = [next(it) if p else None for p in present]
        return _ss_module()._compute_jax_parts(*full, params["delta_softplus"],
                                               params["direction"])
    return present, f


def _placeholder_outs(outs, u, A, params, cd):
    out, lf, lr = outs
    sf, sr = _ss_last_shapes(u, A, params["direction"], params["return_last_state"])
    fix = lambda x, s: x.astype(cd) if s != (0,) else jnp.zeros((0,), cd)
    return [out, fix(lf, sf), fix(lr, sr)]


# --- selective_scan_lin_p: the linearisation ----------------------------------------------------

selective_scan_lin_p = Primitive("jax_selscan_selective_scan_lin")
selective_scan_lin_p.multiple_results = True


def selective_scan_lin_bind(primals, tangents, ckpt=None, **params):
    """Tangents of (out, last_fwd, last_rev); primals/tangents: the nine operands
    (placeholders for absent ones, as selective_scan_bind makes them); ckpt: the
    forward's checkpoints (a residual for the backward) or None (none)."""
    ckpt = no_ckpt() if ckpt is None else ckpt
    return selective_scan_lin_p.bind(*primals, ckpt, *tangents, **params)


def _ss_lin_abstract_eval(*ops, **params):
    return _ss_abstract_eval(*ops[:9], **params)


def _ss_lin_jax(*ops, **params):
    # ops: nine primals, the checkpoints (unused here), nine tangents.
    has = _has(params)
    present, f = _present_fn(has, params)
    prim = [x for x, p in zip(ops[:9], present) if p]
    tang = [x for x, p in zip(ops[10:], present) if p]
    _, touts = jax.jvp(f, prim, tang)
    cd = _ss_compute_dtype(ops[:9], has)
    return _placeholder_outs(touts, ops[0], ops[2], params, cd)


def _ss_lin_transpose(cts, *ops, **params):
    primals, ckpt, tangents = ops[:9], ops[9], ops[10:]
    if any(ad.is_undefined_primal(x) for x in primals + (ckpt,)):
        raise NotImplementedError("selective_scan: the linearisation is linear in the tangents only")
    u = primals[0]
    ct_out, ct_f, ct_r = cts
    ct_out = (jnp.zeros(u.shape, u.dtype) if type(ct_out) is ad.Zero else ct_out)
    ph = lambda c: (jnp.zeros((0,), jnp.float32) if type(c) is ad.Zero or c.size == 0 else c)
    grads = selective_scan_bwd_p.bind(*primals, ct_out, ph(ct_f), ph(ct_r), ckpt, **params)
    return [None] * 10 + [g if ad.is_undefined_primal(t) else None
                         for g, t in zip(grads, tangents)]


selective_scan_lin_p.def_abstract_eval(_ss_lin_abstract_eval)
selective_scan_lin_p.def_impl(_ss_lin_jax)
mlir.register_lowering(selective_scan_lin_p, mlir.lower_fun(_ss_lin_jax, multiple_results=True))
ad.primitive_transposes[selective_scan_lin_p] = _ss_lin_transpose
batching.primitive_batchers[selective_scan_lin_p] = _fold_batcher(
    selective_scan_lin_p, _PRIMAL_KINDS + ("bdl",) + _PRIMAL_KINDS, _OUT_KINDS)


# --- selective_scan_bwd_p: the vector-Jacobian product -------------------------------------------
#
# Operands: the nine primals, then ct_out (u's shape and dtype), ct_last_fwd, ct_last_rev
# ((batch, D, N) in the compute dtype, or (0,) placeholders meaning zero), then the
# forward's checkpoints ((batch, D, K) float32, or a (0,) placeholder: none; read by the
# CPU kernel only). Batching folds the checkpoints like (batch, D, L) operands: every
# row belongs to one (batch, channel).
# Results: the nine gradients in the primals' shapes and dtypes ((0,) float32
# placeholders for absent operands).

selective_scan_bwd_p = Primitive("jax_selscan_selective_scan_bwd")
selective_scan_bwd_p.multiple_results = True


def _ss_bwd_abstract_eval(*ops, **params):
    present = (True,) * 5 + _has(params)
    return [jax.core.ShapedArray(x.shape, x.dtype) if p else jax.core.ShapedArray((0,), np.float32)
            for x, p in zip(ops[:9], present)]


def _ss_bwd_jax(*ops, **params):
    has = _has(params)
    present, f = _present_fn(has, params)
    prim = [x for x, p in zip(ops[:9], present) if p]
    outs, vjp = jax.vjp(f, *prim)
    ct_out, ct_f, ct_r = ops[9:12]
    cts = (ct_out.astype(outs[0].dtype),
           None if outs[1] is None else (ct_f.astype(outs[1].dtype) if ct_f.size else jnp.zeros_like(outs[1])),
           None if outs[2] is None else (ct_r.astype(outs[2].dtype) if ct_r.size else jnp.zeros_like(outs[2])))
    grads = iter(vjp(cts))
    return [next(grads).astype(x.dtype) if p else jnp.zeros((0,), jnp.float32)
            for x, p in zip(ops[:9], present)]


_ss_bwd_fallback_rule = mlir.lower_fun(_ss_bwd_jax, multiple_results=True)


def _ss_bwd_cuda(*ops, **params):
    has = _has(params)
    act, cops = _cuda_operands(ops[:9], has)
    u, delta, A, B, C, D, z, bias, h0 = ops[:9]
    ct_out, ct_f, ct_r, ckpt = ops[9:13]
    f32 = lambda x: x.astype(jnp.float32)
    S = jax.ShapeDtypeStruct
    ph = S((0,), jnp.float32)
    # a varying B / C already in the activations' dtype gets its gradient in that dtype from
    # the kernel's reduction (no convert after it); other gradients come in float32
    bc = lambda x: S(x.shape, act) if x.ndim == 4 and x.dtype == act else S(x.shape, jnp.float32)
    types = [S(u.shape, act), S(u.shape, act), S(u.shape, act) if has[1] else ph,
             S(A.shape, jnp.float32), bc(B), bc(C),
             S(D.shape, jnp.float32) if has[0] else ph,
             S(bias.shape, jnp.float32) if has[2] else ph,
             S(h0.shape, jnp.float32) if has[3] else ph]
    # the forward's checkpoints when they are in the CUDA layout, else a (0,) placeholder
    cuda_ck = ckpt.ndim == 3 and ckpt.shape[2] == _cuda_ckpt_row(u, A, params["direction"])
    ck = f32(ckpt) if cuda_ck else jnp.zeros((0,), jnp.float32)
    types.append(_scratch_type(ops[:9], params, backward=True, saved_ckpt=cuda_ck))  # dropped
    du, dd, dz, dA, dB, dC, dD, db, dh0, _ = jax.ffi.ffi_call(_ffi.SELECTIVE_SCAN_BWD_CUDA, types)(
        *cops, ct_out.astype(act), f32(ct_f), f32(ct_r), ck, **_attrs(params))
    grads = [du, dd, dA, dB, dC, dD, dz, db, dh0]
    present = (True,) * 5 + has
    return [g.astype(x.dtype) if p else jnp.zeros((0,), jnp.float32)
            for g, x, p in zip(grads, ops[:9], present)]


_ss_bwd_cuda_lowering = mlir.lower_fun(_ss_bwd_cuda, multiple_results=True)


def _ss_bwd_cuda_rule(ctx, *ops, **params):
    if not _ss_cuda_supports(ctx.avals_in[:9], _has(params)):
        return _ss_bwd_fallback_rule(ctx, *ops, **params)
    return _ss_bwd_cuda_lowering(ctx, *ops, **params)


# --- CPU lowering of the backward: the fused kernel (cpu_arm/selective_scan_bwd.h) ---------
#
# The FFI target takes the nine operands as they are (float32 / bfloat16 / float16,
# mixed), ct_out in u's dtype, the last states' cotangents in float32 and the
# forward's checkpoints (or a (0,) placeholder), and returns
# every gradient in float32 (cast here to the operand's dtype).

def _ss_bwd_cpu(*ops, **params):
    has = _has(params)
    u, delta, A, B, C, D, z, bias, h0 = ops[:9]
    ct_out, ct_f, ct_r, ckpt = ops[9:]
    f32 = jnp.float32
    S = jax.ShapeDtypeStruct
    ph = S((0,), f32)
    types = [S(u.shape, f32), S(delta.shape, f32), S(z.shape, f32) if has[1] else ph,
             S(A.shape, f32), S(B.shape, f32), S(C.shape, f32),
             S(D.shape, f32) if has[0] else ph, S(bias.shape, f32) if has[2] else ph,
             S(h0.shape, f32) if has[3] else ph]
    du, dd, dz, dA, dB, dC, dD, db, dh0 = jax.ffi.ffi_call(_ffi.SELECTIVE_SCAN_BWD, types)(
        *ops[:9], ct_out.astype(u.dtype), ct_f.astype(f32), ct_r.astype(f32), ckpt.astype(f32),
        **_attrs(params))
    grads = [du, dd, dA, dB, dC, dD, dz, db, dh0]
    present = (True,) * 5 + has
    return [g.astype(x.dtype) if p else jnp.zeros((0,), f32)
            for g, x, p in zip(grads, ops[:9], present)]


_ss_bwd_cpu_lowering = mlir.lower_fun(_ss_bwd_cpu, multiple_results=True)


def _ss_bwd_cpu_supports(avals, has):
    return _ss_kernel_supports(avals[:9], has) and np.dtype(avals[9].dtype) in _SS_KERNEL_DTYPES


def _ss_bwd_cpu_rule(ctx, *ops, **params):
    if not _ss_bwd_cpu_supports(ctx.avals_in, _has(params)):
        return _ss_bwd_fallback_rule(ctx, *ops, **params)
    return _ss_bwd_cpu_lowering(ctx, *ops, **params)


@functools.lru_cache(maxsize=None)
def _ss_bwd_jitted(**params):
    return jax.jit(lambda *ops: selective_scan_bwd_p.bind(*ops, **params))


def _on_cpu(x):
    try:
        return all(d.platform == "cpu" for d in x.devices())
    except AttributeError:  # a tracer or a plain numpy array: the default backend
        return jax.default_backend() == "cpu"


def _ss_bwd_impl(*ops, **params):
    # Eager reverse mode (jax.grad without jit) on CPU runs the fused kernel through a
    # jitted bind, like the forward's impl; elsewhere the pure-JAX VJP op by op.
    if _ffi.HAS_CPU and _on_cpu(ops[0]) and _ss_bwd_cpu_supports(ops, _has(params)):
        return _ss_bwd_jitted(**params)(*ops)
    return _ss_bwd_jax(*ops, **params)


selective_scan_bwd_p.def_abstract_eval(_ss_bwd_abstract_eval)
selective_scan_bwd_p.def_impl(_ss_bwd_impl)
mlir.register_lowering(selective_scan_bwd_p, _ss_bwd_fallback_rule)
if _ffi.HAS_CPU:
    mlir.register_lowering(selective_scan_bwd_p, _ss_bwd_cpu_rule, platform="cpu")
if _ffi.HAS_CUDA:
    mlir.register_lowering(selective_scan_bwd_p, _ss_bwd_cuda_rule, platform="cuda")
batching.primitive_batchers[selective_scan_bwd_p] = _fold_batcher(
    selective_scan_bwd_p, _PRIMAL_KINDS + ("bdl", "bdn", "bdn", "bdl"), _PRIMAL_KINDS)


# --- partitioning: the batch and the channels split across devices under jit ----------------
#
# Under jit over several devices the forward and backward kernel calls go through
# custom_partitioning (_partitioning.py says why). The batch and the channels pass through, so
# each device runs its own (batch row, channel) block: the channels only when they split into
# equal blocks of whole B / C groups (a varying B / C with one group is then on every device of
# a batch block; with G groups, G / shards of them on each); L and N are gathered
# (sharded_selective_scan splits L). The backward's gradients that sum over what a device does
# not hold (A, D, delta_bias, time-invariant B / C over the batch; a one-group B / C over the
# channels) are summed by a psum in the per-device call, in the all-reduce's fixed order
# (reproducible, but not bitwise one device's sums). The *_kernel_p primitives are the kernel
# calls on one device's part; they exist only inside these lowerings.

def _kernel_prim(name, abstract_eval, rules):
    p = Primitive(name)
    p.multiple_results = True
    p.def_abstract_eval(abstract_eval)
    for platform, rule in rules.items():
        mlir.register_lowering(p, rule, platform=platform)
    return p


_fwd_rules: dict = {None: _ss_fallback_rule, **({"cpu": _ss_cpu_rule} if _ffi.HAS_CPU else {}),
              **({"cuda": _ss_cuda_rule} if _ffi.HAS_CUDA else {})}
_bwd_rules: dict = {None: _ss_bwd_fallback_rule, **({"cpu": _ss_bwd_cpu_rule} if _ffi.HAS_CPU else {}),
              **({"cuda": _ss_bwd_cuda_rule} if _ffi.HAS_CUDA else {})}
selective_scan_kernel_p = _kernel_prim("jax_selscan_selective_scan_kernel", _ss_abstract_eval, _fwd_rules)
selective_scan_bwd_kernel_p = _kernel_prim("jax_selscan_selective_scan_bwd_kernel", _ss_bwd_abstract_eval,
                                           _bwd_rules)


def _roles(aval, kind):
    """What each dimension of an operand or result of this kind is: "b" (batch), "d"
    (channels), "g" (B / C groups) or None (gathered). A placeholder has none."""
    if aval.shape == (0,):
        return [None]
    if kind in ("bdl", "bdn", "bdk"):
        return ["b", "d", None]
    if kind in ("dn", "d"):
        return ["d", None][:aval.ndim]
    if kind == "bc":
        return ["d", None] if aval.ndim == 2 else ["b", "g", None, None]
    raise ValueError(kind)


def _split_rule(prim, kernel, in_kinds, out_kinds):
    def rule(ctx, *ops, **params):
        call = lambda *xs: tuple(kernel.bind(*xs, **params))
        if not _partitioning.applies(ctx, prim):
            return mlir.lower_fun(lambda *xs: list(call(*xs)), multiple_results=True)(ctx, *ops)
        ins = [(av, _roles(av, k)) for av, k in zip(ctx.avals_in, in_kinds(params))]
        outs = [(av, _roles(av, k)) for av, k in zip(ctx.avals_out, out_kinds(params))]
        whole = []

        def factors(items, tag):
            terms = []
            for i, (av, roles) in enumerate(items):
                fs = [r if r in ("b", "d") else f"{tag}{i}x{j}" for j, r in enumerate(roles)]
                whole.extend(f for f in fs if f not in ("b", "d"))
                terms.append(" ".join(fs))
            return ", ".join(terms)

        sharding_rule = factors(ins, "i") + " -> " + factors(outs, "o")
        u, B, C = ctx.avals_in[0], ctx.avals_in[3], ctx.avals_in[4]

        def partition(mesh, arg_shapes):
            spec = _partitioning.spec_of(arg_shapes[0].sharding, 3)  # u's layout
            batch, chan = spec[0], spec[1]
            nchan = _partitioning.axis_size(mesh, chan)
            groups = [x.shape[1] for x in (B, C) if x.ndim == 4]
            if u.shape[1] % nchan or any(g > 1 and g % nchan for g in groups):
                chan = None  # channel blocks that would cut a group: gathered
            if u.shape[0] % _partitioning.axis_size(mesh, batch):
                batch = None

            def layout(av, roles):
                """(sharding, mesh axes its gradient / result sums over) of one operand or result."""
                ent = {"b": batch, "d": chan, "g": chan if av.ndim == 4 and av.shape[1] > 1 else None}
                entries = [ent.get(r) if r else None for r in roles][:av.ndim]
                held = set(r for r in roles if r)
                over = [e for r, e in (("b", batch), ("d", chan)) if e is not None and r not in held
                        and not (r == "d" and "g" in held and av.shape[1] > 1)]
                return _partitioning.named(mesh, entries), over

            in_sh = tuple(layout(av, r)[0] for av, r in ins)
            out_l = [layout(av, r) for av, r in outs]
            sums = [tuple(a for e in over for a in (e if isinstance(e, tuple) else (e,))) if av.shape != (0,) else ()
                    for (av, _), (_, over) in zip(outs, out_l)]

            def per_device(*xs):
                res = call(*xs)
                return tuple(lax.psum(r, ax) if ax else r for r, ax in zip(res, sums))

            # the forward's results all hold the batch and channels: nothing to sum
            return per_device, tuple(sh for sh, _ in out_l), in_sh

        return _partitioning.lower_partitioned(ctx, ops, call, sharding_rule, partition, whole)
    return rule


_fwd_in = lambda params: _PRIMAL_KINDS
_fwd_out = lambda params: _OUT_KINDS + (("bdk",) if params.get("ckpt_row", 0) else ())
_bwd_in = lambda params: _PRIMAL_KINDS + ("bdl", "bdn", "bdn", "bdk")
_bwd_out = lambda params: _PRIMAL_KINDS

PARTITIONED = ((_ffi.HAS_CPU or _ffi.HAS_CUDA) and _partitioning.declare(selective_scan_p)
               and _partitioning.declare(selective_scan_bwd_p))
for _platform in [p for p in ("cpu", "cuda") if p in _fwd_rules]:
    mlir.register_lowering(selective_scan_p, _split_rule(selective_scan_p, selective_scan_kernel_p,
                                                         _fwd_in, _fwd_out), platform=_platform)
    mlir.register_lowering(selective_scan_bwd_p, _split_rule(selective_scan_bwd_p, selective_scan_bwd_kernel_p,
                                                             _bwd_in, _bwd_out), platform=_platform)
