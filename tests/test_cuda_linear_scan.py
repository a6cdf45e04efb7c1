"""GPU tests of the CUDA linear_scan kernels against a float64 NumPy reference.

Skipped cleanly when JAX sees no GPU or the CUDA extension is not built. Every algorithm,
both layouts (scanned axis contiguous or strided), every dtype, reverse, h0, return_a_prod.
"""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp


from jax_selscan import linear_scan

try:
    from gpu_marks import requires_cuda
except ImportError:  # tests/ imported as a package
    from tests.gpu_marks import requires_cuda

pytestmark = requires_cuda

ALGOS = ("auto", "blelloch", "three_pass", "lookback_serial", "lookback_warp", "lookback_regs", "hillis_steele")
DTYPES = {
    "float32": (jnp.float32, 2e-5),
    "float64": (jnp.float64, 1e-12),
    "bfloat16": (jnp.bfloat16, 1.5e-2),
    "float16": (jnp.float16, 4e-3),
    "complex64": (jnp.complex64, 2e-5),
}


def reference(a, b, h0, axis, reverse):
    """float64 (complex128) sequential recurrence; returns (h, a_prod)."""
    a = np.moveaxis(np.asarray(a, np.complex128 if np.iscomplexobj(a) else np.float64), axis, 0)
    b = np.moveaxis(np.asarray(b, a.dtype), axis, 0)
    h = np.empty_like(a)
    p = np.empty_like(a)
    st = np.asarray(h0, a.dtype).copy()
    pr = np.ones_like(st)
    order = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    for t in order:
        st = a[t] * st + b[t]
        pr = a[t] * pr
        h[t] = st
        p[t] = pr
    return np.moveaxis(h, 0, axis), np.moveaxis(p, 0, axis)


def make(shape, axis, dtype, seed):
    rng = np.random.default_rng(seed)
    hshape = shape[:axis] + shape[axis + 1:]
    if np.dtype(dtype) == np.complex64:
        a = rng.uniform(0.5, 0.99, shape) * np.exp(1j * rng.uniform(-0.2, 0.2, shape))
        b = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        h0 = rng.standard_normal(hshape) + 1j * rng.standard_normal(hshape)
    else:
        a = rng.uniform(0.5, 0.99, shape)
        b = rng.standard_normal(shape)
        h0 = rng.standard_normal(hshape)
    # round through the dtype so that the reference sees the kernel's inputs
    a, b, h0 = (np.asarray(jnp.asarray(x, dtype)) for x in (a, b, h0))
    return a, b, h0


def rel_err(x, ref):
    x = np.asarray(x).astype(ref.dtype)
    assert np.all(np.isfinite(x)), "non-finite output"
    return float(np.linalg.norm((x - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-300))


SHAPES = [
    ((3, 5000), 1),        # contiguous rows, several tiles per row
    ((2, 4099), 1),        # contiguous, L not a multiple of the vector width
    ((20000,), 0),         # one row, many tiles
    ((300, 132), 0),       # strided, channels a multiple of the vector width
    ((2, 250, 130), 1),    # strided with an outer dimension, ragged channels
    ((4, 3, 70), 2),       # short rows
    ((520, 64), 1),        # >= 512 rows: auto runs row_walk (16-byte vectors)
    ((600, 37), 1),        # >= 512 rows, L not a multiple of the vector width: row_walk scalars
    ((2, 700, 264), 1),    # strided, 16-byte vectors for every dtype: auto runs strided_stage
                           # (11 chunks of 64 steps, a partial channel tile)
]


@pytest.fixture(scope="module", autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("reverse", [False, True])
def test_against_float64(algorithm, dtype, reverse):
    jdt, tol = DTYPES[dtype]
    for i, (shape, axis) in enumerate(SHAPES):
        a, b, h0 = make(shape, axis, jdt, seed=hash((algorithm, dtype, reverse, i)) % 2**32)
        h, p = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0,
                                                    return_a_prod=True, algorithm=algorithm))(a, b, h0)
        rh, rp = reference(a, b, h0, axis, reverse)
        assert rel_err(h, rh) < tol, (shape, axis, "h", rel_err(h, rh))
        assert rel_err(p, rp) < tol, (shape, axis, "a_prod", rel_err(p, rp))
        if algorithm == "auto" and i < 2:  # the eager path too
            h1 = linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, algorithm=algorithm)
            assert rel_err(h1, rh) < tol


@pytest.mark.parametrize("shape,axis", [((0, 5), 1), ((5, 0), 1), ((0,), 0), ((4, 0, 3), 1), ((0, 3), 0)])
def test_empty(shape, axis):
    a = jnp.ones(shape, jnp.float32)
    h, p = linear_scan(a, a, axis=axis, return_a_prod=True)
    assert h.shape == shape and p.shape == shape


@pytest.mark.parametrize("algorithm", ALGOS)
def test_large_contiguous_and_strided(algorithm):
    for shape, axis in [((64, 40000), 1), ((3000, 512), 0)]:
        a, b, h0 = make(shape, axis, jnp.float32, seed=5)
        h = linear_scan(a, b, axis=axis, h0=h0, algorithm=algorithm)
        rh, _ = reference(a, b, h0, axis, False)
        assert rel_err(h, rh) < 5e-5


def test_default_is_deterministic():
    """Bitwise-identical results over repeated runs (the full 500-run check is in gpu_check.sh)."""
    a, b, h0 = make((1 << 22,), 0, jnp.float32, seed=3)
    f = jax.jit(lambda a, b, h0: linear_scan(a, b, h0=h0))
    ref = np.asarray(f(a, b, h0))
    for _ in range(50):
        assert np.array_equal(np.asarray(f(a, b, h0)), ref)


def test_grad_through_kernel():
    a, b, h0 = make((3, 777), 1, jnp.float32, seed=9)
    f = lambda a, b: jnp.sum(linear_scan(a, b, axis=1) ** 2)
    g = jax.grad(f, argnums=(0, 1))(a, b)
    with jax.default_device(jax.devices("cpu")[0]):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    eps = 1e-3
    # directional finite difference in float64 reference
    rng = np.random.default_rng(0)
    da, db = rng.standard_normal(a.shape), rng.standard_normal(b.shape)
    fr = lambda a, b: np.sum(reference(a, b, np.zeros(3), 1, False)[0] ** 2)
    fd = (fr(a64 + eps * da, b64 + eps * db) - fr(a64 - eps * da, b64 - eps * db)) / (2 * eps)
    an = float(np.sum(np.asarray(g[0]) * da) + np.sum(np.asarray(g[1]) * db))
    assert abs(an - fd) / abs(fd) < 1e-3
