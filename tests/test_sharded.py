"""sharded_linear_scan / sharded_selective_scan: the sequence split across 4 CPU devices,
against the float64 loops.

The tests need 4 devices. XLA makes them only if --xla_force_host_platform_device_count is set
before JAX starts, so when this process has fewer, one test reruns this file in a subprocess
with the flag (and its failures are that test's). JAX_SELSCAN_SHARDED_PLATFORM=gpu runs the
same tests on 4 GPUs instead (scripts/gpu_check.sh, stage sharded_gpu, on a 4-GPU machine).
"""
import contextlib
import os
import re
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.test_util import check_grads

from jax_selscan import _partitioning, primitives, selective_scan
from jax_selscan import selective_scan_primitives as ssp
from jax_selscan import linear_scan, selective_scan_ref, sharded_linear_scan, sharded_selective_scan
from references import selective_scan_np
from test_linear_scan import DTYPES, assert_close, np_linear_scan, random_inputs
import test_selective_scan as tss

NDEV = 4
PLATFORM = os.environ.get("JAX_SELSCAN_SHARDED_PLATFORM", "cpu")


def devices():
    """The first NDEV devices of PLATFORM (fewer, or none, where it has fewer)."""
    try:
        return jax.devices(PLATFORM)[:NDEV]
    except RuntimeError:  # no such platform in this process
        return []


HAVE = len(devices()) >= NDEV
needs_devices = pytest.mark.skipif(not HAVE, reason=f"needs 4 {PLATFORM} devices (CPU: run by "
                                   "test_suite_with_4_cpu_devices)")


@pytest.mark.skipif(HAVE or PLATFORM != "cpu", reason="the tests below run in this process")
def test_suite_with_4_cpu_devices():
    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={NDEV}"
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.basename(__file__)],
                       cwd=os.path.dirname(os.path.abspath(__file__)), env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    skipped = re.search(r"(\d+) skipped", last)  # only this test skips itself there
    assert re.search(r"\d+ passed", last) and (not skipped or skipped.group(1) == "1"), r.stdout[-2000:]


def seq_mesh():
    return Mesh(np.array(devices()), ("seq",))


def grid_mesh():
    return Mesh(np.array(devices()).reshape(2, 2), ("data", "seq"))


# (shape, axis, spec, mesh): rows (the scanned axis last), strided (channels after it), the
# batch sharded too, and a mesh axis that leaves the scanned axis whole
LAYOUTS = {
    "rows": ((3, 32), 1, P(None, "seq"), seq_mesh),
    "strided": ((32, 5), 0, P("seq", None), seq_mesh),
    "rank3_axis1": ((2, 16, 3), 1, P(None, "seq", None), seq_mesh),
    "grid": ((4, 24, 3), 1, P("data", "seq"), grid_mesh),
    "seq_whole": ((4, 10), 1, P("seq", None), seq_mesh),
}


def check_values(dtype, layout, reverse, with_h0):
    shape, axis, spec, mesh = LAYOUTS[layout]
    rng = np.random.default_rng(zlib.crc32(f"{layout} {reverse} {with_h0} {np.dtype(dtype)}".encode()))
    a, b, h0 = random_inputs(rng, shape, dtype, axis=axis, with_h0=with_h0)
    f = jax.jit(lambda a, b, h0: sharded_linear_scan(a, b, mesh=mesh(), spec=spec, axis=axis, reverse=reverse,
                                                     h0=h0, return_a_prod=True))
    h, p = f(a, b, h0)
    f64 = lambda x: None if x is None else np.asarray(x).astype(np.complex128 if np.iscomplexobj(x) else np.float64)
    want_h, want_p = np_linear_scan(f64(a), f64(b), axis, reverse, f64(h0), return_a_prod=True)
    assert h.dtype == a.dtype and p.dtype == a.dtype and h.shape == a.shape
    assert_close(h, want_h, dtype)
    assert_close(p, want_p, dtype)
    assert h.sharding.is_equivalent_to(NamedSharding(mesh(), spec), h.ndim)  # laid out as the inputs
    # h alone (another compilation: equal to rounding, not bitwise)
    assert_close(sharded_linear_scan(a, b, mesh=mesh(), spec=spec, axis=axis, reverse=reverse, h0=h0), want_h, dtype)


