"""The linear_scan primitive and every JAX rule for it, kept in this one module.

(selective_scan's primitives live in selective_scan_primitives.py.)

    h[t] = a[t] * h[t-1] + b[t]   along `axis`, h[-1] = h0      (reverse=False)
    h[t] = a[t] * h[t+1] + b[t]   along `axis`, h[L] = h0       (reverse=True)

Operands: a, b (same shape and dtype), h0 (the shape with `axis` removed).
Results:  [h] or, with return_a_prod, [h, a_prod] where a_prod is the running
product of `a` in scan order. Any rank and axis: the kernels see the array as
(outer, L, inner), so the scanned axis is contiguous when inner == 1 and strided
otherwise. jax.extend promises no stability, so everything that touches it lives here,
with the partitioning rule (custom_partitioning around the kernel call, so that jit keeps
sharded rows and channels on their devices; the shared mechanics in _partitioning.py).
"""
from __future__ import annotations

import functools
from typing import Literal, get_args

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from . import _ffi, _partitioning
from ._checks import state_dtype

# The CUDA kernels linear_scan(..., algorithm=...) can pick; the Literal is the one list.
Algorithm = Literal["auto", "blelloch", "three_pass", "lookback_serial", "lookback_warp",
                    "lookback_regs", "hillis_steele"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)

linear_scan_p = Primitive("jax_selscan_linear_scan")
linear_scan_p.multiple_results = True


def bind(a, b, h0, *, axis, reverse, return_a_prod=False, algorithm="auto"):
    return linear_scan_p.bind(a, b, h0, axis=axis, reverse=reverse,
                              return_a_prod=return_a_prod, algorithm=algorithm)


# --- evaluation outside jit: compile the primitive alone (cached per params) --------

@functools.lru_cache(maxsize=None)
def _jitted(**params):
    return jax.jit(lambda a, b, h0: linear_scan_p.bind(a, b, h0, **params))


def _impl(a, b, h0, **params):
    return _jitted(**params)(a, b, h0)


linear_scan_p.def_impl(_impl)


# --- abstract evaluation ----------------------------------------------------------

