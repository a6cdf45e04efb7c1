"""GPU tests of the CUDA linear_scan kernels against a float64 NumPy reference.

Skipped cleanly when JAX sees no GPU or the CUDA extension is not built. Every algorithm,
both layouts (scanned axis contiguous or strided), every dtype, reverse, h0, return_a_prod,
and the handlers inside XLA command buffers. The lowering tests at the end need only the
built extension (no GPU): they lower for CUDA on the CPU.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jax
import jax.numpy as jnp


import jax_selscan
from jax_selscan import linear_scan, primitives

try:
    from gpu_marks import requires_cuda
    from references import SPECIAL_SHAPES, with_specials
except ImportError:  # tests/ imported as a package
    from tests.gpu_marks import requires_cuda
    from tests.references import SPECIAL_SHAPES, with_specials


def gpu(f):
    """requires_cuda per test, not as pytestmark: the lowering tests at the end need no GPU."""
    for mark in requires_cuda:
        f = mark(f)
    return f

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
    ((2, 700, 264), 1),    # strided, 16-byte vectors for every dtype: auto runs strided_stage,
                           # strided_pipe_narrow for bfloat16 / float16 (11 chunks of 64
                           # steps, a partial channel tile)
    ((1500, 264), 0),      # strided, L > 1024 (24 chunks, a partial last chunk and channel
                           # tile): auto runs strided_pipe for float32 (3 channel tiles),
                           # strided_pipe_narrow for bfloat16 / float16 (3 tiles of 128)
    ((1500, 252), 0),      # 2 wide channel tiles: strided_pipe_narrow for fp32 and 16-bit
                           # types (4 fp32 tiles of 64 channels, 2 16-bit ones of 128; the
                           # last one partial)
    ((1500, 64), 0),       # one narrow channel tile: strided_stage
    ((1200, 1288), 0),     # 11 tiles of 128 16-bit channels: strided_pipe for all
    ((4, 1, 1028), 1),     # one step: strided_pipe_narrow for 16-bit types (a partial tile)
]


@pytest.fixture(scope="module", autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@gpu
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


@gpu
@pytest.mark.parametrize("shape,axis", [((0, 5), 1), ((5, 0), 1), ((0,), 0), ((4, 0, 3), 1), ((0, 3), 0)])
def test_empty(shape, axis):
    a = jnp.ones(shape, jnp.float32)
    h, p = linear_scan(a, a, axis=axis, return_a_prod=True)
    assert h.shape == shape and p.shape == shape


@gpu
@pytest.mark.parametrize("algorithm", ALGOS)
@pytest.mark.parametrize("reverse", [False, True])
def test_nan_and_inf_propagate_like_the_loop(algorithm, reverse):
    """With a close to 1 no product of a that a kernel forms underflows (0.9975^20000 is
    e^-50), so NaN and +-Inf land exactly where the sequential loop puts them."""
    for i, (shape, axis) in enumerate(SPECIAL_SHAPES):
        a, b = with_specials(shape, axis, (0.995, 1.0), seed=i)
        h = np.asarray(jax.jit(lambda a, b: linear_scan(a, b, axis=axis, reverse=reverse,
                                                        algorithm=algorithm))(a, b))
        want, _ = reference(a, b, np.zeros(np.delete(shape, axis)), axis, reverse)
        assert np.isnan(want).any() and np.isinf(want).any()
        np.testing.assert_array_equal(np.isnan(h), np.isnan(want), err_msg=str(shape))
        np.testing.assert_array_equal(h[np.isinf(want)], want[np.isinf(want)], err_msg=str(shape))
        fin = np.isfinite(want)
        scale = max(1.0, float(np.abs(want[fin]).max()))  # float32 error grows with |h|
        np.testing.assert_allclose(h[fin], want[fin], rtol=0, atol=1e-4 * scale, err_msg=str(shape))


@gpu
@pytest.mark.parametrize("reverse", [False, True])
def test_inf_meeting_an_underflowed_product_is_never_finite(reverse):
    """The documented difference from the loop: where a product of a over a stretch that a
    kernel combines at once underflows to 0, an infinite carry becomes NaN (0 * inf), as in
    lax.associative_scan; the loop keeps +-Inf. Never a finite number, and NaN stays NaN."""
    for i, (shape, axis) in enumerate(SPECIAL_SHAPES):
        a, b = with_specials(shape, axis, (0.5, 0.6), seed=10 + i)
        h = np.asarray(jax.jit(lambda a, b: linear_scan(a, b, axis=axis, reverse=reverse))(a, b))
        want, _ = reference(a, b, np.zeros(np.delete(shape, axis)), axis, reverse)
        assert not np.isfinite(h[~np.isfinite(want)]).any(), shape
        assert np.isnan(h[np.isnan(want)]).all(), shape
        fin = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(h), fin, err_msg=str(shape))
        scale = max(1.0, float(np.abs(want[fin]).max()))  # float32 error grows with |h|
        np.testing.assert_allclose(h[fin], want[fin], rtol=0, atol=1e-4 * scale, err_msg=str(shape))


@gpu
@pytest.mark.parametrize("algorithm", ALGOS)
def test_large_contiguous_and_strided(algorithm):
    for shape, axis in [((64, 40000), 1), ((3000, 512), 0)]:
        a, b, h0 = make(shape, axis, jnp.float32, seed=5)
        h = linear_scan(a, b, axis=axis, h0=h0, algorithm=algorithm)
        rh, _ = reference(a, b, h0, axis, False)
        assert rel_err(h, rh) < 5e-5


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64", "complex64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_few_long_rows(dtype, reverse):
    """Few long rows: "auto" runs row_pipe (float32, bfloat16) or row_stage (float64,
    complex64) when the rows are 16-byte vectors (a multiple of 8 here) and lookback_regs
    otherwise (the + 3)."""
    jdt, tol = DTYPES[dtype]
    for shape in [(64, (1 << 16) + 8), (64, (1 << 16) + 3)]:  # >= 2^22 elements, rows >= 65536
        a, b, h0 = make(shape, 1, jdt, seed=hash((dtype, reverse, shape)) % 2**32)
        h, p = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=1, reverse=reverse, h0=h0,
                                                    return_a_prod=True))(a, b, h0)
        rh, rp = reference(a, b, h0, 1, reverse)
        assert rel_err(h, rh) < tol, (shape, "h", rel_err(h, rh))
        assert rel_err(p, rp) < tol, (shape, "a_prod", rel_err(p, rp))


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_pipe_long_chains(dtype, reverse):
    """Strided scans with long chains (auto: strided_pipe, or strided_pipe_narrow for 16-bit
    types with at most 8 chains of 128-channel tiles and for fp32 at (5000, 130), 2 wide tiles
    and 3 narrow ones): 313 chunks of 64 steps on 3-6 channel
    tiles, more tiles than the persistent grid holds, so every block's ring wraps around many
    times and the look-backs reach back several windows; h0, a_prod, an outer dimension; and
    channels that are not a multiple of the vector (the fallback)."""
    jdt, tol = DTYPES[dtype]
    for shape, axis in [((20001, 520), 0), ((3, 3000, 136), 1), ((5000, 130), 0), ((20001, 1288), 0)]:
        a, b, h0 = make(shape, axis, jdt, seed=hash((dtype, reverse, shape)) % 2**32)
        h, p = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0,
                                                    return_a_prod=True))(a, b, h0)
        rh, rp = reference(a, b, h0, axis, reverse)
        assert rel_err(h, rh) < tol, (shape, "h", rel_err(h, rh))
        assert rel_err(p, rp) < tol, (shape, "a_prod", rel_err(p, rp))


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_few_long_chains(dtype, reverse):
    """Long strided scans on at most 2 wide channel tiles (auto: the narrow pipe from 2 narrow
    tiles of 64 fp32 / 128 16-bit channels, strided_stage on one): up to 157 chunks of 128 steps on
    2-4 narrow tiles, one with an outer dimension and a partial tile, and 313 chunks of 64
    steps on one tile (fp32 at 64 channels, 16-bit types at 64 and 128); h0 and a_prod."""
    jdt, tol = DTYPES[dtype]
    for shape, axis in [((20001, 256), 0), ((2, 5000, 120), 1), ((20001, 64), 0), ((20001, 128), 0)]:
        a, b, h0 = make(shape, axis, jdt, seed=hash((dtype, reverse, shape, "stage")) % 2**32)
        h, p = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0,
                                                    return_a_prod=True))(a, b, h0)
        rh, rp = reference(a, b, h0, axis, reverse)
        assert rel_err(h, rh) < tol, (shape, "h", rel_err(h, rh))
        assert rel_err(p, rp) < tol, (shape, "a_prod", rel_err(p, rp))


def check_with_and_without_prod(a, b, h0, axis, reverse, tol, shape):
    """One jitted scan with a_prod and one without; h and a_prod checked against the float64
    recurrence. Returns (h, a_prod, h without a_prod, the reference h)."""
    h, p = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0,
                                                return_a_prod=True))(a, b, h0)
    h_only = jax.jit(lambda a, b, h0: linear_scan(a, b, axis=axis, reverse=reverse, h0=h0))(a, b, h0)
    rh, rp = reference(a, b, h0, axis, reverse)
    assert rel_err(h, rh) < tol, (shape, "h", rel_err(h, rh))
    assert rel_err(p, rp) < tol, (shape, "a_prod", rel_err(p, rp))
    return h, p, h_only, rh


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("reverse", [False, True])
def test_row_pipe_long_rows(dtype, reverse):
    """Few long rows (auto: row_pipe; fp32 scanned in place, 16-bit re-walked): one row of 512
    tiles (more than the persistent grid's ring slots, and far past the 128-word look-back
    window), 8 rows with a partial last tile, h0 and a_prod; and a row length that is not a
    multiple of the 16-byte vector (the fallback). Without a_prod fp32 takes another store
    path (one bulk copy of each tile's h), so h is checked both ways."""
    jdt, tol = DTYPES[dtype]
    n1 = 1 << (22 if dtype == "float32" else 23)  # 512 tiles of 8192 / 16384 elements
    for shape, axis in [((n1,), 0), ((8, (1 << 19) + 4096), 1), ((5, (1 << 20) + 2), 1)]:
        a, b, h0 = make(shape, axis, jdt, seed=hash((reverse, shape)) % 2**32)
        h, _, h_only, rh = check_with_and_without_prod(a, b, h0, axis, reverse, tol, shape)
        assert rel_err(h_only, rh) < tol, (shape, "h without a_prod", rel_err(h_only, rh))


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("reverse", [False, True])
def test_strided_whole(dtype, reverse, monkeypatch):
    """strided_whole (one block per channel tile through the whole axis), forced wherever it can
    run (JAX_SELSCAN_LS_WHOLE=1): one round of 1024 / NCV steps with NCV = 2, 8, 32 vectors a
    block, two rounds of NCV = 2 (L = 1000), four rounds of NCV = 4 (L = 1000 over 4096 channels:
    >= 128 blocks), several rounds with the carry crossing them, a row of one vector (NCV = 1),
    outer rows, a partial last block of vectors; h and a_prod against the float64 recurrence, and
    the kernel it ran."""
    from jax_selscan import _cuda
    monkeypatch.setenv("JAX_SELSCAN_LS_WHOLE", "1")
    jdt, tol = DTYPES[dtype]
    one_vector = ((700, 4), 0) if dtype == "float32" else ((700, 8), 0)
    for shape, axis in [((1000, 64), 0), ((2, 300, 136), 1), ((3, 100, 48), 1), ((2, 9, 512), 1),
                        ((2600, 40), 0), ((1, 5000, 8), 1), one_vector, ((1000, 4096), 0)]:
        outer, L, inner = int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:]))
        assert _cuda.launched_algorithm(dtype, outer, L, inner) == 15, shape  # kStridedWhole
        a, b, h0 = make(shape, axis, jdt, seed=hash((dtype, reverse, shape)) % 2**32)
        h, _, h_only, rh = check_with_and_without_prod(a, b, h0, axis, reverse, tol, shape)
        assert np.array_equal(np.asarray(h_only), np.asarray(h)), shape  # the same bits either way


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_row_walk_rows_per_warp(dtype, reverse, monkeypatch):
    """Many short rows on row_walk with a warp walking several consecutive rows, its load ring
    running on across them (JAX_SELSCAN_LS_ROWS_PER_WARP set to what the default rule gives, at
    least 2): rows of one to four sub-chunks, a partial last warp, rows whose length is not a
    multiple of the 16-byte vector (scalar loads), and 7 rows a warp over 1000 rows; h and
    a_prod against float64."""
    from jax_selscan import _cuda
    jdt, tol = DTYPES[dtype]
    eb = jnp.dtype(jdt).itemsize
    for shape, rpw in [((32771, 64), None), ((65539, 200), None), ((40000, 37), None), ((1000, 300), 7)]:
        rpw = rpw or max(2, _cuda.row_walk_rows_per_warp(*shape, elem_bytes=eb, rule=True))
        monkeypatch.setenv("JAX_SELSCAN_LS_ROWS_PER_WARP", str(rpw))
        assert _cuda.row_walk_rows_per_warp(*shape, elem_bytes=eb) == rpw
        assert _cuda.launched_algorithm(dtype, shape[0], shape[1], 1) == 7, shape  # kRowWalk
        a, b, h0 = make(shape, 1, jdt, seed=hash((dtype, reverse, shape)) % 2**32)
        check_with_and_without_prod(a, b, h0, 1, reverse, tol, shape)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_walk_warps_per_sm(dtype, monkeypatch):
    """Long rows on row_walk with the one-warp blocks an SM holds capped (the launch pads each
    block's shared memory; sections 22-23, forced: the rule takes none): more rows than the cap
    keeps in flight (8192 x 2048, a length that is not a multiple of the 16-byte vector,
    reversed), forced to 8, 16 and 24, each against float64 and bitwise equal to the uncapped
    launch (the padding must change nothing but the timing)."""
    from jax_selscan import _cuda
    jdt, tol = DTYPES[dtype]
    eb = jnp.dtype(jdt).itemsize
    for shape, reverse in [((8192, 2048), False), ((3000, 4100), True), ((4099, 2051), False)]:
        a, b, h0 = make(shape, 1, jdt, seed=hash((dtype, shape)) % 2**32)
        monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", "0")
        assert _cuda.row_walk_warps_per_sm() == 0
        assert _cuda.launched_algorithm(dtype, shape[0], shape[1], 1) == 7, shape  # kRowWalk
        h_free = np.asarray(linear_scan(a, b, axis=1, reverse=reverse, h0=h0))
        for cap in ["8", "16", "24"]:
            monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", cap)
            assert _cuda.row_walk_warps_per_sm() == int(cap)
            h, _, _, _ = check_with_and_without_prod(a, b, h0, 1, reverse, tol, (shape, cap))
            np.testing.assert_array_equal(np.asarray(h).view(np.uint16 if eb == 2 else np.uint32),
                                          h_free.view(np.uint16 if eb == 2 else np.uint32))


