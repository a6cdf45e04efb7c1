"""The fused CPU backward kernel of selective_scan (cpu_arm/selective_scan_bwd.h).

Gradients through jax.vjp / jax.grad of selective_scan (float32 / bfloat16 / float16
inputs, so the kernels run) against the gradients of selective_scan_ref evaluated in
float64 on the same (exactly upcast) inputs and cotangents. Tolerances, relative to
the largest |gradient| of each operand: float32 1e-4 (float32 state, sums over L and
batch); dD and ddelta_bias 3x that (single sums of batch * L terms of both signs);
bfloat16 1.6e-2 and float16 2e-3 (the float32 gradient rounded to the operand's
dtype; the reference sees the same 16-bit input values, so input rounding is not in
the error). Random non-zero inputs per case (seeded); odd L everywhere.

JAX_SELSCAN_BWD_SWEEP=1 runs every option combination (directions x B/C layouts x
D/z/delta_bias+softplus/h0 x last state; a few minutes); the default runs a covering
subset (each option on and off in every direction, each layout on both B and C).
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
import zlib

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jax_selscan import _ffi
from jax_selscan.reference import selective_scan_ref
from jax_selscan.selective_scan import selective_scan

sys.path.insert(0, os.path.dirname(__file__))
from conftest import REQUIRE_CPU_KERNEL  # noqa: E402

jax.config.update("jax_enable_x64", True)

if not _ffi.HAS_CPU and not REQUIRE_CPU_KERNEL:
    pytest.skip("the CPU extension is not built", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("cpu_default_device")  # the CPU kernels, on any machine

BWD = _ffi.SELECTIVE_SCAN_BWD
NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0")
TOL = {np.dtype(np.float32): 1e-4, np.dtype(jnp.bfloat16): 1.6e-2, np.dtype(np.float16): 2e-3}
DIRECTIONS = ("forward", "reverse", "bidirectional")
LAYOUTS = ("invariant", "variable", "grouped")


def make(seed, *, batch=2, dim=12, dstate=5, length=23, groups=3, b_kind="variable",
         c_kind="variable", D=True, z=True, bias=True, h0=True, act=np.float32, state=None):
    """Operands (None where absent) as float64 numpy arrays already rounded to their dtype,
    and the dtypes to feed the kernel with."""
    rng = np.random.default_rng(seed)
    state = state or act
    bc_shape = {"invariant": (dim, dstate), "variable": (batch, dstate, length),
                "grouped": (batch, groups, dstate, length)}

    def arr(shape, dtype, scale=1.0, shift=0.0):
        v = rng.standard_normal(shape) * scale + shift
        return np.asarray(np.asarray(v, dtype), np.float64)

    def bc(kind):
        return arr(bc_shape[kind], state if kind == "invariant" else act)

    x = dict(u=arr((batch, dim, length), act),
             delta=arr((batch, dim, length), act, 0.5, -0.5),
             A=np.asarray(np.asarray(-np.exp(rng.standard_normal((dim, dstate)) * 0.5), state),
                          np.float64),
             B=bc(b_kind), C=bc(c_kind),
             D=arr((dim,), state) if D else None,
             z=arr((batch, dim, length), act) if z else None,
             delta_bias=np.asarray(np.asarray(rng.uniform(0.05, 0.5, dim), state), np.float64)
             if bias else None,
             h0=arr((batch, dim, dstate), state) if h0 else None)
    dtypes = dict(u=act, delta=act, A=state, B=act if b_kind != "invariant" else state,
                  C=act if c_kind != "invariant" else state, D=state, z=act, delta_bias=state,
                  h0=state)
    return x, dtypes


def cotangents(seed, x, direction, last, act):
    rng = np.random.default_rng(seed + 1000)
    batch, dim, length = x["u"].shape
    n = x["A"].shape[1]
    dout = np.asarray(np.asarray(rng.standard_normal((batch, dim, length)), act), np.float64)
    if not last:
        return dout, None
    lf, lr = (rng.standard_normal((batch, dim, n)) for _ in range(2))
    return dout, {"forward": lf, "reverse": lr, "bidirectional": (lf, lr)}[direction]


def _pull(fn, present, direction, softplus, last):
    """The jitted VJP of `fn` over the operands `present`, the cotangents as arguments."""
    def pull(args, ct):
        def f(*a):
            return fn(**dict(zip(present, a)), delta_softplus=softplus, return_last_state=last,
                      direction=direction)
        _, vjp = jax.vjp(f, *args)
        return vjp(ct)
    return jax.jit(pull)


# The float64 reference's VJP, one jitted function per configuration, so that the tests of one
# shape share its compilation (seconds each). Not the kernels': tests monkeypatch what their
# tracing reads (ssp.ckpt_row_for), so each of their calls traces anew.
_ref_pull = functools.lru_cache(maxsize=None)(functools.partial(_pull, selective_scan_ref))


def grads(fn, x, dtypes, dout, dlast, direction, softplus, compute):
    """(gradients of the present operands in NAMES order, the jitted function's HLO)."""
    present = tuple(k for k in NAMES if x[k] is not None)
    cast = (lambda k, v: jnp.asarray(v, dtypes[k])) if compute is None else \
        (lambda k, v: jnp.asarray(v, compute))
    args = [cast(k, x[k]) for k in present]
    out_dt = dtypes["u"] if compute is None else compute
    last_dt = np.float32 if compute is None else compute
    ct_out = jnp.asarray(dout, out_dt)
    ct_last = None if dlast is None else jax.tree.map(lambda v: jnp.asarray(v, last_dt), dlast)
    last = dlast is not None
    j = _ref_pull(present, direction, softplus, last) if fn is selective_scan_ref else \
        _pull(fn, present, direction, softplus, last)
    ct = ct_out if ct_last is None else (ct_out, ct_last)
    hlo = j.lower(args, ct).as_text() if compute is None else ""
    return dict(zip(present, j(args, ct))), hlo


def check(seed, direction, *, softplus=True, last=True, **kw):
    x, dtypes = make(seed, **kw)
    if not softplus:  # delta > 0, as softplus would make it (negative delta grows the state)
        x["delta"] = np.abs(x["delta"])
    dout, dlast = cotangents(seed, x, direction, last, dtypes["u"])
    got, hlo = grads(selective_scan, x, dtypes, dout, dlast, direction, softplus, None)
    assert BWD in hlo, "the fused CPU backward kernel is not in the lowered program"
    want, _ = grads(selective_scan_ref, x, dtypes, dout, dlast, direction, softplus, np.float64)
    for k in got:
        assert got[k].dtype == np.dtype(dtypes[k]), k
        g, w = np.asarray(got[k], np.float64), np.asarray(want[k])
        assert g.shape == w.shape, k
        tol = TOL[np.dtype(dtypes[k])] * (3 if k in ("D", "delta_bias") else 1)
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
        assert err <= tol, f"d{k}: relative error {err:.3g} > {tol:g}"


# Each option on and off in every direction; each layout on B and on C.
COVER = [
    dict(b_kind="variable", c_kind="variable"),
    dict(b_kind="grouped", c_kind="invariant", D=False, z=False, h0=False, last=False),
    dict(b_kind="invariant", c_kind="grouped", bias=False, softplus=False),
    dict(b_kind="grouped", c_kind="variable", z=False, bias=False, h0=False),
]


@pytest.mark.parametrize("opts", range(len(COVER)))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gradients_match_float64_reference(direction, opts):
    check(10 * opts + DIRECTIONS.index(direction), direction, **COVER[opts])


def test_long_odd_sequence_n16():
    # N = 16 (the register-state kernel), L neither a multiple of 16 nor short; both
    # directions (bidirectional).
    check(50, "bidirectional", batch=1, dim=19, dstate=16, length=173, groups=1,
          b_kind="variable", c_kind="grouped")


@pytest.mark.parametrize("act,state", [(jnp.bfloat16, jnp.bfloat16), (np.float16, np.float16),
                                       (jnp.bfloat16, np.float32)])
def test_16_bit_inputs(act, state):
    check(60, "bidirectional", act=act, state=state, dim=8, length=21, dstate=4, groups=2,
          b_kind="grouped", c_kind="variable")


def test_bitwise_reproducible_and_eager_grad_uses_the_kernel():
    x, dtypes = make(70, batch=3, dim=40, dstate=16, length=129, groups=2, b_kind="grouped")
    args = {k: jnp.asarray(v, dtypes[k]) for k, v in x.items()}
    loss = lambda a: jnp.sum(jnp.sin(selective_scan(**a, delta_softplus=True,
                                                    direction="bidirectional")))
    g1 = jax.jit(jax.grad(loss))(args)
    g2 = jax.jit(jax.grad(loss))(args)
    g3 = jax.grad(loss)(args)  # eager: the bwd primitive's impl runs the kernel too
    for k in g1:
        np.testing.assert_array_equal(g1[k], g2[k])
        np.testing.assert_array_equal(g1[k], g3[k])


def test_vmap_of_grad_and_float64_fallback():
    x, dtypes = make(80, dim=8, dstate=4, length=11)
    args = {k: jnp.asarray(v, dtypes[k]) for k, v in x.items()}
    loss = lambda a: jnp.sum(selective_scan(**a, delta_softplus=True) ** 2)
    stacked = jax.tree.map(lambda v: jnp.stack([v, 2 * v]), args)
    vg = jax.jit(jax.vmap(jax.grad(loss)))
    assert BWD in vg.lower(stacked).as_text()
    got = vg(stacked)
    for i in range(2):
        one = jax.jit(jax.grad(loss))(jax.tree.map(lambda v: v[i], stacked))
        for k in one:
            np.testing.assert_allclose(got[k][i], one[k], rtol=1e-5,
                                       atol=1e-5 * float(np.max(np.abs(one[k]))))
    args64 = jax.tree.map(lambda v: v.astype(jnp.float64), args)
    text = jax.jit(jax.grad(loss)).lower(args64).as_text()
    assert BWD not in text  # float64: the pure-JAX VJP


@pytest.mark.parametrize("slow", [False, True])
def test_l_split_gradients_match_float64_reference(monkeypatch, slow):
    # One task (batch 1, 8 channels: one tile of 8 or 16 lanes) and short pieces forced by
    # JAX_SELSCAN_SS_PIECE_STEPS (read on every call): with >= 2 threads the backward (and
    # the forward, which then leaves no checkpoints) split L across threads
    # (cpu_arm/selective_scan_bwd_cpu.cc). Gradients against the float64 reference at the
    # usual tolerances in every direction, bitwise reproducible, and not bitwise the
    # unsplit gradients (which shows that the split ran). slow: A / 50, so the carries
    # between pieces stay large (windows that do not close).
    x, dtypes = make(95 + slow, batch=1, dim=8, dstate=16, length=1001, groups=1)
    if slow:
        x["A"] = np.asarray(np.asarray(x["A"] / 50, np.float32), np.float64)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for direction in DIRECTIONS:
        dout, dlast = cotangents(96, x, direction, True, dtypes["u"])
        plain, _ = grads(selective_scan, x, dtypes, dout, dlast, direction, True, None)
        with monkeypatch.context() as m:
            m.setenv("JAX_SELSCAN_SS_PIECE_STEPS", "64")
            got, hlo = grads(selective_scan, x, dtypes, dout, dlast, direction, True, None)
            again, _ = grads(selective_scan, x, dtypes, dout, dlast, direction, True, None)
        assert BWD in hlo
        want, _ = grads(selective_scan_ref, x, dtypes, dout, dlast, direction, True, np.float64)
        for k in got:
            np.testing.assert_array_equal(got[k], again[k])
            g, w = np.asarray(got[k], np.float64), np.asarray(want[k])
            tol = TOL[np.dtype(dtypes[k])] * (3 if k in ("D", "delta_bias") else 1)
            err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
            assert err <= tol, f"{direction} d{k}: relative error {err:.3g} > {tol:g}"
        if threads >= 2:
            assert any(not np.array_equal(got[k], plain[k]) for k in got), "no L split ran"


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_along_l_backward_for_few_channels(monkeypatch, direction):
    # Groups of one channel and a long L take the backward's along-L path (time in the lanes,
    # cpu_arm/selective_scan_bwd_narrow.h) at every ISA's lane count: grouped B (each group's
    # dB written directly by its one task), variable C (summed over the channels through the
    # [L][N] partial), N = 16, L = 1100 (a scalar tail unit); then one channel (one task) of
    # L = 4400 with L split into pieces across threads (>= 2^16 (b D L N) and fewer tasks
    # than threads: on >= 2 threads; the two-channel call above is two tasks, and too small
    # to be threaded).
    kw = dict(batch=1, dim=2, dstate=16, length=1100, groups=2, b_kind="grouped",
              c_kind="variable")
    check(300 + DIRECTIONS.index(direction), direction, **kw)
    with monkeypatch.context() as m:
        m.setenv("JAX_SELSCAN_SS_PIECE_STEPS", "64")
        check(310 + DIRECTIONS.index(direction), direction, **dict(kw, dim=1, groups=1, length=4400))


@pytest.mark.parametrize("kw", [dict(batch=1, dim=3, dstate=4, length=40, groups=1),
                                dict(batch=1, dim=8, dstate=16, length=1001, groups=1),
                                dict(batch=1, dim=2, dstate=3, length=1100, groups=2),
                                dict(batch=1, dim=1, dstate=16, length=4400, groups=1)],
                         ids=["channel_path", "channel_path_split", "along_l", "along_l_split"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("source", ["u", "delta", "z"])
def test_nan_propagates_to_the_gradients_like_reference(monkeypatch, source, direction, kw):
    # One NaN in u (reaches the states), delta (states and adjoints) or z (adjoints): every
    # gradient NaN exactly where the float64 reference's is, and equal to it elsewhere (both
    # CPU backward paths). The *_split cases are one task of >= 2^16 (b D L N) with pieces of
    # >= 64 steps allowed: on >= 2 threads the forward and the backward split L, whose 2^-30
    # cut-off of an entering state or adjoint must not drop a NaN.
    x, dtypes = make(400 + DIRECTIONS.index(direction), b_kind="grouped", c_kind="variable", **kw)
    x[source][0, kw["dim"] // 2, kw["length"] // 3 if source == "u" else 2 * kw["length"] // 3] = np.nan
    dout, dlast = cotangents(401, x, direction, True, dtypes["u"])
    monkeypatch.setenv("JAX_SELSCAN_SS_PIECE_STEPS", "64")
    got, _ = grads(selective_scan, x, dtypes, dout, dlast, direction, True, None)
    want, _ = grads(selective_scan_ref, x, dtypes, dout, dlast, direction, True, np.float64)
    assert any(np.isnan(np.asarray(w)).any() for w in want.values())
    for k in got:
        g, w = np.asarray(got[k], np.float64), np.asarray(want[k])
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"d{k}")
        ok = ~np.isnan(w)
        err = np.max(np.abs(g[ok] - w[ok]), initial=0.0) / max(np.max(np.abs(w[ok]), initial=0.0), 1e-30)
        assert err <= TOL[np.dtype(dtypes[k])] * 3, f"d{k}: relative error {err:.3g}"


SWEEP = os.environ.get("JAX_SELSCAN_BWD_SWEEP") == "1"


@pytest.mark.skipif(not SWEEP, reason="full option sweep: set JAX_SELSCAN_BWD_SWEEP=1")
@pytest.mark.parametrize("combo", list(itertools.product(
    DIRECTIONS, LAYOUTS, LAYOUTS, *([(False, True)] * 5))) if SWEEP else [None])
def test_sweep_every_option(combo):
    direction, bk, ck, D, z, bias, h0, last = combo
    check(zlib.crc32(repr(combo).encode()) % 10000, direction, b_kind=bk, c_kind=ck, D=D, z=z, bias=bias,
          softplus=bias, h0=h0, last=last, dim=6, length=13, dstate=3, groups=2)


# --- the forward's checkpoints (a residual) instead of the backward's sweep -----------------
#
# Under differentiation on CPU the forward is the FFI target jax_selscan_selective_scan_ckpt,
# whose fourth result (the state entering every block of the backward's `lanes` steps)
# selective_scan_lin_p carries to the backward, which then skips its checkpoint sweep.
# Same arithmetic in both, so the gradients are bitwise those of the sweep path.

from jax_selscan import selective_scan_primitives as ssp  # noqa: E402

CKPT = _ffi.SELECTIVE_SCAN_CKPT


def _bwd_ckpt_operand(hlo):
    """The type of the backward custom call's last (13th) operand in the lowered text."""
    line = next(ln for ln in hlo.splitlines() if f"custom_call @{BWD}(" in ln)
    sig = line[line.rindex(" : (") + 4:line.rindex(") -> ")]
    types = [t.strip() for t in sig.split("tensor<")[1:]]
    assert len(types) == 13
    return "tensor<" + types[-1].rstrip(", ")


def _grads_both_ways(monkeypatch, x, dtypes, dout, dlast, direction, softplus):
    got, hlo = grads(selective_scan, x, dtypes, dout, dlast, direction, softplus, None)
    with monkeypatch.context() as m:
        m.setattr(ssp, "ckpt_row_for", lambda *a, **k: 0)
        swept, hlo_sweep = grads(selective_scan, x, dtypes, dout, dlast, direction, softplus, None)
    return got, hlo, swept, hlo_sweep


RESIDUAL_CASES = [
    dict(b_kind="variable", c_kind="variable"),
    dict(b_kind="grouped", c_kind="invariant", D=False, z=False, h0=False, last=False),
    dict(b_kind="invariant", c_kind="grouped", bias=False, softplus=False, dstate=16, dim=21,
         length=37),
]


@pytest.mark.parametrize("opts", range(len(RESIDUAL_CASES)))
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_residual_checkpoints_give_the_sweeps_gradients(monkeypatch, direction, opts):
    kw = dict(RESIDUAL_CASES[opts])
    softplus, last = kw.pop("softplus", True), kw.pop("last", True)
    seed = 200 + 10 * opts + DIRECTIONS.index(direction)
    x, dtypes = make(seed, **kw)
    if not softplus:
        x["delta"] = np.abs(x["delta"])
    dout, dlast = cotangents(seed, x, direction, last, dtypes["u"])
    got, hlo, swept, hlo_sweep = _grads_both_ways(monkeypatch, x, dtypes, dout, dlast, direction,
                                                  softplus)
    # The residual path is taken: the checkpointing forward, and the backward gets them.
    assert CKPT in hlo and BWD in hlo
    assert _bwd_ckpt_operand(hlo) != "tensor<0xf32>"
    assert CKPT not in hlo_sweep and BWD in hlo_sweep
    assert _bwd_ckpt_operand(hlo_sweep) == "tensor<0xf32>"
    for k in got:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(swept[k]), err_msg=k)
    # And against the float64 reference, as the sweep path.
    want, _ = grads(selective_scan_ref, x, dtypes, dout, dlast, direction, softplus, np.float64)
    for k in got:
        g, w = np.asarray(got[k], np.float64), np.asarray(want[k])
        tol = TOL[np.dtype(dtypes[k])] * (3 if k in ("D", "delta_bias") else 1)
        assert np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30) <= tol, k


def test_residual_16_bit_and_plain_forward_writes_none(monkeypatch):
    x, dtypes = make(230, act=jnp.bfloat16, dim=8, length=21, dstate=4, groups=2,
                     b_kind="grouped", c_kind="variable")
    dout, dlast = cotangents(230, x, "bidirectional", True, dtypes["u"])
    got, hlo, swept, _ = _grads_both_ways(monkeypatch, x, dtypes, dout, dlast, "bidirectional", True)
    assert CKPT in hlo
    for k in got:
        np.testing.assert_array_equal(np.asarray(got[k], np.float32), np.asarray(swept[k], np.float32))
    args = {k: jnp.asarray(v, dtypes[k]) for k, v in x.items()}
    plain = jax.jit(lambda a: selective_scan(**a, direction="bidirectional")).lower(args).as_text()
    assert CKPT not in plain and _ffi.SELECTIVE_SCAN in plain


def test_residual_under_vmap_of_grad_and_grad_of_vmap(monkeypatch):
    x, dtypes = make(240, dim=8, dstate=4, length=29, groups=2, b_kind="grouped")
    args = {k: jnp.asarray(v, dtypes[k]) for k, v in x.items()}
    stacked = jax.tree.map(lambda v: jnp.stack([v, 0.5 * v]), args)

    def loss(a):
        out, last = selective_scan(**a, delta_softplus=True, return_last_state=True,
                                   direction="bidirectional")
        return jnp.sum(jnp.sin(out)) + jnp.sum(last[0] * last[1])

    vg = jax.jit(jax.vmap(jax.grad(loss)))
    text = vg.lower(stacked).as_text()
    assert CKPT in text and _bwd_ckpt_operand(text) != "tensor<0xf32>"
    got = vg(stacked)
    gv = jax.jit(jax.grad(lambda s: jnp.sum(jax.vmap(loss)(s))))
    assert CKPT in gv.lower(stacked).as_text()
    got_gv = gv(stacked)
    with monkeypatch.context() as m:
        m.setattr(ssp, "ckpt_row_for", lambda *a, **k: 0)
        for i in range(2):
            one = jax.jit(jax.grad(loss))(jax.tree.map(lambda v: v[i], stacked))
            for k in one:
                scale = float(np.max(np.abs(one[k])))
                np.testing.assert_allclose(got[k][i], one[k], rtol=1e-5, atol=1e-5 * scale)
                np.testing.assert_allclose(got_gv[k][i], one[k], rtol=1e-5, atol=1e-5 * scale)


def test_residual_forward_mode_and_eager():
    x, dtypes = make(250, dim=8, dstate=4, length=13)
    args = {k: jnp.asarray(v, dtypes[k]) for k, v in x.items()}
    f = lambda a: selective_scan(**a, delta_softplus=True, direction="reverse")
    tang = jax.tree.map(lambda v: 0.1 * v, args)
    p1, t1 = jax.jvp(f, (args,), (tang,))
    p2, t2 = jax.jit(lambda a, t: jax.jvp(f, (a,), (t,)))(args, tang)
    np.testing.assert_allclose(t1, t2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(p1, f(args))
    loss = lambda a: jnp.sum(f(a) ** 2)
    eager = jax.grad(loss)(args)
    jitted = jax.jit(jax.grad(loss))(args)
    for k in eager:
        np.testing.assert_array_equal(eager[k], jitted[k])
