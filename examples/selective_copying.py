"""Example 1: train a small Mamba on the Selective Copying task (Mamba paper, section 4.1.1).

The task: a sequence of `seq_len` positions holds `n_memorize` data tokens (from a
vocabulary of `n_data`) at random positions, every other position is a noise token;
then `n_memorize` marker tokens follow, and at those positions the model must output
the data tokens in their order of appearance. Data are generated on the fly inside
the jitted training step. Token accuracy is measured on the output positions.

The model (examples/mamba_model.py) is written for one sequence and vmapped over the
batch; the scan is `jax_selscan.selective_scan` ("ours") or the plain-JAX
`jax_selscan.selective_scan_ref` ("ref"). `--compare` trains both from the same
initialisation on the same batches, prints their time per step side by side and plots
both loss curves (when matplotlib is installed).

    python examples/selective_copying.py --small            # CPU, a few minutes
    python examples/selective_copying.py --large            # GPU
    python examples/selective_copying.py --small --compare  # + the reference model
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mamba_model as mm  # noqa: E402

NOISE, MARKER, FIRST_DATA = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    seq_len: int = 64        # positions holding data + noise (before the markers)
    n_memorize: int = 4      # data tokens to copy
    n_data: int = 8          # data vocabulary (the model's vocabulary is n_data + 2)

    @property
    def vocab_size(self) -> int:
        return self.n_data + FIRST_DATA


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    task: TaskConfig = TaskConfig()
    d_model: int = 64
    n_layers: int = 2
    d_state: int = 16
    batch: int = 64
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    seed: int = 0
    scan: str = "ours"           # "ours" or "ref"
    eval_every: int = 50
    eval_batch: int = 512
    target_accuracy: float = 1.0  # stop early once an evaluation reaches it

    def model(self) -> mm.ModelConfig:
        return mm.ModelConfig(vocab_size=self.task.vocab_size, d_model=self.d_model,
                              n_layers=self.n_layers, d_state=self.d_state)


# Paper: L=4096, 16 data tokens, 16 to memorise. Scaled down so that the CPU run
# takes minutes; the GPU configuration is longer and larger.
TINY = TrainConfig(task=TaskConfig(seq_len=16, n_memorize=2, n_data=4), d_model=16,
                   n_layers=1, d_state=4, batch=16, steps=30, lr=1e-2, warmup=0,
                   eval_every=10, eval_batch=64)
SMALL = TrainConfig(task=TaskConfig(seq_len=64, n_memorize=4, n_data=8), d_model=32,
                    n_layers=2, d_state=8, batch=32, steps=3000, lr=5e-3, target_accuracy=0.99)
LARGE = TrainConfig(task=TaskConfig(seq_len=512, n_memorize=16, n_data=16), d_model=64,
                    n_layers=2, d_state=16, batch=64, steps=5000, lr=3e-3, eval_every=100,
                    target_accuracy=0.99)


# --- data ------------------------------------------------------------------------------------

def make_batch(key, task: TaskConfig, batch: int):
    """(inputs (batch, seq_len + n_memorize) int32, targets (batch, n_memorize) int32)."""
    L, M = task.seq_len, task.n_memorize
    k_tok, k_pos = jax.random.split(key)
    data = jax.random.randint(k_tok, (batch, M), FIRST_DATA, FIRST_DATA + task.n_data,
                              dtype=jnp.int32)
    pos = jax.vmap(lambda k: jnp.sort(jax.random.choice(k, L, (M,), replace=False)))(
        jax.random.split(k_pos, batch))
    rows = jnp.arange(batch)[:, None]
    context = jnp.full((batch, L), NOISE, jnp.int32).at[rows, pos].set(data)
    inputs = jnp.concatenate([context, jnp.full((batch, M), MARKER, jnp.int32)], axis=1)
    return inputs, data


def loss_and_accuracy(params, inputs, targets, cfg: TrainConfig):
    logits = mm.batched_apply(params, inputs, cfg.model(), mm.SCANS[cfg.scan])
    logits = logits[:, -cfg.task.n_memorize:].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    acc = jnp.mean(jnp.argmax(logits, -1) == targets)
    return jnp.mean(nll), acc


# --- training --------------------------------------------------------------------------------

def make_optimizer(cfg: TrainConfig):
    import optax
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, max(cfg.warmup, 1),
                                               max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.1)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(sched, b1=0.9, b2=0.98, weight_decay=cfg.weight_decay))


def make_step(cfg: TrainConfig, opt):
    import optax

    @jax.jit
    def train_step(params, opt_state, key):
        inputs, targets = make_batch(key, cfg.task, cfg.batch)
        (loss, acc), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(
            params, inputs, targets, cfg)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, acc

    @jax.jit
    def evaluate(params, key):
        inputs, targets = make_batch(key, cfg.task, cfg.eval_batch)
        return loss_and_accuracy(params, inputs, targets, cfg)

    return train_step, evaluate


def train(cfg: TrainConfig, log=print, max_steps=None) -> dict:
    """Train from scratch; returns the history (per-step loss/accuracy/time, evaluations).

    `max_steps` stops early without changing the learning-rate schedule (which spans
    `cfg.steps`), so a short run follows a long one's first steps exactly.

    The same seed gives the same initial parameters and the same batches for either
    scan, so two runs that differ only in `cfg.scan` are directly comparable.
    """
    key = jax.random.PRNGKey(cfg.seed)
    k_init, k_data, k_eval = jax.random.split(key, 3)
    params = mm.init_params(k_init, cfg.model())
    opt = make_optimizer(cfg)
    opt_state = opt.init(params)
    train_step, evaluate = make_step(cfg, opt)

    t0 = time.perf_counter()
    compiled = train_step.lower(params, opt_state, k_data).compile()
    compile_s = time.perf_counter() - t0
    hist = {"config": dataclasses.asdict(cfg), "n_params": int(mm.n_params(params)),
            "compile_s": compile_s, "loss": [], "acc": [], "step_s": [], "eval": []}
    start = time.perf_counter()
    n_steps = cfg.steps if max_steps is None else min(cfg.steps, max_steps)
    for i in range(n_steps):
        t = time.perf_counter()
        params, opt_state, loss, acc = compiled(params, opt_state, jax.random.fold_in(k_data, i))
        loss = float(loss)                                  # waits for the step
        hist["step_s"].append(time.perf_counter() - t)
        hist["loss"].append(loss)
        hist["acc"].append(float(acc))
        last = i + 1 == n_steps
        if (i + 1) % cfg.eval_every == 0 or last:
            ev_loss, ev_acc = map(float, evaluate(params, jax.random.fold_in(k_eval, i)))
            hist["eval"].append({"step": i + 1, "loss": ev_loss, "acc": ev_acc,
                                 "elapsed_s": time.perf_counter() - start})
            if log:
                log(f"[{cfg.scan}] step {i + 1:5d}  train loss {loss:.4f}  eval loss "
                    f"{ev_loss:.4f}  eval acc {ev_acc:.4f}  ({time.perf_counter() - start:.1f} s)")
            if ev_acc >= cfg.target_accuracy:
                break
    hist["train_s"] = time.perf_counter() - start
    hist["steps_run"] = len(hist["loss"])
    hist["final_eval"] = hist["eval"][-1] if hist["eval"] else None
    # median step time, skipping the first few (warm-up of the allocator and caches)
    hist["median_step_s"] = float(np.median(hist["step_s"][min(5, len(hist["step_s"]) - 1):]))
    return hist


def plot(histories: dict, path: str) -> bool:
    """Loss curves of several runs in one PNG; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, h in histories.items():
        ax.plot(np.arange(1, len(h["loss"]) + 1), h["loss"], label=name, lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (cross-entropy on the copied tokens)")
    ax.set_title("Selective Copying: selective_scan vs selective_scan_ref")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="seconds; what CI runs")
    size.add_argument("--small", action="store_true", help="CPU: minutes (default)")
    size.add_argument("--large", action="store_true", help="GPU: longer sequences, bigger model")
    ap.add_argument("--compare", action="store_true",
                    help="also train with selective_scan_ref; plot both loss curves")
    ap.add_argument("--compare-steps", type=int, default=None,
                    help="steps for the comparison runs (default: the configuration's)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--out", default="selective_copying", help="prefix of the JSON/PNG outputs")
    args = ap.parse_args(argv)
    cfg = TINY if args.tiny else LARGE if args.large else SMALL
    if args.steps:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    print(f"backend {jax.default_backend()}, devices {jax.devices()}; task {cfg.task}")
    histories = {}
    if args.compare:
        n = args.compare_steps or cfg.steps
        for scan in ("ours", "ref"):
            c = dataclasses.replace(cfg, scan=scan, steps=n, target_accuracy=2.0)
            histories[scan] = train(c)
        a, b = histories["ours"], histories["ref"]
        diff = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a["loss"], b["loss"]))
        print(f"\n{'':28s} {'selective_scan':>15s} {'selective_scan_ref':>19s}")
        print(f"{'median time per step (ms)':28s} {1e3 * a['median_step_s']:15.2f} "
              f"{1e3 * b['median_step_s']:19.2f}")
        print(f"{'compile (s)':28s} {a['compile_s']:15.1f} {b['compile_s']:19.1f}")
        print(f"{'final eval accuracy':28s} {a['final_eval']['acc']:15.4f} "
              f"{b['final_eval']['acc']:19.4f}")
        print(f"speed-up per step: {b['median_step_s'] / a['median_step_s']:.2f}x; "
              f"step-0 loss {a['loss'][0]:.6f} vs {b['loss'][0]:.6f}; "
              f"largest relative loss difference over {n} steps: {diff:.2e}")
        if plot(histories, args.out + "_loss.png"):
            print(f"wrote {args.out}_loss.png")
    else:
        h = train(cfg)
        histories["ours"] = h
        fe = h["final_eval"]
        print(f"\n{h['steps_run']} steps, {h['train_s']:.1f} s training (+{h['compile_s']:.1f} s "
              f"compile), median {1e3 * h['median_step_s']:.1f} ms/step; eval accuracy "
              f"{fe['acc']:.4f} on {cfg.eval_batch} fresh sequences; {h['n_params']} parameters")
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "jax": jax.__version__,
            "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "command": " ".join(sys.argv)}
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "runs": histories}, f)
    print(f"wrote {args.out}.json")
    return histories


if __name__ == "__main__":
    main()
