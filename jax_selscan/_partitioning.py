"""The mechanics shared by the primitives' partitioning rules (primitives.py and
selective_scan_primitives.py hold the rules themselves).

A custom call is opaque to XLA's partitioners: given sharded operands they gather them onto
every device, which then computes the whole array. So, under jit over several devices, a
kernel's lowering wraps the call in jax.experimental.custom_partitioning, which tells the
partitioner which dimensions pass through and gives it the per-device call.
"""
from __future__ import annotations

from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec

__all__ = ["declare", "applies", "spec_of", "named", "axis_size", "lower_partitioned"]

_DECLARED: set = set()


def declare(prim) -> bool:
    """Declare that lowering `prim` needs the device assignment (custom_partitioning's lowering
    builds the mesh from it). JAX has no public way to say so; this is the package's one use
    of jax._src. Returns False where this jax lacks the hook: the primitive then lowers
    unpartitioned, as XLA would without the rule."""
    try:
        from jax._src import dispatch
        dispatch.prim_requires_devices_during_lowering.add(prim)
    except (ImportError, AttributeError):
        return False
    _DECLARED.add(prim)
    return True


def applies(ctx, prim) -> bool:
    """Whether the lowering in `ctx` of `prim` is for several devices with a known assignment:
    not inside shard_map (its body is partitioned by hand), not when lowering for another
    platform (JAX lowers without devices then), not for one device."""
    ac = ctx.module_context.axis_context
    if prim not in _DECLARED or hasattr(ac, "manual_axes"):
        return False
    return getattr(ac, "num_devices", 1) > 1 and getattr(ac, "device_assignment", None) is not None


def spec_of(sharding, ndim):
    """A NamedSharding's spec as a list of ndim entries; all None for any other sharding."""
    if not isinstance(sharding, NamedSharding):
        return [None] * ndim
    spec = list(sharding.spec)
    return spec + [None] * (ndim - len(spec))


def named(mesh, entries):
    return NamedSharding(mesh, PartitionSpec(*entries))


def axis_size(mesh, entry) -> int:
    """How many blocks a PartitionSpec entry (None, a mesh axis name, or a tuple of them) cuts
    a dimension into on `mesh`."""
    if entry is None:
        return 1
    size = 1
    for name in entry if isinstance(entry, tuple) else (entry,):
        size *= mesh.shape[name]
    return size


def lower_partitioned(ctx, ops, call, rule, partition, replicated):
    """Lower call(*ops) through custom_partitioning: `rule` is Shardy's einsum-like rule,
    `replicated` the factors that must stay whole, `partition(mesh, arg_shapes)` returns
    (per-device function, result shardings, operand shardings)."""
    f = custom_partitioning(call)

    def part(mesh, arg_shapes, result_shape):
        fn, results, operands = partition(mesh, arg_shapes)
        return mesh, fn, results, operands

    f.def_partition(partition=part,
                    infer_sharding_from_operands=lambda mesh, arg_shapes, _: partition(mesh, arg_shapes)[1],
                    sharding_rule=rule, need_replication_factors=tuple(replicated))
    return mlir.lower_fun(lambda *xs: list(f(*xs)), multiple_results=True)(ctx, *ops)
