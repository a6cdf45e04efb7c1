"""associative_scan: the affine combine runs as linear_scan, everything else is lax's."""
import functools
import gc
import operator
import weakref

import numpy as np
import pytest
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp
from hypothesis import given, settings, strategies as st

from jax_selscan import affine_combine, _ffi
from jax_selscan.associative_scan import associative_scan

PRIM = "jax_selscan_linear_scan"


# --- the affine combine, written the ways real code writes it --------------------------

def s5_op(q_i, q_j):                       # S5 / minimal-LRU
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j


def reordered_op(q_i, q_j):                # operands commuted
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_i * A_j, b_j + b_i * A_j


def mamba_jax_op(s, c):                    # vvvm23/mamba-jax names, jnp functions
    sa, sb = s
    ca, cb = c
    return jnp.multiply(ca, sa), jnp.add(jnp.multiply(ca, sb), cb)


def xy_op(x, y):                           # indexing into the tuples
    return y[0] * x[0], y[0] * x[1] + y[1]


def jitted_op(e1, e2):                     # the body under an inner jit
    return jax.jit(s5_op)(e1, e2)


def ba_op(e1, e2):                         # elems given as (b, a)
    b1, a1 = e1
    b2, a2 = e2
    return a2 * b1 + b2, a1 * a2


def cosmetic_op(e1, e2):                   # harmless 0/1 constants and a subtraction
    a1, b1 = e1
    a2, b2 = e2
    return (a2 * 1.0) * a1 + 0.0, a2 * b1 - (-b2)


@jax.vmap
def s5_vmapped(q_i, q_j):                  # S5's @jax.vmap-decorated operator
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j


AFFINE = {
    "ours": (affine_combine, "ab"),
    "s5": (s5_op, "ab"),
    "reordered": (reordered_op, "ab"),
    "mamba_jax": (mamba_jax_op, "ab"),
    "xy": (xy_op, "ab"),
    "jitted": (jitted_op, "ab"),
    "ba_order": (ba_op, "ba"),
    "cosmetic": (cosmetic_op, "ab"),
    "vmap": (s5_vmapped, "ab"),
    "vmap_vmap": (jax.vmap(jax.vmap(s5_op)), "ab"),
}

DTYPES = {"float32": jnp.float32, "float64": jnp.float64, "complex64": jnp.complex64,
          "bfloat16": jnp.bfloat16}
# (rtol, atol) against the float64 NumPy loop, and against lax (which rounds every
# step in the input dtype; bf16 inputs are accumulated in float32 on our side).
TOL_REF = {"float32": (2e-5, 2e-5), "float64": (1e-12, 1e-12), "complex64": (2e-5, 2e-5),
           "bfloat16": (1e-2, 1e-2)}
TOL_LAX = {"float32": (2e-5, 2e-5), "float64": (1e-12, 1e-12), "complex64": (2e-5, 2e-5),
           "bfloat16": (6e-2, 6e-2)}


def make_inputs(rng, shape, dtype, grow=False):
    """a with 0.5 < |a| < 0.99 (1 < |a| < 1.5 with grow=True), random signs/phases; b ~ N(0, 1)."""
    dtype = np.dtype(dtype)
    mag = rng.uniform(1.0, 1.5, shape) if grow else rng.uniform(0.5, 0.99, shape)
    if dtype.kind == "c":
        a = mag * np.exp(1j * rng.uniform(-np.pi, np.pi, shape))
        b = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    else:
        a = mag * rng.choice([-1.0, 1.0], shape)
        b = rng.normal(size=shape)
    return jnp.asarray(a, dtype), jnp.asarray(b, dtype)


def ref_loop(a, b, axis, reverse):
    """(running product of a, h) in float64/complex128, by a NumPy loop."""
    a = np.moveaxis(np.asarray(a).astype(np.complex128 if np.iscomplexobj(a) else np.float64), axis, 0)
    b = np.moveaxis(np.asarray(b).astype(np.complex128 if np.iscomplexobj(b) else np.float64), axis, 0)
    shape = np.broadcast_shapes(a.shape, b.shape)
    p, h = np.empty_like(a), np.empty(shape, np.result_type(a, b))
    order = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    pp, hh = np.ones_like(a[0]), np.zeros_like(h[0])
    for t in order:
        pp, hh = a[t] * pp, a[t] * hh + b[t]
        p[t], h[t] = pp, hh
    return np.moveaxis(p, 0, axis), np.moveaxis(h, 0, axis)


