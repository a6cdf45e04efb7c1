"""linear_scan and selective_scan with the scanned axis split across devices (jax.shard_map).

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

selective_scan, the same pattern per (batch, d, n) state: a chunk's effect on the state that
enters it is multiplication by exp(A * sum of its dt), so the totals are that decay and the
chunk's last state from zero (a first kernel pass); the chunk is then scanned again from its
true incoming state (a second pass, which also applies D and the gate exactly). Twice the
kernel work of one unsplit pass, spread over the devices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array, lax
from jax.sharding import Mesh, PartitionSpec

from ._checks import ArrayInput, state_dtype
from ._partitioning import axis_size
from . import primitives
from .linear_scan import linear_scan, prepare
from .selective_scan import LastState, _validate, selective_scan
from .selective_scan_primitives import Direction

__all__ = ["sharded_linear_scan", "sharded_selective_scan"]


def _seq_axis_name(spec, axis):
    """The one mesh axis name that splits the scanned axis (None: it is not split)."""
    entry = spec[axis] if axis < len(spec) else None
    if entry is None:
        return None
    names = entry if isinstance(entry, tuple) else (entry,)
    if len(names) != 1:
        raise ValueError(f"spec[{axis}] (the scanned axis) must name at most one mesh axis, got {entry!r}")
    return names[0]  # a known axis: _check_divides, called first, checked every name


def _check_divides(name, shape, spec, mesh):
    """Every dimension that `spec` shards must split into equal blocks (shard_map's rule), said
    with the argument and dimension named."""
    for i, entry in enumerate(tuple(spec)[:len(shape)]):
        if entry is None:
            continue
        names = entry if isinstance(entry, tuple) else (entry,)
        for n in names:
            if n not in mesh.axis_names:
                raise ValueError(f"spec[{i}] names {n!r}, which is not an axis of the mesh {mesh.axis_names}")
        size = axis_size(mesh, entry)
        if shape[i] % size:
            raise ValueError(f"{name} has length {shape[i]} on axis {i}, which mesh axis {entry!r} "
                             f"({size} devices) does not divide into equal chunks")


def _fold_carries(tot_a, tot_h, h0, seq, reverse):
    """Each chunk's incoming state, given every device's chunk totals (the product of a over the
    chunk, its last state from zero) and h0: the gathered totals folded from h0 in scan order
    (a linear_scan over the devices, in the recurrence's operand order). Also the state after
    the whole sequence and the product of a over the chunks before this one."""
    all_a = lax.all_gather(tot_a, seq)  # (devices, *state), in device order
    all_h = lax.all_gather(tot_h, seq)
    inc_h, inc_a = linear_scan(all_a, all_h, axis=0, reverse=reverse, h0=h0, return_a_prod=True)
    ones = jnp.ones((1,) + inc_a.shape[1:], inc_a.dtype)
    if reverse:
        ex_h = jnp.concatenate([inc_h[1:], h0[None]], axis=0)
        ex_a = jnp.concatenate([inc_a[1:], ones], axis=0)
        end = inc_h[0]
    else:
        ex_h = jnp.concatenate([h0[None], inc_h[:-1]], axis=0)
        ex_a = jnp.concatenate([ones, inc_a[:-1]], axis=0)
        end = inc_h[-1]
    i = lax.axis_index(seq)
    return (lax.dynamic_index_in_dim(ex_h, i, 0, keepdims=False), end,
            lax.dynamic_index_in_dim(ex_a, i, 0, keepdims=False))


def split_scan(a, b, h0, *, seq, axis, reverse, return_a_prod, algorithm):
    """One device's part of a scan whose axis is split along mesh axis `seq` (inside shard_map,
    or the per-device call of linear_scan's partitioning rule): its chunk scanned from zero,
    the chunks' totals folded, the carry added. Returns (h,) or (h, a_prod) in a's dtype."""
    dtype = a.dtype
    sdt = state_dtype(dtype)
    a, b, h0 = (jnp.asarray(x, sdt) for x in (a, b, h0))
    h, p = linear_scan(a, b, axis=axis, reverse=reverse, return_a_prod=True, algorithm=algorithm)
    last = 0 if reverse else a.shape[axis] - 1  # the chunk's last element in scan order
    tot_a = lax.index_in_dim(p, last, axis, keepdims=False)
    tot_h = lax.index_in_dim(h, last, axis, keepdims=False)
    carry_h, _, carry_a = _fold_carries(tot_a, tot_h, h0, seq, reverse)
    h = p * jnp.expand_dims(carry_h, axis) + h
    if not return_a_prod:
        return (h.astype(dtype),)
    return h.astype(dtype), (p * jnp.expand_dims(carry_a, axis)).astype(dtype)


def sharded_linear_scan(a: ArrayInput, b: ArrayInput, *, mesh: Mesh, spec: PartitionSpec, axis: int = 0,
                        reverse: bool = False, h0: ArrayInput | None = None, return_a_prod: bool = False,
                        algorithm: primitives.Algorithm = "auto") -> Array | tuple[Array, Array]:
    """linear_scan over arrays laid out on `mesh` by the PartitionSpec `spec`.

    `spec` gives a and b's (and the result's) sharding; its entry for `axis` may name one mesh
    axis, which then splits the scanned axis into contiguous chunks, one per device along it,
    in device order. Other entries shard the independent dimensions as usual. h0 (default
    zeros) has the result's shape without `axis` and the matching spec; a and b broadcast as for
    linear_scan. Returns h, or (h, a_prod) with return_a_prod=True, laid out as a and b.
    Differentiable, jittable and vmappable like linear_scan; `algorithm` is passed to each
    device's kernel.
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"spec must be a jax.sharding.PartitionSpec, got {type(spec).__name__}")
    a, b, h0, axis, reverse, return_a_prod = prepare(a, b, axis=axis, reverse=reverse, h0=h0,
                                                     return_a_prod=return_a_prod, algorithm=algorithm)
    shape = a.shape
    if len(spec) > len(shape):
        raise ValueError(f"spec {spec} has more entries than a and b have dimensions ({len(shape)})")
    _check_divides("a", shape, spec, mesh)
    seq = _seq_axis_name(spec, axis)
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    state_spec = PartitionSpec(*(entries[:axis] + entries[axis + 1:]))

    def local(a, b, h0):
        if seq is None:  # the scanned axis is whole on every device
            outs = linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=return_a_prod,
                               algorithm=algorithm)
            return outs if return_a_prod else (outs,)
        return split_scan(a, b, h0, seq=seq, axis=axis, reverse=reverse, return_a_prod=return_a_prod,
                          algorithm=algorithm)

    nout = 2 if return_a_prod else 1
    f = jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, state_spec), out_specs=(spec,) * nout,
                      check_vma=False)
    outs = f(a, b, h0)
    return tuple(outs) if return_a_prod else outs[0]


