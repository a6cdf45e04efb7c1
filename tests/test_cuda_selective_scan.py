"""GPU tests of the fused CUDA selective scan (forward and backward kernels).

Skipped cleanly when JAX sees no GPU or the CUDA extension is not built. References:
selective_scan_ref evaluated in float64 on the exact (rounded) inputs the kernel sees;
gradients against the float64 reference's gradients. Tolerances are relative to the
largest magnitude of the reference (the outputs mix signs, so elementwise relative
error is meaningless near zero crossings):
    forward  float32 1e-4, float16 4e-3, bfloat16 2e-2 (the output is rounded to the dtype)
    gradient float32 1e-3, float16 1e-2, bfloat16 5e-2
"""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)


try:
    from references import selective_scan_np
    from gpu_marks import requires_cuda
except ImportError:  # tests/ imported as a package
    from tests.references import selective_scan_np
    from tests.gpu_marks import requires_cuda

from jax_selscan import selective_scan, selective_scan_ref, selective_state_update  # noqa: E402

pytestmark = requires_cuda

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
FWD_TOL = {F32: 1e-4, F16: 4e-3, BF16: 2e-2}
GRAD_TOL = {F32: 1e-3, F16: 1e-2, BF16: 5e-2}
DIRECTIONS = ("forward", "reverse", "bidirectional")
ARGS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")


