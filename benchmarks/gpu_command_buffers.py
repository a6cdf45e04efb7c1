"""Do XLA's command buffers (CUDA graphs) help short scans? One jitted function chains K
dependent calls (each call's output feeds the next call's b, with a small fusion between), and
is timed under three settings, each in its own process (XLA reads XLA_FLAGS once): "none"
(`--xla_gpu_enable_command_buffer=`, no command buffers), "default" (jax's own flags, which
record custom calls once a graph is large enough) and "forced" (`FUSION,CUSTOM_CALL` with
`--xla_gpu_graph_min_graph_size=1`). Per setting and case:
  * pipelined: R chains issued back to back, one sync at the end, per chain (median of 7);
  * synchronised: one chain and its wait (median of 21);
  * recorded: the handler calls made while XLA captured a graph (_cuda.captured_calls());
    0 means the setting ran without graphs. XLA records a graph again whenever the buffers'
    addresses change, as they do for calls in flight together (pipelined), each with its own
    outputs.

    python3 -P benchmarks/gpu_command_buffers.py [--k 16] [--out benchmarks/results/gpu_command_buffers]

Cases: linear_scan fp32 on 1 x 2^20 (one row), 64 x 4096 rows and (1024, 1024) along axis 0,
and the selective-scan forward at (1, 768, 256, 16) with z, delta_bias and softplus; all of
them launch-bound (a few microseconds of device time per call).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"none": "--xla_gpu_enable_command_buffer=", "default": "",
            "forced": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"}
CASES = ["linear 1x2^20", "linear 64x4096", "linear (1024, 1024) axis 0", "selective (1, 768, 256, 16)"]


def child(k):
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax_selscan import _cuda, linear_scan, selective_scan

    rng = np.random.default_rng(0)
    out = {}
    for case in CASES:
        if case.startswith("linear"):
            shape, axis = {"linear 1x2^20": ((1, 1 << 20), 1), "linear 64x4096": ((64, 4096), 1),
                           "linear (1024, 1024) axis 0": ((1024, 1024), 0)}[case]
            a = jnp.asarray(rng.uniform(0.5, 1.0, shape), jnp.float32)
            b = jnp.asarray(rng.standard_normal(shape), jnp.float32)

            def chain(a, b):
                for _ in range(k):
                    b = linear_scan(a, b, axis=axis) * 0.5 + 0.25
                return b
            args = (a, b)
        else:
            bsz, dim, length, n = 1, 768, 256, 16
            f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
            x = dict(u=f(bsz, dim, length), delta=f(bsz, dim, length) * 0.5 - 1.0,
                     A=-jnp.exp(f(dim, n) * 0.5), B=f(bsz, n, length), C=f(bsz, n, length),
                     D=f(dim), z=f(bsz, dim, length), delta_bias=f(dim) * 0.1 + 0.1)

            def chain(x):
                u = x["u"]
                for _ in range(k):
                    u = selective_scan(**{**x, "u": u}, delta_softplus=True) * 0.5
                return u
            args = (x,)
        fn = jax.jit(chain)
        before = _cuda.captured_calls()
        for _ in range(3):
            jax.block_until_ready(fn(*args))  # compile, warm-up, graph recording
        sync = []
        for _ in range(21):
            t = time.perf_counter()
            jax.block_until_ready(fn(*args))
            sync.append(time.perf_counter() - t)
        reps, piped = 20, []
        for _ in range(7):
            t = time.perf_counter()
            outs = [fn(*args) for _ in range(reps)]
            jax.block_until_ready(outs)
            piped.append((time.perf_counter() - t) / reps)
        out[case] = dict(pipelined_us=statistics.median(piped) * 1e6, sync_us=statistics.median(sync) * 1e6,
                         recorded=_cuda.captured_calls() - before)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=16, help="dependent calls per jitted chain")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                  "gpu_command_buffers"))
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.k)))
        return
    res = {}
    for setting, flags in SETTINGS.items():
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
        p = subprocess.run([sys.executable, "-P", os.path.abspath(__file__), "--child", setting, "--k", str(args.k)],
                           env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{setting} failed:\n{p.stderr[-3000:]}")
        res[setting] = json.loads(p.stdout.strip().splitlines()[-1])
    import jax
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=jax.devices()[0].device_kind, jax=jax.__version__, k=args.k, settings=SETTINGS,
                commit=os.environ.get("JSS_COMMIT", ""), command=" ".join(["python3", "-P"] + sys.argv))
    lines = [f"# XLA command buffers and short scans ({meta['device']})\n",
             f"date {meta['date']}, commit {meta['commit']}, jax {meta['jax']}, command `{meta['command']}`; "
             f"one jitted chain of {args.k} dependent calls; settings (XLA_FLAGS): "
             + "; ".join(f"{k} `{v}`" for k, v in SETTINGS.items()) + "\n",
             "| case | pipelined us / chain: none | default | forced | synchronised us: none | default | forced "
             "| recorded calls: none / default / forced |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for case in CASES:
        r = [res[k][case] for k in SETTINGS]
        lines.append(f"| {case} | " + " | ".join(f"{x['pipelined_us']:.1f}" for x in r) + " | "
                     + " | ".join(f"{x['sync_us']:.1f}" for x in r) + " | "
                     + " / ".join(str(x["recorded"]) for x in r) + " |")
    md = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(dict(meta=meta, results=res), f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
