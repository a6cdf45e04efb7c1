"""The CUDA lowering of selective_scan, checked without a GPU.

jax can lower a jitted function for the "cuda" platform on a machine without one
(`.trace(...).lower(lowering_platforms=("cuda",))`), so CI checks which custom calls the
GPU program would run: the fused forward, the fused backward under grad / vjp / vmap of
grad, the float32 casts of the non-activation operands, and the pure-JAX fallback where
the kernels do not apply (float64, N > 128). Skipped when the CUDA extension is not built.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jax_selscan import _ffi, selective_scan

pytestmark = pytest.mark.skipif(not _ffi.HAS_CUDA, reason="jax_selscan._cuda not built")

FWD, BWD = _ffi.SELECTIVE_SCAN_FWD_CUDA, _ffi.SELECTIVE_SCAN_BWD_CUDA


@pytest.fixture(autouse=True)
def _trace_as_on_a_cpu_machine(monkeypatch):
    """These tests lower for CUDA a trace made as on a machine without a GPU. On a GPU
    machine the default backend is "gpu", which makes a grad's forward save the backward's
    checkpoints (a different custom call, tested on its own below): pin it, so the suite
    passes wherever it runs (12 of these tests failed on the H200 without this)."""
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")


def inputs(dtype=jnp.float32, N=16, b=2, D=8, L=12):
    rng = np.random.default_rng(0)
    act = lambda s: jnp.asarray(rng.standard_normal(s), dtype)
    return dict(u=act((b, D, L)), delta=act((b, D, L)),
                A=jnp.asarray(-np.exp(rng.standard_normal((D, N))), jnp.float32),
                B=act((b, N, L)), C=act((b, 2, N, L)),
                D=jnp.asarray(rng.standard_normal(D), jnp.float32), z=act((b, D, L)),
                delta_bias=jnp.asarray(rng.standard_normal(D), jnp.float32))


def cuda_calls(fn, *args):
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    return set(re.findall(r"custom_call @(\w+)", text))


def scan(x, **kw):
    return selective_scan(**x, delta_softplus=True, **kw)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_forward_and_grad_use_the_kernels(dtype, direction):
    x = inputs(dtype)
    assert FWD in cuda_calls(lambda x: scan(x, direction=direction), x)
    loss = lambda x: jnp.sum(jnp.sin(scan(x, direction=direction).astype(jnp.float32)))
    calls = cuda_calls(jax.grad(loss), x)
    assert {FWD, BWD} <= calls


def bwd_result_types(fn, *args):
    """The element types of the CUDA backward custom call's results, in order."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    line = next(l for l in text.splitlines() if f"custom_call @{BWD}(" in l)
    return re.findall(r"tensor<[^>]*?(bf16|f16|f32|ui8)>", line.rsplit("->", 1)[1])


@pytest.mark.parametrize("dtype, bc_dtype, want", [(jnp.bfloat16, None, "bf16"), (jnp.float16, None, "f16"),
                                                    (jnp.float32, None, "f32"),
                                                    (jnp.bfloat16, jnp.float32, "f32")])
def test_backward_writes_varying_dB_dC_in_their_dtype(dtype, bc_dtype, want):
    # A varying B / C in the activations' dtype gets its gradient from the kernel's reduction
    # in that dtype (no float32 result and convert after it); a B / C of another dtype than u
    # makes the activations float32, and every gradient comes in float32.
    x = inputs(dtype)
    if bc_dtype is not None:
        x = dict(x, B=x["B"].astype(bc_dtype), C=x["C"].astype(bc_dtype))
    loss = lambda x: jnp.sum(jnp.sin(scan(x).astype(jnp.float32)))
    types = bwd_result_types(jax.grad(loss), x)
    # du, ddelta, dz, dA, dB, dC, dD, ddelta_bias, dh0 (placeholder), scratch
    assert types[4:6] == [want, want], types
    assert types[3] == types[6] == types[7] == "f32", types
    g = jax.grad(loss)(x)
    assert g["B"].dtype == x["B"].dtype and g["C"].dtype == x["C"].dtype


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_grad_has_exactly_the_cuda_kernels_and_no_checkpoints(direction):
    # The CPU forward saves the backward's checkpoints under differentiation
    # (jax_selscan_selective_scan_ckpt); the CUDA program must not change: exactly the
    # CUDA forward and backward custom calls (as before the checkpoints existed), no
    # checkpoint-writing variant and no CPU target.
    x = inputs()
    loss = lambda x: jnp.sum(jnp.sin(scan(x, direction=direction, return_last_state=True)[0]))
    assert cuda_calls(jax.grad(loss), x) == {FWD, BWD}
    assert cuda_calls(jax.vmap(jax.grad(loss)),
                      jax.tree_util.tree_map(lambda v: jnp.stack([v, v]), x)) == {FWD, BWD}
    assert _ffi.SELECTIVE_SCAN_CKPT not in cuda_calls(jax.grad(loss), x)


