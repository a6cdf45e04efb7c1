"""The CPU selective-scan kernel (cpu_arm/selective_scan.h) behind selective_scan.

Kernel-specific checks; the semantics are covered by test_selective_scan.py.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jax_selscan import _ffi
from jax_selscan.reference import selective_scan_ref
from jax_selscan.selective_scan import selective_scan

sys.path.insert(0, os.path.dirname(__file__))
from references import selective_scan_np  # noqa: E402
from conftest import REQUIRE_CPU_KERNEL  # noqa: E402

jax.config.update("jax_enable_x64", True)

if not _ffi.HAS_CPU and not REQUIRE_CPU_KERNEL:
    pytest.skip("the CPU extension is not built", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("cpu_default_device")  # the CPU kernels, on any machine

F32, BF16 = np.dtype(np.float32), np.dtype(jnp.bfloat16)


def inputs(seed, batch=2, dim=8, dstate=4, length=9, groups=2, dtype=np.float32,
           b_kind="grouped", c_kind="variable", state_dtype=None):
    rng = np.random.default_rng(seed)
    state_dtype = state_dtype or dtype

    def bc(kind):
        shape = {"invariant": (dim, dstate), "variable": (batch, dstate, length),
                 "grouped": (batch, groups, dstate, length)}[kind]
        return jnp.asarray(rng.standard_normal(shape), state_dtype)

    x = dict(u=jnp.asarray(rng.standard_normal((batch, dim, length)), dtype),
             delta=jnp.asarray(rng.standard_normal((batch, dim, length)) * 0.5 - 0.5, dtype),
             A=jnp.asarray(-np.exp(rng.standard_normal((dim, dstate)) * 0.5), state_dtype),
             B=bc(b_kind), C=bc(c_kind),
             D=jnp.asarray(rng.standard_normal(dim), state_dtype),
             z=jnp.asarray(rng.standard_normal((batch, dim, length)), dtype),
             delta_bias=jnp.asarray(rng.uniform(0, 0.5, dim), state_dtype),
             h0=jnp.asarray(rng.standard_normal((batch, dim, dstate)), state_dtype))
    return x


def np64(x):
    return {k: np.asarray(v, np.float64) for k, v in x.items()}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)


def run(x, **kw):
    return jax.jit(lambda x: selective_scan(**x, delta_softplus=True, **kw))(x)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16])
def test_custom_call_in_hlo(dtype):
    x = inputs(0, dtype=dtype)
    hlo = jax.jit(lambda x: selective_scan(**x, delta_softplus=True)).lower(x).as_text()
    assert _ffi.SELECTIVE_SCAN in hlo


def test_float64_uses_the_fallback():
    x = inputs(0, dtype=np.float64)
    hlo = jax.jit(lambda x: selective_scan(**x, delta_softplus=True)).lower(x).as_text()
    assert _ffi.SELECTIVE_SCAN not in hlo


@pytest.mark.parametrize("b_kind,c_kind", [("grouped", "variable"), ("invariant", "invariant"),
                                           ("variable", "grouped")])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_matches_float64_loop(direction, b_kind, c_kind):
    x = inputs(1, dim=20, dstate=5, length=37, groups=4, b_kind=b_kind, c_kind=c_kind)
    out, last = run(x, direction=direction, return_last_state=True)
    want, want_last = selective_scan_np(**np64(x), delta_softplus=True, direction=direction)
    assert rel_err(out, want) < 2e-5
    for got, exp in zip(jax.tree.leaves(last), jax.tree.leaves(want_last)):
        assert got.dtype == np.float32
        assert rel_err(got, exp) < 2e-5


def test_bidirectional_equals_forward_plus_reverse_two_kernel_calls():
    x = inputs(2, batch=2, dim=48, dstate=16, length=203)
    fused, (lf, lr) = run(x, direction="bidirectional", return_last_state=True)
    fwd, lf1 = run(x, direction="forward", return_last_state=True)
    rev, lr1 = run(x, direction="reverse", return_last_state=True)
    # The fused kernel does the separate calls' arithmetic: last states bit-identical,
    # the output equal up to the rounding of the sum (D u counted once per direction).
    np.testing.assert_array_equal(lf, lf1)
    np.testing.assert_array_equal(lr, lr1)
    assert rel_err(fused, np.asarray(fwd, np.float64) + np.asarray(rev, np.float64)) < 1e-6


@pytest.mark.parametrize("dim", [3, 20])
def test_long_sequence(dim):
    # dim=3: narrow tasks, vectorised along L in segments; dim=20: channel tiles.
    x = inputs(3, batch=1, dim=dim, dstate=3, length=6001, groups=1)
    out, last = run(x, direction="bidirectional", return_last_state=True)
    want, want_last = selective_scan_np(**np64(x), delta_softplus=True, direction="bidirectional")
    assert rel_err(out, want) < 5e-5
    assert rel_err(last[0], want_last[0]) < 5e-5 and rel_err(last[1], want_last[1]) < 5e-5


@pytest.mark.parametrize("dim,length", [(1, 9000), (8, 3000)], ids=["along_l", "channel_tile"])
@pytest.mark.parametrize("special", [np.nan, np.inf], ids=["nan", "inf"])
def test_nan_and_inf_cross_the_l_split(monkeypatch, dim, length, special):
    """One NaN or +Inf in u early in a long sequence, L split into pieces (forced short by
    JAX_SELSCAN_SS_PIECE_STEPS; on >= 2 threads). The split drops an entering state's term once
    dA's product falls below 2^-30, which must not turn a NaN or infinite state finite: the
    outputs and last states are NaN / +-Inf exactly where the float64 loop's are, and close
    to it elsewhere (one task of >= 2^16 (b D L N): dim 1 takes the along-L path, dim 8 a
    channel tile; every direction). On the along-L path an infinite state may turn NaN where the loop
    keeps +-Inf (its segments combine products of dA, as linear_scan's chunked path does). (Its finite outputs keep the unsplit bits: the dropped term is
    below float32 resolution. Before the fix the NaN / Inf stopped at the first piece.)"""
    x = inputs(7, batch=1, dim=dim, dstate=8, length=length, groups=1)
    x["u"] = x["u"].at[0, dim // 2, 200].set(special).at[0, dim // 2, length - 200].set(special)
    monkeypatch.setenv("JAX_SELSCAN_SS_PIECE_STEPS", "256")
    for direction in ("forward", "reverse", "bidirectional"):
        out, last = run(x, direction=direction, return_last_state=True)
        with np.errstate(invalid="ignore"):  # the loop's own inf - inf: the NaN it must give
            want, want_last = selective_scan_np(**np64(x), delta_softplus=True, direction=direction)
        lasts = zip(last, want_last) if direction == "bidirectional" else [(last, want_last)]
        for got, ref in [(out, want)] + list(lasts):
            got, ref = np.asarray(got, np.float64), np.asarray(ref)
            assert not np.isfinite(ref).all(), direction
            fin = np.isfinite(ref)
            np.testing.assert_array_equal(np.isfinite(got), fin, err_msg=direction)
            assert np.isnan(got[np.isnan(ref)]).all(), direction
            if dim == 1:  # along L, +-Inf meets products of dA that underflowed: NaN (0 * inf)
                inf = np.isinf(got)  # where it stays infinite, it has the loop's sign
                np.testing.assert_array_equal(got[inf], ref[inf], err_msg=direction)
            else:  # time runs in order in each lane: exactly the loop's NaN and +-Inf
                np.testing.assert_array_equal(got[~fin], ref[~fin], err_msg=direction)
            assert not fin.any() or rel_err(got[fin], ref[fin]) < 5e-5, direction


def test_multithreaded_shape_matches_reference():
    # 4 x 96 channels = many tasks over the intra-op pool, N = 16 (state in registers).
    x = inputs(4, batch=4, dim=96, dstate=16, length=130, groups=1)
    out = run(x, direction="bidirectional")
    want = jax.jit(lambda x: selective_scan_ref(**x, delta_softplus=True,
                                                direction="bidirectional"))(x)
    assert rel_err(out, want) < 2e-5


def test_large_outputs_faulted_in_first(monkeypatch):
    """Forward and backward with outputs of >= 4 MiB, which the handlers fault in over the threads
    first (huge_pages.h prepare_output): bitwise what they give with that step off
    (JAX_SELSCAN_CPU_PREFAULT=0, read per call), and the forward as the float64 loop."""
    x = inputs(12, batch=1, dim=64, dstate=4, length=16_411, groups=1)  # out, du, ...: 4 MiB each
    fwd_vjp = jax.jit(lambda x: jax.vjp(lambda x: selective_scan(**x, delta_softplus=True), x))

    def once():
        out, vjp = fwd_vjp(x)
        return [out] + jax.tree_util.tree_leaves(vjp(jnp.cos(out)))

    monkeypatch.setenv("JAX_SELSCAN_CPU_PREFAULT", "0")
    off = once()
    monkeypatch.setenv("JAX_SELSCAN_CPU_PREFAULT", "1")
    on = once()
    for a, b in zip(on, off):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    want, _ = selective_scan_np(**np64(x), delta_softplus=True)
    assert rel_err(on[0], want) < 2e-5


def test_bfloat16_and_mixed_dtypes():
    x = inputs(5, batch=2, dim=32, dstate=16, length=77, dtype=jnp.bfloat16,
               state_dtype=np.float32)
    out, last = run(x, direction="bidirectional", return_last_state=True)
    assert out.dtype == BF16 and last[0].dtype == F32
    want, want_last = selective_scan_np(**np64(x), delta_softplus=True, direction="bidirectional")
    assert rel_err(out, want) < 1e-2
    assert rel_err(last[0], want_last[0]) < 2e-5
    x16 = inputs(6, dim=24, dstate=3, length=40, dtype=jnp.bfloat16)
    out16 = run(x16, direction="forward")
    want16, _ = selective_scan_np(**np64(x16), delta_softplus=True)
    assert rel_err(out16, want16) < 1e-2


@pytest.mark.parametrize("isa", ["avx2", "generic"])
def test_forced_isa_agrees(isa, monkeypatch):
    from jax_selscan import _cpu
    if isa not in _cpu.supported_isas():
        pytest.skip(f"{isa} not available here")
    x = inputs(7, batch=2, dim=40, dstate=16, length=65)
    best = np.asarray(run(x, direction="bidirectional"))
    monkeypatch.setenv("JAX_SELSCAN_CPU_ISA", isa)
    assert _cpu.isa() == isa
    forced = np.asarray(run(x, direction="bidirectional"))
    assert rel_err(forced, best) < 1e-5


def test_vmap_folds_into_batch_and_channels():
    xs = [inputs(10 + i, dim=8, dstate=4, length=11) for i in range(3)]
    stacked = {k: jnp.stack([x[k] for x in xs]) for k in xs[0]}
    f = lambda **kw: selective_scan(**kw, delta_softplus=True, return_last_state=True,
                                    direction="bidirectional")
    # Everything mapped, A/D/delta_bias included: folded into the channels.
    out, (lf, lr) = jax.jit(jax.vmap(lambda x: f(**x)))(stacked)
    # A/D/delta_bias shared: folded into the batch.
    shared = {k: xs[0][k] for k in ("A", "D", "delta_bias")}
    mapped = {k: v for k, v in stacked.items() if k not in shared}
    out2, _ = jax.jit(jax.vmap(lambda m: f(**m, **shared)))(mapped)
    for i, x in enumerate(xs):
        want, (wf, wr) = selective_scan_np(**np64(x), delta_softplus=True,
                                           direction="bidirectional")
        assert rel_err(out[i], want) < 2e-5
        assert rel_err(lf[i], wf) < 2e-5 and rel_err(lr[i], wr) < 2e-5
        want2, _ = selective_scan_np(**np64(dict(x, **shared)), delta_softplus=True,
                                     direction="bidirectional")
        assert rel_err(out2[i], want2) < 2e-5


def test_gradients_through_kernel_path_match_reference():
    x = inputs(8, batch=1, dim=8, dstate=4, length=13)
    names = tuple(x)

    def loss(fn):
        def f(*args):
            out, last = fn(**dict(zip(names, args)), delta_softplus=True, return_last_state=True,
                           direction="bidirectional")
            return jnp.sum(out * out) + jnp.sum(last[0]) - jnp.sum(last[1] ** 2)
        return f

    g = jax.jit(jax.grad(loss(selective_scan), argnums=tuple(range(len(names)))))(*x.values())
    g_ref = jax.jit(jax.grad(loss(selective_scan_ref),
                             argnums=tuple(range(len(names)))))(*x.values())
    for name, a, b in zip(names, g, g_ref):
        assert rel_err(a, b) < 1e-4, name


@pytest.mark.slow
@pytest.mark.parametrize("dim, direction", [(2, "forward"), (2, "reverse"), (16, "forward")])
def test_more_than_2_31_elements(dim, direction):
    """u, delta and the output hold dim * L > 2^31 bfloat16 elements (dim 2: the along-L path
    of narrow tasks, split over the threads; dim 16: a channel tile). With dt * A ~ -12 per step
    the state forgets within a few steps, so windows checked against a float64 reference over
    the window alone test the kernel where element offsets pass 2^31: every row's far end, and
    the last row across offset 2^31 itself (8 steps at the window's entering side left out)."""
    if not _ffi.HAS_CPU:
        pytest.skip("the CPU extension is not built (the fallback would materialise 2^31 x N)")
    L = (1 << 31) // dim + 37
    rng = np.random.default_rng(11)
    A = jnp.asarray(-4.0 - rng.uniform(0, 1, (dim, 4)), F32)
    B = jnp.asarray(rng.standard_normal((dim, 4)), F32)
    C = jnp.asarray(rng.standard_normal((dim, 4)), F32)
    # u: a pattern of period 251 (a shifted or wrapped index shows), made on the device
    pattern = lambda i: (((i % 251) % 17) - 8).astype(jnp.float32) / 8
    make_u = jax.jit(lambda: pattern(jax.lax.broadcasted_iota(jnp.int64, (1, dim, L), 1) * L
                                     + jax.lax.broadcasted_iota(jnp.int64, (1, dim, L), 2)).astype(jnp.bfloat16))
    t_cross = (1 << 31) - (dim - 1) * L  # step of the last row at element offset 2^31
    windows = [(r, L - 64) for r in range(dim)] + [(dim - 1, t_cross - 32)]
    try:
        u = make_u()
        delta = jnp.full((1, dim, L), 3.0, jnp.bfloat16)
        out = jax.jit(lambda u, d: selective_scan(u, d, A, B, C, direction=direction))(u, delta)
        got = [np.asarray(out[0, r, t:t + 64], np.float64) for r, t in windows]
        del u, delta, out
    except (MemoryError, RuntimeError) as e:  # XlaRuntimeError derives from RuntimeError
        pytest.skip(f"not enough memory: {e}")
    keep = slice(8, None) if direction == "forward" else slice(None, -8)
    for (r, t), g in zip(windows, got):
        i = r * L + np.arange(t, t + 64)
        uw = np.asarray(pattern(jnp.asarray(i)), np.float64).astype(jnp.bfloat16).astype(np.float64)
        want = selective_scan_ref(jnp.asarray(uw)[None, None], jnp.full((1, 1, 64), 3.0, jnp.float64),
                                  A[r:r + 1].astype(jnp.float64), B[r:r + 1].astype(jnp.float64),
                                  C[r:r + 1].astype(jnp.float64), direction=direction)
        assert rel_err(g[keep], np.asarray(want)[0, 0][keep]) < 1e-2, f"row {r}, steps {t}.."