def f64(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def assert_close(x, y, tol):
    np.testing.assert_allclose(f64(x), f64(y), rtol=tol[0], atol=tol[1])


def jaxpr_text(fn, elems, **kw):
    return str(jax.make_jaxpr(lambda e: associative_scan(fn, e, **kw))(elems))


def assert_fast(fn, elems, **kw):
    assert PRIM in jaxpr_text(fn, elems, **kw)
    if _ffi.HAS_CPU:
        hlo = jax.jit(lambda e: associative_scan(fn, e, **kw)).lower(elems).as_text()
        assert PRIM in hlo and "custom_call" in hlo


def run_both(fn, elems, use_jit, lax_jit=None, **kw):
    """(ours, lax's); lax under jit too unless lax_jit=False (eager lax is slow)."""
    ours = lambda e: associative_scan(fn, e, **kw)
    theirs = lambda e: jax.lax.associative_scan(fn, e, **kw)
    if use_jit:
        ours = jax.jit(ours)
    if use_jit if lax_jit is None else lax_jit:
        theirs = jax.jit(theirs)
    return ours(elems), theirs(elems)


def check_affine(fn, order, a, b, axis, reverse, use_jit, dtype_name):
    elems = (a, b) if order == "ab" else (b, a)
    got, want = run_both(fn, elems, use_jit, lax_jit=True, axis=axis, reverse=reverse)
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
    (p, h) = got if order == "ab" else got[::-1]
    p_ref, h_ref = ref_loop(a, b, axis, reverse)
    assert_close(p, p_ref, TOL_REF[dtype_name])
    assert_close(h, h_ref, TOL_REF[dtype_name])
    for g, w in zip(got, want):
        assert_close(g, w, TOL_LAX[dtype_name])
    assert_fast(fn, elems, axis=axis, reverse=reverse)


# --- affine forms: same result as lax and as a float64 loop, through linear_scan --------

@pytest.mark.parametrize("kind", ["real", "complex_or_bf16"])
@pytest.mark.parametrize("form", list(AFFINE))
def test_affine_forms(form, kind):
    fn, order = AFFINE[form]
    # cycle dtype / axis / reverse / jit over the forms, so that each value of each is
    # seen by several forms; test_affine_all_modes covers every combination for one form
    f = list(AFFINE).index(form)
    dtype_name = (("float32", "float64") if kind == "real" else ("complex64", "bfloat16"))[f % 2]
    i = 2 * f + (kind != "real")
    axis, reverse, use_jit = (0, 1)[i % 2], bool((i // 2) % 2), bool((i // 4) % 2)
    rng = np.random.default_rng(i)
    a, b = make_inputs(rng, (7, 3, 4) if axis == 0 else (3, 7, 4), DTYPES[dtype_name])
    check_affine(fn, order, a, b, axis, reverse, use_jit, dtype_name)


# every axis x reverse x jit combination; float64/bfloat16 only under jit (eager mode is
# dtype-independent and covered by float32/complex64; this keeps the suite fast)
ALL_MODES = [(d, axis, rev, jit) for d in DTYPES for axis in (0, 2) for rev in (False, True)
             for jit in (False, True) if jit or d in ("float32", "complex64")]


@pytest.mark.parametrize("dtype_name,axis,reverse,use_jit", ALL_MODES)
def test_affine_all_modes(dtype_name, axis, reverse, use_jit):
    rng = np.random.default_rng(7)
    a, b = make_inputs(rng, (7, 4, 5), DTYPES[dtype_name])
    check_affine(s5_op, "ab", a, b, axis, reverse, use_jit, dtype_name)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype_name", ["float32", "float64", "complex64"])
def test_growing_a_short_sequence(dtype_name, reverse):
    rng = np.random.default_rng(3)
    a, b = make_inputs(rng, (6, 4), DTYPES[dtype_name], grow=True)
    check_affine(reordered_op, "ab", a, b, 0, reverse, False, dtype_name)


@pytest.mark.parametrize("reverse", [False, True])
def test_s5_complex_diagonal(reverse):
    """S5: Lambda_bar (P,) tiled to (L, P), Bu (L, P), complex64, vmapped operator."""
    rng = np.random.default_rng(11)
    L, P = 32, 8
    lam = jnp.asarray(0.9 * np.exp(1j * rng.uniform(-1, 1, P)), jnp.complex64)
    Bu = jnp.asarray(rng.normal(size=(L, P)) + 1j * rng.normal(size=(L, P)), jnp.complex64)
    Lambda_elements = lam * jnp.ones((L, P), jnp.float32)
    check_affine(s5_vmapped, "ab", Lambda_elements, Bu, 0, reverse, True, "complex64")


@pytest.mark.parametrize("reverse", [False, True])
def test_real_a_complex_b(reverse):
    rng = np.random.default_rng(5)
    a, _ = make_inputs(rng, (10, 4), jnp.float32)
    _, b = make_inputs(rng, (10, 4), jnp.complex64)
    check_affine(s5_op, "ab", a, b, 0, reverse, False, "complex64")
    (p, h), _ = run_both(s5_op, (a, b), False, reverse=reverse)
    assert p.dtype == jnp.float32 and h.dtype == jnp.complex64


def parts_op(q_i, q_j):                    # real a, complex b, b's product written by parts
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jax.lax.complex(A_j * jnp.real(b_i), A_j * jnp.imag(b_i)) + b_j


def parts_swapped_op(q_i, q_j):            # the parts exchanged: conj(i * b), not a * b
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jax.lax.complex(A_j * jnp.imag(b_i), A_j * jnp.real(b_i)) + b_j


def parts_of_two_op(q_i, q_j):             # real part of b_i, imaginary part of b_j
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jax.lax.complex(A_j * jnp.real(b_i), A_j * jnp.imag(b_j)) + b_j


def parts_dropped_op(q_i, q_j):            # the imaginary part of b_i lost
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jax.lax.complex(A_j * jnp.real(b_i), A_j * 0 * jnp.imag(b_i)) + b_j


@pytest.mark.parametrize("reverse", [False, True])
def test_complex_product_written_by_parts(reverse):
    """real * complex as complex(a * real(b), a * imag(b)) (how jax 0.12.1 lowers a * b with
    a real and b complex) is the affine combine; exchanged parts, parts of two different
    values or a lost part are not, and go to lax."""
    rng = np.random.default_rng(6)
    a, _ = make_inputs(rng, (10, 4), jnp.float32)
    _, b = make_inputs(rng, (10, 4), jnp.complex64)
    check_affine(parts_op, "ab", a, b, 0, reverse, False, "complex64")
    for fn in (parts_swapped_op, parts_of_two_op, parts_dropped_op):
        got, want = run_both(fn, (a, b), False, reverse=reverse)
        jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)
        assert PRIM not in jaxpr_text(fn, (a, b), reverse=reverse), fn.__name__


@pytest.mark.parametrize("use_jit", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_broadcast_a(reverse, use_jit):
    """a (L, P, 1) against b (L, P, N), as in a materialised selective scan."""
    rng = np.random.default_rng(9)
    a, _ = make_inputs(rng, (12, 3, 1), jnp.float32)
    _, b = make_inputs(rng, (12, 3, 5), jnp.float32)
    check_affine(s5_op, "ab", a, b, 0, reverse, use_jit, "float32")
    check_affine(mamba_jax_op, "ab", a, b, 0, reverse, use_jit, "float32")


def test_negative_axis():
    # lax.associative_scan rejects a negative axis with reverse=True (lax.rev); we accept it
    rng = np.random.default_rng(12)
    a, b = make_inputs(rng, (4, 9), jnp.float32)
    for reverse in (False, True):
        got = associative_scan(s5_op, (a, b), axis=-1, reverse=reverse)
        want = jax.lax.associative_scan(s5_op, (a, b), axis=1, reverse=reverse)
        for g, w in zip(got, want):
            assert_close(g, w, TOL_LAX["float32"])
        assert_fast(s5_op, (a, b), axis=-1, reverse=reverse)


def test_pytree_structures():
    rng = np.random.default_rng(2)
    a, b = make_inputs(rng, (8, 3), jnp.float32)

    def dict_op(x, y):
        return {"a": y["a"] * x["a"], "b": y["a"] * x["b"] + y["b"]}

    def list_op(x, y):
        return [y[0] * x[0], y[0] * x[1] + y[1]]

    for fn, elems in ((dict_op, {"a": a, "b": b}), (list_op, [a, b])):
        got, want = run_both(fn, elems, False)
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        jax.tree_util.tree_map(lambda g, w: assert_close(g, w, TOL_LAX["float32"]), got, want)
        assert_fast(fn, elems)


def test_numpy_inputs_and_vmap_outside():
    rng = np.random.default_rng(4)
    a, b = (np.asarray(x) for x in make_inputs(rng, (5, 7, 3), jnp.float64))
    got, want = run_both(s5_op, (a, b), False, axis=1)
    for g, w in zip(got, want):
        assert_close(g, w, TOL_LAX["float64"])
    vm = jax.vmap(lambda e: associative_scan(s5_op, e, reverse=True), in_axes=((2, 2),))
    vl = jax.vmap(lambda e: jax.lax.associative_scan(s5_op, e, reverse=True), in_axes=((2, 2),))
    for g, w in zip(vm((a, b)), vl((a, b))):
        assert_close(g, w, TOL_LAX["float64"])
    assert PRIM in str(jax.make_jaxpr(vm)((a, b)))


# --- gradients ---------------------------------------------------------------------------

@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype_name", ["float64", "complex64"])
def test_grad_matches_lax(dtype_name, reverse):
    rng = np.random.default_rng(8)
    a, b = make_inputs(rng, (11, 3), DTYPES[dtype_name])
    w = jnp.asarray(rng.normal(size=(11, 3)))

    def loss(scan, a, b):
        p, h = scan(s5_op, (a, b), reverse=reverse, axis=0)
        return jnp.sum(w * jnp.abs(h) ** 2) + jnp.sum(w * jnp.real(p))

    g_ours = jax.jit(jax.grad(functools.partial(loss, associative_scan), argnums=(0, 1)))(a, b)
    g_lax = jax.jit(jax.grad(functools.partial(loss, jax.lax.associative_scan), argnums=(0, 1)))(a, b)
    tol = (1e-10, 1e-10) if dtype_name == "float64" else (1e-4, 1e-4)
    for g, l in zip(g_ours, g_lax):
        assert_close(g, l, tol)
    assert PRIM in str(jax.make_jaxpr(jax.grad(functools.partial(loss, associative_scan)))(a, b))


# --- everything else is lax's, bit for bit ------------------------------------------------

def matmul2x2_leaves(x, y):                # 2x2 matrices as a pytree of 4 leaves: y @ x
    (x00, x01, x10, x11), (y00, y01, y10, y11) = x, y
    return (y00 * x00 + y01 * x10, y00 * x01 + y01 * x11,
            y10 * x00 + y11 * x10, y10 * x01 + y11 * x11)


def swapped_op(q_i, q_j):                  # the operands of the combine swapped
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_i * A_j, A_i * b_j + b_i


def plus_const_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j + 0.5


def scaled_op(q_i, q_j):                   # a non-0/1 constant that cancels in exact arithmetic
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, 2.0 * (A_j * b_i) - A_j * b_i + b_j


def cancelling_op(q_i, q_j):               # equal as polynomials, not in floating point
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j + A_i - A_i


def doubled_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j + b_j - b_j


def sum_a_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_i + A_j, A_j * b_i + b_j


def no_b2_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i


def max_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jnp.maximum(A_j * b_i + b_j, A_j * b_i + b_j)


def div_op(q_i, q_j):
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, (A_j * b_i + b_j) / 1.0


def rolled_op(q_i, q_j):                   # moves data between elements
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, jnp.flip(A_j * b_i, axis=-1) + b_j


def mixed_pairs_op(q_i, q_j):              # a from one element, b from another
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_i * b_i + b_j


NON_AFFINE = {
    "add_single": (operator.add, lambda a, b: a),
    "add_pair": (lambda x, y: jax.tree_util.tree_map(operator.add, x, y), lambda a, b: (a, b)),
    "maximum": (jnp.maximum, lambda a, b: b),
    "matmul_leaves": (matmul2x2_leaves, lambda a, b: (a, b, b, a)),
    "matmul_arrays": (lambda x, y: jnp.matmul(y, x),
                      lambda a, b: jnp.stack([a, b, b, a], -1).reshape(a.shape + (2, 2))),
    "swapped": (swapped_op, lambda a, b: (a, b)),
    "plus_const": (plus_const_op, lambda a, b: (a, b)),
    "scaled": (scaled_op, lambda a, b: (a, b)),
    "cancelling": (cancelling_op, lambda a, b: (a, b)),
    "doubled": (doubled_op, lambda a, b: (a, b)),
    "sum_a": (sum_a_op, lambda a, b: (a, b)),
    "no_b2": (no_b2_op, lambda a, b: (a, b)),
    "max": (max_op, lambda a, b: (a, b)),
    "div": (div_op, lambda a, b: (a, b)),
    "flip": (rolled_op, lambda a, b: (a, b)),
    "mixed_pairs": (mixed_pairs_op, lambda a, b: (a, b)),
}


@pytest.mark.parametrize("use_jit", [False, True])
@pytest.mark.parametrize("name", list(NON_AFFINE))
def test_non_affine_is_lax(name, use_jit):
    fn, build = NON_AFFINE[name]
    rng = np.random.default_rng(1)
    a, b = make_inputs(rng, (10, 4), jnp.float32)
    elems = build(a, b)
    axis, reverse = (1, True) if use_jit else (0, False)
    got, want = run_both(fn, elems, use_jit, axis=axis, reverse=reverse)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)
    for axis, reverse in ((0, False), (1, True)):
        assert PRIM not in jaxpr_text(fn, elems, axis=axis, reverse=reverse)


@jax.custom_jvp
def _custom_mul(x, y):
    return x * y


_custom_mul.defjvp(lambda primals, tangents: (_custom_mul(*primals),
                                               tangents[0] * primals[1] + primals[0] * tangents[1]))


def _ab(e):
    return e


RECOGNITION = [   # (fn, elems shape, recognised?) -- checked on the jaxpr only
    (lambda x, y: (-(-y[0]) * x[0], -(-y[1] - y[0] * x[1])), (6, 3), True),
    (lambda x, y: (jnp.asarray(y[0]) * x[0].astype(x[0].dtype), y[1] + y[0] * x[1]), (6, 3), True),
    (lambda x, y: (y[0].reshape(y[0].shape) * x[0], y[0] * x[1] + y[1]), (6, 3), True),
    (lambda x, y: (jnp.squeeze(y[0][:, None], 1) * x[0], y[0] * x[1] + y[1]), (6, 3), True),
    (lambda x, y: (_custom_mul(y[0], x[0]), _custom_mul(y[0], x[1]) + y[1]), (6, 3), True),
    (jax.checkpoint(affine_combine), (6, 3), True),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1] + 0 * x[0]), (6, 3), True),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1]), (6, 1, 3), True),
    (lambda x, y: (y[0] * x[0], (y[0] * x[1]).reshape(-1).reshape(y[1].shape) + y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], jnp.sum(y[0] * x[1], -1, keepdims=True) + y[1]), (6, 1), False),
    (lambda x, y: (y[0] * x[0], jnp.roll(y[0] * x[1], 1, 0) + y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], y[0][::-1] * x[1] + y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], jnp.swapaxes(y[0], -1, -2) * x[1] + y[1]), (6, 3, 3), False),
    (lambda x, y: (y[0] * x[0], jnp.where(y[0] > 0, y[0] * x[1] + y[1], y[1])), (6, 3), False),
    (lambda x, y: (y[0] * x[0], jnp.exp(jnp.log(y[0])) * x[1] + y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1] * y[1] / y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], (y[0] + 0 * y[1]) * (x[1] + y[1]) - y[0] * y[1] + y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], (y[0].astype(jnp.bfloat16) * x[1]).astype(jnp.float32) + y[1]),
     (6, 3), False),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + jnp.ones_like(y[1]) * y[1] * 2), (6, 3), False),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1][:1] + 0 * y[1]), (6, 3), False),
    (lambda x, y: (y[0] * x[0], y[0] * x[1] + jnp.broadcast_to(y[1][..., :1], y[1].shape)), (6, 3), False),
]