def test_vmap_of_grad_and_last_state_use_the_kernels():
    x = inputs()
    stacked = jax.tree_util.tree_map(lambda v: jnp.stack([v, v]), x)
    loss = lambda x: jnp.sum(jnp.cos(scan(x, return_last_state=True)[1]))
    assert BWD in cuda_calls(jax.vmap(jax.grad(loss)), stacked)


def test_forward_mode_uses_the_pure_jax_jvp():
    x = inputs()
    calls = cuda_calls(lambda x, t: jax.jvp(lambda y: scan(y), (x,), (t,)), x, x)
    assert FWD in calls and BWD not in calls


@pytest.mark.parametrize("case", ["float64", "N=129"])
def test_fallback_where_the_kernels_do_not_apply(case):
    x = inputs(jnp.float64) if case == "float64" else inputs(N=129)
    if case == "float64":
        x = {k: v.astype(jnp.float64) for k, v in x.items()}
    calls = cuda_calls(lambda x: scan(x), x)
    assert FWD not in calls


def test_geometry_hook():
    from jax_selscan import _cuda
    # (states per lane, lanes per row): few rows spread the states over more lanes.
    assert _cuda.selective_scan_geometry(16, 1 << 20) == (4, 4)
    assert _cuda.selective_scan_geometry(16, 12288) == (2, 8)
    assert _cuda.selective_scan_geometry(1, 1 << 20) == (1, 1)
    assert _cuda.selective_scan_geometry(128, 1 << 20) == (4, 32)


