"""The CPU selective scan's forward and forward + backward for few channels, through JAX.

    JAX_PLATFORMS=cpu python benchmarks/cpu_selective_scan_few_channels.py \
        [--shapes "1,1,1048576,1;1,4,262144,16;2,16,8192,16"] [--threads T] [--repeats 9] [--out PATH]

`selective_scan` (float32, Mamba options: z, D, delta_bias with softplus, B and C
(batch, N, L)) forward, and the jitted forward + backward (all gradients, cotangent ones), timed
in turn within each round (medians of `--repeats` rounds after a warm-up; compile excluded), at
shapes (batch, D, L, N) with few channels, where the backward runs along L
(cpu_arm/selective_scan_bwd_narrow.h), and a control shape with full channel tiles
(docs/PERFORMANCE_CPU.md, session 34). `--threads` sets JAX_SELSCAN_CPU_THREADS (default: the
kernel's own choice). Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import os

from cpu_selective_scan import HERE, fwd_bwd, kernel, make, run_meta, timeit_rounds
from jax_selscan.selective_scan import selective_scan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1,1,1048576,1;1,4,262144,16;2,16,8192,16")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_selective_scan_few_channels"))
    args = ap.parse_args()
    if args.threads > 0:
        os.environ["JAX_SELSCAN_CPU_THREADS"] = str(args.threads)
    rows = []
    for spec in args.shapes.split(";"):
        shape = tuple(int(v) for v in spec.split(","))
        fns = [kernel("forward"), fwd_bwd(lambda **a: selective_scan(**a, delta_softplus=True))]
        meds, runs = timeit_rounds(fns, make(shape), args.repeats)
        elems = shape[0] * shape[1] * shape[2] * shape[3]
        r = dict(shape=dict(zip(("batch", "D", "L", "N"), shape)), repeats=args.repeats)
        for d, m, t in zip(("forward", "fwd_bwd"), meds, runs):
            r[f"{d}_ms"], r[f"{d}_ns_per_tdn"], r[f"{d}_runs"] = m, m * 1e6 / elems, t
        r["fwd_bwd_vs_forward"] = r["fwd_bwd_ms"] / r["forward_ms"]
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_runs")}), flush=True)
    meta = run_meta(threads=args.threads or "default")
    commit = meta["commit"]
    with open(args.out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    md = ["# CPU selective_scan with few channels: forward and forward + backward\n",
          f"- date: {meta['date']}\n- machine: {meta['machine']}\n- commit: {commit} (jax {meta['jax']})\n"
          f"- kernel threads: {meta['threads']}\n- command: `{meta['command']}`\n",
          "| batch, D, L, N | fwd ms | fwd+bwd ms | fwd+bwd / fwd | fwd ns/(t,d,n) | fwd+bwd ns/(t,d,n) |",
          "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["shape"]
        md.append(f"| {s['batch']}, {s['D']}, {s['L']}, {s['N']} | {r['forward_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
                  f"{r['fwd_bwd_vs_forward']:.1f}x | {r['forward_ns_per_tdn']:.3f} | {r['fwd_bwd_ns_per_tdn']:.3f} |")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
