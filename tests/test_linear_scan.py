"""linear_scan against a float64 NumPy loop: dtypes, layouts, axes, lengths, transforms, errors."""
import operator

import chex
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_selscan
from jax_selscan import affine_combine, linear_scan
from jax_selscan import _ffi
from conftest import REQUIRE_CPU_KERNEL
from references import SPECIAL_SHAPES, with_specials

# Tolerances per dtype, relative to the scale of the reference (max |h|, at least 1).
TOL = {
    np.dtype(np.float64): 1e-12,
    np.dtype(np.float32): 2e-5,
    np.dtype(np.complex64): 2e-5,
    np.dtype(jnp.bfloat16): 2e-2,
    np.dtype(jnp.float16): 4e-3,
}
DTYPES = list(TOL)


def np_linear_scan(a, b, axis=0, reverse=False, h0=None, return_a_prod=False):
    """The recurrence, one step at a time, in float64 (complex128 for complex inputs)."""
    wide = np.complex128 if np.iscomplexobj(a) or np.iscomplexobj(b) else np.float64
    a = np.moveaxis(np.asarray(a, wide), axis, 0)
    b = np.moveaxis(np.asarray(b, wide), axis, 0)
    h = np.zeros(a.shape[1:], wide) if h0 is None else np.asarray(h0, wide).copy()
    p = np.ones(a.shape[1:], wide)
    hs, ps = np.empty_like(b), np.empty_like(a)
    steps = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    for t in steps:
        h = a[t] * h + b[t]
        p = a[t] * p
        hs[t], ps[t] = h, p
    hs, ps = np.moveaxis(hs, 0, axis), np.moveaxis(ps, 0, axis)
    return (hs, ps) if return_a_prod else hs


def random_inputs(rng, shape, dtype, axis=0, a_range=(0.5, 1.0), with_h0=False):
    """Fresh random a (|a| in a_range, random sign) and b; never zeros."""
    def draw(lo, hi):
        mag = rng.uniform(lo, hi, shape) * rng.choice([-1.0, 1.0], shape)
        if np.dtype(dtype).kind == "c":
            mag = mag * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
        return mag
    a = draw(*a_range)
    b = draw(0.1, 1.0)
    state = shape[:axis] + shape[axis + 1:]
    h0 = None
    if with_h0:
        h0 = rng.uniform(0.1, 1.0, state) * rng.choice([-1.0, 1.0], state)
        h0 = np.asarray(h0, dtype)
    return np.asarray(a, dtype), np.asarray(b, dtype), h0


def assert_close(got, want, dtype):
    got = np.asarray(got).astype(want.dtype)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL[np.dtype(dtype)] * scale)


def _f64_view(x):
    return None if x is None else np.asarray(x).astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def check_against_numpy(a, b, axis, reverse, h0, return_a_prod, fn=linear_scan):
    out = fn(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=return_a_prod)
    want = np_linear_scan(_f64_view(a), _f64_view(b), axis, reverse, _f64_view(h0), return_a_prod)
    if return_a_prod:
        assert out[0].dtype == a.dtype and out[1].dtype == a.dtype
        assert_close(out[0], want[0], a.dtype)
        assert_close(out[1], want[1], a.dtype)
    else:
        assert out.dtype == a.dtype and out.shape == a.shape
        assert_close(out, want, a.dtype)


# --- values ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["rows", "strided"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("return_a_prod", [False, True])
def test_dtypes_layouts_options(dtype, layout, reverse, with_h0, return_a_prod):
    rng = np.random.default_rng(abs(hash((str(dtype), layout, reverse, with_h0, return_a_prod))) % 2**32)
    shape, axis = ((6, 333), 1) if layout == "rows" else ((333, 7), 0)
    a, b, h0 = random_inputs(rng, shape, dtype, axis, with_h0=with_h0)
    check_against_numpy(a, b, axis, reverse, h0, return_a_prod)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_every_axis_of_every_rank(rank):
    rng = np.random.default_rng(rank)
    shape = (5, 4, 3, 6)[:rank]
    for axis in range(-rank, rank):
        for reverse in (False, True):
            a, b, h0 = random_inputs(rng, shape, np.float32, axis % rank, with_h0=True)
            check_against_numpy(a, b, axis, reverse, h0, True)