def rng_for(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_inputs(rng, batch, dim, length, dstate, *, b_kind="variable", c_kind="variable",
                groups=2, dtype=F32, D=True, z=True, bias=True, h0=True, softplus=True):
    """Mamba-like magnitudes; activations in `dtype`, A/D/delta_bias/h0 in float32."""
    def bc(kind):
        shape = {"invariant": (dim, dstate), "variable": (batch, dstate, length),
                 "grouped": (batch, groups, dstate, length)}[kind]
        return jnp.asarray(rng.standard_normal(shape), dtype if kind != "invariant" else F32)
    act = lambda a: jnp.asarray(a, dtype)
    delta = (rng.standard_normal((batch, dim, length)) * 0.5 - 1.0 if softplus
             else rng.uniform(0.05, 0.6, (batch, dim, length)))
    x = dict(u=act(rng.standard_normal((batch, dim, length))), delta=act(delta),
             A=jnp.asarray(-np.exp(rng.standard_normal((dim, dstate)) * 0.5), F32),
             B=bc(b_kind), C=bc(c_kind),
             D=jnp.asarray(rng.standard_normal(dim), F32) if D else None,
             z=act(rng.standard_normal((batch, dim, length))) if z else None,
             delta_bias=jnp.asarray(rng.uniform(0.0, 0.5, dim), F32) if bias else None,
             h0=jnp.asarray(rng.standard_normal((batch, dim, dstate)), F32) if h0 else None)
    return x


def to64(x):
    return {k: (None if v is None else v.astype(jnp.float64)) for k, v in x.items()}


def rel_err(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    scale = max(np.max(np.abs(want)), 1e-30)
    return float(np.max(np.abs(got - want)) / scale)


def ref_np(x, delta_softplus=False, return_last_state=False, direction="forward"):
    """The float64 NumPy loop (no compilation), in selective_scan's return convention."""
    a = {k: (None if v is None else np.asarray(v.astype(jnp.float32), np.float64)) for k, v in x.items()}
    out, last = selective_scan_np(**a, delta_softplus=delta_softplus, direction=direction)
    return (out, last) if return_last_state else out


def hlo_of(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


# --- forward ---------------------------------------------------------------------------------

OPTION_SETS = [  # (D, z, bias, softplus, h0, return_last_state)
    (True, True, True, True, True, True),
    (False, False, False, False, False, False),
    (True, False, True, False, True, True),
    (False, True, False, True, False, True),
]


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("bc", [("variable", "variable"), ("invariant", "grouped"), ("grouped", "invariant")])
def test_forward_options(opts, direction, bc):
    Dk, z, bias, sp, h0, rls = opts
    x = make_inputs(rng_for("fwd", opts, direction, bc), 2, 8, 37, 16, b_kind=bc[0], c_kind=bc[1],
                    D=Dk, z=z, bias=bias, h0=h0, softplus=sp)
    kw = dict(delta_softplus=sp, return_last_state=rls, direction=direction)
    got = jax.jit(lambda x: selective_scan(**x, **kw))(x)
    want = ref_np(x, **kw)
    if rls:
        (got, glast), (want, wlast) = got, want
        glast = glast if isinstance(glast, tuple) else (glast,)
        wlast = wlast if isinstance(wlast, tuple) else (wlast,)
        for g, w in zip(glast, wlast):
            assert g.dtype == jnp.float32
            assert rel_err(g, w) < 1e-4
    assert got.dtype == F32
    assert rel_err(got, want) < FWD_TOL[F32]


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("length", [1, 4, 29, 1000])
@pytest.mark.parametrize("dstate", [1, 5, 16, 64])
def test_forward_dtypes_lengths_states(dtype, length, dstate):
    x = make_inputs(rng_for("len", str(dtype), length, dstate), 2, 6, length, dstate, dtype=dtype,
                    b_kind="grouped", c_kind="variable", groups=3)
    kw = dict(delta_softplus=True, return_last_state=True)
    (got, last), (want, wlast) = (jax.jit(lambda x: selective_scan(**x, **kw))(x),
                                  ref_np(x, **kw))
    assert got.dtype == dtype
    assert rel_err(got, want) < FWD_TOL[dtype]
    assert rel_err(last, wlast) < 1e-4


@pytest.mark.parametrize("rows", [1, 3, 64, 5000])
def test_forward_row_counts(rows):
    # Few rows pick fewer states per lane (more lanes per row): every geometry is checked.
    x = make_inputs(rng_for("rows", rows), 1, rows, 64, 16)
    got = jax.jit(lambda x: selective_scan(**x, delta_softplus=True))(x)
    want = ref_np(x, delta_softplus=True)
    assert rel_err(got, want) < FWD_TOL[F32]


# The staged kernel (default for varying B/C whose groups hold whole 32-row blocks): every
# lane geometry (P = 4, 8, 16 lanes per row; 2, 4, 8 states per lane), partial row blocks,
# grouped B/C, tails of the 32-step tile, unaligned L (scalar loads) and 16-bit types.
STAGED_CASES = [  # (batch, dim, L, N, groups, dtype)
    (1, 40, 77, 16, 1, F32),      # P = 8, a partial block, L % 32 != 0, L % 4 != 0
    (2, 4224, 40, 16, 1, F32),    # 8448 rows, 264 blocks: P = 8 (fills 67% of a wave against 50%)
    (1, 16896, 40, 16, 1, F32),   # 528 blocks: P = 4 (fills 100% against 67%)
    (2, 64, 64, 16, 2, BF16),     # grouped, D / G = 32, aligned bf16 vectors
    (1, 32, 29, 20, 1, F16),      # N = 20: P = 8, NS = 4 with padding states
    (1, 33, 50, 64, 1, F32),      # P = 8, NS = 8
    (1, 32, 35, 128, 1, BF16),    # P = 16, NS = 8
    (3, 96, 1, 16, 3, F32),       # L = 1
]


@pytest.mark.parametrize("case", STAGED_CASES)
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_staged_geometries(case, direction):
    batch, dim, length, dstate, groups, dtype = case
    kind = "grouped" if groups > 1 else "variable"
    x = make_inputs(rng_for("staged", case, direction), batch, dim, length, dstate, dtype=dtype,
                    b_kind=kind, c_kind=kind, groups=groups)
    kw = dict(delta_softplus=True, return_last_state=True, direction=direction)
    got, last = jax.jit(lambda x: selective_scan(**x, **kw))(x)
    want, wlast = ref_np(x, **kw)
    assert rel_err(got, want) < FWD_TOL[dtype]
    glast = last if isinstance(last, tuple) else (last,)
    wl = wlast if isinstance(wlast, tuple) else (wlast,)
    for g, w in zip(glast, wl):
        assert rel_err(g, w) < 1e-4


@pytest.mark.parametrize("lanes", ["4", "8"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_staged_forced_lanes(lanes, direction, monkeypatch):
    # JAX_SELSCAN_SS_FWD_LANES (read at every launch) forces either geometry of N <= 16, so
    # both stay tested whichever the fill rule picks: the forward (bf16) and the gradients
    # (float32; their checkpoints come from the forward) against the float64 reference.
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_LANES", lanes)
    rng = rng_for("lanes", lanes, direction)
    x = make_inputs(rng, 2, 64, 77, 16, dtype=BF16)
    kw = dict(delta_softplus=True, return_last_state=True, direction=direction)
    got = jax.jit(lambda x: selective_scan(**x, **kw))(x)[0]
    assert rel_err(got, ref_np(x, **kw)[0]) < FWD_TOL[BF16]
    x = make_inputs(rng, 1, 40, 77, 16)
    check_grads_against_ref(x, dict(delta_softplus=True, direction=direction), rng, GRAD_TOL[F32])


# The warp-specialised forward (cuda/selective_scan_ws.cuh; opt-in with JAX_SELSCAN_SS_FWD_WS=1,
# read at every launch) takes 16-bit inputs, N <= 16, the plain output
# mode, no L split, L % 8 == 0. It computes the 4-lane staged kernel's expressions, so the two must
# agree bitwise (outputs and last states); both
# against the float64 reference too. "2" makes a launch it does not take fail, so these cases
# surely ran it; the L split is forced off. Cases: padded rows (D = 80), padded states (N = 13),
# a partial last tile, a single partial tile, z / h0 absent, grouped B.
WS_CASES = [((2, 80, 264, 13), {}), ((1, 64, 8, 16), dict(z=False)), ((2, 64, 40, 16), dict(h0=False)),
            ((1, 128, 1032, 16), dict(b_kind="grouped"))]


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("direction", ("forward", "reverse"))
@pytest.mark.parametrize("case", range(len(WS_CASES)))
def test_warp_specialised_forward_bitwise(case, direction, dtype, monkeypatch):
    shape, opts = WS_CASES[case]
    x = make_inputs(rng_for("ws", case, direction, str(dtype)), *shape, dtype=dtype, **opts)
    kw = dict(delta_softplus=True, return_last_state=True, direction=direction)
    f = jax.jit(lambda x: selective_scan(**x, **kw))
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CHUNKS", "1")
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_LANES", "4")  # the staged geometry whose y sums it shares
    runs = {}
    for ws in ("0", "2"):
        monkeypatch.setenv("JAX_SELSCAN_SS_FWD_WS", ws)
        runs[ws] = [np.asarray(v) for v in f(x)]
    for a, b in zip(runs["0"], runs["2"]):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    want, wlast = ref_np(x, **kw)
    assert rel_err(runs["2"][0], want) < FWD_TOL[dtype]
    assert rel_err(runs["2"][1], wlast) < FWD_TOL[dtype]


def test_warp_specialised_forward_gradients(monkeypatch):
    # The forward saving the backward's checkpoints runs the warp-specialised kernel too.
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_WS", "1")
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CHUNKS", "1")
    rng = rng_for("ws grads")
    x = make_inputs(rng, 2, 64, 136, 16, dtype=BF16)
    check_grads_against_ref(x, dict(delta_softplus=True), rng, GRAD_TOL[BF16])


@pytest.mark.parametrize("kernel", ["rows", "staged"])
def test_forward_kernel_choices_agree(kernel, monkeypatch):
    # JAX_SELSCAN_SS_FWD is read at every launch: both forward kernels on one input.
    x = make_inputs(rng_for("choice"), 2, 64, 77, 16)
    kw = dict(delta_softplus=True, return_last_state=True)
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD", kernel)
    got, last = jax.jit(lambda x: selective_scan(**x, **kw))(x)
    want, wlast = ref_np(x, **kw)
    assert rel_err(got, want) < FWD_TOL[F32]
    assert rel_err(last, wlast) < 1e-4


# The L split (docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md 5.5), forced with JAX_SELSCAN_SS_FWD_CHUNKS
# (read when a call is planned, not at trace time): chunks of whole 32-step tiles with a partial
# last one, both forward kernels, every direction; outputs and last states against the float64
# reference, and the gradients, whose checkpoints then come from the split forward (and, with
# JAX_SELSCAN_SS_FWD_CKPT=0, from the backward's sweep split the same way). A slow decay makes
# the carries between chunks matter. JAX_SELSCAN_SS_BWD_CHUNKS splits the staged backward;
# JAX_SELSCAN_SS_{FWD,BWD}_SUB set phase A's sub-chunks per chunk.
SPLIT_CASES = [((2, 64, 300, 16), "variable", "variable", F32),    # staged
               ((1, 32, 333, 16), "grouped", "variable", BF16),    # staged, L % 4 != 0
               ((2, 8, 300, 16), "invariant", "grouped", F32)]     # round 1


@pytest.mark.parametrize("chunks, sub", [(2, None), (5, None), (2, "1"), (3, "2"), (2, "4")])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_forward_l_split(case, direction, chunks, sub, monkeypatch):
    (b, D, L, N), bk, ck, dtype = case
    if sub:  # phase A's sub-chunks per chunk (by default as many as fill the GPU; these grids
        # are tiny, so up to 8); 3 chunks of 2: the last chunk has fewer sub-chunks
        monkeypatch.setenv("JAX_SELSCAN_SS_FWD_SUB", sub)
        monkeypatch.setenv("JAX_SELSCAN_SS_BWD_SUB", sub)
    rng = rng_for("split", case, direction, chunks, sub)
    x = make_inputs(rng, b, D, L, N, b_kind=bk, c_kind=ck, groups=1, dtype=dtype)
    x["A"] = x["A"] * 0.05
    kw = dict(delta_softplus=True, return_last_state=True, direction=direction)
    fwd = lambda: jax.jit(lambda x: selective_scan(**x, **kw))(x)
    tup = lambda v: v if isinstance(v, tuple) else (v,)
    _, whole_last = fwd()
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CHUNKS", str(chunks))
    got, last = fwd()
    want, wlast = ref_np(x, **kw)
    # the split ran (the carries round differently from the step-by-step walk: visible in the
    # float32 last states; a 16-bit output can round to the same bits) and is right
    assert any(not np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(tup(last), tup(whole_last)))
    assert rel_err(got, want) < FWD_TOL[dtype]
    for g, w in zip(tup(last), tup(wlast)):
        assert rel_err(g, w) < 1e-4
    # The backward: its checkpoints from the split walk, and (staged cases) its own split too.
    kw["return_last_state"] = False
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), jnp.float64)
    want_g = _grads(selective_scan_ref, to64(x), kw, cot)
    grads = lambda: jax.jit(lambda x: _grads(selective_scan, x, kw, cot.astype(F32)))(x)
    monkeypatch.delenv("JAX_SELSCAN_SS_FWD_CHUNKS")
    whole_g = grads()
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CHUNKS", str(chunks))
    monkeypatch.setenv("JAX_SELSCAN_SS_BWD_CHUNKS", str(chunks))
    for saved in ("1", "0"):
        monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CKPT", saved)
        got_g = grads()
        assert any(not np.array_equal(np.asarray(got_g[k]), np.asarray(whole_g[k])) for k in got_g)
        for k in got_g:
            assert rel_err(got_g[k], want_g[k]) < GRAD_TOL[dtype], (saved, k, rel_err(got_g[k], want_g[k]))


@pytest.mark.parametrize("chunks", [None, 3])
@pytest.mark.parametrize("source", ["u", "delta", "z"])
def test_nan_propagates_like_the_loop(source, chunks, monkeypatch):
    """One NaN in u (reaches the states), delta (states and adjoints) or z (adjoints), whole
    or with the L split forced: the outputs NaN exactly where the float64 loop's are and the
    gradients where the reference's are, close to them elsewhere (every direction)."""
    x = make_inputs(rng_for("nan", source), 2, 64, 300, 16, groups=1)
    x[source] = x[source].at[1, 7, 200].set(jnp.nan)
    if chunks:
        monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CHUNKS", str(chunks))
        monkeypatch.setenv("JAX_SELSCAN_SS_BWD_CHUNKS", str(chunks))
    cot = jnp.asarray(rng_for("nan-cot").standard_normal(x["u"].shape), jnp.float64)
    for direction in DIRECTIONS:
        kw = dict(delta_softplus=True, direction=direction)
        got = np.asarray(jax.jit(lambda x: selective_scan(**x, **kw))(x), np.float64)
        want = ref_np(x, **kw)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=direction)
        ok = ~np.isnan(want)
        assert rel_err(got[ok], want[ok]) < FWD_TOL[F32], direction
        got_g = jax.jit(lambda x: _grads(selective_scan, x, kw, cot.astype(F32)))(x)
        want_g = _grads(selective_scan_ref, to64(x), kw, cot)
        for k in got_g:
            g, w = np.asarray(got_g[k], np.float64), np.asarray(want_g[k])
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{direction} d{k}")
            ok = ~np.isnan(w)
            assert not ok.any() or rel_err(g[ok], w[ok]) < GRAD_TOL[F32], (direction, k)


def test_mixed_dtypes_use_kernel():
    x = make_inputs(rng_for("mixed"), 2, 8, 40, 16, dtype=BF16)
    x["delta"] = x["delta"].astype(F32)  # mixed activations: computed in float32
    got = jax.jit(lambda x: selective_scan(**x, delta_softplus=True))(x)
    assert got.dtype == BF16
    assert rel_err(got, ref_np(x, delta_softplus=True)) < FWD_TOL[BF16]
    assert "jax_selscan_selective_scan_fwd" in hlo_of(lambda x: selective_scan(**x), x)


def test_kernel_is_in_the_hlo():
    x = make_inputs(rng_for("hlo"), 2, 8, 16, 16)
    # A non-linear loss, so that the forward output is needed (a linear one lets XLA drop it).
    loss = lambda x: jnp.sum(jnp.sin(selective_scan(**x, delta_softplus=True)))
    text = hlo_of(jax.grad(loss), x)
    assert "jax_selscan_selective_scan_fwd" in text
    assert "jax_selscan_selective_scan_bwd" in text


def test_bidirectional_is_forward_plus_reverse():
    x = make_inputs(rng_for("bidi"), 2, 16, 100, 16)
    f = jax.jit(lambda x, d: selective_scan(**x, delta_softplus=True, direction=d), static_argnums=1)
    both = f(x, "bidirectional")
    assert rel_err(both, f(x, "forward") + f(x, "reverse")) < 1e-5


@pytest.mark.parametrize("grouped", [False, True])
def test_streaming_prefix_then_decode(grouped):
    L0, steps = 50, 6
    x = make_inputs(rng_for("stream", grouped), 2, 8, L0 + steps, 16, b_kind="grouped" if grouped else "variable",
                    c_kind="grouped" if grouped else "variable", h0=False)
    full = selective_scan(**x, delta_softplus=True)
    pre = {k: (v[..., :L0] if k in ("u", "delta", "z", "B", "C") else v) for k, v in x.items()}
    out, state = selective_scan(**pre, delta_softplus=True, return_last_state=True)
    np.testing.assert_allclose(np.asarray(out), np.asarray(full[..., :L0]), rtol=1e-5, atol=1e-5)
    for t in range(L0, L0 + steps):
        y, state = selective_state_update(state, x["u"][..., t], x["delta"][..., t], x["A"],
                                          x["B"][..., t], x["C"][..., t], x["D"], x["z"][..., t],
                                          x["delta_bias"], dt_softplus=True)
        np.testing.assert_allclose(np.asarray(y), np.asarray(full[..., t]), rtol=1e-4, atol=1e-4)


def test_vmap_forward():
    xs = [make_inputs(rng_for("vmap", i), 2, 8, 33, 16) for i in range(3)]
    stacked = {k: jnp.stack([x[k] for x in xs]) for k in ARGS}
    stacked["A"] = xs[0]["A"]                     # shared parameters, batched activations
    got = jax.jit(jax.vmap(lambda x: selective_scan(**x, delta_softplus=True),
                           in_axes=({k: (None if k == "A" else 0) for k in ARGS},)))(stacked)
    for i, x in enumerate(xs):
        x = dict(x, A=xs[0]["A"])
        assert rel_err(got[i], ref_np(x, delta_softplus=True)) < FWD_TOL[F32]


# --- backward --------------------------------------------------------------------------------

def _grads(fn, x, kw, cot, cot_last=None):
    def loss(x):
        res = fn(**x, **kw)
        if kw.get("return_last_state"):
            out, last = res
            last = last if isinstance(last, tuple) else (last,)
            extra = sum(jnp.sum(l * c) for l, c in zip(last, cot_last))
        else:
            out, extra = res, 0.0
        return jnp.sum(out.astype(cot.dtype) * cot) + extra
    present = {k: v for k, v in x.items() if v is not None}
    absent = {k: None for k, v in x.items() if v is None}
    return jax.grad(lambda p: loss({**p, **absent}))(present)


def check_grads_against_ref(x, kw, rng, tol):
    """The kernels' gradients for a random cotangent (drawn from rng) against the float64
    reference's, within tol of the reference's largest magnitude."""
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), jnp.float64)
    got = jax.jit(lambda x: _grads(selective_scan, x, kw, cot.astype(F32)))(x)
    want = _grads(selective_scan_ref, to64(x), kw, cot)
    for k in got:
        assert rel_err(got[k], want[k]) < tol, (k, rel_err(got[k], want[k]))