def sharded_selective_scan(u: ArrayInput, delta: ArrayInput, A: ArrayInput, B: ArrayInput, C: ArrayInput,
                           D: ArrayInput | None = None, z: ArrayInput | None = None,
                           delta_bias: ArrayInput | None = None, delta_softplus: bool = False,
                           return_last_state: bool = False, h0: ArrayInput | None = None,
                           direction: Direction = "forward", *, mesh: Mesh, spec: PartitionSpec
                           ) -> Array | tuple[Array, LastState]:
    """selective_scan over arrays laid out on `mesh`: `spec` is the PartitionSpec of u, delta, z
    and the output, (batch, D, L). Its L entry may name one mesh axis, which then splits the
    sequence into one contiguous chunk per device; its D entry may shard the channels (grouped
    B / C then need G = 1 or G divisible by that axis's size). Every other argument is laid out
    to match (A, D, delta_bias by channel; B, C by batch, group and L; h0 and the last state by
    batch and channel). Same arguments and results as selective_scan, to rounding (for
    "bidirectional" with 16-bit inputs the two directions' outputs are added in u's dtype).
    """
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"spec must be a jax.sharding.PartitionSpec, got {type(spec).__name__}")
    args = _validate(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, h0, direction)
    batch, dim, length = args.u.shape
    if len(spec) > 3:
        raise ValueError(f"spec {spec} has more entries than u has dimensions (batch, D, L)")
    sb, sd, sl = tuple(spec) + (None,) * (3 - len(spec))
    _check_divides("u", args.u.shape, spec, mesh)
    seq = _seq_axis_name(spec, 2)
    nd = axis_size(mesh, sd)

    def bc_spec(name, x):
        if x.ndim == 2:  # (D, N): time-invariant
            return PartitionSpec(sd, None)
        groups = x.shape[1]
        if sd is not None and groups > 1 and groups % nd != 0:
            raise ValueError(f"{name} has {groups} groups, which the {nd} shards of D (spec entry {sd!r}) "
                             "do not divide: each shard's channels must hold whole groups")
        return PartitionSpec(sb, sd if groups > 1 else None, None, sl)

    chan = PartitionSpec(sd)
    state = PartitionSpec(sb, sd, None)
    h0 = args.h0 if args.h0 is not None else jnp.zeros((batch, dim, args.A.shape[1]), args.compute_dtype)
    opt = {k: getattr(args, k) for k in ("D", "z", "delta_bias")}
    present = [k for k, v in opt.items() if v is not None]
    opt_specs = {"D": chan, "z": spec, "delta_bias": chan}
    softplus = args.delta_softplus

    def scan_dir(u, delta, A, B, C, kw, h0, direction):
        """(out, last) of one direction on this device's chunk, from the true incoming state."""
        if seq is None:
            return selective_scan(u, delta, A, B, C, **kw, delta_softplus=softplus, return_last_state=True,
                                  h0=h0, direction=direction)
        rev = direction == "reverse"
        # first pass: the chunk's last state from zero (no D, no gate: only the state is used)
        _, last0 = selective_scan(u, delta, A, B, C, delta_bias=kw.get("delta_bias"), delta_softplus=softplus,
                                  return_last_state=True, direction=direction)
        dt = delta.astype(last0.dtype)
        if kw.get("delta_bias") is not None:
            dt = dt + kw["delta_bias"].astype(dt.dtype)[:, None]
        if softplus:
            dt = jax.nn.softplus(dt)
        decay = jnp.exp(jnp.sum(dt, axis=-1)[..., None] * A.astype(dt.dtype))  # (batch, D, N)
        carry, end, _ = _fold_carries(decay, last0, h0.astype(last0.dtype), seq, rev)
        out, _ = selective_scan(u, delta, A, B, C, **kw, delta_softplus=softplus, return_last_state=True,
                                h0=carry, direction=direction)
        return out, end

    def local(u, delta, A, B, C, h0, *opts):
        kw = dict(zip(present, opts))
        if args.direction != "bidirectional":
            return scan_dir(u, delta, A, B, C, kw, h0, args.direction)
        out_f, last_f = scan_dir(u, delta, A, B, C, kw, h0, "forward")
        out_r, last_r = scan_dir(u, delta, A, B, C, kw, h0, "reverse")
        return out_f + out_r, (last_f, last_r)

    last_spec = (state, state) if args.direction == "bidirectional" else state
    f = jax.shard_map(local, mesh=mesh, check_vma=False,
                      in_specs=(spec, spec, PartitionSpec(sd, None), bc_spec("B", args.B), bc_spec("C", args.C),
                                state) + tuple(opt_specs[k] for k in present),
                      out_specs=(spec, last_spec))
    out, last = f(args.u, args.delta, args.A, args.B, args.C, h0, *(opt[k] for k in present))
    return (out, last) if args.return_last_state else out