@pytest.mark.parametrize("case", range(len(RECOGNITION)))
def test_recognition_table(case):
    fn, shape, expected = RECOGNITION[case]
    a = jnp.ones(shape, jnp.float32)
    assert (PRIM in jaxpr_text(fn, (a, a))) == expected


def test_unsupported_dtype_and_closure_fall_back():
    rng = np.random.default_rng(6)
    a, b = make_inputs(rng, (6, 3), jnp.complex128)          # no complex128 kernel
    got, want = run_both(s5_op, (a, b), False)
    jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)
    assert PRIM not in jaxpr_text(s5_op, (a, b))

    a, b = make_inputs(rng, (6, 3), jnp.float32)

    @jax.jit
    def closes_over_tracer(a, b, z):         # z may be anything at run time: not provably 0
        fn = lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1] + z)
        return associative_scan(fn, (a, b))

    assert PRIM not in str(jax.make_jaxpr(closes_over_tracer)(a, b, 0.0))
    @jax.jit
    def lax_version(a, b, z):
        fn = lambda x, y: (y[0] * x[0], y[0] * x[1] + y[1] + z)
        return jax.lax.associative_scan(fn, (a, b))

    jax.tree_util.tree_map(np.testing.assert_array_equal, closes_over_tracer(a, b, 1.0),
                           lax_version(a, b, 1.0))


