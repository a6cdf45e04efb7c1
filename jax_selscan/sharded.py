"""linear_scan with the scanned axis split across devices (jax.shard_map).

Each device scans its own chunk from a zero state with our kernel, keeping the running
product of `a` (return_a_prod); the chunks' totals (product of a, last state) are gathered
along the mesh axis and folded, in scan order, from h0 into each chunk's incoming state;
each device then adds `a_prod * carry` to its chunk:

    h[t] = A_chunk[t] * carry_in + h_chunk[t]    (A_chunk: the product of a since the chunk began)

The fold over the totals is itself a linear_scan over the gathered (devices, ...) arrays, in the
same operand order as the recurrence (the pair operator is not commutative), so reverse scans
fold from the last device. Every device computes the same fold in the same order: the
results do not depend on timing. Communication: one all_gather of two state-sized arrays
per call; the backward pass (through shard_map's own transposes) moves the same again.

Numerics: the result differs from one unsplit scan by rounding only (the carry enters through
one multiply-add instead of through the recurrence). 16-bit inputs are scanned in float32 on
each device and rounded once at the end, as the kernels' own float32 state does. Where a
chunk's product of `a` underflows to 0 and the carry is infinite, 0 * inf gives NaN where the
sequential recurrence keeps the infinity (as lax.associative_scan does too).
"""
from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, PartitionSpec

from ._checks import check_array, check_bool, normalize_axis, result_dtype, state_dtype
from .linear_scan import linear_scan
from .primitives import ALGORITHMS

__all__ = ["sharded_linear_scan"]


def _seq_axis_name(spec, axis, mesh):
    """The one mesh axis name that splits the scanned axis (None: it is not split)."""
    entry = spec[axis] if axis < len(spec) else None
    if entry is None:
        return None
    names = entry if isinstance(entry, tuple) else (entry,)
    if len(names) != 1:
        raise ValueError(f"spec[{axis}] (the scanned axis) must name at most one mesh axis, got {entry!r}")
    if names[0] not in mesh.axis_names:
        raise ValueError(f"spec[{axis}] names {names[0]!r}, which is not an axis of the mesh {mesh.axis_names}")
    return names[0]


def sharded_linear_scan(a, b, *, mesh, spec, axis=0, reverse=False, h0=None, return_a_prod=False,
                        algorithm="auto"):
    """linear_scan over arrays laid out on `mesh` by the PartitionSpec `spec`.

    `spec` gives a and b's (and the result's) sharding; its entry for `axis` may name one mesh
    axis, which then splits the scanned axis into contiguous chunks, one per device along it,
    in device order. Other entries shard the independent dimensions as usual. h0 (default
    zeros) has the result's shape without `axis` and the matching spec. Returns h, or
    (h, a_prod) with return_a_prod=True, laid out as a and b. Differentiable, jittable and
    vmappable like linear_scan; `algorithm` is passed to each device's kernel.
    """
    check_array("a", a)
    check_array("b", b)
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"spec must be a jax.sharding.PartitionSpec, got {type(spec).__name__}")
    dtype = result_dtype(a=a, b=b)
    if np.shape(a) != np.shape(b):
        raise ValueError(f"a and b must have the same shape, got a{tuple(np.shape(a))} and b{tuple(np.shape(b))}")
    shape = tuple(np.shape(a))
    if len(shape) == 0:
        raise ValueError("a and b must have at least one dimension (the scanned axis)")
    if len(spec) > len(shape):
        raise ValueError(f"spec {spec} has more entries than a and b have dimensions ({len(shape)})")
    axis = normalize_axis(axis, len(shape))
    reverse = check_bool("reverse", reverse)
    return_a_prod = check_bool("return_a_prod", return_a_prod)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not one of {ALGORITHMS}")
    seq = _seq_axis_name(spec, axis, mesh)
    if seq is not None and shape[axis] % mesh.shape[seq] != 0:
        raise ValueError(f"axis {axis} has length {shape[axis]}, which mesh axis {seq!r} "
                         f"({mesh.shape[seq]} devices) does not divide into equal chunks")
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    state_spec = PartitionSpec(*(entries[:axis] + entries[axis + 1:]))
    state_shape = shape[:axis] + shape[axis + 1:]
    if h0 is None:
        h0 = jnp.zeros(state_shape, dtype)
    else:
        check_array("h0", h0)
        dtype = result_dtype(a=a, b=b, h0=h0)
        if tuple(np.shape(h0)) != state_shape:
            raise ValueError(f"h0 must have shape {state_shape} (the result's shape without axis {axis}), "
                             f"got {tuple(np.shape(h0))}")
    sdt = state_dtype(dtype)

    def local(a, b, h0):
        a, b, h0 = (jnp.asarray(x, sdt) for x in (a, b, h0))
        if seq is None:  # the scanned axis is whole on every device
            outs = linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=return_a_prod,
                               algorithm=algorithm)
            return tuple(o.astype(dtype) for o in outs) if return_a_prod else (outs.astype(dtype),)
        h, p = linear_scan(a, b, axis=axis, reverse=reverse, return_a_prod=True, algorithm=algorithm)
        last = 0 if reverse else a.shape[axis] - 1  # the chunk's last element in scan order
        tot_a = lax.index_in_dim(p, last, axis, keepdims=False)
        tot_h = lax.index_in_dim(h, last, axis, keepdims=False)
        all_a = lax.all_gather(tot_a, seq)  # (devices, *state), in device order
        all_h = lax.all_gather(tot_h, seq)
        # the state after each chunk, folded from h0 in scan order; a chunk's carry is the
        # state after its predecessor in scan order (h0 for the first)
        inc_h, inc_a = linear_scan(all_a, all_h, axis=0, reverse=reverse, h0=h0, return_a_prod=True)
        ones = jnp.ones((1,) + inc_a.shape[1:], sdt)
        if reverse:
            ex_h = jnp.concatenate([inc_h[1:], h0[None]], axis=0)
            ex_a = jnp.concatenate([inc_a[1:], ones], axis=0)
        else:
            ex_h = jnp.concatenate([h0[None], inc_h[:-1]], axis=0)
            ex_a = jnp.concatenate([ones, inc_a[:-1]], axis=0)
        i = lax.axis_index(seq)
        carry_h = jnp.expand_dims(lax.dynamic_index_in_dim(ex_h, i, 0, keepdims=False), axis)
        h = p * carry_h + h
        if not return_a_prod:
            return (h.astype(dtype),)
        carry_a = jnp.expand_dims(lax.dynamic_index_in_dim(ex_a, i, 0, keepdims=False), axis)
        return h.astype(dtype), (p * carry_a).astype(dtype)

    nout = 2 if return_a_prod else 1
    f = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, state_spec), out_specs=(spec,) * nout,
                      check_vma=False)
    outs = f(jnp.asarray(a, dtype), jnp.asarray(b, dtype), jnp.asarray(h0, dtype))
    return tuple(outs) if return_a_prod else outs[0]
