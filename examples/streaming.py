"""Example 4: streaming generation with a Mamba model.

Prefill: the prompt goes through the model once, each layer's scan being
`selective_scan(..., return_last_state=True)`; the cache keeps, per layer, that last
SSM state (d_inner, N) and the last d_conv-1 inputs of the causal convolution.
Decode: one token at a time with `selective_state_update` (O(1) work per token,
independent of the length so far). The check: the logits of every generated
position equal those of one full pass over prompt + generated tokens.

    python examples/streaming.py [--prompt 64 --new 32]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_model as mm  # noqa: E402

CONFIG = mm.ModelConfig(vocab_size=32, d_model=64, n_layers=2, d_state=16)


def generate(params, prompt, n_new, cfg: mm.ModelConfig, temperature=0.0, key=None):
    """(tokens (len(prompt) + n_new,), logits of each generated token (n_new, vocab),
    seconds per decoded token). Greedy when temperature == 0."""
    prefill = jax.jit(mm.prefill, static_argnums=2)
    step = jax.jit(mm.step, static_argnums=3)
    logits, cache = prefill(params, prompt, cfg)
    last = logits[-1]
    tokens, out_logits = list(np.asarray(prompt)), []
    key = jax.random.PRNGKey(0) if key is None else key
    t0, n_timed = None, 0
    for i in range(n_new):
        out_logits.append(last)
        if temperature > 0:
            tok = jax.random.categorical(jax.random.fold_in(key, i), last / temperature)
        else:
            tok = jnp.argmax(last)
        tok = int(tok)
        tokens.append(tok)
        if i + 1 < n_new:
            if i == 1:                      # steps 0 and 1 include compilation
                t0 = time.perf_counter()
            last, cache = step(params, jnp.int32(tok), cache, cfg)
            if t0 is not None:
                last.block_until_ready()
                n_timed += 1
    per_token = (time.perf_counter() - t0) / n_timed if n_timed else float("nan")
    return np.array(tokens, np.int32), jnp.stack(out_logits), per_token


def check(params, prompt, n_new, cfg: mm.ModelConfig, temperature=0.0):
    """Generate, then run ONE full pass over the whole sequence; the largest difference
    of the generated positions' logits, relative to their largest magnitude."""
    tokens, stream_logits, per_token = generate(params, prompt, n_new, cfg, temperature)
    full = jax.jit(mm.apply, static_argnums=2)(params, jnp.asarray(tokens), cfg)
    p = len(prompt)
    full_logits = full[p - 1:p - 1 + n_new]
    err = float(jnp.max(jnp.abs(stream_logits - full_logits)) / jnp.max(jnp.abs(full_logits)))
    return {"tokens": tokens, "rel_err": err, "per_token_s": per_token,
            "stream_logits": stream_logits, "full_logits": full_logits}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    args = ap.parse_args(argv)
    k_p, k_t = jax.random.split(jax.random.PRNGKey(0))
    params = mm.init_params(k_p, CONFIG)
    prompt = jax.random.randint(k_t, (args.prompt,), 0, CONFIG.vocab_size, jnp.int32)
    r = check(params, prompt, args.new, CONFIG, args.temperature)
    print(f"prompt {args.prompt} tokens, generated {args.new}: {r['tokens'][args.prompt:].tolist()}")
    print(f"streamed vs full-pass logits: max relative difference {r['rel_err']:.2e} "
          f"(tolerance 1e-4); {1e3 * r['per_token_s']:.2f} ms per decoded token")
    return r


if __name__ == "__main__":
    main()