@needs_devices
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("reverse", [False, True])
def test_dtypes_against_float64_loop(dtype, reverse):
    check_values(dtype, "rows", reverse, with_h0=True)


@needs_devices
@pytest.mark.parametrize("layout", [k for k in LAYOUTS if k != "rows"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_layouts_against_float64_loop(layout, reverse, with_h0):
    check_values(np.float32, layout, reverse, with_h0)


@needs_devices
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients(reverse):
    rng = np.random.default_rng(7)
    a, b, h0 = random_inputs(rng, (3, 32), np.float64, axis=1, with_h0=True)
    mesh = seq_mesh()

    def loss(fn, **kw):
        return lambda a, b, h0: jnp.sum(jnp.sin(fn(a, b, axis=1, reverse=reverse, h0=h0, **kw)))

    got = jax.grad(loss(sharded_linear_scan, mesh=mesh, spec=P(None, "seq")), argnums=(0, 1, 2))(a, b, h0)
    want = jax.grad(loss(linear_scan), argnums=(0, 1, 2))(a, b, h0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-12)
    f = jax.jit(lambda a, b, h0: sharded_linear_scan(a, b, mesh=mesh, spec=P(None, "seq"), axis=1, reverse=reverse,
                                                     h0=h0))
    check_grads(f, (a, b, h0), order=1, modes=("fwd", "rev"))


@needs_devices
def test_vmap_and_jit():
    rng = np.random.default_rng(3)
    a, b, _ = random_inputs(rng, (5, 2, 32), np.float32, axis=2)
    f = lambda a, b: sharded_linear_scan(a, b, mesh=seq_mesh(), spec=P(None, "seq"), axis=1)
    got = jax.jit(jax.vmap(f))(a, b)
    for i in range(a.shape[0]):
        assert_close(got[i], np_linear_scan(a[i].astype(np.float64), b[i].astype(np.float64), axis=1), np.float32)


@needs_devices
def test_a_and_b_broadcast_as_for_linear_scan():
    rng = np.random.default_rng(9)
    a = rng.uniform(0.5, 1.0, (1, 32))  # one row of decays for every row of b
    b = rng.standard_normal((3, 32))
    got = sharded_linear_scan(a, b, mesh=seq_mesh(), spec=P(None, "seq"), axis=1, reverse=True)
    np.testing.assert_allclose(got, np_linear_scan(np.broadcast_to(a, b.shape), b, axis=1, reverse=True), rtol=1e-12)


@needs_devices
def test_only_the_chunk_totals_cross_devices():
    # each device scans its chunk with our kernel; the only collectives gather state-sized totals
    a = jnp.ones((8, 1024), jnp.float32)
    f = jax.jit(lambda a, b: sharded_linear_scan(a, b, mesh=seq_mesh(), spec=P(None, "seq"), axis=1))
    text = f.lower(a, a).compile().as_text()
    assert "jax_selscan_linear_scan" in text
    found = gathers(text)
    assert found, "no all-gather in the compiled module"
    for g in found:
        dims = [int(x) for x in re.findall(r"\d+", g.split("[")[1])]
        assert int(np.prod(dims)) <= NDEV * 8, f"an all-gather of {g}: more than the chunk totals"


@needs_devices
@pytest.mark.parametrize("reverse", [False, True])
def test_nan_propagates_across_chunks(reverse):
    rng = np.random.default_rng(11)
    a, b, _ = random_inputs(rng, (2, 32), np.float64, axis=1)
    b[0, 12] = np.nan  # in the second of four chunks
    got = np.asarray(sharded_linear_scan(a, b, mesh=seq_mesh(), spec=P(None, "seq"), axis=1, reverse=reverse))
    want = np_linear_scan(a, b, axis=1, reverse=reverse)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-12)


@needs_devices
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(spec=P(None, "seq"), shape=(2, 30)), ValueError, "does not divide"),
    (dict(spec=P(None, "time")), ValueError, "not an axis of the mesh"),
    (dict(spec=P("seq", None), shape=(3, 32)), ValueError, "a has length 3 on axis 0"),
    (dict(spec=P(None, ("seq", "seq"))), ValueError, "at most one mesh axis"),
    (dict(spec=P(None, "seq", None)), ValueError, "more entries"),
    (dict(spec=(None, "seq")), TypeError, "PartitionSpec"),
    (dict(mesh="seq"), TypeError, "Mesh"),
    (dict(h0_shape=(3,)), ValueError, "h0 must have shape"),
    (dict(b_shape=(2, 16)), ValueError, "broadcast-compatible"),
    (dict(dtype=np.int32), TypeError, "dtype int32"),
])
def test_bad_input_errors_name_the_argument(kwargs, error, match):
    kwargs = dict(kwargs)
    shape = kwargs.pop("shape", (2, 32))
    dtype = kwargs.pop("dtype", np.float32)
    a = np.ones(shape, dtype)
    b = np.ones(kwargs.pop("b_shape", shape), dtype)
    h0 = np.ones(kwargs.pop("h0_shape", shape[:1]), dtype)
    args = dict(mesh=seq_mesh(), spec=P(None, "seq"), axis=1, h0=h0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        sharded_linear_scan(a, b, **args)


# --- plain linear_scan under jit with sharded operands (the primitive's partitioning rule) ----

@contextlib.contextmanager
def rule_off(prim):
    """The primitive lowered as if it had no partitioning rule (what XLA did before them)."""
    _partitioning._DECLARED.discard(prim)
    try:
        yield
    finally:
        _partitioning._DECLARED.add(prim)


def gathers(compiled_text):
    """The result shapes of the compiled module's all-gathers (on GPUs XLA makes them
    asynchronous: the `all-gather-done` of each pair carries the gathered shape)."""
    return re.findall(r"= (\w+\[[\d,]*\])[^\n]*? all-gather(?:-done)?\(", compiled_text)


@needs_devices
@pytest.mark.skipif(not primitives.PARTITIONED, reason="no kernel, or this jax has no hook for the rule")
@pytest.mark.parametrize("shape, axis, spec", [
    ((8, 64), 1, P("seq", None)),            # rows split over the devices
    ((64, 12), 0, P(None, "seq")),           # channels of a strided scan split
    ((4, 32, 6), 1, P("seq", None, None)),
])
@pytest.mark.parametrize("reverse", [False, True])
def test_jit_keeps_independent_dimensions_sharded(shape, axis, spec, reverse):
    rng = np.random.default_rng(zlib.crc32(f"{shape} {reverse}".encode()))
    a, b, h0 = random_inputs(rng, shape, np.float32, axis=axis, with_h0=True)
    state_spec = P(*[e for i, e in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))) if i != axis])
    put = lambda x, sp: jax.device_put(x, NamedSharding(seq_mesh(), sp))
    args = put(a, spec), put(b, spec), put(h0, state_spec)
    f = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=True))
    h, p = f(*args)
    want_h, want_p = np_linear_scan(a.astype(np.float64), b.astype(np.float64), axis, reverse,
                                    h0.astype(np.float64), return_a_prod=True)
    assert_close(h, want_h, np.float32)
    assert_close(p, want_p, np.float32)
    assert h.sharding.is_equivalent_to(NamedSharding(seq_mesh(), spec), len(shape))  # not gathered
    assert not gathers(f.lower(*args).compile().as_text())
    with rule_off(primitives.linear_scan_p):  # the check can fail: without the rule XLA gathers a
        text = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0)).lower(*args)
        text = text.compile().as_text()
    assert f"f32[{','.join(map(str, shape))}]" in gathers(text)
    # and the gradient (scans of the transposed recurrence, partitioned alike)
    loss = lambda a, b, h0: jnp.sum(jnp.sin(linear_scan(a, b, axis=axis, reverse=reverse, h0=h0)))
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    got = g(*args)
    want = jax.grad(loss, argnums=(0, 1, 2))(a.astype(np.float64), b.astype(np.float64), h0.astype(np.float64))
    for x, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(x, np.float64), w, rtol=0, atol=1e-4 * float(np.max(np.abs(w))))
    assert not gathers(g.lower(*args).compile().as_text())