@gpu
def test_auto_runs_the_pipelines():
    """On a GPU whose blocks may have 227 KB of shared memory (compute capability 9.x: H100,
    H200), "auto" must run the warp-specialised pipelines, not their slower fallbacks (which
    give the same numbers, so no accuracy test can tell)."""
    from jax_selscan import _cuda
    dev = jax.devices("gpu")[0]
    cc = getattr(dev, "compute_capability", None)
    hopper = str(cc).startswith("9") if cc is not None else any(k in dev.device_kind for k in ("H100", "H200"))
    if not hopper:
        pytest.skip(f"{dev.device_kind} (compute capability {cc}): the fallbacks may run")
    assert _cuda.launched_algorithm("float32", 1, 1 << 26, 1) == 13  # kRowPipe (cuda/linear_scan.h)
    assert _cuda.launched_algorithm("bfloat16", 1, 1 << 26, 1) == 13
    assert _cuda.launched_algorithm("float16", 64, 1 << 20, 1) == 13
    assert _cuda.launched_algorithm("float32", 1, 4096, 24576) == 12  # kStridedPipe
    assert _cuda.launched_algorithm("bfloat16", 1, 4096, 24576) == 12
    assert _cuda.launched_algorithm("float32", 1, 65536, 64) == 9  # kStridedStage: 1 narrow tile
    assert _cuda.launched_algorithm("float32", 1, 65536, 256) == 14  # kStridedPipeNarrow
    assert _cuda.launched_algorithm("bfloat16", 1, 65536, 256) == 14
    assert _cuda.launched_algorithm("bfloat16", 1, 65536, 1024) == 14
    assert _cuda.launched_algorithm("float16", 2048, 32, 1024) == 14
    assert _cuda.launched_algorithm("float64", 1, 1 << 26, 1) == 11  # kRowStage: no pipeline