@pytest.mark.parametrize("direction, opts, bc", [
    (d, o, ("variable", "variable")) for d in DIRECTIONS for o in OPTION_SETS] + [
    (d, OPTION_SETS[0], bc) for d in DIRECTIONS for bc in (("invariant", "grouped"), ("grouped", "invariant"))])
def test_gradients_against_reference(direction, opts, bc):
    Dk, z, bias, sp, h0, rls = opts
    rng = rng_for("grad", direction, opts, bc)
    x = make_inputs(rng, 2, 8, 45, 16, b_kind=bc[0], c_kind=bc[1], D=Dk, z=z, bias=bias, h0=h0,
                    softplus=sp)
    kw = dict(delta_softplus=sp, return_last_state=rls, direction=direction)
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), jnp.float64)
    nl = 2 if direction == "bidirectional" else 1
    cl = [jnp.asarray(rng.standard_normal((2, 8, 16)), jnp.float64) for _ in range(nl)]
    got = jax.jit(lambda x: _grads(selective_scan, x, kw, cot.astype(F32), [c.astype(F32) for c in cl]))(x)
    want = _grads(selective_scan_ref, to64(x), kw, cot, cl)
    for k in got:
        assert got[k].dtype == x[k].dtype, k
        assert rel_err(got[k], want[k]) < GRAD_TOL[F32], (k, rel_err(got[k], want[k]))


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("length", [1, 13, 300])
def test_gradients_16bit(dtype, length):
    rng = rng_for("grad16", str(dtype), length)
    x = make_inputs(rng, 2, 8, length, 16, dtype=dtype, b_kind="grouped", groups=2)
    kw = dict(delta_softplus=True)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[dtype])