def _abstract_eval(a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    if a.shape != b.shape:
        raise ValueError(f"linear_scan: a and b must have the same shape, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype or h0.dtype != a.dtype:
        raise TypeError(f"linear_scan: a, b and h0 must share a dtype, got {a.dtype}, {b.dtype}, {h0.dtype}")
    if not 0 <= axis < a.ndim:
        raise ValueError(f"linear_scan: axis={axis} out of range for rank {a.ndim}")
    expected = a.shape[:axis] + a.shape[axis + 1:]
    if h0.shape != expected:
        raise ValueError(f"linear_scan: h0 must have shape {expected}, got {h0.shape}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"linear_scan: unknown algorithm {algorithm!r}; choose from {ALGORITHMS}")
    out = jax.core.ShapedArray(a.shape, a.dtype)
    return [out, out] if return_a_prod else [out]


linear_scan_p.def_abstract_eval(_abstract_eval)


# --- batching: fold the vmapped dimension into the independent channels ----------

def _batch(args, dims, *, axis, **params):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = [jnp.broadcast_to(x, (size,) + x.shape) if d is None else jnp.moveaxis(x, d, 0)
             for x, d in zip(args, dims)]
    outs = linear_scan_p.bind(*moved, axis=axis + 1, **params)
    return outs, [0] * len(outs)


batching.primitive_batchers[linear_scan_p] = _batch


# --- autodiff ----------------------------------------------------------------------

def _shift_in(x, first, axis, reverse):
    """x moved one step along the scan direction, with `first` entering at the start.

    first has x's shape with `axis` of size 1. Forward: [first, x[0], ..., x[L-2]].
    """
    n = x.shape[axis]
    if n == 0:
        return x
    if reverse:
        return lax.concatenate([lax.slice_in_dim(x, 1, n, axis=axis), first], axis)
    return lax.concatenate([first, lax.slice_in_dim(x, 0, n - 1, axis=axis)], axis)


def _jvp(primals, tangents, *, axis, reverse, return_a_prod, algorithm):
    a, b, h0 = primals
    da, db, dh0 = tangents
    outs = linear_scan_p.bind(a, b, h0, axis=axis, reverse=reverse,
                              return_a_prod=return_a_prod, algorithm=algorithm)
    h = outs[0]
    kw = dict(axis=axis, reverse=reverse, return_a_prod=False, algorithm=algorithm)
    # d h[t] = a[t] dh[t-1] + (da[t] h[t-1] + db[t]): another scan with the same a.
    terms = []
    if type(da) is not ad.Zero:
        terms.append(da * _shift_in(h, jnp.expand_dims(h0, axis), axis, reverse))
    if type(db) is not ad.Zero:
        terms.append(db)
    if not terms and type(dh0) is ad.Zero:
        dh = ad.Zero(jax.core.ShapedArray(h.shape, h.dtype))
    else:
        rhs = functools.reduce(lax.add, terms) if terms else jnp.zeros_like(b)
        dh = linear_scan_p.bind(a, rhs, ad.instantiate_zeros(dh0), **kw)[0]
    if not return_a_prod:
        return outs, [dh]
    # d P[t] = a[t] dP[t-1] + da[t] P[t-1], dP[-1] = 0.
    p = outs[1]
    if type(da) is ad.Zero:
        dp = ad.Zero(jax.core.ShapedArray(p.shape, p.dtype))
    else:
        ones = jnp.ones(p.shape[:axis] + (1,) + p.shape[axis + 1:], p.dtype)
        dp = linear_scan_p.bind(a, da * _shift_in(p, ones, axis, reverse), jnp.zeros_like(h0), **kw)[0]
    return outs, [dh, dp]


def _transpose(cts, a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    """Transpose of the map (b, h0) -> h for a fixed `a`: a scan in the other direction.

    Forward: g[s] = ct[s] + a[s+1] g[s+1]; ct_b = g; ct_h0 = a[0] g[0].
    """
    if ad.is_undefined_primal(a):
        raise NotImplementedError("linear_scan is not linear in a")
    ct = cts[0]
    b_aval = b.aval if ad.is_undefined_primal(b) else jax.typeof(b)
    h0_aval = h0.aval if ad.is_undefined_primal(h0) else jax.typeof(h0)
    if type(ct) is ad.Zero:
        ct_b = ad.Zero(b_aval) if ad.is_undefined_primal(b) else None
        ct_h0 = ad.Zero(h0_aval) if ad.is_undefined_primal(h0) else None
        return [None, ct_b, ct_h0]
    n = a.shape[axis]
    zero = jnp.zeros(a.shape[:axis] + (1,) + a.shape[axis + 1:], a.dtype)
    # a shifted against the scan direction, so that the reverse scan pairs ct[s] with a[s+1].
    a_next = _shift_in(a, zero, axis, not reverse)
    g = linear_scan_p.bind(a_next, ct, jnp.zeros(h0_aval.shape, a.dtype), axis=axis,
                           reverse=not reverse, return_a_prod=False, algorithm=algorithm)[0]
    ct_b = g if ad.is_undefined_primal(b) else None
    ct_h0 = None
    if ad.is_undefined_primal(h0):
        if n == 0:
            ct_h0 = jnp.zeros(h0_aval.shape, h0_aval.dtype)
        else:
            i = n - 1 if reverse else 0
            first = lambda x: lax.index_in_dim(x, i, axis, keepdims=False)
            ct_h0 = first(a) * first(g)
    return [None, ct_b, ct_h0]


ad.primitive_jvps[linear_scan_p] = _jvp
ad.primitive_transposes[linear_scan_p] = _transpose


# --- lowering ------------------------------------------------------------------------

def _combine(earlier, later):
    (a1, b1), (a2, b2) = earlier, later
    return a2 * a1, a2 * b1 + b2


def _fallback(a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    """Pure-JAX lowering for platforms without a kernel (lax.associative_scan)."""
    del algorithm
    dtype = a.dtype
    acc = state_dtype(dtype)
    a, b, h0 = a.astype(acc), b.astype(acc), h0.astype(acc)
    if a.shape[axis] == 0:
        outs = [a.astype(dtype)]
        return outs * 2 if return_a_prod else outs
    i = a.shape[axis] - 1 if reverse else 0
    # Fold h0 into the first element of the scan: b[first] += a[first] * h0.
    b_first = lax.index_in_dim(a, i, axis) * jnp.expand_dims(h0, axis) + lax.index_in_dim(b, i, axis)
    b = lax.dynamic_update_index_in_dim(b, b_first, i, axis)
    p, h = lax.associative_scan(_combine, (a, b), reverse=reverse, axis=axis)
    return [h.astype(dtype), p.astype(dtype)] if return_a_prod else [h.astype(dtype)]


mlir.register_lowering(linear_scan_p, mlir.lower_fun(_fallback, multiple_results=True))


def _ffi_rule(ctx, a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    target = _ffi.LINEAR_SCAN_PROD if return_a_prod else _ffi.LINEAR_SCAN
    return jax.ffi.ffi_lowering(target)(
        ctx, a, b, h0, axis=np.int64(axis), reverse=np.bool_(reverse),
        algorithm=np.int64(ALGORITHMS.index(algorithm)))


def cuda_scratch_bytes(shape, dtype, *, axis, reverse, algorithm):
    """Size of the uint8 scratch result the CUDA handlers take (tile status words, carries).

    Requested from XLA at trace time, not allocated in the call, so that the handlers can be
    captured into command buffers (CUDA graphs). Includes the slack the handler needs to
    align the buffer to 256 bytes; at least 1.
    """
    from . import _cuda
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    n = _cuda.linear_scan_scratch_bytes(np.dtype(dtype).name, outer, shape[axis], inner,
                                        bool(reverse), ALGORITHMS.index(algorithm))
    return n + _cuda.linear_scan_scratch_align() if n else 1


def _ffi_rule_cuda(ctx, a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    """_ffi_rule with one more result, the scratch (last), which is dropped."""
    aval = ctx.avals_in[0]
    n = cuda_scratch_bytes(aval.shape, aval.dtype, axis=axis, reverse=reverse, algorithm=algorithm)
    ctx = ctx.replace(avals_out=[*ctx.avals_out, jax.core.ShapedArray((n,), np.uint8)])
    return _ffi_rule(ctx, a, b, h0, axis=axis, reverse=reverse, return_a_prod=return_a_prod,
                     algorithm=algorithm)[:-1]


# --- partitioning --------------------------------------------------------------------
# Under jit over several devices the kernel call goes through custom_partitioning
# (_partitioning.py says why): every dimension passes through. Each device scans its own rows
# and channels; a scanned axis split into equal chunks over one mesh axis is scanned in pieces
# with one gather of the chunks' totals (sharded.split_scan, as sharded_linear_scan does), any
# other split of it is gathered first. linear_scan_kernel_p is the kernel call on one device's
# part; it exists only inside these lowerings (after every transformation), so it has no
# batching or autodiff rules.

linear_scan_kernel_p = Primitive("jax_selscan_linear_scan_kernel")
linear_scan_kernel_p.multiple_results = True
linear_scan_kernel_p.def_abstract_eval(_abstract_eval)
linear_scan_kernel_p.def_impl(_impl)
mlir.register_lowering(linear_scan_kernel_p, mlir.lower_fun(_fallback, multiple_results=True))


def _kernel_rule(ctx, a, b, h0, *, axis, reverse, return_a_prod, algorithm):
    params = dict(axis=axis, reverse=reverse, return_a_prod=return_a_prod, algorithm=algorithm)
    call = lambda a, b, h0: tuple(linear_scan_kernel_p.bind(a, b, h0, **params))
    rank = len(ctx.avals_in[0].shape)
    if rank == 1 or not _partitioning.applies(ctx, linear_scan_p):  # one device, or nothing to split
        return mlir.lower_fun(lambda *xs: list(call(*xs)), multiple_results=True)(ctx, a, b, h0)
    nout = 2 if return_a_prod else 1
    dims = [f"d{i}" for i in range(rank)]
    full, state = " ".join(dims), " ".join(d for i, d in enumerate(dims) if i != axis)
    rule = f"{full}, {full}, {state} -> " + ", ".join([full] * nout)

    def partition(mesh, arg_shapes):
        """a's sharding; a scanned axis split over one mesh axis into equal chunks is scanned in
        pieces (sharded.split_scan), any other split of it gathered."""
        spec = _partitioning.spec_of(arg_shapes[0].sharding, rank)
        seq = spec[axis]
        seq = seq[0] if isinstance(seq, tuple) and len(seq) == 1 else seq
        if isinstance(seq, tuple) or (seq is not None and arg_shapes[0].shape[axis] % mesh.shape[seq]):
            seq = None
        spec[axis] = seq
        f, s = _partitioning.named(mesh, spec), _partitioning.named(mesh, spec[:axis] + spec[axis + 1:])
        if seq is None:
            return call, (f,) * nout, (f, f, s)
        from .sharded import split_scan  # (sharded.py imports this module)
        return functools.partial(split_scan, seq=seq, **params), (f,) * nout, (f, f, s)

    return _partitioning.lower_partitioned(ctx, (a, b, h0), call, rule, partition, replicated=())


PARTITIONED = (_ffi.HAS_CPU or _ffi.HAS_CUDA) and _partitioning.declare(linear_scan_p)

if _ffi.HAS_CPU:
    mlir.register_lowering(linear_scan_kernel_p, _ffi_rule, platform="cpu")
    mlir.register_lowering(linear_scan_p, _kernel_rule, platform="cpu")
if _ffi.HAS_CUDA:
    mlir.register_lowering(linear_scan_kernel_p, _ffi_rule_cuda, platform="cuda")
    mlir.register_lowering(linear_scan_p, _kernel_rule, platform="cuda")
