"""Tests of the CPU FFI kernel of linear_scan (jax_selscan._cpu) specifically.

The generic behaviour of linear_scan is tested elsewhere; these check the
compiled kernel: it is used (custom call in the HLO), every ISA the CPU has
(forced through JAX_SELSCAN_CPU_ISA, read on every call), the layouts and
tails each kernel path handles, the chunked multithreaded path (few long
sequences), and sizes past 2^31 bytes.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_selscan

pytestmark = [pytest.mark.skipif(not jax_selscan.has_cpu_kernels,
                                 reason="jax_selscan built without its CPU kernels"),
              pytest.mark.usefixtures("cpu_default_device")]  # the CPU kernels, on any machine

if jax_selscan.has_cpu_kernels:
    from jax_selscan import _cpu
    ISAS = list(_cpu.supported_isas())
else:
    ISAS = []

TOL = {np.dtype(np.float32): 2e-5, np.dtype(np.float64): 1e-12, np.dtype(np.complex64): 2e-5,
       np.dtype(jnp.bfloat16): 1e-2, np.dtype(np.float16): 1e-2}


@pytest.fixture
def isa(request):
    old = os.environ.get("JAX_SELSCAN_CPU_ISA")
    os.environ["JAX_SELSCAN_CPU_ISA"] = request.param
    yield request.param
    if old is None:
        os.environ.pop("JAX_SELSCAN_CPU_ISA", None)
    else:
        os.environ["JAX_SELSCAN_CPU_ISA"] = old


def reference(a, b, axis, reverse, h0):
    """float64 / complex128 loop."""
    a = np.moveaxis(np.asarray(a).astype(np.complex128), axis, 0)
    b = np.moveaxis(np.asarray(b).astype(np.complex128), axis, 0)
    h = np.empty_like(a)
    p = np.empty_like(a)
    hc = np.asarray(h0).astype(np.complex128) if h0 is not None else np.zeros(a.shape[1:], np.complex128)
    pc = np.ones_like(hc)
    for t in (range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])):
        hc = a[t] * hc + b[t]
        pc = a[t] * pc
        h[t], p[t] = hc, pc
    return np.moveaxis(h, 0, axis), np.moveaxis(p, 0, axis)


def make(shape, dtype, rng, a_range=(-0.95, 0.95)):
    a = rng.uniform(*a_range, shape)
    b = rng.uniform(-1, 1, shape)
    if np.dtype(dtype) == np.complex64:
        a = a * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
        b = b + 1j * rng.uniform(-1, 1, shape)
    return jnp.asarray(a).astype(dtype), jnp.asarray(b).astype(dtype)


def check(a, b, *, axis, reverse=False, h0=None, prod=True):
    out = jax_selscan.linear_scan(a, b, axis=axis, reverse=reverse, h0=h0, return_a_prod=prod)
    h, p = out if prod else (out, None)
    assert h.dtype == a.dtype and h.shape == a.shape
    hr, pr = reference(a, b, axis, reverse, h0)
    tol = TOL[np.dtype(a.dtype)]
    if hr.size:
        scale = max(1.0, float(np.abs(hr).max()))
        np.testing.assert_allclose(np.asarray(h).astype(np.complex128), hr, rtol=0, atol=tol * scale)
        if prod:
            np.testing.assert_allclose(np.asarray(p).astype(np.complex128), pr, rtol=0, atol=tol)


def test_custom_call_in_hlo():
    f = jax.jit(lambda a, b: jax_selscan.linear_scan(a, b, axis=1))
    text = f.lower(jnp.ones((2, 8, 3)), jnp.ones((2, 8, 3))).as_text()
    assert "jax_selscan_linear_scan" in text
    g = jax.jit(lambda a, b: jax_selscan.linear_scan(a, b, return_a_prod=True))
    assert "jax_selscan_linear_scan_prod" in g.lower(jnp.ones(8), jnp.ones(8)).as_text()


def test_isa_env_var_is_read_per_call():
    old = os.environ.get("JAX_SELSCAN_CPU_ISA")
    try:
        for name in ISAS:
            os.environ["JAX_SELSCAN_CPU_ISA"] = name
            assert _cpu.isa() == name
        os.environ["JAX_SELSCAN_CPU_ISA"] = "scalar"
        assert _cpu.isa() == "generic"
        os.environ["JAX_SELSCAN_CPU_ISA"] = "no-such-isa"
        with pytest.raises(Exception, match="JAX_SELSCAN_CPU_ISA"):
            jax.block_until_ready(jax_selscan.linear_scan(jnp.ones(5), jnp.ones(5)))
    finally:
        if old is None:
            os.environ.pop("JAX_SELSCAN_CPU_ISA", None)
        else:
            os.environ["JAX_SELSCAN_CPU_ISA"] = old


DTYPES = [np.float32, np.float64, np.complex64, jnp.bfloat16, np.float16]
# (shape, axis): rows layout (axis last) with vector/block tails and 4 KiB
# strides (staggered rows), strided layout with register tiles, wide blocks and
# partial vectors, and tiny/empty edge cases.
LAYOUTS = [
    ((1,), 0), ((2,), 0), ((17,), 0), ((3, 7), 1), ((33, 129), 1), ((9, 1024), 1), ((5, 1025), 1),
    ((7, 3), 0), ((13, 17), 0), ((31, 64), 0), ((6, 1000), 0), ((3, 2, 5, 4), 2), ((0, 4), 0),
    ((4, 0), 1), ((2, 3, 0), 0),
]


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,axis", LAYOUTS)
@pytest.mark.parametrize("reverse", [False, True])
def test_every_isa_layout(isa, dtype, shape, axis, reverse):
    rng = np.random.default_rng(hash((shape, axis, reverse)) % 2**32)
    a, b = make(shape, dtype, rng)
    h0 = jnp.asarray(rng.uniform(-1, 1, shape[:axis] + shape[axis + 1:])).astype(dtype)
    check(a, b, axis=axis, reverse=reverse, h0=h0)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.complex64, jnp.bfloat16])
@pytest.mark.parametrize("shape,axis", [((300_007,), 0), ((3, 100_003), 1), ((70_001, 3), 0),
                                        ((40_009, 40), 0)])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunked_multithreaded(isa, dtype, shape, axis, reverse):
    """Few long sequences: the axis is split into chunks (reduce, carries, scan) on all threads."""
    rng = np.random.default_rng(1)
    a, b = make(shape, dtype, rng)
    h0 = jnp.asarray(rng.uniform(-1, 1, shape[:axis] + shape[axis + 1:])).astype(dtype)
    check(a, b, axis=axis, reverse=reverse, h0=h0)


@pytest.mark.parametrize("prefault", ["1", "0"])
def test_large_outputs_faulted_in_first(prefault, monkeypatch):
    """Outputs of >= 4 MiB are faulted in over the threads before the scan (huge_pages.h
    prepare_output; JAX_SELSCAN_CPU_PREFAULT=0 skips it): h and a_prod as the reference."""
    monkeypatch.setenv("JAX_SELSCAN_CPU_PREFAULT", prefault)
    rng = np.random.default_rng(11)
    a, b = make((1_100_003, 3), np.float32, rng)  # 12.6 MiB each, not 2 MiB-aligned in general
    check(a, b, axis=0, reverse=False, h0=None)


def test_growing_a_short_sequences():
    rng = np.random.default_rng(2)
    for shape, axis in [((61,), 0), ((3, 47), 1), ((64, 33), 0)]:
        a, b = make(shape, np.float32, rng, a_range=(1.0, 1.05))
        check(a, b, axis=axis)


def test_nan_propagates():
    a = jnp.full((3, 200_000), 0.9, jnp.float32)
    b = jnp.ones((3, 200_000), jnp.float32).at[1, 1000].set(jnp.nan)
    h = np.asarray(jax_selscan.linear_scan(a, b, axis=1))
    assert np.isnan(h[1, 1000:]).all() and not np.isnan(h[1, :1000]).any()
    assert not np.isnan(h[0]).any() and not np.isnan(h[2]).any()
    hr = np.asarray(jax_selscan.linear_scan(a, b, axis=1, reverse=True))
    assert np.isnan(hr[1, :1001]).all() and not np.isnan(hr[1, 1001:]).any()


def test_vmap_and_grad_use_kernel():
    rng = np.random.default_rng(3)
    a, b = make((4, 50, 3), np.float32, rng)
    f = lambda a, b: jax_selscan.linear_scan(a, b, axis=0)
    hv = jax.vmap(f)(a, b)
    for i in range(4):
        np.testing.assert_allclose(hv[i], f(a[i], b[i]), rtol=1e-6, atol=1e-6)
    g = jax.grad(lambda b: jax_selscan.linear_scan(a, b, axis=1).sum())(b)
    assert g.shape == b.shape and np.isfinite(np.asarray(g)).all()


@pytest.mark.slow
def test_more_than_2_31_elements_bytes():
    """2^29 + 3 float32 elements = 2 GiB + 12 bytes per array: 64-bit offsets throughout."""
    n = (1 << 29) + 3
    try:
        a = jnp.full((n,), 0.5, jnp.float32)
        b = jnp.ones((n,), jnp.float32)
        h = jax_selscan.linear_scan(a, b, axis=0)
        tail = np.asarray(h[-4:])
    except (MemoryError, RuntimeError) as e:  # XlaRuntimeError derives from RuntimeError
        pytest.skip(f"not enough memory: {e}")
    np.testing.assert_allclose(tail, 2.0, rtol=1e-6)  # fixed point of h = 0.5 h + 1
    assert float(h[0]) == 1.0