@gpu
def test_default_is_deterministic():
    """Bitwise-identical results over repeated runs (the full 500-run check is in gpu_check.sh)."""
    a, b, h0 = make((1 << 22,), 0, jnp.float32, seed=3)
    f = jax.jit(lambda a, b, h0: linear_scan(a, b, h0=h0))
    ref = np.asarray(f(a, b, h0))
    for _ in range(50):
        assert np.array_equal(np.asarray(f(a, b, h0)), ref)


@gpu
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


# --- command buffers (CUDA graphs) -----------------------------------------------------

# (shape, axis, dtype, reverse, return_a_prod): contiguous fp32; strided bf16 (strided_stage)
# reversed; one long fp32 row (look-back over many tiles) reversed with a_prod; a long strided
# fp32 axis (strided_pipe) with a_prod; the same in bf16 on 2 chains (strided_pipe_narrow); few
# long rows (row_pipe), fp32 with a_prod and bf16 reversed.
GRAPH_CASES = [((3, 5000), 1, "float32", False, False),
               ((2, 700, 264), 1, "bfloat16", True, False),
               ((20000,), 0, "float32", True, True),
               ((3000, 512), 0, "float32", False, True),  # strided_pipe
               ((3000, 256), 0, "bfloat16", False, False),  # strided_pipe_narrow
               ((8, 1 << 19), 1, "float32", False, True),  # row_pipe
               ((8, 1 << 19), 1, "bfloat16", True, False)]  # row_pipe, 16-bit

