"""The examples in examples/, at tiny sizes, with assertions on what each one claims."""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import jax
import jax.numpy as jnp

import jax_selscan
from jax_selscan import _ffi

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import mamba_model as mm  # noqa: E402
import lru  # noqa: E402
import lru_drop_in  # noqa: E402
import streaming  # noqa: E402

REQUIRE_CPU_KERNEL = os.environ.get("JAX_SELSCAN_REQUIRE_CPU_KERNEL") == "1"


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """The examples compare two computations of one model (our scan against the reference's,
    streaming against one pass). On a GPU, XLA's default float32 matmul precision is TF32
    (about 1e-3 relative per product), which rounds the two computations' dense layers
    differently (H200: 2e-4 to 5e-4 apart); the comparisons are about the scans, so the dense
    layers run at full float32 here."""
    with jax.default_matmul_precision("float32"):
        yield


def rel_err(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.max(np.abs(x - y)) / np.max(np.abs(y)))


# --- 1. Selective Copying --------------------------------------------------------------------

def test_selective_copying_batch():
    import selective_copying as sc
    task = sc.TaskConfig(seq_len=12, n_memorize=3, n_data=5)
    inputs, targets = sc.make_batch(jax.random.PRNGKey(3), task, 16)
    inputs, targets = np.asarray(inputs), np.asarray(targets)
    assert inputs.shape == (16, 15) and targets.shape == (16, 3)
    assert (inputs[:, 12:] == sc.MARKER).all()
    for row, tgt in zip(inputs, targets):
        data = row[:12][row[:12] != sc.NOISE]
        np.testing.assert_array_equal(data, tgt)             # in order of appearance
    assert targets.min() >= sc.FIRST_DATA and targets.max() < sc.FIRST_DATA + 5
    assert len(np.unique(targets)) > 1


def test_selective_copying_trains_and_matches_reference():
    pytest.importorskip("optax")
    import selective_copying as sc
    cfg = sc.TINY                                             # 30 steps, seconds
    ours = sc.train(cfg, log=None)
    ref = sc.train(dataclasses.replace(cfg, scan="ref"), log=None, max_steps=5)
    loss = np.array(ours["loss"])
    assert np.isfinite(loss).all()
    # the loss falls: the last 5 steps average well below the first 5
    assert loss[-5:].mean() < 0.9 * loss[:5].mean(), loss
    # same initialisation and batches: the same loss at step 0 (float32 rounding) ...
    np.testing.assert_allclose(ours["loss"][0], ref["loss"][0], rtol=1e-5)
    # ... and close losses over the first steps (the trajectories drift apart slowly)
    np.testing.assert_allclose(ours["loss"][:5], ref["loss"], rtol=1e-3)


# --- the shared model: ours vs the reference scan ----------------------------------------------

@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_model_ours_matches_reference(direction):
    cfg = mm.ModelConfig(vocab_size=11, d_model=16, n_layers=2, d_state=4, direction=direction)
    params = mm.init_params(jax.random.PRNGKey(1), cfg)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (3, 20), 0, 11, jnp.int32)
    ours = jax.jit(lambda p, t: mm.batched_apply(p, t, cfg, mm.SCANS["ours"]))(params, tokens)
    ref = jax.jit(lambda p, t: mm.batched_apply(p, t, cfg, mm.SCANS["ref"]))(params, tokens)
    assert ours.dtype == jnp.float32 and ours.shape == (3, 20, 11)
    assert rel_err(ours, ref) < 1e-5
    # vmap over the batch == one sequence at a time
    one = jax.jit(lambda p, t: mm.apply(p, t, cfg))(params, tokens[1])
    assert rel_err(ours[1], one) < 1e-5


# --- 2. LRU drop-in ------------------------------------------------------------------------------

def test_lru_drop_in_one_line_same_outputs_fast_path():
    fast = lru_drop_in.switched_module("lru_selscan_test")
    assert fast.associative_scan is jax_selscan.associative_scan
    assert lru.associative_scan is jax.lax.associative_scan
    params, u = lru_drop_in.make_inputs(jax.random.PRNGKey(4), batch=2, length=64, d_model=8,
                                        d_hidden=16)
    cmp = lru_drop_in.compare(fast, params, u)
    assert cmp["outputs"][0].dtype == np.float32
    assert cmp["output_rel_err"] < 1e-5, cmp
    assert cmp["grad_rel_err"] < 1e-4, cmp
    rep = lru_drop_in.fast_path_report(fast, params, u)
    assert rep["primitive_in_jaxpr"] == 2                      # one per LRU layer
    assert rep["primitive_in_grad_jaxpr"] >= 2
    assert not rep["lax_version_has_custom_call"]
    if REQUIRE_CPU_KERNEL:
        assert _ffi.HAS_CPU
    if _ffi.HAS_CPU and jax.default_backend() == "cpu":
        assert rep["kernels_for_backend"]
        assert rep["custom_call_in_hlo"] and rep["custom_call_count"] == 2, rep
        assert rep["custom_call_count_compiled"] == 2, rep


# --- 3. bidirectional encoder ------------------------------------------------------------------

def test_bidirectional_encoder_trains_and_sees_the_future():
    pytest.importorskip("optax")
    import bidirectional_encoder as be
    hist = be.train(be.TINY, log=None)
    loss = np.array(hist["loss"])
    assert loss[-5:].mean() < 0.9 * loss[:5].mean(), loss
    # below chance (log vocab): impossible without looking ahead
    assert loss[-5:].mean() < np.log(be.TINY.vocab) - 0.1, loss
    # position 0's output depends on the last token only through the reverse scan
    cfg = be.TINY.model()
    params = hist["params"]
    emb = params["embed"][jax.random.randint(jax.random.PRNGKey(5), (be.TINY.length,), 0,
                                              be.TINY.vocab)]

    def first_logits(x, direction):
        c = dataclasses.replace(cfg, direction=direction)
        for p in params["layers"]:
            x = mm.block(p, x, c, jax_selscan.selective_scan)
        return jnp.sum(mm.rms_norm(x, params["norm_f"])[0] @ params["head"])

    g_bi = jax.grad(first_logits)(emb, "bidirectional")
    g_fw = jax.grad(first_logits)(emb, "forward")
    assert float(jnp.max(jnp.abs(g_bi[-1]))) > 1e-6
    assert float(jnp.max(jnp.abs(g_fw[1:]))) == 0.0            # causal: no future


# --- 4. streaming ----------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streaming_matches_full_pass(temperature):
    cfg = mm.ModelConfig(vocab_size=13, d_model=16, n_layers=2, d_state=4)
    params = mm.init_params(jax.random.PRNGKey(6), cfg)
    prompt = jax.random.randint(jax.random.PRNGKey(7), (9,), 0, 13, jnp.int32)
    r = streaming.check(params, prompt, 6, cfg, temperature)
    assert len(r["tokens"]) == 15
    np.testing.assert_array_equal(r["tokens"][:9], np.asarray(prompt))
    assert r["rel_err"] < 1e-5, r["rel_err"]
    # the prefill's last logits are the full pass's too
    logits, cache = jax.jit(mm.prefill, static_argnums=2)(params, prompt, cfg)
    full = jax.jit(mm.apply, static_argnums=2)(params, prompt, cfg)
    assert rel_err(logits, full) < 1e-5
    assert cache[0]["ssm"].shape == (cfg.d_inner, cfg.d_state)
    assert cache[0]["conv"].shape == (cfg.d_conv - 1, cfg.d_inner)