@pytest.mark.parametrize("shape, plain, plain16, saving, sweep", [
    # (batch, D, L): 32-row blocks; the lanes of the plain forward (float32, then 16-bit), of the
    # forward saving checkpoints and of the checkpoint sweep on 132 SMs
    # (PERFORMANCE_SELECTIVE_SCAN_CUDA 26)
    ((64, 768, 512), 4, 4, 8, 4),      # fills 0.97 / 0.97: a tie
    ((32, 1024, 1024), 4, 4, 4, 4),    # 0.97 / 0.86: 4 lanes fill better
    ((8, 1536, 2048), 8, 4, 8, 8),     # 0.73 / 0.97: 8 lanes fill better; 16-bit: 4 lanes (26.5)
    ((16, 1536, 2048), 8, 4, 8, 8),    # 0.73 / 0.97
    ((12, 1536, 2048), 8, 8, 8, 8),    # 0.55 / 0.73
    ((8, 2560, 4096), 8, 8, 8, 8),     # 0.61 / 0.81
    ((1, 64, 2048), 8, 8, 8, 4),       # 2 blocks, short of a wave (the tests' grids): 8, but 4 without y
])
def test_staged_forward_lanes(shape, plain, plain16, saving, sweep):
    from jax_selscan import _cuda
    b, D, _ = shape
    lanes = lambda ys, plain, eb=4: _cuda.selective_scan_staged_lanes(b * D // 32, 132, 4, 3, ys, plain, eb)
    assert (lanes(True, True), lanes(True, True, 2), lanes(True, False), lanes(False, False)) == \
        (plain, plain16, saving, sweep)
    # Only the plain forward's choice depends on the element size.
    assert (lanes(True, False, 2), lanes(False, False, 2)) == (saving, sweep)


def _plan_gpu_is_an_h200_or_none():
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return not gpus or getattr(gpus[0], "core_count", None) == 132


@pytest.mark.skipif(not _plan_gpu_is_an_h200_or_none(), reason="the plans below are for 132 SMs")
@pytest.mark.parametrize("shape, plan", [
    # (batch, D, L, N): (forward chunks, phase A sub-chunks per chunk, backward chunks, sub-chunks)
    ((1, 5120, 16384, 16), (3, 3, 7, 2)),   # notes 15.1, 16.4, 17.3: the measured best
    ((2, 2560, 8192, 16), (3, 3, 7, 1)),
    ((1, 4224, 16384, 16), (4, 4, 3, 3)),   # 132 row blocks: whole waves
    ((1, 1536, 8192, 16), (11, 1, 8, 1)),   # sub-chunks shorter than 24 tiles measured slower
    ((8, 1536, 2048, 16), (1, 1, 1, 1)),    # enough rows: no split
    ((64, 768, 512, 16), (1, 1, 1, 1)),
])
def test_split_plans_at_the_benchmark_shapes(shape, plan, monkeypatch):
    # The L split's launch plan (selective_scan_host.cc, ss_plan) on the H200's 132 SMs (also
    # what is assumed without a GPU), pinned at the shapes whose timings chose its rules.
    from jax_selscan import _cuda
    for knob in ("FWD_CHUNKS", "BWD_CHUNKS", "FWD_SUB", "BWD_SUB", "FWD", "BWD"):
        monkeypatch.delenv(f"JAX_SELSCAN_SS_{knob}", raising=False)
    assert tuple(_cuda.selective_scan_split_plan(*shape)) == plan


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_forward_saved_checkpoints_default(direction, monkeypatch):
    # By default a grad traced with the GPU as default backend lowers to the
    # checkpoint-writing forward, whose (batch, D, ndir * ceil(L / 8) * N) float32 result is
    # the backward's last operand.
    monkeypatch.delenv("JAX_SELSCAN_SS_FWD_CKPT", raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    x = inputs()  # b 2, D 8, L 12, N 16
    loss = lambda x: jnp.sum(jnp.sin(scan(x, direction=direction)))
    fn = jax.grad(loss)
    text = jax.jit(fn).trace(x).lower(lowering_platforms=("cuda",)).as_text()
    calls = set(re.findall(r"custom_call @(\w+)", text))
    assert {_ffi.SELECTIVE_SCAN_FWD_CKPT_CUDA, BWD} <= calls and FWD not in calls
    row = (2 if direction == "bidirectional" else 1) * 2 * 16
    assert f"tensor<2x8x{row}xf32>" in text
    # without differentiation nothing changes
    plain = cuda_calls(lambda x: scan(x, direction=direction), x)
    assert FWD in plain and _ffi.SELECTIVE_SCAN_FWD_CKPT_CUDA not in plain
    # and JAX_SELSCAN_SS_FWD_CKPT=0 keeps the backward's own sweep (a new function: jit
    # would reuse the trace of `fn`, and the choice is made at trace time)
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CKPT", "0")
    assert _ffi.SELECTIVE_SCAN_FWD_CKPT_CUDA not in cuda_calls(jax.grad(lambda x: loss(x)), x)


# --- the scratch result: every CUDA custom call gets one more, a uint8 buffer sized at trace
# time by the extension's plan plus 256 bytes of alignment slack (1 byte when the plan needs
# none), which the lowering drops -----------------------------------------------------------

def _spec(b, D, L, N, dtype, grouped):
    s = jax.ShapeDtypeStruct
    act = lambda shape: s(shape, dtype)
    bc = act((b, 2, N, L)) if grouped else act((b, N, L))
    return dict(u=act((b, D, L)), delta=act((b, D, L)), A=s((D, N), jnp.float32), B=bc, C=bc,
                D=s((D,), jnp.float32), z=act((b, D, L)), delta_bias=s((D,), jnp.float32),
                h0=s((b, D, N), jnp.float32))


def _results(fn, *args):
    """The result types of each selective-scan custom call of fn lowered for CUDA."""
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    calls = {}
    for line in text.splitlines():
        m = re.search(r"custom_call @(jax_selscan_selective_scan\w*)\(", line)
        if m:
            calls[m.group(1)] = re.findall(r"tensor<([^>]*)>", line.split("->")[-1])
    return calls


def _want(backward, x, direction):
    from jax_selscan import _cuda
    b, D, L = x["u"].shape
    def g(v):  # groups as the primitive sees them: (D, N) time-invariant, (b, N, L) one group
        return {2: 0, 3: 1}.get(len(v.shape)) if len(v.shape) < 4 else v.shape[1]
    n = _cuda.selective_scan_scratch_bytes(backward, b, D, L, x["A"].shape[1], g(x["B"]), g(x["C"]),
                                           ("forward", "reverse", "bidirectional").index(direction), True,
                                           False)  # lowered off the GPU: no saved checkpoints
    return f"{n + 256}xui8" if n else "1xui8"


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
@pytest.mark.parametrize("shape, dtype, grouped", [((2, 64, 300, 16), jnp.float32, False),
                                                   ((1, 32, 4096, 16), jnp.bfloat16, True),
                                                   ((8, 1536, 2048, 16), jnp.bfloat16, False)])
def test_scratch_results(shape, dtype, grouped, direction):
    x = _spec(*shape, dtype, grouped)
    kw = dict(delta_softplus=True, direction=direction)
    res = _results(lambda x: selective_scan(**x, **kw), x)[FWD]
    assert len(res) == 4, res  # out, last_fwd, last_rev, scratch
    assert res[-1] == _want(False, x, direction), res
    cot = jax.ShapeDtypeStruct(shape[:3], dtype)
    bwd = _results(lambda x, c: jax.vjp(lambda x: selective_scan(**x, **kw), x)[1](c), x, cot)[BWD]
    assert len(bwd) == 10, bwd  # nine gradients and the scratch
    assert bwd[-1] == _want(True, x, direction) and bwd[-1] != "1xui8", bwd  # dB / dC partials at least


def test_scratch_sizes():
    from jax_selscan import _cuda
    q = _cuda.selective_scan_scratch_bytes
    # bidirectional: the first direction's y (one float per element) at least
    assert q(False, 2, 64, 300, 16, 1, 1, 2, True, False) >= 2 * 64 * 300 * 4
    # the backward's partials grow with L; its checkpoint sweep costs more unless they were saved
    assert q(True, 2, 64, 600, 16, 1, 1, 0, True, False) > q(True, 2, 64, 300, 16, 1, 1, 0, True, False) > 0
    assert q(True, 2, 64, 300, 16, 1, 1, 0, True, False) > q(True, 2, 64, 300, 16, 1, 1, 0, True, True)
    assert q(False, 0, 64, 300, 16, 1, 1, 0, True, False) == 0  # empty: rejected before planning
    with pytest.raises(ValueError):
        q(False, 1, 64, 300, 16, 1, 1, 3, True, False)
    with pytest.raises(ValueError):
        q(False, -1, 64, 300, 16, 1, 1, 0, True, False)