def test_fn_that_fails_to_trace_raises_like_lax():
    def bad(x, y):
        raise RuntimeError("boom")
    a = jnp.ones((4, 2))
    with pytest.raises(RuntimeError, match="boom"):
        associative_scan(bad, (a, a))


# --- edge cases and errors -------------------------------------------------------------------

@pytest.mark.parametrize("L", [0, 1, 2, 3])
def test_short_sequences(L):
    rng = np.random.default_rng(L)
    a, b = make_inputs(rng, (L, 3), jnp.float32)
    for reverse in (False, True):
        got, want = run_both(affine_combine, (a, b), False, reverse=reverse)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert_close(g, w, TOL_LAX["float32"])


def test_bad_axis():
    a = jnp.ones((4, 3))
    for fn in (affine_combine, operator.add):
        with pytest.raises(ValueError, match="axis"):
            associative_scan(fn, (a, a), axis=2)
        with pytest.raises(ValueError, match="axis"):
            associative_scan(fn, (a, a), axis=-3)
        with pytest.raises(TypeError, match="axis"):
            associative_scan(fn, (a, a), axis=0.0)


def test_errors_like_lax():
    a, b = jnp.ones((4, 3)), jnp.ones((5, 3))
    with pytest.raises(ValueError, match="same first dimension"):
        jax.lax.associative_scan(affine_combine, (a, b))
    with pytest.raises(ValueError, match="same first dimension"):
        associative_scan(affine_combine, (a, b))
    with pytest.raises(TypeError, match="callable"):
        associative_scan(None, (a, a))