_GRAPH_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax_selscan import linear_scan, _cuda

    cases = json.loads(sys.argv[1])
    data = np.load(sys.argv[2])
    args = [jnp.asarray(data[f"{k}{i}"], getattr(jnp, c[2])) for i, c in enumerate(cases) for k in "abh"]
    # b and h0 times -2: every h scales by exactly -2 (powers of two round exactly), a_prod
    # stays; so a replay that kept the first inputs' launches or stale look-back flags shows.
    args2 = [x if j % 3 == 0 else x * -2 for j, x in enumerate(args)]
    scale = [s for c in cases for s in ([-2.0, 1.0] if c[4] else [-2.0])]

    def f(*args):
        outs = []
        for i, (shape, axis, dtype, reverse, prod) in enumerate(cases):
            a, b, h0 = args[3 * i:3 * i + 3]
            r = linear_scan(a, 2 * b, axis=axis, reverse=reverse, h0=h0, return_a_prod=prod)
            outs += list(r) if prod else [r]
        return outs

    jitted = jax.jit(f)
    host = lambda outs: [np.asarray(x.astype(jnp.float32)) for x in outs]
    runs = [host(jitted(*args)) for _ in range(3)]
    runs2 = [host(jitted(*args2)) for _ in range(2)]
    again = host(jitted(*args))
    same = all(np.array_equal(x, y) for r in runs[1:] + [again] for x, y in zip(r, runs[0]))
    scaled = all(np.array_equal(y, s * x) for r in runs2 for x, y, s in zip(runs[0], r, scale))
    np.savez(sys.argv[3], *runs[0])
    calls = jitted.lower(*args).as_text().count("@jax_selscan_linear_scan")  # none on a fallback
    print(json.dumps(dict(bitwise_equal_runs=same, scaled_inputs_exact=scaled, custom_calls=calls,
                          captured_calls=_cuda.captured_calls())))