@pytest.mark.parametrize("dstate, b_kind", [(8, "variable"), (4, "grouped"), (2, "variable")])
def test_gradients_many_rows_few_states(dstate, b_kind):
    """>= 32768 rows and N <= 8: 2 or 1 lanes per row in the forward's geometry, while the staged
    backward still sums dB / dC over blocks of 32 rows. The partials' buffer was once sized for
    blocks of 128 / lanes rows (64 or 128), half or a quarter of what the kernel writes."""
    rng = rng_for("gradwide", dstate, b_kind)
    x = make_inputs(rng, 16, 2048, 40, dstate, b_kind=b_kind, c_kind="variable")
    kw = dict(delta_softplus=True)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[F32])


@pytest.mark.parametrize("dstate", [1, 5, 64])
def test_gradients_state_counts(dstate):
    rng = rng_for("gradN", dstate)
    x = make_inputs(rng, 1, 16, 70, dstate)
    kw = dict(delta_softplus=True, return_last_state=False)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[F32])


@pytest.mark.parametrize("case", [(1, 40, 77, 16, 1, F32), (2, 64, 64, 16, 2, F32)])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gradients_staged_checkpoints(case, direction):
    # The backward's checkpoint sweep runs on the staged kernel for these shapes.
    batch, dim, length, dstate, groups, dtype = case
    kind = "grouped" if groups > 1 else "variable"
    rng = rng_for("gstaged", case, direction)
    x = make_inputs(rng, batch, dim, length, dstate, b_kind=kind, c_kind=kind, groups=groups)
    kw = dict(delta_softplus=True, direction=direction)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[F32])


