"""selective_scan, selective_scan_ref and selective_state_update against float64 NumPy loops."""
from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
import chex
import jax
import jax.numpy as jnp
from absl.testing import parameterized
from jax.test_util import check_grads

jax.config.update("jax_enable_x64", True)

from jax_selscan.selective_scan import selective_scan, selective_state_update  # noqa: E402
from jax_selscan.reference import selective_scan_ref  # noqa: E402

try:
    from references import selective_scan_np, selective_state_update_np
except ImportError:  # tests/ imported as a package
    from tests.references import selective_scan_np, selective_state_update_np

DIRECTIONS = ("forward", "reverse", "bidirectional")
BC_KINDS = ("invariant", "variable", "grouped")
SCANS = {"selective_scan": selective_scan, "selective_scan_ref": selective_scan_ref}

# Tolerances against the float64 NumPy loop, per input dtype, all in one place. The NumPy
# loop sees exactly the (rounded) inputs the code sees, so 16-bit errors come from the
# final rounding of the output to the input dtype; the state is always float32/float64.
F64, F32, BF16, F16 = (np.dtype(jnp.float64), np.dtype(jnp.float32),
                       np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
TOL = {
    F64: dict(rtol=1e-10, atol=1e-10),
    F32: dict(rtol=1e-4, atol=1e-4),
    BF16: dict(rtol=2e-2, atol=2e-2),
    F16: dict(rtol=3e-3, atol=3e-3),
}
STATE_TOL = {F64: TOL[F64], F32: TOL[F32], BF16: TOL[F32], F16: TOL[F32]}  # float32 state


def rng_for(*key):
    """A fresh generator seeded from the test's parameters."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_inputs(rng, *, batch=2, dim=4, dstate=3, length=7, groups=2, b_kind="grouped",
                c_kind="variable", D=True, z=True, delta_bias=True, softplus=True, h0=True,
                dtype=F64):
    """Random inputs (never zeros) as jnp arrays of `dtype`, Mamba-like magnitudes."""
    def bc(kind):
        shape = {"invariant": (dim, dstate), "variable": (batch, dstate, length),
                 "grouped": (batch, groups, dstate, length)}[kind]
        return rng.standard_normal(shape)

    if softplus:
        delta = rng.standard_normal((batch, dim, length)) * 0.5 - 0.5
    else:
        delta = rng.uniform(0.1, 1.0, (batch, dim, length))
    x = dict(
        u=rng.standard_normal((batch, dim, length)),
        delta=delta,
        A=-np.exp(rng.standard_normal((dim, dstate)) * 0.5),
        B=bc(b_kind), C=bc(c_kind),
        D=rng.standard_normal(dim) if D else None,
        z=rng.standard_normal((batch, dim, length)) if z else None,
        delta_bias=rng.uniform(0.0, 0.5, dim) if delta_bias else None,
        h0=rng.standard_normal((batch, dim, dstate)) if h0 else None,
    )
    return {k: (None if v is None else jnp.asarray(v, dtype)) for k, v in x.items()}


def np_args(inputs):
    """The exact input values, as float64 NumPy arrays, for the NumPy loop."""
    return {k: (None if v is None else np.asarray(v, np.float64)) for k, v in inputs.items()}


def assert_close(actual, expected, tol, err_msg=""):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, err_msg=err_msg, **tol)


def check_scan_result(res, expected, dtype, direction, return_last_state, msg=""):
    out_ref, last_ref = expected
    if not return_last_state:
        assert not isinstance(res, tuple), msg
        out = res
    else:
        out, last = res
        if direction == "bidirectional":
            assert isinstance(last, tuple) and len(last) == 2, msg
            pairs = zip(last, last_ref)
        else:
            pairs = [(last, last_ref)]
        for got, want in pairs:
            state_dtype = F64 if dtype == F64 else F32
            assert got.dtype == state_dtype, (msg, got.dtype)
            assert got.shape == want.shape, msg
            assert_close(got, want, STATE_TOL[dtype], msg + " (last state)")
    assert out.dtype == dtype, (msg, out.dtype)
    assert out.shape == out_ref.shape, msg
    assert_close(out, out_ref, TOL[dtype], msg + " (out)")


# --- every option combination, float64 ---------------------------------------------------

@pytest.mark.parametrize("c_kind", BC_KINDS)
@pytest.mark.parametrize("b_kind", BC_KINDS)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_all_options_float64(direction, b_kind, c_kind):
    flags = ("D", "z", "delta_bias", "softplus", "h0")
    for values in itertools.product((False, True), repeat=len(flags)):
        opts = dict(zip(flags, values))
        rng = rng_for("all_options", direction, b_kind, c_kind, values)
        x = make_inputs(rng, b_kind=b_kind, c_kind=c_kind, length=5, **opts)
        expected = selective_scan_np(**np_args(x), delta_softplus=opts["softplus"],
                                     direction=direction)
        # Alternate return_last_state over the combinations (each value meets each flag).
        rls = sum(values) % 2 == 0
        for name, fn in SCANS.items():
            res = fn(**x, delta_softplus=opts["softplus"], return_last_state=rls,
                     direction=direction)
            check_scan_result(res, expected, F64, direction, rls, f"{name} {opts}")


# --- dtypes and lengths -----------------------------------------------------------------------

@pytest.mark.parametrize("b_kind,c_kind", [("grouped", "variable"), ("invariant", "grouped")])
@pytest.mark.parametrize("length", [1, 5])
@pytest.mark.parametrize("dtype", [F32, F64, BF16, F16], ids=lambda d: d.name)
def test_dtypes_and_lengths(dtype, length, b_kind, c_kind):
    rng = rng_for("dtypes", dtype.name, length, b_kind, c_kind)
    x = make_inputs(rng, b_kind=b_kind, c_kind=c_kind, length=length, dtype=dtype)
    for direction in DIRECTIONS:
        expected = selective_scan_np(**np_args(x), delta_softplus=True, direction=direction)
        for name, fn in SCANS.items():
            res = fn(**x, delta_softplus=True, return_last_state=True, direction=direction)
            check_scan_result(res, expected, dtype, direction, True, f"{name} {direction}")


@pytest.mark.parametrize("name", SCANS)
def test_mixed_dtypes_like_mamba(name):
    """bf16 activations with float32 parameters: bf16 output, float32 last state."""
    rng = rng_for("mixed", name)
    x = make_inputs(rng, dtype=F32)
    for k in ("u", "delta", "z"):
        x[k] = x[k].astype(jnp.bfloat16)
    out, last = SCANS[name](**x, delta_softplus=True, return_last_state=True)
    out_ref, last_ref = selective_scan_np(**np_args(x), delta_softplus=True)
    assert out.dtype == BF16 and last.dtype == F32
    assert_close(out, out_ref, TOL[BF16])
    assert_close(last, last_ref, TOL[F32])


@pytest.mark.parametrize("name", SCANS)
def test_empty_sequence(name):
    x = make_inputs(rng_for("empty", name), length=0)
    out, last = SCANS[name](**x, delta_softplus=True, return_last_state=True)
    assert out.shape == (2, 4, 0)
    np.testing.assert_array_equal(last, x["h0"])


# --- structural identities ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.name)
@pytest.mark.parametrize("name", SCANS)
def test_bidirectional_is_forward_plus_reverse(name, dtype):
    fn = SCANS[name]
    x = make_inputs(rng_for("bidir", name, dtype.name), dtype=dtype, length=5)
    kw = dict(delta_softplus=True, return_last_state=True)
    out_f, last_f = fn(**x, direction="forward", **kw)
    out_r, last_r = fn(**x, direction="reverse", **kw)
    out_b, (last_bf, last_br) = fn(**x, direction="bidirectional", **kw)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == F32 else dict(rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(out_b, out_f + out_r, **tol)
    np.testing.assert_allclose(last_bf, last_f, **tol)
    np.testing.assert_allclose(last_br, last_r, **tol)


@pytest.mark.parametrize("dtype", [F32, F64], ids=lambda d: d.name)
@pytest.mark.parametrize("b_kind,c_kind", [("grouped", "variable"), ("variable", "grouped")])
def test_prefix_scan_then_decode_steps(b_kind, c_kind, dtype):
    """A prefix scan's last state followed by selective_state_update steps == one scan."""
    length, prefix = 8, 5
    x = make_inputs(rng_for("decode", b_kind, c_kind, dtype.name), b_kind=b_kind,
                    c_kind=c_kind, length=length, dtype=dtype)
    full_out, full_last = selective_scan(**x, delta_softplus=True, return_last_state=True)

    def at(v, t):          # B/C at time t in the decode layout: (batch, N) or (batch, G, N)
        return v[..., t] if v.ndim == 3 else v[..., t]

    def seq(v, sl):
        return None if v is None else v[..., sl]

    pre = dict(x, u=x["u"][..., :prefix], delta=x["delta"][..., :prefix],
               B=x["B"][..., :prefix], C=x["C"][..., :prefix], z=seq(x["z"], slice(0, prefix)))
    out, state = selective_scan(**pre, delta_softplus=True, return_last_state=True)
    outs = [out]
    for t in range(prefix, length):
        y, state = selective_state_update(
            state, x["u"][..., t], x["delta"][..., t], x["A"], at(x["B"], t), at(x["C"], t),
            D=x["D"], z=x["z"][..., t], dt_bias=x["delta_bias"], dt_softplus=True)
        assert y.dtype == dtype and state.dtype == (F64 if dtype == F64 else F32)
        outs.append(y[..., None])
    tol = TOL[dtype]
    np.testing.assert_allclose(jnp.concatenate(outs, axis=-1), full_out, **tol)
    np.testing.assert_allclose(state, full_last, **tol)


@pytest.mark.parametrize("dtype", [F32, F64, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("grouped", [False, True])
def test_state_update_matches_numpy(grouped, dtype):
    rng = rng_for("state_update", grouped, dtype.name)
    batch, dim, dstate, groups = 2, 4, 3, 2
    bc_shape = (batch, groups, dstate) if grouped else (batch, dstate)
    x = dict(state=rng.standard_normal((batch, dim, dstate)),
             x=rng.standard_normal((batch, dim)), dt=rng.standard_normal((batch, dim)),
             A=-np.exp(rng.standard_normal((dim, dstate))), B=rng.standard_normal(bc_shape),
             C=rng.standard_normal(bc_shape), D=rng.standard_normal(dim),
             z=rng.standard_normal((batch, dim)), dt_bias=rng.standard_normal(dim))
    x = {k: jnp.asarray(v, dtype) for k, v in x.items()}
    for opts in itertools.product((False, True), repeat=3):
        use_d, use_z, softplus = opts
        kw = dict(x, D=x["D"] if use_d else None, z=x["z"] if use_z else None)
        if not softplus:
            kw["dt"], kw["dt_bias"] = jnp.abs(kw["dt"]), None
        y, new = selective_state_update(**kw, dt_softplus=softplus)
        y_ref, new_ref = selective_state_update_np(**np_args(kw), dt_softplus=softplus)
        assert y.dtype == dtype and new.dtype == dtype
        assert_close(y, y_ref, TOL[dtype], str(opts))
        assert_close(new, new_ref, TOL[dtype], str(opts))


# --- jit / no-jit, vmap ---------------------------------------------------------------------

class TransformsTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.product(name=tuple(SCANS), direction=DIRECTIONS)
    def test_jit_and_nojit(self, name, direction):
        fn = SCANS[name]
        x = make_inputs(rng_for("variants", name, direction), length=6)
        expected = selective_scan_np(**np_args(x), delta_softplus=True, direction=direction)
        f = self.variant(lambda x: fn(**x, delta_softplus=True, return_last_state=True,
                                      direction=direction))
        check_scan_result(f(x), expected, F64, direction, True, name)

    @chex.variants(with_jit=True, without_jit=True)
    def test_state_update_jit_and_nojit(self):
        x = make_inputs(rng_for("variants_update"), length=1)
        args = (x["h0"], x["u"][..., 0], x["delta"][..., 0], x["A"], x["B"][..., 0],
                x["C"][..., 0])
        f = self.variant(lambda *a: selective_state_update(*a, D=x["D"], z=x["z"][..., 0],
                                                           dt_bias=x["delta_bias"],
                                                           dt_softplus=True))
        y, new = f(*args)
        y_ref, new_ref = selective_state_update_np(
            *[np.asarray(a) for a in args], D=x["D"], z=x["z"][..., 0],
            dt_bias=x["delta_bias"], dt_softplus=True)
        assert_close(y, y_ref, TOL[F64])
        assert_close(new, new_ref, TOL[F64])

    @parameterized.product(name=tuple(SCANS), direction=DIRECTIONS)
    def test_vmap_extra_batch_axis(self, name, direction):
        fn = SCANS[name]
        rng = rng_for("vmap", name, direction)
        xs = [make_inputs(rng, length=5) for _ in range(3)]
        # A, D and delta_bias are shared (not mapped); the rest is stacked on axis 0.
        mapped = ("u", "delta", "B", "C", "z", "h0")
        shared = {k: xs[0][k] for k in ("A", "D", "delta_bias")}
        stacked = {k: jnp.stack([x[k] for x in xs]) for k in mapped}
        f = jax.vmap(lambda m: fn(**m, **shared, delta_softplus=True, return_last_state=True,
                                  direction=direction))
        out, last = f(stacked)
        for i, x in enumerate(xs):
            expected = selective_scan_np(**np_args(dict(x, **shared)), delta_softplus=True,
                                         direction=direction)
            res = (out[i], jax.tree.map(lambda v: v[i], last))
            check_scan_result(res, expected, F64, direction, True, f"{name} example {i}")

    def test_vmap_state_update(self):
        rng = rng_for("vmap_update")
        xs = [make_inputs(rng, length=1) for _ in range(3)]
        shared = {k: xs[0][k] for k in ("A", "D", "delta_bias")}

        def step(x):
            return selective_state_update(x["h0"], x["u"][..., 0], x["delta"][..., 0],
                                          shared["A"], x["B"][..., 0], x["C"][..., 0],
                                          D=shared["D"], z=x["z"][..., 0],
                                          dt_bias=shared["delta_bias"], dt_softplus=True)

        mapped = ("u", "delta", "B", "C", "z", "h0")
        y, new = jax.vmap(step)({k: jnp.stack([x[k] for x in xs]) for k in mapped})
        for i, x in enumerate(xs):
            y_i, new_i = step(dict(x, **shared))
            np.testing.assert_allclose(y[i], y_i, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(new[i], new_i, rtol=1e-12, atol=1e-12)


# --- gradients ------------------------------------------------------------------------------

GRAD_ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("name", SCANS)
def test_gradients(name, direction):
    fn = SCANS[name]
    x = make_inputs(rng_for("grads", name, direction), batch=1, dim=4, dstate=2, length=4)

    def f(*args):
        return fn(**dict(zip(GRAD_ARGS, args)), delta_softplus=True, return_last_state=True,
                  direction=direction)

    check_grads(jax.jit(f), tuple(x[k] for k in GRAD_ARGS), order=1, modes=("fwd", "rev"))


@pytest.mark.parametrize("b_kind,c_kind", [("invariant", "invariant"), ("variable", "grouped")])
def test_gradients_bc_layouts_no_softplus(b_kind, c_kind):
    x = make_inputs(rng_for("grads_bc", b_kind, c_kind), batch=1, dim=4, dstate=2, length=3,
                    b_kind=b_kind, c_kind=c_kind, softplus=False)

    def f(*args):
        return selective_scan(**dict(zip(GRAD_ARGS, args)), return_last_state=True)

    check_grads(jax.jit(f), tuple(x[k] for k in GRAD_ARGS), order=1, modes=("fwd", "rev"))


def test_gradients_state_update():
    x = make_inputs(rng_for("grads_update"), batch=1, length=1)
    args = (x["h0"], x["u"][..., 0], x["delta"][..., 0], x["A"], x["B"][..., 0],
            x["C"][..., 0], x["D"], x["z"][..., 0], x["delta_bias"])

    def f(state, u, dt, A, B, C, D, z, dt_bias):
        return selective_state_update(state, u, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                      dt_softplus=True)

    check_grads(jax.jit(f), args, order=1, modes=("fwd", "rev"))


# --- NaN propagation -----------------------------------------------------------------------

@pytest.mark.parametrize("direction", DIRECTIONS)
def test_nan_in_u_propagates_like_reference(direction):
    x = make_inputs(rng_for("nan", direction), length=5)
    x["u"] = x["u"].at[0, 1, 3].set(jnp.nan)
    out_np, _ = selective_scan_np(**np_args(x), delta_softplus=True, direction=direction)
    assert np.isnan(out_np).any() and not np.isnan(out_np).all()
    for name, fn in SCANS.items():
        out = fn(**x, delta_softplus=True, direction=direction)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(out_np), err_msg=name)
        assert_close(np.where(np.isnan(out_np), 0, out), np.nan_to_num(out_np, nan=0.0),
                     TOL[F64], name)


# --- bad input ---------------------------------------------------------------------------------

def _base():
    return make_inputs(rng_for("bad"), batch=2, dim=4, dstate=3, length=5, groups=2)


BAD_SCAN = [
    # (description, changes, error type, message regex)
    ("u list", dict(u=[[1.0]]), TypeError, r"u must be an array"),
    ("u int", dict(u=np.ones((2, 4, 5), np.int32)), TypeError, r"u has dtype int32"),
    ("u rank", dict(u=jnp.ones((2, 4))), ValueError, r"u must have rank 3"),
    ("delta shape", dict(delta=jnp.ones((2, 4, 6))), ValueError, r"delta has shape \(2, 4, 6\)"),
    ("delta scalar", dict(delta=1.0), TypeError, r"delta must be an array"),
    ("A shape", dict(A=-jnp.ones((5, 3))), ValueError, r"A has shape \(5, 3\)"),
    ("A rank", dict(A=-jnp.ones((4,))), ValueError, r"A must have rank 2"),
    ("A complex", dict(A=-jnp.ones((4, 3), jnp.complex64)), TypeError, r"A has dtype complex64"),
    ("A bool", dict(A=jnp.ones((4, 3), bool)), TypeError, r"A has dtype bool"),
    ("B rank 5", dict(B=jnp.ones((2, 1, 1, 3, 5))), ValueError, r"B must have shape"),
    ("B variable L", dict(B=jnp.ones((2, 3, 6))), ValueError, r"B has shape \(2, 3, 6\)"),
    ("B invariant N", dict(B=jnp.ones((4, 2))), ValueError, r"B has shape \(4, 2\)"),
    ("B groups", dict(B=jnp.ones((2, 3, 3, 5))), ValueError, r"B has G=3 groups.*D=4"),
    ("C groups", dict(C=jnp.ones((2, 3, 3, 5))), ValueError, r"C has G=3 groups"),
    ("C batch", dict(C=jnp.ones((3, 3, 5))), ValueError, r"C has shape \(3, 3, 5\)"),
    ("C float8", dict(C=jnp.ones((2, 3, 5), jnp.float8_e4m3fn)), TypeError, r"C has dtype float8"),
    ("D shape", dict(D=jnp.ones((5,))), ValueError, r"^D has shape \(5,\)"),
    ("z shape", dict(z=jnp.ones((2, 4, 4))), ValueError, r"z has shape \(2, 4, 4\)"),
    ("z int", dict(z=jnp.ones((2, 4, 5), jnp.int32)), TypeError, r"z has dtype int32"),
    ("delta_bias shape", dict(delta_bias=jnp.ones((4, 1))), ValueError, r"delta_bias has shape"),
    ("h0 shape", dict(h0=jnp.ones((2, 4, 2))), ValueError, r"h0 has shape \(2, 4, 2\).*\(2, 4, 3\)"),
    ("h0 list", dict(h0=[0.0]), TypeError, r"h0 must be an array"),
    ("direction", dict(direction="sideways"), ValueError, r"direction must be one of"),
    ("direction None", dict(direction=None), ValueError, r"direction must be one of"),
    ("softplus", dict(delta_softplus="yes"), TypeError, r"delta_softplus must be a bool"),
    ("last state", dict(return_last_state=1), TypeError, r"return_last_state must be a bool"),
]


@pytest.mark.parametrize("name", SCANS)
@pytest.mark.parametrize("desc,changes,exc,match", BAD_SCAN, ids=[b[0] for b in BAD_SCAN])
def test_bad_input_scan(name, desc, changes, exc, match):
    x = dict(_base(), **changes)
    with pytest.raises(exc, match=match):
        SCANS[name](**x)


def test_bad_input_raises_at_trace_time_under_jit():
    x = _base()
    f = jax.jit(lambda h0: selective_scan(**dict(x, h0=h0)))
    with pytest.raises(ValueError, match=r"h0 has shape"):
        f(jnp.ones((2, 4, 4)))


def _base_update():
    x = _base()
    return dict(state=x["h0"], x=x["u"][..., 0], dt=x["delta"][..., 0], A=x["A"],
                B=x["B"][..., 0], C=x["C"][..., 0], D=x["D"], z=x["z"][..., 0],
                dt_bias=x["delta_bias"])


BAD_UPDATE = [
    ("state rank", dict(state=jnp.ones((2, 4))), ValueError, r"state must have rank 3"),
    ("state list", dict(state=[1.0]), TypeError, r"state must be an array"),
    ("x shape", dict(x=jnp.ones((2, 5))), ValueError, r"x has shape \(2, 5\)"),
    ("x int", dict(x=jnp.ones((2, 4), jnp.int32)), TypeError, r"x has dtype int32"),
    ("dt shape", dict(dt=jnp.ones((2,))), ValueError, r"dt has shape \(2,\)"),
    ("A shape", dict(A=jnp.ones((4, 2))), ValueError, r"A has shape \(4, 2\)"),
    ("B shape", dict(B=jnp.ones((2, 5))), ValueError, r"B has shape \(2, 5\)"),
    ("B groups", dict(B=jnp.ones((2, 3, 3))), ValueError, r"B has G=3 groups"),
    ("C rank", dict(C=jnp.ones((2, 1, 1, 3))), ValueError, r"C must have shape"),
    ("C complex", dict(C=jnp.ones((2, 3), jnp.complex64)), TypeError, r"C has dtype complex64"),
    ("D shape", dict(D=jnp.ones((3,))), ValueError, r"^D has shape"),
    ("z shape", dict(z=jnp.ones((2, 3))), ValueError, r"z has shape"),
    ("dt_bias shape", dict(dt_bias=jnp.ones((5,))), ValueError, r"dt_bias has shape"),
    ("dt_softplus", dict(dt_softplus=None), TypeError, r"dt_softplus must be a bool"),
]


@pytest.mark.parametrize("desc,changes,exc,match", BAD_UPDATE, ids=[b[0] for b in BAD_UPDATE])
def test_bad_input_state_update(desc, changes, exc, match):
    with pytest.raises(exc, match=match):
        selective_state_update(**dict(_base_update(), **changes))