@needs_devices
@pytest.mark.skipif(not primitives.PARTITIONED, reason="no kernel, or this jax has no hook for the rule")
@pytest.mark.parametrize("reverse", [False, True])
def test_jit_with_the_scanned_axis_sharded_scans_it_in_pieces(reverse):
    # the rule splits a scanned axis cut into equal chunks as sharded_linear_scan does: only
    # the chunks' totals cross devices, and the result stays where its chunks are
    rng = np.random.default_rng(5)
    a, b, h0 = random_inputs(rng, (6, 64), np.float32, axis=1, with_h0=True)
    spec = P("data", "seq")
    put = lambda x, sp: jax.device_put(x, NamedSharding(grid_mesh(), sp))
    args = put(a, spec), put(b, spec), put(h0, P("data"))
    f = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=1, reverse=reverse, h0=h0, return_a_prod=True))
    h, p = f(*args)
    want_h, want_p = np_linear_scan(a.astype(np.float64), b.astype(np.float64), 1, reverse, h0.astype(np.float64),
                                    return_a_prod=True)
    assert_close(h, want_h, np.float32)
    assert_close(p, want_p, np.float32)
    assert h.sharding.is_equivalent_to(NamedSharding(grid_mesh(), spec), 2)
    for g in gathers(f.lower(*args).compile().as_text()):  # the totals: (2 devices, 3 rows)
        assert int(np.prod([int(x) for x in re.findall(r"\d+", g.split("[")[1])])) <= 6, g
    loss = lambda a, b, h0: jnp.sum(jnp.sin(linear_scan(a, b, axis=1, reverse=reverse, h0=h0)))
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    want = jax.grad(loss, argnums=(0, 1, 2))(a.astype(np.float64), b.astype(np.float64), h0.astype(np.float64))
    for x, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(x, np.float64), w, rtol=0, atol=1e-4 * float(np.max(np.abs(w))))