# The staged backward (D % 32 == 0, N <= 16, varying B/C in 32-row groups): every option set
# and direction, tile tails, L = 1, 16-bit, and the round-1 backward on the same input.
@pytest.mark.parametrize("direction, opts", [(d, o) for d in DIRECTIONS for o in OPTION_SETS])
def test_gradients_staged_bwd(direction, opts):
    Dk, z, bias, sp, h0, rls = opts
    rng = rng_for("sbwd", direction, opts)
    x = make_inputs(rng, 2, 64, 77, 16, D=Dk, z=z, bias=bias, h0=h0, softplus=sp)
    kw = dict(delta_softplus=sp, return_last_state=rls, direction=direction)
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), jnp.float64)
    nl = 2 if direction == "bidirectional" else 1
    cl = [jnp.asarray(rng.standard_normal((2, 64, 16)), jnp.float64) for _ in range(nl)]
    got = jax.jit(lambda x: _grads(selective_scan, x, kw, cot.astype(F32), [c.astype(F32) for c in cl]))(x)
    want = _grads(selective_scan_ref, to64(x), kw, cot, cl)
    for k in got:
        assert rel_err(got[k], want[k]) < GRAD_TOL[F32], (k, rel_err(got[k], want[k]))


@pytest.mark.parametrize("case", [(1, 32, 1, 16, F32), (2, 96, 300, 16, BF16), (1, 64, 40, 8, F16),
                                  (1, 32, 33, 12, F32), (1, 32, 45, 6, F32)])  # N = 6: scalar checkpoints
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_gradients_staged_bwd_shapes(case, direction):
    batch, dim, length, dstate, dtype = case
    rng = rng_for("sbwd2", case, direction)
    x = make_inputs(rng, batch, dim, length, dstate, dtype=dtype)
    kw = dict(delta_softplus=True, direction=direction)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[dtype])


# The backward's reductions over batch x chunks x directions in their 8-warp layout (sum_jobs:
# fewer than 32768 outputs and at least 16 terms each): dA, dD, ddelta_bias, and time-invariant
# dB / dC on the round-1 backward (D not a multiple of 32); with the L split forced, the chunks
# multiply the terms.
@pytest.mark.parametrize("dim, b_kind, direction, chunks", [
    (64, "variable", "forward", None), (64, "variable", "bidirectional", None),
    (40, "invariant", "reverse", None), (64, "variable", "forward", "3"),
    (64, "variable", "reverse", "7")])  # 7 chunks: what 160 row blocks get on the H200