""")


@gpu
def test_command_buffers(tmp_path):
    """The handlers recorded into XLA command buffers (CUDA graphs) and replayed: results
    against float64, bitwise equal over repeated runs, and right again (exactly -2 times) when
    the same executable runs on other inputs, then on the first ones once more. XLA calls a
    handler only while it records it; _cuda.captured_calls() counts those calls, so the test
    knows the graph path ran (the compiled HLO does not show command buffers any more)."""
    arrays, refs = {}, []
    for i, (shape, axis, dtype, reverse, prod) in enumerate(GRAPH_CASES):
        a, b, h0 = make(shape, axis, DTYPES[dtype][0], seed=100 + i)
        arrays.update({f"a{i}": a.astype(np.float32), f"b{i}": b.astype(np.float32),
                       f"h{i}": h0.astype(np.float32)})  # exact for bf16; cast back there
        rh, rp = reference(a, 2 * b.astype(np.float64), h0, axis, reverse)
        refs += [(rh, DTYPES[dtype][1])] + ([(rp, DTYPES[dtype][1])] if prod else [])
    np.savez(tmp_path / "in.npz", **arrays)
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
               " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"))
    env.pop("JAX_ENABLE_X64", None)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process holds the GPU too
    # the same jax_selscan as this test session imports (source tree or installed)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(jax_selscan.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, "-c", _GRAPH_SCRIPT, json.dumps(GRAPH_CASES),
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    print(info)
    assert info["bitwise_equal_runs"], info
    assert info["scaled_inputs_exact"], info
    assert info["custom_calls"] == len(GRAPH_CASES), info
    out = np.load(tmp_path / "out.npz")
    assert len(out.files) == len(refs)
    for k, (ref, tol) in enumerate(refs):
        assert rel_err(out[f"arr_{k}"], ref) < tol, (k, rel_err(out[f"arr_{k}"], ref))
    if info["captured_calls"] == 0:
        pytest.skip(f"XLA recorded no handler call into a command buffer: {info}")


# --- the CUDA lowering, checked on the CPU (needs the extension, not a GPU) ---------------

needs_extension = pytest.mark.skipif(not jax_selscan.has_cuda_kernels,
                                     reason="jax_selscan._cuda not built")


def _exported_text(platform, shape, axis, dtype, reverse=False, prod=False, algorithm="auto"):
    targets = ["jax_selscan_linear_scan", "jax_selscan_linear_scan_prod"]
    f = jax.jit(lambda a, b, h0: primitives.bind(a, b, h0, axis=axis, reverse=reverse,
                                                 return_a_prod=prod, algorithm=algorithm))
    h_shape = shape[:axis] + shape[axis + 1:]
    spec = jax.ShapeDtypeStruct
    exp = jax.export.export(
        f, platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(t) for t in targets])(
        spec(shape, dtype), spec(shape, dtype), spec(h_shape, dtype))
    return exp.mlir_module()


def _custom_call_results(text):
    line = next(l for l in text.splitlines() if "stablehlo.custom_call @jax_selscan_linear_scan" in l)
    return re.findall(r"tensor<([^>]*)>", line.split("->")[-1])


@needs_extension
@pytest.mark.parametrize("shape,axis,dtype,prod", [((3, 5000), 1, jnp.float32, False),
                                                   ((2, 700, 264), 1, jnp.bfloat16, True),
                                                   ((20000,), 0, jnp.float32, True)])
def test_cuda_lowering_requests_scratch(shape, axis, dtype, prod):
    """The CUDA custom call gets one more uint8 result, sized by the extension's query plus
    the alignment slack; the primitive's results are unchanged; the CPU call is unchanged."""
    from jax_selscan import _cuda
    outer, inner = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
    need = _cuda.linear_scan_scratch_bytes(np.dtype(dtype).name, outer, shape[axis], inner, False, 0)
    assert need > 0  # look-back kernels: status words / carries
    res = _custom_call_results(_exported_text("cuda", shape, axis, dtype, prod=prod))
    n_out = 2 if prod else 1
    assert len(res) == n_out + 1, res
    assert res[-1] == f"{need + _cuda.linear_scan_scratch_align()}xui8", res
    assert _cuda.linear_scan_scratch_align() == 256
    if jax_selscan.has_cpu_kernels:  # a CUDA-only build lowers the CPU path to plain JAX
        cpu = _custom_call_results(_exported_text("cpu", shape, axis, dtype, prod=prod))
        assert len(cpu) == n_out and not any("ui8" in r for r in cpu), cpu