# --- plain selective_scan under jit with the batch sharded (its partitioning rule) ----------

@needs_devices
@pytest.mark.skipif(not ssp.PARTITIONED, reason="no kernel, or this jax has no hook for the rule")
@pytest.mark.parametrize("direction, b_kind, options", [
    ("forward", "grouped", True),
    ("reverse", "invariant", True),
    ("bidirectional", "variable", False),
])
def test_jit_selective_scan_keeps_the_batch_sharded(direction, b_kind, options):
    rng = tss.rng_for("jit batch split", direction, b_kind, options)
    x = tss.make_inputs(rng, batch=8, dim=4, dstate=3, length=24, groups=2, b_kind=b_kind, D=options,
                        z=options, delta_bias=options, softplus=options, h0=options, dtype=np.float32)
    mesh = seq_mesh()
    spec = {"u": P("seq"), "delta": P("seq"), "z": P("seq"), "h0": P("seq"),
            "B": P("seq") if b_kind != "invariant" else P(), "C": P("seq")}
    xs = {k: None if v is None else jax.device_put(v, NamedSharding(mesh, spec.get(k, P()))) for k, v in x.items()}
    flags = dict(delta_softplus=options, return_last_state=True, direction=direction)
    f = jax.jit(lambda x: selective_scan(**x, **flags))
    res = f(xs)
    tss.check_scan_result(res, selective_scan_np(**tss.np_args(x), delta_softplus=options, direction=direction),
                          np.dtype(np.float32), direction, True, direction)
    assert res[0].sharding.is_equivalent_to(NamedSharding(mesh, P("seq")), 3)  # each device its batch rows
    assert not gathers(f.lower(xs).compile().as_text())
    with rule_off(ssp.selective_scan_p):  # the check can fail: without the rule XLA gathers u
        text = jax.jit(lambda x: selective_scan(**x, **flags)).lower(xs).compile().as_text()
    assert f"f32[{','.join(map(str, x['u'].shape))}]" in gathers(text)
    # the gradients: per-batch ones stay sharded, the batch sums are all-reduced
    names = [k for k, v in x.items() if v is not None]
    cot = jnp.asarray(rng.standard_normal((8, 4, 24)), np.float32)

    def grads(fn, x):
        loss = lambda *v: jnp.sum(cot * fn(**dict(zip(names, v)), delta_softplus=options, direction=direction))
        return jax.jit(jax.grad(loss, argnums=tuple(range(len(names)))))

    g = grads(selective_scan, xs)
    got = g(*(xs[k] for k in names))
    want = grads(selective_scan_ref, x)(*(jnp.asarray(x[k], jnp.float64) for k in names))
    for k, a, w in zip(names, got, want):
        np.testing.assert_allclose(np.asarray(a, np.float64), w, rtol=0, atol=2e-4 * float(jnp.max(jnp.abs(w))),
                                   err_msg=k)
    assert not gathers(g.lower(*(xs[k] for k in names)).compile().as_text())
    again = g(*(xs[k] for k in names))
    for a, b in zip(got, again):  # reproducible: the all-reduce sums in a fixed order
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@needs_devices
@pytest.mark.skipif(not ssp.PARTITIONED, reason="no kernel, or this jax has no hook for the rule")
@pytest.mark.parametrize("b_kind", ["grouped", "variable", "invariant"])
def test_jit_selective_scan_keeps_batch_and_channels_sharded(b_kind):
    # channels split into blocks of whole groups: grouped B by group, one-group B on every
    # channel block (its gradient summed over them), time-invariant B by channel
    rng = tss.rng_for("jit channel split", b_kind)
    x = tss.make_inputs(rng, batch=4, dim=8, dstate=3, length=16, groups=2, b_kind=b_kind, dtype=np.float32)
    mesh = Mesh(np.array(devices()).reshape(2, 2), ("data", "chan"))
    spec = {"A": P("chan"), "D": P("chan"), "delta_bias": P("chan"), "C": P("data"),
            "B": {"grouped": P("data", "chan"), "variable": P("data"), "invariant": P("chan")}[b_kind]}
    xs = {k: jax.device_put(v, NamedSharding(mesh, spec.get(k, P("data", "chan")))) for k, v in x.items()}
    names = list(x)
    flags = dict(delta_softplus=True, direction="bidirectional")
    f = jax.jit(lambda x: selective_scan(**x, **flags))
    out = f(xs)
    tss.assert_close(out, selective_scan_np(**tss.np_args(x), **flags)[0], tss.TOL[np.dtype(np.float32)])
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "chan")), 3)
    assert not gathers(f.lower(xs).compile().as_text())
    loss = lambda fn: lambda *v: jnp.sum(jnp.sin(fn(**dict(zip(names, v)), **flags)))
    g = jax.jit(jax.grad(loss(selective_scan), argnums=tuple(range(len(names)))))
    got = g(*(xs[k] for k in names))
    want = jax.grad(loss(selective_scan_ref), argnums=tuple(range(len(names))))(
        *(jnp.asarray(x[k], jnp.float64) for k in names))
    for k, a, w in zip(names, got, want):
        np.testing.assert_allclose(np.asarray(a, np.float64), w, rtol=0, atol=2e-4 * float(jnp.max(jnp.abs(w))),
                                   err_msg=k)
    for sh in gathers(g.lower(*(xs[k] for k in names)).compile().as_text()):  # at most a B-sized gradient
        assert int(np.prod([int(v) for v in re.findall(r"\d+", sh.split("[")[1])])) < x["u"].size, sh