def test_gradients_long_partial_sums(dim, b_kind, direction, chunks, monkeypatch):
    if chunks:
        monkeypatch.setenv("JAX_SELSCAN_SS_BWD_CHUNKS", chunks)
    rng = rng_for("gradsum", dim, b_kind, direction, chunks)
    batch = 20
    x = make_inputs(rng, batch, dim, 800 if chunks else 40, 16, b_kind=b_kind)
    kw = dict(delta_softplus=True, direction=direction)
    check_grads_against_ref(x, kw, rng, GRAD_TOL[F32])


def test_backward_kernel_choices_agree(monkeypatch):
    rng = rng_for("bchoice")
    x = make_inputs(rng, 2, 64, 70, 16)
    kw = dict(delta_softplus=True, direction="bidirectional")
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), F32)
    f = jax.jit(lambda x: _grads(selective_scan, x, kw, cot))
    staged = f(x)
    monkeypatch.setenv("JAX_SELSCAN_SS_BWD", "rows")
    rows = jax.jit(lambda x: _grads(selective_scan, x, kw, cot))(x)
    for k in staged:
        assert rel_err(staged[k], rows[k]) < 1e-4, k


def test_check_grads_reverse_mode():
    from jax.test_util import check_grads
    x = make_inputs(rng_for("check"), 1, 4, 9, 4)
    args = tuple(x[k] for k in ARGS)
    f = lambda *a: selective_scan(**dict(zip(ARGS, a)), delta_softplus=True)
    # float32 kernel: loose numerical-derivative tolerance (eps 1e-3 in float32).
    check_grads(jax.jit(f), args, order=1, modes=("rev",), atol=5e-2, rtol=5e-2, eps=1e-3)


def test_vmap_of_grad_and_grad_of_vmap():
    xs = [make_inputs(rng_for("vg", i), 2, 8, 21, 16) for i in range(3)]
    st = {k: jnp.stack([x[k] for x in xs]) for k in ARGS}
    loss = lambda fn, x: jnp.sum(jnp.sin(fn(**x, delta_softplus=True)))
    got = jax.jit(jax.vmap(jax.grad(lambda x: loss(selective_scan, x))))(st)
    for i, x in enumerate(xs):
        want = jax.grad(lambda x: loss(selective_scan_ref, x))(to64(x))
        for k in ARGS:
            assert rel_err(got[k][i], want[k]) < GRAD_TOL[F32], k
    g2 = jax.jit(jax.grad(lambda s: jnp.sum(jax.vmap(lambda x: loss(selective_scan, x))(s))))(st)
    for k in ARGS:
        np.testing.assert_allclose(np.asarray(g2[k]), np.asarray(got[k]), rtol=1e-5, atol=1e-5)


# --- determinism -----------------------------------------------------------------------------

@pytest.mark.parametrize("direction", DIRECTIONS)
def test_bitwise_deterministic_forward_and_backward(direction):
    runs = int(os.environ.get("JAX_SELSCAN_DETERMINISM_RUNS", "20"))
    rng = rng_for("det", direction)
    x = make_inputs(rng, 4, 256, 1024, 16, dtype=BF16)
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), F32)
    kw = dict(delta_softplus=True, direction=direction)
    fwd = jax.jit(lambda x: selective_scan(**x, **kw))
    bwd = jax.jit(lambda x: _grads(selective_scan, x, kw, cot))
    o0, g0 = np.asarray(fwd(x)), jax.tree_util.tree_map(np.asarray, bwd(x))
    for _ in range(runs):
        assert np.array_equal(np.asarray(fwd(x)), o0)
        g = bwd(x)
        for k in g0:
            assert np.array_equal(np.asarray(g[k]), g0[k]), k


# --- more than 2^31 elements -----------------------------------------------------------------

def _tails(f, *args, window=64):
    """f(*args)'s arrays cut to their last `window` steps inside the jit, as float64. Only the
    tails leave the device: eager slices of the multi-GiB arrays (XLA's dynamic_slice) asked the
    allocator for tens of GiB more, which ran an 80 GB H100 out of memory after earlier tests."""
    L = args[0].shape[-1]
    cut = lambda v: v[..., L - window:].astype(F32)
    outs = jax.jit(lambda *a: [cut(v) for v in f(*a)])(*args)
    return [np.asarray(v, np.float64) for v in outs]