@pytest.mark.parametrize("length", [0, 1, 2, 7, 31, 97, 1000, 4099])
def test_lengths(length):
    rng = np.random.default_rng(length)
    for axis, shape in ((0, (length, 5)), (1, (3, length))):
        a, b, h0 = random_inputs(rng, shape, np.float64, axis, with_h0=True)
        for reverse in (False, True):
            check_against_numpy(a, b, axis, reverse, h0, True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64], ids=lambda d: np.dtype(d).name)
def test_growing_a(dtype):
    """|a| > 1: the state grows; short L keeps it finite, the error stays relative."""
    rng = np.random.default_rng(11)
    a, b, h0 = random_inputs(rng, (40, 9), dtype, 0, a_range=(1.0, 1.3), with_h0=True)
    check_against_numpy(a, b, 0, False, h0, True)
    check_against_numpy(a, b, 0, True, h0, True)


def test_large_rows_and_channels():
    """Shapes big enough for the CPU kernel's multithreaded and chunked paths."""
    rng = np.random.default_rng(5)
    for shape, axis in (((2, 100_003), 1), ((65_537, 3), 0), ((64, 2048), 1), ((2048, 256), 0)):
        a, b, h0 = random_inputs(rng, shape, np.float32, axis, a_range=(0.9, 1.0), with_h0=True)
        for reverse in (False, True):
            check_against_numpy(a, b, axis, reverse, h0, True)


def test_broadcasting_a_and_scalar_like_h0():
    rng = np.random.default_rng(2)
    a = rng.uniform(0.5, 1.0, (1, 6))
    b = rng.normal(size=(50, 6))
    h = linear_scan(a, b, axis=0)
    assert_close(h, np_linear_scan(np.broadcast_to(a, b.shape), b), np.float64)


def test_matches_lax_associative_scan():
    rng = np.random.default_rng(3)
    for axis, reverse in ((0, False), (1, True), (2, False)):
        a, b, _ = random_inputs(rng, (17, 8, 13), np.float64, axis)
        p_ref, h_ref = jax.lax.associative_scan(affine_combine, (a, b), axis=axis, reverse=reverse)
        h, p = linear_scan(a, b, axis=axis, reverse=reverse, return_a_prod=True)
        np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(p, p_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_nan_and_inf_propagate_like_the_loop(reverse):
    rng = np.random.default_rng(4)
    a, b, _ = random_inputs(rng, (64, 3), np.float32, 0, a_range=(0.5, 1.0))
    a = np.abs(a)
    b[20, 0] = np.nan
    b[30, 1] = np.inf
    a[40, 2] = np.nan
    got = np.asarray(linear_scan(a, b, reverse=reverse))
    want = np_linear_scan(a, b, reverse=reverse)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reverse", [False, True])
def test_nan_and_inf_in_long_scans(reverse):
    """Few long rows take the CPU kernel's chunked path, many rows its threads. With a close
    to 1 no product of a underflows (0.9999^(2^18) is e^-26) and NaN / +-Inf land where the
    loop puts them; with a in [0.5, 0.6] an infinite carry meeting an underflowed product
    turns NaN (0 * inf, as in lax.associative_scan; the documented difference), never finite."""
    for i, (shape, axis) in enumerate(SPECIAL_SHAPES + [((2**18,), 0)]):
        for a_range, exact in (((0.9999, 1.0), True), ((0.5, 0.6), False)):
            a, b = with_specials(shape, axis, a_range, seed=i)
            got = np.asarray(linear_scan(a, b, axis=axis, reverse=reverse))
            want = np_linear_scan(a, b, axis=axis, reverse=reverse)
            fin = np.isfinite(want)
            if exact:
                assert np.isinf(want).any(), shape
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=str(shape))
                inf = np.isinf(want)
                np.testing.assert_array_equal(got[inf], want[inf], err_msg=str(shape))
            else:
                assert np.isnan(got[np.isnan(want)]).all(), shape
            np.testing.assert_array_equal(np.isfinite(got), fin, err_msg=str(shape))
            scale = max(1.0, float(np.abs(want[fin]).max()))  # float32 error grows with |h|
            np.testing.assert_allclose(got[fin], want[fin], rtol=0, atol=1e-4 * scale, err_msg=str(shape))


# --- jit, vmap, autodiff -----------------------------------------------------------------

class TransformTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_jit_and_no_jit(self):
        rng = np.random.default_rng(6)
        a, b, h0 = random_inputs(rng, (4, 50, 3), np.float32, 1, with_h0=True)
        fn = self.variant(lambda a, b, h0: linear_scan(a, b, axis=1, h0=h0, return_a_prod=True))
        h, p = fn(a, b, h0)
        want_h, want_p = np_linear_scan(a, b, 1, False, h0, True)
        assert_close(h, want_h, np.float32)
        assert_close(p, want_p, np.float32)


VMAP_CASES = [  # (in_axes for a, b, h0)
    (0, 0, 0), (None, 0, 0), (0, None, None), (1, 0, None), (0, 2, 1), (None, None, 0), (2, 1, None),
]


@pytest.mark.parametrize("in_axes", VMAP_CASES, ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_vmap_in_axes(in_axes, reverse):
    rng = np.random.default_rng(7)
    n, L, C = 3, 20, 4
    base = {None: (L, C), 0: (n, L, C), 1: (L, n, C), 2: (L, C, n)}
    base_h0 = {None: (C,), 0: (n, C), 1: (C, n)}
    a = rng.uniform(0.5, 1.0, base[in_axes[0]])
    b = rng.normal(size=base[in_axes[1]])
    h0 = rng.normal(size=base_h0[in_axes[2]])
    got = jax.vmap(lambda a, b, h0: linear_scan(a, b, h0=h0, reverse=reverse), in_axes=in_axes)(a, b, h0)
    take = lambda x, ax, i: x if ax is None else np.take(x, i, axis=ax)
    for i in range(n):
        want = np_linear_scan(take(a, in_axes[0], i), take(b, in_axes[1], i), 0, reverse, take(h0, in_axes[2], i))
        np.testing.assert_allclose(got[i], want, rtol=1e-12, atol=1e-12)


def test_vmap_folds_into_one_primitive_call():
    """Batching never loops: the vmapped jaxpr holds a single linear_scan."""
    a = jnp.ones((5, 8, 3)) * 0.5
    jaxpr = jax.make_jaxpr(jax.vmap(lambda a, b: linear_scan(a, b)))(a, a)
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("jax_selscan_linear_scan") == 1
    assert not any(n in ("while", "scan") for n in names)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_second_order(axis, reverse):
    rng = np.random.default_rng(8)
    a, b, h0 = random_inputs(rng, (6, 5), np.float64, axis, with_h0=True)
    f = lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=True)
    check_grads(f, (a, b, h0), order=2, modes=("fwd", "rev"))


def test_gradients_complex():
    rng = np.random.default_rng(9)
    # complex128 is outside the supported dtypes: check complex64 with a loose tolerance.
    a, b, h0 = random_inputs(rng, (7, 3), np.complex64, 0, with_h0=True)
    f = lambda a, b, h0: linear_scan(a, b, h0=h0)
    check_grads(f, (a, b, h0), order=1, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2, eps=1e-2)


def test_vmap_of_grad_and_grad_of_vmap():
    rng = np.random.default_rng(10)
    a = rng.uniform(0.5, 1.0, (4, 12))
    b = rng.normal(size=(4, 12))
    loss = lambda a, b: jnp.sum(jnp.sin(linear_scan(a, b, axis=0)))
    per_row = jax.vmap(jax.grad(loss, argnums=(0, 1)))(a, b)
    whole = jax.grad(lambda a, b: jnp.sum(jax.vmap(loss)(a, b)), argnums=(0, 1))(a, b)
    # Reference gradient of the plain-JAX formulation.
    ref_loss = lambda a, b: jnp.sum(jnp.sin(jax.lax.associative_scan(affine_combine, (a, b))[1]))
    ref = jax.vmap(jax.grad(ref_loss, argnums=(0, 1)))(a, b)
    for got in (per_row, whole):
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


def test_gradient_matches_reference_bf16_runs():
    a = jnp.full((16, 2), 0.9, jnp.bfloat16)
    b = jnp.ones((16, 2), jnp.bfloat16)
    g = jax.grad(lambda b: jnp.sum(linear_scan(a, b).astype(jnp.float32)))(b)
    assert g.dtype == jnp.bfloat16
    want = np_linear_scan(np.full((16, 2), 0.9)[::-1], np.ones((16, 2)))[::-1]  # sum of powers
    np.testing.assert_allclose(np.asarray(g, np.float32), want, rtol=3e-2)


# --- the fast path is taken --------------------------------------------------------------