# --- sharded_selective_scan ------------------------------------------------------------------

# (spec, mesh, b_kind): the batch split with the sequence; the channels split with the sequence
# (grouped B: each shard holds whole groups); the sequence alone, B / C time-invariant; the
# sequence whole (the channels split)
SS_LAYOUTS = {
    "batch_seq": (P("data", None, "seq"), grid_mesh, "grouped"),
    "dim_seq": (P(None, "data", "seq"), grid_mesh, "grouped"),
    "seq_invariant": (P(None, None, "seq"), seq_mesh, "invariant"),
    "dim_only": (P(None, "seq", None), seq_mesh, "variable"),
}


def check_selective(dtype, layout, direction, options=True):
    spec, mesh, b_kind = SS_LAYOUTS[layout]
    rng = tss.rng_for("sharded", np.dtype(dtype).name, layout, direction, options)
    x = tss.make_inputs(rng, batch=2, dim=4, dstate=3, length=32, groups=2, b_kind=b_kind, D=options,
                        z=options, delta_bias=options, softplus=options, h0=options, dtype=dtype)
    flags = dict(delta_softplus=options, return_last_state=True, direction=direction)
    f = jax.jit(lambda x: sharded_selective_scan(**x, **flags, mesh=mesh(), spec=spec))
    res = f(x)
    want = selective_scan_np(**tss.np_args(x), delta_softplus=options, direction=direction)
    tss.check_scan_result(res, want, np.dtype(dtype), direction, True, f"{layout} {direction}")
    assert res[0].sharding.is_equivalent_to(NamedSharding(mesh(), spec), 3)


