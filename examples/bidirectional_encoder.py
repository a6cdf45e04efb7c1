"""Example 3: a small bidirectional Mamba encoder (`selective_scan(..., direction="bidirectional")`).

Each block runs the selective scan both ways with shared parameters (the output is
the sum of the forward and the reverse scan, computed by one call). The task needs
the future: at every position t the encoder must output the token `shift` positions
LATER (x[t + shift]; the last `shift` positions are not scored). A causal
(direction="forward") model with the same parameters can only guess (accuracy about
1 / vocab); the bidirectional one learns it.

    python examples/bidirectional_encoder.py [--steps 600]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_model as mm  # noqa: E402


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    vocab: int = 8
    length: int = 64
    shift: int = 3
    d_model: int = 32
    n_layers: int = 2
    d_state: int = 8
    batch: int = 32
    steps: int = 600
    lr: float = 3e-3
    direction: str = "bidirectional"
    scan: str = "ours"
    seed: int = 0

    def model(self) -> mm.ModelConfig:
        return mm.ModelConfig(vocab_size=self.vocab, d_model=self.d_model, n_layers=self.n_layers,
                              d_state=self.d_state, direction=self.direction)


TINY = EncoderConfig(vocab=4, length=16, shift=1, d_model=32, n_layers=1, d_state=4, batch=16,
                     steps=60, lr=2e-2)


def make_batch(key, cfg: EncoderConfig, batch=None):
    tokens = jax.random.randint(key, (batch or cfg.batch, cfg.length), 0, cfg.vocab, jnp.int32)
    return tokens, tokens[:, cfg.shift:]          # targets for positions 0 .. L-shift-1


def loss_and_accuracy(params, tokens, targets, cfg: EncoderConfig):
    logits = mm.batched_apply(params, tokens, cfg.model(), mm.SCANS[cfg.scan])
    logits = logits[:, :targets.shape[1]]
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(nll), jnp.mean(jnp.argmax(logits, -1) == targets)


def train(cfg: EncoderConfig, log=print) -> dict:
    import optax
    k_init, k_data, k_eval = jax.random.split(jax.random.PRNGKey(cfg.seed), 3)
    params = mm.init_params(k_init, cfg.model())
    opt = optax.adam(cfg.lr)
    opt_state = opt.init(params)

    @jax.jit
    def step(params, opt_state, key):
        tokens, targets = make_batch(key, cfg)
        (loss, acc), g = jax.value_and_grad(loss_and_accuracy, has_aux=True)(
            params, tokens, targets, cfg)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    hist = {"loss": [], "acc": []}
    t0 = time.perf_counter()
    for i in range(cfg.steps):
        params, opt_state, loss, acc = step(params, opt_state, jax.random.fold_in(k_data, i))
        hist["loss"].append(float(loss))
        hist["acc"].append(float(acc))
        if log and ((i + 1) % 50 == 0 or i + 1 == cfg.steps):
            log(f"[{cfg.direction}] step {i + 1:4d} loss {float(loss):.4f} acc {float(acc):.3f}")
    tokens, targets = make_batch(k_eval, cfg, 256)
    ev_loss, ev_acc = jax.jit(loss_and_accuracy, static_argnums=3)(params, tokens, targets, cfg)
    hist.update(eval_loss=float(ev_loss), eval_acc=float(ev_acc), seconds=time.perf_counter() - t0,
                params=params)
    return hist


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=EncoderConfig.steps)
    args = ap.parse_args(argv)
    results = {}
    for direction in ("bidirectional", "forward"):
        cfg = EncoderConfig(steps=args.steps, direction=direction)
        results[direction] = train(cfg)
    print(f"\ntask: output x[t+{cfg.shift}] (vocab {cfg.vocab}, chance {1 / cfg.vocab:.3f})")
    for d, h in results.items():
        print(f"{d:14s} eval accuracy {h['eval_acc']:.3f}  loss {h['eval_loss']:.3f}  "
              f"({h['seconds']:.1f} s)")
    return results


if __name__ == "__main__":
    main()