def test_cpu_kernel_is_built_when_required():
    if REQUIRE_CPU_KERNEL:
        assert _ffi.HAS_CPU, "the CPU extension jax_selscan._cpu was not built/importable"


def test_hlo_contains_custom_call_on_cpu():
    if not _ffi.HAS_CPU:
        pytest.skip("CPU extension not built")
    a = jnp.ones((8, 4), jnp.float32)
    text = jax.jit(lambda a, b: linear_scan(a, b, axis=0)).lower(a, a).as_text()
    assert "jax_selscan_linear_scan" in text and "custom_call" in text
    text = jax.jit(lambda a, b: linear_scan(a, b, return_a_prod=True)).lower(a, a).as_text()
    assert "jax_selscan_linear_scan_prod" in text


# --- property-based ------------------------------------------------------------------------

@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    shape=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    axis_seed=st.integers(0, 100),
    reverse=st.booleans(),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**31),
)
def test_property_random_shapes(shape, axis_seed, reverse, dtype, seed):
    shape = tuple(shape)
    axis = axis_seed % len(shape)
    a, b, h0 = random_inputs(np.random.default_rng(seed), shape, dtype, axis, with_h0=True)
    check_against_numpy(a, b, axis, reverse, h0, True)


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, match", [
    (lambda: linear_scan([1.0, 2.0], jnp.ones(2)), TypeError, "a must be an array"),
    (lambda: linear_scan(jnp.ones(2), "x"), TypeError, "b must be an array"),
    (lambda: linear_scan(jnp.ones(2, jnp.int32), jnp.ones(2)), TypeError, "a has dtype int32"),
    (lambda: linear_scan(jnp.ones(2), jnp.ones(2, bool)), TypeError, "b has dtype bool"),
    (lambda: linear_scan(jnp.ones(2, jnp.complex128), jnp.ones(2)), TypeError, "a has dtype complex128"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((4, 2))), ValueError, "a and b must have broadcast"),
    (lambda: linear_scan(jnp.ones(()), jnp.ones(())), ValueError, "at least one dimension"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((3, 2)), axis=2), ValueError, "axis=2 is out of range"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((3, 2)), axis=1.0), TypeError, "axis must be an int"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((3, 2)), h0=jnp.ones(3)), ValueError, r"h0 must have shape \(2,\)"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((3, 2)), h0=[0.0, 1.0]), TypeError, "h0 must be an array"),
    (lambda: linear_scan(jnp.ones((3, 2)), jnp.ones((3, 2)), h0=jnp.ones(2, jnp.int8)), TypeError, "h0 has dtype int8"),
    (lambda: linear_scan(jnp.ones(3), jnp.ones(3), reverse=1), TypeError, "reverse must be a bool"),
    (lambda: linear_scan(jnp.ones(3), jnp.ones(3), algorithm="bogus"), ValueError, "algorithm='bogus'"),
])
def test_bad_input_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
    with pytest.raises(error, match=match):
        jax.jit(lambda: call())()


@pytest.mark.slow
def test_more_than_2_31_elements():
    """A single sequence of 2^31 + 77 bfloat16 elements: offsets past 2^31 must not wrap.

    b follows a pattern of period 251 so that a wrapped or shifted index shows; with a = 0.5
    each output depends on ~60 predecessors only, so windows are checked against float64.
    """
    n = 2**31 + 77
    make_b = jax.jit(lambda: ((jax.lax.iota(jnp.int64, n) % 251) % 17 + 1).astype(jnp.bfloat16))
    starts = [0, 2**30 + 5, 2**31 - 40, n - 64]
    try:
        b = make_b()
        a = jnp.full((n,), 0.5, jnp.bfloat16)
        h = linear_scan(a, b)
        windows = [np.asarray(h[s:s + 64], np.float64) for s in starts]
        del a, b, h
    except (MemoryError, RuntimeError) as e:  # XlaRuntimeError derives from RuntimeError
        pytest.skip(f"not enough memory: {e}")
    for s, got in zip(starts, windows):
        first = max(0, s - 64)
        idx = np.arange(first, s + 64)
        b_np = (idx % 251) % 17 + 1.0
        want = np_linear_scan(np.full(idx.shape, 0.5), b_np)[s - first:]
        np.testing.assert_allclose(got, want, rtol=1e-2, err_msg=f"window at {s}")