@needs_extension
def test_auto_rule_for_short_strided_scans(monkeypatch):
    """strided_whole (one block per channel tile through the whole axis, no look-back) for
    strided axes of L <= 1024: fp32 at any size, 16-bit types up to 2^22 elements (what was
    measured); JAX_SELSCAN_LS_WHOLE=1 / 0 turns it on / off wherever it can run
    (docs/PERFORMANCE_CUDA.md sections 20, 20.2, 22.8)."""
    from jax_selscan import _cuda
    WHOLE, STAGE, NARROW, ROWS = 15, 9, 14, 7  # cuda/linear_scan.h
    r = _cuda.resolve_algorithm
    monkeypatch.delenv("JAX_SELSCAN_LS_WHOLE", raising=False)
    assert r(1, 1024, 1024) == WHOLE and r(1, 1024, 1024, elem_bytes=2) == WHOLE
    assert r(4, 1024, 1024, elem_bytes=2) == WHOLE and r(8, 1024, 1024, elem_bytes=2) != WHOLE
    assert r(2048, 32, 1024) == WHOLE and r(1, 1024, 1 << 20) == WHOLE  # fp32: any size ...
    assert r(1 << 21, 8, 1 << 11) == WHOLE and r(1 << 22, 8, 1 << 11) != WHOLE  # ... grid < 2^31
    assert r(1, 1025, 1024) != WHOLE and r(2048, 32, 1024, elem_bytes=2) == NARROW
    assert r(1, 1024, 1024, elem_bytes=8) != WHOLE and r(1024, 1024, 1) == ROWS  # not contiguous
    monkeypatch.setenv("JAX_SELSCAN_LS_WHOLE", "0")
    assert r(1, 1024, 1024) == STAGE and r(1, 1024, 1024, elem_bytes=2) == NARROW
    monkeypatch.setenv("JAX_SELSCAN_LS_WHOLE", "1")
    assert r(1, 65536, 1024) == WHOLE and r(1024, 1024, 1) == ROWS