_BIG_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import test_cuda_selective_scan as t
getattr(t, sys.argv[2])()
print("checked", sys.argv[2])
"""
big_test = pytest.mark.skipif(os.environ.get("JAX_SELSCAN_BIG_TESTS") != "1",
                              reason="set JAX_SELSCAN_BIG_TESTS=1 (needs up to ~52 GiB of GPU memory)")


def _subprocess_env(**extra):
    """The environment of a child Python process on the GPU: the installed package first on its
    path (not the source tree), XLA's memory grown on demand (this process holds the GPU too),
    and `extra`."""
    import jax_selscan
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", **extra)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(jax_selscan.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _in_fresh_process(check, tmp_path):
    """Run the module's function `check` in a new Python process, with the installed package,
    allowed 95% of the GPU's memory. The > 2^31-element checks need up to 52 GiB at once (the
    staged backward's peak in XLA's memory statistics on an H100). In the test process that
    one ran out of memory on an 80 GB H100, after the other tests and alone: XLA's default cap
    is 75% of the card (59 GiB), and its pool, grown on demand and never returned, keeps what
    ran before in pieces. A fresh process whose first work is the check passed (session 55)."""
    import subprocess
    import sys
    env = _subprocess_env(XLA_PYTHON_CLIENT_MEM_FRACTION="0.95")
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _BIG_SCRIPT, tests_dir, check], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "checked " + check


@big_test
def test_more_than_2_31_elements(tmp_path):
    _in_fresh_process("check_more_than_2_31_elements", tmp_path)


@big_test
def test_more_than_2_31_elements_staged(tmp_path):
    _in_fresh_process("check_more_than_2_31_elements_staged", tmp_path)


@big_test
def test_more_than_2_31_elements_staged_backward(tmp_path):
    _in_fresh_process("check_more_than_2_31_elements_staged_backward", tmp_path)


def check_more_than_2_31_elements():
    # Row 1 of u starts past 2^30 elements and ends past 2^31: a strongly decaying state
    # (dt * A ~ -12) makes the output at the end depend only on the last few steps, so a
    # float64 reference over the last 64 steps checks the far end of the array.
    L = (1 << 30) + 37
    dim, dstate = 2, 4
    rng = np.random.default_rng(7)
    key = jax.random.PRNGKey(0)
    k1, k2 = jax.random.split(key)
    u = jax.random.normal(k1, (1, dim, L), BF16)
    delta = jnp.full((1, dim, L), 3.0, BF16)
    A = jnp.asarray(-4.0 - rng.uniform(0, 1, (dim, dstate)), F32)
    B = jnp.asarray(rng.standard_normal((dim, dstate)), F32)
    C = jnp.asarray(rng.standard_normal((dim, dstate)), F32)
    got, u_t, d_t = _tails(lambda u, d: [selective_scan(u, d, A, B, C), u, d], u, delta)
    want = selective_scan_ref(u_t, d_t, A.astype(jnp.float64), B.astype(jnp.float64), C.astype(jnp.float64))
    assert rel_err(got[..., 8:], want[..., 8:]) < FWD_TOL[BF16]


def check_more_than_2_31_elements_staged():
    # As above with varying B and C (the staged kernel): B/C offsets n * L pass 2^31 too.
    L = (1 << 30) + 37
    dim, dstate = 2, 4
    rng = np.random.default_rng(8)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    u = jax.random.normal(k1, (1, dim, L), BF16)
    delta = jnp.full((1, dim, L), 3.0, BF16)
    A = jnp.asarray(-4.0 - rng.uniform(0, 1, (dim, dstate)), F32)
    B = jax.random.normal(k2, (1, dstate, L), BF16)
    C = jax.random.normal(k3, (1, dstate, L), BF16)
    got, *x = _tails(lambda u, d, B, C: [selective_scan(u, d, A, B, C), u, d, B, C], u, delta, B, C)
    want = selective_scan_ref(x[0], x[1], A.astype(jnp.float64), x[2], x[3])
    assert rel_err(got[..., 8:], want[..., 8:]) < FWD_TOL[BF16]


def _far_end_gradients(L, dim=32, dstate=16, window=64):
    """Gradients of a strongly decaying scan (dt * A ~ -12 per step) at the far end of every
    row, ours against a float64 reference over the last `window` steps alone: there they
    depend only on the last few steps. Returns the relative errors for u, delta, B and C (the
    first 8 steps of the window left out; dA and dD sum over every step: not checked)."""
    rng = np.random.default_rng(9)
    k = jax.random.split(jax.random.PRNGKey(2), 4)
    u = jax.random.normal(k[0], (1, dim, L), BF16)
    delta = jnp.full((1, dim, L), 3.0, BF16)
    A = jnp.asarray(-4.0 - rng.uniform(0, 1, (dim, dstate)), F32)
    B = jax.random.normal(k[1], (1, dstate, L), BF16)
    C = jax.random.normal(k[2], (1, dstate, L), BF16)
    cot = jax.random.normal(k[3], (1, dim, L), BF16)

    def grads(f, A, *x):
        return jax.vjp(lambda u, d, B, C: f(u, d, A, B, C), *x[:4])[1](x[4])

    tails = _tails(lambda *x: [*grads(selective_scan, A, *x), *x], u, delta, B, C, cot, window=window)
    want = grads(selective_scan_ref, A.astype(jnp.float64), *tails[4:])
    return [rel_err(g[..., 8:], w[..., 8:]) for g, w in zip(tails[:4], want)]


def test_far_end_gradients_small():
    """The check of the next test at a size any machine runs (it must pass here too)."""
    assert max(_far_end_gradients((1 << 10) + 37)) < GRAD_TOL[BF16]


def check_more_than_2_31_elements_staged_backward():
    # The staged backward (one 32-row block, varying B/C, split along L) over
    # 32 x (2^26 + 37) > 2^31 elements: the last row's element offsets pass 2^31, its
    # checkpoint offsets (2 L floats per row) pass 2^32.
    assert max(_far_end_gradients((1 << 26) + 37)) < GRAD_TOL[BF16]


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("shape, dtype", [((2, 64, 77, 16), F32),   # staged kernels (D % 32 == 0)
                                          ((2, 8, 45, 16), F32),    # round-1 kernels
                                          ((2, 64, 64, 16), BF16)])
def test_forward_saved_checkpoints_same_gradients(direction, shape, dtype, monkeypatch):
    # By default the forward writes the backward's checkpoints (custom call
    # jax_selscan_selective_scan_fwd_ckpt) and the backward skips its own sweep. Same
    # states, same kernels after that: the gradients must be bitwise those of the sweep.
    b, D, L, N = shape
    rng = rng_for("fwdckpt", direction, shape, str(dtype))
    x = make_inputs(rng, b, D, L, N, dtype=dtype)
    cot = jnp.asarray(rng.standard_normal(x["u"].shape), F32)
    kw = dict(delta_softplus=True, direction=direction)
    grads = lambda: jax.jit(lambda x: _grads(selective_scan, x, kw, cot))
    monkeypatch.setenv("JAX_SELSCAN_SS_FWD_CKPT", "0")
    want = grads()(x)
    monkeypatch.delenv("JAX_SELSCAN_SS_FWD_CKPT")  # the default: the forward saves them
    f = grads()
    assert "jax_selscan_selective_scan_fwd_ckpt" in f.lower(x).as_text()
    got = f(x)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]), err_msg=k)


# The handlers take their scratch as an XLA result and are declared command-buffer compatible:
# forward + backward run in a subprocess with XLA command buffers (CUDA graphs) forced on give
# the float64 reference's results and the same bits on every run, and stay right when the
# same executable replays on other inputs (u and h0 times -2: the output and every gradient
# but du and dh0 scale by -2, those two stay). The bidirectional case (its y buffer), a forced
# L split (its carries) and the backward's dB / dC partials all live in that scratch. XLA
# calls a handler only while recording it; _cuda.captured_calls() counts those calls (the
# compiled HLO does not show command buffers any more). (Not compared bitwise with launches
# in this process: this process runs with x64 on, which changed XLA's ops around the custom
# calls and so the last bits of u, z and delta's gradients, and dB / dC differed between
# processes at the 1e-6 level even with x64 matched, while ss_driver showed that no kernel
# reads scratch or results before writing them: PERFORMANCE_SELECTIVE_SCAN_CUDA 8.8.)
_SS_GRAPH_SCRIPT = """
import json, sys
import numpy as np
import jax, jax.numpy as jnp
from jax_selscan import selective_scan, _cuda

