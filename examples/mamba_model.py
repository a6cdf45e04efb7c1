"""A small Mamba (Mamba-1) language model in plain JAX, built on jax_selscan.selective_scan.

Parameters are a plain dict of arrays; every function here works on ONE sequence
(`tokens` of shape (L,)) and is `jax.vmap`-ed over the batch by the caller. Inside a
block the sequence is laid out the way `selective_scan` wants it, (batch=1, D, L), so
under `vmap` the batch axis is folded into the scan's batch (no Python loop).

    block(x):  h = RMSNorm(x)
               x_in, z = split(h @ W_in)                  (L, 2*d_inner)
               x_in = silu(causal depthwise conv(x_in))   kernel d_conv
               dt_low, B, C = split(x_in @ W_x)           (L, dt_rank + 2*d_state)
               dt = dt_low @ W_dt                         (L, d_inner)   bias -> delta_bias
               y = selective_scan(x_in, dt, A=-exp(A_log), B, C, D, z,
                                  delta_bias, delta_softplus=True, direction=...)
               return x + y @ W_out

The scan is a parameter (`scan_fn`), so the same model runs with
`jax_selscan.selective_scan` or with the plain-JAX `jax_selscan.selective_scan_ref`.
`prefill` / `step` are the streaming (decode) path: the prompt goes through
`selective_scan(..., return_last_state=True)`, each new token through
`selective_state_update` plus a rolling convolution window.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp

import jax_selscan

SCANS: dict[str, Callable] = {
    "ours": jax_selscan.selective_scan,       # the package's primitive-backed scan
    "ref": jax_selscan.selective_scan_ref,    # plain JAX (lax.associative_scan), no custom call
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 16
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int = 0            # 0: ceil(d_model / 16), as in Mamba
    direction: str = "forward"  # "bidirectional" for an encoder

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)


# --- parameters ------------------------------------------------------------------------------

def init_params(key, cfg: ModelConfig, dtype=jnp.float32) -> dict:
    """Mamba's initialisation: S4D-real A (A_log = log n), dt bias so that softplus(bias)
    is log-uniform in [1e-3, 1e-1], scaled normal projections."""
    di, dm, n, r = cfg.d_inner, cfg.d_model, cfg.d_state, cfg.rank
    keys = jax.random.split(key, cfg.n_layers + 2)

    def dense(k, fan_in, fan_out, scale=1.0):
        return (jax.random.normal(k, (fan_in, fan_out), dtype) * scale / math.sqrt(fan_in))

    layers = []
    for k in keys[:cfg.n_layers]:
        k = jax.random.split(k, 7)
        dt = jnp.exp(jax.random.uniform(k[5], (di,), dtype, math.log(1e-3), math.log(1e-1)))
        layers.append({
            "norm": jnp.ones((dm,), dtype),
            "W_in": dense(k[0], dm, 2 * di),
            "conv_w": jax.random.normal(k[1], (cfg.d_conv, di), dtype) / math.sqrt(cfg.d_conv),
            "conv_b": jnp.zeros((di,), dtype),
            "W_x": dense(k[2], di, r + 2 * n),
            "W_dt": dense(k[3], r, di),
            "dt_bias": dt + jnp.log(-jnp.expm1(-dt)),           # softplus^-1(dt)
            "A_log": jnp.log(jnp.broadcast_to(jnp.arange(1, n + 1, dtype=dtype), (di, n))),
            "D": jnp.ones((di,), dtype),
            "W_out": dense(k[4], di, dm, scale=1.0 / math.sqrt(2 * cfg.n_layers)),
        })
    return {
        "embed": jax.random.normal(keys[-2], (cfg.vocab_size, dm), dtype),
        "layers": layers,
        "norm_f": jnp.ones((dm,), dtype),
        "head": dense(keys[-1], dm, cfg.vocab_size),
    }


# --- the model, one sequence at a time ---------------------------------------------------------

def rms_norm(x, w, eps=1e-5):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def causal_conv(x, w, b):
    """Depthwise causal convolution: out[t] = b + sum_k w[k] x[t - (K-1) + k]; x (L, C)."""
    K = w.shape[0]
    xp = jnp.pad(x, ((K - 1, 0), (0, 0)))
    return b + sum(w[k] * xp[k:k + x.shape[0]] for k in range(K))


def _ssm_inputs(p, h, cfg):
    """Everything before the scan: (x_in, z, dt, B, C) for the block input h (L, d_model),
    plus the pre-convolution x (the streaming path keeps its last d_conv-1 rows)."""
    xz = h @ p["W_in"]
    x_pre, z = jnp.split(xz, 2, axis=-1)
    x_in = jax.nn.silu(causal_conv(x_pre, p["conv_w"], p["conv_b"]))
    proj = x_in @ p["W_x"]
    dt_low, B, C = jnp.split(proj, [cfg.rank, cfg.rank + cfg.d_state], axis=-1)
    return x_pre, x_in, z, dt_low @ p["W_dt"], B, C


def block(p, x, cfg: ModelConfig, scan_fn, return_state=False):
    """One residual Mamba block on x (L, d_model)."""
    x_pre, x_in, z, dt, B, C = _ssm_inputs(p, rms_norm(x, p["norm"]), cfg)
    T = lambda v: v.T[None]                                    # (L, c) -> (1, c, L)
    out = scan_fn(T(x_in), T(dt), -jnp.exp(p["A_log"]), T(B), T(C), D=p["D"], z=T(z),
                  delta_bias=p["dt_bias"], delta_softplus=True,
                  return_last_state=return_state, direction=cfg.direction)
    if return_state:
        out, ssm_state = out
    y = x + out[0].T @ p["W_out"]
    if not return_state:
        return y
    conv_state = jnp.pad(x_pre, ((cfg.d_conv - 1, 0), (0, 0)))[-(cfg.d_conv - 1):]
    return y, {"conv": conv_state, "ssm": ssm_state[0]}


def hidden(params, tokens, cfg: ModelConfig, scan_fn=jax_selscan.selective_scan):
    """Final hidden states (L, d_model) of one token sequence (L,)."""
    x = params["embed"][tokens]
    for p in params["layers"]:
        x = block(p, x, cfg, scan_fn)
    return rms_norm(x, params["norm_f"])


def apply(params, tokens, cfg: ModelConfig, scan_fn=jax_selscan.selective_scan):
    """Logits (L, vocab) for one token sequence (L,); vmap over the batch."""
    return hidden(params, tokens, cfg, scan_fn) @ params["head"]


def batched_apply(params, tokens, cfg: ModelConfig, scan_fn=jax_selscan.selective_scan):
    """Logits (batch, L, vocab): `apply` vmapped over the batch."""
    return jax.vmap(lambda t: apply(params, t, cfg, scan_fn))(tokens)


# --- streaming (decoding) ----------------------------------------------------------------------

def prefill(params, tokens, cfg: ModelConfig):
    """(logits (L, vocab), cache) for a prompt (L,) with one selective_scan per layer
    (return_last_state=True). cache[i] = {"conv": (d_conv-1, d_inner), "ssm": (d_inner, N)}."""
    if cfg.direction != "forward":
        raise ValueError("streaming needs a causal (direction='forward') model")
    x = params["embed"][tokens]
    cache = []
    for p in params["layers"]:
        x, state = block(p, x, cfg, jax_selscan.selective_scan, return_state=True)
        cache.append(state)
    return rms_norm(x, params["norm_f"]) @ params["head"], cache


def step(params, token, cache, cfg: ModelConfig):
    """(logits (vocab,), new cache) for one new token (scalar) given the cache."""
    x = params["embed"][token]
    new_cache = []
    for p, c in zip(params["layers"], cache):
        h = rms_norm(x, p["norm"])
        x_pre, z = jnp.split(h @ p["W_in"], 2, axis=-1)
        window = jnp.concatenate([c["conv"], x_pre[None]], axis=0)       # (d_conv, d_inner)
        x_in = jax.nn.silu(p["conv_b"] + jnp.sum(p["conv_w"] * window, axis=0))
        dt_low, B, C = jnp.split(x_in @ p["W_x"], [cfg.rank, cfg.rank + cfg.d_state])
        y, ssm = jax_selscan.selective_state_update(
            c["ssm"][None], x_in[None], (dt_low @ p["W_dt"])[None], -jnp.exp(p["A_log"]),
            B[None], C[None], D=p["D"], z=z[None], dt_bias=p["dt_bias"], dt_softplus=True)
        x = x + y[0] @ p["W_out"]
        new_cache.append({"conv": window[1:], "ssm": ssm[0]})
    return rms_norm(x, params["norm_f"]) @ params["head"], new_cache


def n_params(params) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(params))