@needs_extension
def test_row_walk_rows_per_warp_rule(monkeypatch):
    """row_walk's rows per warp (no GPU needed): about 2 KB of a and b per unit a warp walks, so
    rows of 1 KB two a warp, of 512 B four, of >= 2 KB one, while at least 16384 warps remain
    (docs/PERFORMANCE_CUDA.md section 21.2). The environment variable forces a count."""
    from jax_selscan import _cuda
    runs = _cuda.row_walk_rows_per_warp

    def r(*args, **kw):
        return runs(*args, **kw, rule=True)

    monkeypatch.delenv("JAX_SELSCAN_LS_ROWS_PER_WARP", raising=False)
    assert r(65536, 256, elem_bytes=2) == 2 and r(65536, 256) == 1 and r(65536, 256, elem_bytes=8) == 1
    assert r(131072, 128, elem_bytes=2) == 4 and r(131072, 128) == 2 and r(131072, 100) == 3
    assert r(10**6, 32) == 8 and r(32771, 64) == 2 and r(16383, 64) == 1
    assert r(32768, 512, elem_bytes=2) == 1 and r(4096, 16384) == 1 and r(10**6, 768) == 1
    assert runs(65536, 256, elem_bytes=2) == 2 and runs(131072, 128) == 2  # the rule by default
    monkeypatch.setenv("JAX_SELSCAN_LS_ROWS_PER_WARP", "5")
    assert runs(4096, 16384) == 5 and r(4096, 16384) == 1
    monkeypatch.setenv("JAX_SELSCAN_LS_ROWS_PER_WARP", "0")  # not a count: the default
    assert runs(65536, 256, elem_bytes=2) == 2


@needs_extension
def test_row_walk_warps_per_sm_rule(monkeypatch):
    """row_walk's cap on the one-warp blocks an SM holds (no GPU needed): none by default
    (docs/PERFORMANCE_CUDA.md section 23: with one row a warp on its own loop a cap measured
    level with none). The environment variable forces a cap, 0 none; anything else in it is
    ignored."""
    from jax_selscan import _cuda
    runs = _cuda.row_walk_warps_per_sm

    monkeypatch.delenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", raising=False)
    assert runs() == 0
    monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", "0")
    assert runs() == 0
    monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", "12")
    assert runs() == 12
    monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", "-3")
    assert runs() == 0
    monkeypatch.setenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM", "many")
    assert runs() == 0


@needs_extension
def test_auto_rule_for_long_strided_scans(monkeypatch):
    """"auto" for strided axes among the tiled kernels (no GPU needed; the measurements behind
    it are in cuda/dispatch.cc; strided_whole, which takes the small ones, is off here). A
    chain is one channel tile of one outer row: wide tiles hold 128 fp32 / 256 16-bit channels,
    narrow ones 64 / 128. Axes longer than 1024 steps: fp32 the wide pipe from 3 wide chains,
    else the narrow pipe from 2 narrow chains, else strided_stage; 16-bit types the narrow pipe
    from 2 to 8 narrow chains, the wide pipe beyond, strided_stage on one.
    Axes of at most 1024 steps: fp32 strided_stage; 16-bit types the narrow pipe from 3 narrow
    chains, else strided_stage. 8-byte types: lookback_regs."""
    from jax_selscan import _cuda
    PIPE, STAGE, REGS, NARROW = 12, 9, 5, 14  # cuda/linear_scan.h
    r = _cuda.resolve_algorithm
    monkeypatch.setenv("JAX_SELSCAN_LS_WHOLE", "0")
    # fp32, L > 1024: 2 wide tiles -> the narrow pipe (4 narrow tiles); 3 wide tiles -> the pipe
    assert r(1, 65536, 256) == NARROW and r(1, 65536, 257) == PIPE
    assert r(1, 65536, 65) == NARROW and r(1, 65536, 64) == STAGE  # 2 / 1 narrow tiles
    assert r(2, 5000, 32) == NARROW and r(3, 5000, 128) == PIPE  # outer rows count as chains
    # 16-bit, L > 1024: the narrow pipe from 2 to 8 chains of 128 channels
    assert r(1, 65536, 128, elem_bytes=2) == STAGE and r(1, 65536, 129, elem_bytes=2) == NARROW
    assert r(1, 65536, 1024, elem_bytes=2) == NARROW and r(1, 65536, 1025, elem_bytes=2) == PIPE
    assert r(2, 5000, 512, elem_bytes=2) == NARROW and r(3, 5000, 512, elem_bytes=2) == PIPE
    assert r(1, 4096, 24576) == PIPE and r(1, 4096, 24576, elem_bytes=2) == PIPE
    # L <= 1024: fp32 the stage; 16-bit the narrow pipe from 3 chains of 128 channels
    assert r(1, 1024, 256) == STAGE and r(1, 1024, 24576) == STAGE and r(1, 1024, 64) == STAGE
    assert r(2048, 32, 1024, elem_bytes=2) == NARROW and r(1, 1024, 24576, elem_bytes=2) == NARROW
    assert r(1, 1024, 256, elem_bytes=2) == STAGE and r(1, 1024, 257, elem_bytes=2) == NARROW
    assert r(1, 65536, 256, elem_bytes=8) == REGS and r(1, 65536, 4096, elem_bytes=8) == REGS