@needs_devices
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", ["batch_seq", "dim_seq"])
def test_selective_float32_against_float64_loop(layout, direction):
    check_selective(np.float32, layout, direction)


@needs_devices
@pytest.mark.parametrize("dtype, layout, direction, options", [
    (jnp.bfloat16, "batch_seq", "forward", True),
    (np.float64, "dim_seq", "bidirectional", True),
    (np.float32, "seq_invariant", "reverse", False),
    (np.float32, "dim_only", "bidirectional", True),
])
def test_selective_other_cases(dtype, layout, direction, options):
    check_selective(dtype, layout, direction, options)


@needs_devices
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_selective_gradients_match_the_reference(dtype):
    rng = tss.rng_for("sharded grads", np.dtype(dtype).name)
    x = tss.make_inputs(rng, batch=2, dim=4, dstate=3, length=32, groups=2, dtype=dtype)
    spec, mesh, _ = SS_LAYOUTS["batch_seq"]
    cot = jnp.asarray(rng.standard_normal((2, 4, 32)), dtype)
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")

    def grads(fn, x, **kw):
        loss = lambda *v: jnp.sum(cot * fn(**dict(zip(names, v)), delta_softplus=True, direction="bidirectional",
                                           **kw))
        return jax.jit(jax.grad(loss, argnums=tuple(range(len(names)))))(*(x[k] for k in names))

    got = grads(sharded_selective_scan, x, mesh=mesh(), spec=spec)
    want = grads(selective_scan_ref, {k: jnp.asarray(v, jnp.float64) for k, v in x.items()})
    for k, g, w in zip(names, got, want):  # relative to the gradient's scale
        tol = 1e-10 if dtype == np.float64 else 2e-4
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=0, atol=tol * float(jnp.max(jnp.abs(w))),
                                   err_msg=k)


@needs_devices
@pytest.mark.parametrize("change, error, match", [
    (dict(spec=P(None, "data", "seq"), dim=6, groups=3), ValueError, "groups, which the 2 shards"),
    (dict(length=31), ValueError, "does not divide"),
    (dict(spec=P("data", "seq", None), dim=5, groups=1), ValueError, "u has length 5 on axis 1"),
    (dict(spec=P(None, None, "seq", None)), ValueError, "more entries"),
    (dict(spec=P(None, None, "time")), ValueError, "not an axis of the mesh"),
    (dict(mesh=None), TypeError, "Mesh"),
])
def test_selective_bad_input_errors(change, error, match):
    change = dict(change)
    rng = np.random.default_rng(0)
    x = tss.make_inputs(rng, batch=2, dim=change.pop("dim", 4), dstate=3, length=change.pop("length", 32),
                        groups=change.pop("groups", 2), dtype=np.float32)
    kw = dict(mesh=grid_mesh(), spec=P("data", None, "seq"))
    kw.update(change)
    with pytest.raises(error, match=match):
        sharded_selective_scan(**x, delta_softplus=True, **kw)