def test_recognised_once_and_independent_of_length(monkeypatch):
    calls = []

    def op(x, y):
        calls.append(1)
        return y[0] * x[0], y[0] * x[1] + y[1]

    rng = np.random.default_rng(0)
    for L in (8, 300, 37):
        a, b = make_inputs(rng, (L, 3), jnp.float32)
        p, h = associative_scan(op, (a, b))
        assert_close(h, ref_loop(a, b, 0, False)[1], TOL_REF["float32"])
    assert len(calls) == 1        # one trace, on length-2 elements, for every L

    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None          # the cache does not keep functions alive


def test_builtin_fn_cache():
    a = jnp.arange(6.0).reshape(3, 2)
    for _ in range(2):
        np.testing.assert_array_equal(associative_scan(operator.mul, a),
                                      jax.lax.associative_scan(operator.mul, a))


# --- property-based: random shapes, axis, direction, dtype ------------------------------

@st.composite
def scan_cases(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    axis = draw(st.integers(-rank, rank - 1))
    L = draw(st.integers(2, 20))
    shape = shape[:axis % rank] + (L,) + shape[axis % rank + 1:]
    return (shape, axis, draw(st.booleans()),
            draw(st.sampled_from(["float32", "float64", "complex64"])), draw(st.integers(0, 2**31)))


@settings(max_examples=12, deadline=None)
@given(scan_cases())
def test_property_matches_lax(case):
    shape, axis, reverse, dtype_name, seed = case
    a, b = make_inputs(np.random.default_rng(seed), shape, DTYPES[dtype_name])
    got = associative_scan(affine_combine, (a, b), axis=axis, reverse=reverse)
    # (lax.rev rejects a negative axis: give lax the positive one)
    want = jax.jit(functools.partial(jax.lax.associative_scan, affine_combine,
                                     axis=axis % len(shape), reverse=reverse))((a, b))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g, w, TOL_LAX[dtype_name])