@needs_extension
def test_cuda_scratch_sizes():
    from jax_selscan import _cuda
    q = _cuda.linear_scan_scratch_bytes
    # >= 512 contiguous rows: auto runs row_walk, which needs no scratch: a 1-byte result
    assert q("float32", 520, 64, 1, False, 0) == 0
    assert primitives.cuda_scratch_bytes((520, 64), jnp.float32, axis=1, reverse=False,
                                         algorithm="auto") == 1
    assert q("float32", 0, 64, 1, False, 0) == 0  # empty: nothing is launched
    # more tiles, more status words
    assert q("float32", 1, 1 << 20, 1, False, 3) > q("float32", 1, 1 << 16, 1, False, 3) > 0
    # strided, L > 1024 (auto: strided_pipe): one 16-byte status word per channel and 64-step tile
    assert q("float32", 1, 3000, 512, False, 0) >= 16 * 512 * -(-3000 // 64)
    assert q("bfloat16", 1, 3000, 1024, False, 0) >= 16 * 1024 * -(-3000 // 64)
    # ... and lookback_regs, which runs in that scratch where a GPU cannot hold a pipe's ring
    # (auto: the fp32 pipe, the narrow fp32 pipe, the narrow 16-bit pipe of 128- and 64-step
    # tiles, the wide 16-bit pipe at (3000, 2048), and lookback_regs itself at 4100
    # half-precision channels)
    for dtype, (L, C) in [("float32", (3000, 512)), ("float32", (3000, 256)), ("bfloat16", (65536, 1024)),
                          ("float16", (2000, 4100)), ("bfloat16", (3000, 2048)), ("float16", (32, 1028))]:
        assert q(dtype, 1, L, C, False, 0) >= q(dtype, 1, L, C, False, ALGOS.index("lookback_regs")) > 0
    # few long fp32 rows (auto: row_pipe): one 16-byte status word per 8192-element tile
    assert _cuda.resolve_algorithm(1, 1 << 26, 1) == 13  # kRowPipe (cuda/linear_scan.h)
    assert _cuda.resolve_algorithm(1024, 1 << 16, 1) == 7  # kRowWalk from 1024 rows
    assert q("float32", 1, 1 << 22, 1, False, 0) >= 16 * ((1 << 22) // 8192)
    # and 16-bit ones: one per 16384-element tile
    assert q("bfloat16", 1, 1 << 22, 1, False, 0) >= 16 * ((1 << 22) // 16384)
    assert q("float16", 3, 1 << 20, 1, True, 0) >= 16 * 3 * ((1 << 20) // 16384)
    # every named algorithm and dtype answers; unknown ones are refused
    for dtype in DTYPES:
        for alg in range(len(ALGOS)):
            assert q(dtype, 2, 4099, 130, True, alg) >= 0
    with pytest.raises(ValueError):
        q("int32", 1, 10, 1, False, 0)
    with pytest.raises(ValueError):
        q("float32", 1, 10, 1, False, len(ALGOS))