data = np.load(sys.argv[1])
x = {k: jnp.asarray(data[k]) for k in data.files if k != "cot"}
x2 = {k: v * -2 if k in ("u", "h0") else v for k, v in x.items()}
cot = jnp.asarray(data["cot"])
kw = dict(delta_softplus=True, direction=sys.argv[2])
f = jax.jit(lambda x: jax.vjp(lambda x: selective_scan(**x, **kw), x))
def run(x):
    out, vjp = f(x)
    return [np.asarray(v) for v in [out] + [g for _, g in sorted(vjp(cot)[0].items())]]
runs = [run(x) for _ in range(3)]
runs2 = [run(x2) for _ in range(2)]
runs.append(run(x))
np.savez(sys.argv[3], *runs[0])
same = all(np.array_equal(a, b) for r in runs[1:] for a, b in zip(r, runs[0]))
scale = [-2.0] + [1.0 if k in ("u", "h0") else -2.0 for k in sorted(x)]
rel = lambda g, w: float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))
scaled_err = max(rel(b, s * a) for r in runs2 for a, b, s in zip(runs[0], r, scale))
# the kernels' custom calls, forward (f) and backward (a fallback to plain JAX has none)
grads = jax.jit(lambda x: jax.vjp(lambda x: selective_scan(**x, **kw), x)[1](cot))
text = f.lower(x).as_text() + grads.lower(x).as_text()
print(json.dumps(dict(bitwise_equal_runs=same, scaled_inputs_err=scaled_err,
                      custom_calls=text.count("@jax_selscan_selective_scan"),
                      captured_calls=_cuda.captured_calls())))
"""


@pytest.mark.parametrize("direction, chunks", [("bidirectional", None), ("forward", "3")])
def test_command_buffers(direction, chunks, tmp_path):
    import json
    import subprocess
    import sys
    rng = rng_for("graph", direction)
    x = make_inputs(rng, 2, 64, 300, 16)
    cot = rng.standard_normal(x["u"].shape).astype(np.float32)
    np.savez(tmp_path / "in.npz", cot=cot, **{k: np.asarray(v) for k, v in x.items()})
    env = _subprocess_env(XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"))
    env.pop("JAX_ENABLE_X64", None)
    if chunks:
        env["JAX_SELSCAN_SS_FWD_CHUNKS"] = env["JAX_SELSCAN_SS_BWD_CHUNKS"] = chunks
    proc = subprocess.run([sys.executable, "-c", _SS_GRAPH_SCRIPT, str(tmp_path / "in.npz"), direction,
                           str(tmp_path / "out.npz")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    print(info)
    names = ["out"] + sorted(x)
    saved = np.load(tmp_path / "out.npz")
    assert len(saved.files) == len(names)
    got = {n: saved[f"arr_{k}"] for k, n in enumerate(names)}
    kw = dict(delta_softplus=True, direction=direction)
    assert info["bitwise_equal_runs"], info
    assert rel_err(got["out"], ref_np(x, **kw)) < FWD_TOL[F32]
    want = _grads(selective_scan_ref, to64(x), kw, jnp.asarray(cot, jnp.float64))
    errs = {k: rel_err(got[k], want[k]) for k in want}
    assert all(e < GRAD_TOL[F32] for e in errs.values()), errs
    assert info["scaled_inputs_err"] < 1e-6, info  # exact but for flushed subnormals
    assert info["custom_calls"] >= 2, info  # the forward (with checkpoints) and the backward
    if info["captured_calls"] == 0:
        pytest.skip(f"XLA recorded no handler call into a command buffer: {info}")
    assert info["captured_calls"] >= 2, info  # the forward (with checkpoints) and the backward
