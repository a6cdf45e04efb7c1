"""The CPU selective scan's time per (t, d, n) across sequence lengths, through JAX.

    JAX_PLATFORMS=cpu python benchmarks/cpu_selective_scan_lengths.py \
        [--lengths 1024,1040,2048,2064] [--batch 8] [--dim 768] [--n 16] [--threads 1] [--out PATH]

The directional forward and reverse calls, the fused bidirectional call and (`--vjp`) the jitted
forward + backward of the forward direction (all gradients; cotangent ones) of `selective_scan`
(float32, Mamba options: z, D, delta_bias with softplus, B and C (batch, N, L)) at
(batch, dim, L, n) for each L, timed in turn within each round (medians of `--repeats` rounds
after a warm-up; compile excluded). Lengths whose rows are a multiple of 128 bytes against their
neighbours show how the kernel copes with rows that alias in the caches
(docs/PERFORMANCE_CPU.md, sessions 25, 32, 33). `--threads` sets JAX_SELSCAN_CPU_THREADS (the
kernel's threads; read on every call). Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from cpu_selective_scan import HERE, fwd_bwd, kernel, make, run_meta, timeit_rounds
from jax_selscan.selective_scan import selective_scan

DIRS = ("forward", "reverse", "bidirectional")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,1040,2048,2064")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--vjp", action="store_true", help="also time the forward + backward")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_selective_scan_lengths"))
    args = ap.parse_args()
    os.environ["JAX_SELSCAN_CPU_THREADS"] = str(args.threads)
    rows = []
    for L in (int(v) for v in args.lengths.split(",")):
        shape = (args.batch, args.dim, L, args.n)
        fns = [kernel(d) for d in DIRS]
        names = DIRS + (("fwd_bwd",) if args.vjp else ())
        if args.vjp:
            fns.append(fwd_bwd(lambda **a: selective_scan(**a, delta_softplus=True)))
        meds, runs = timeit_rounds(fns, make(shape), args.repeats)
        elems = args.batch * args.dim * L * args.n
        r = dict(shape=dict(zip(("batch", "D", "L", "N"), shape)), repeats=args.repeats,
                 row_bytes=4 * L)
        for d, m, t in zip(names, meds, runs):
            r[f"{d}_ms"], r[f"{d}_ns_per_tdn"], r[f"{d}_runs"] = m, m * 1e6 / elems, t
        r["fused_vs_two_calls_per_round"] = statistics.median((f + v) / b for f, v, b in zip(*runs[:3]))
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_runs")}), flush=True)
    meta = run_meta(threads=args.threads)
    commit = meta["commit"]
    res = dict(meta=meta, rows=rows)
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    md = [f"# CPU selective_scan across lengths\n",
          f"- date: {meta['date']}\n- machine: {meta['machine']}\n- commit: {commit} (jax {meta['jax']})\n"
          f"- kernel threads: {args.threads}\n- command: `{meta['command']}`\n",
          "| batch, D, L, N | row bytes | fwd ms | rev ms | bidi (fused) ms | fwd ns/(t,d,n) | rev ns | "
          "bidi ns (both directions) | fused vs two calls (per round) | fwd+bwd ms | fwd+bwd ns |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["shape"]
        md.append(f"| {s['batch']}, {s['D']}, {s['L']}, {s['N']} | {r['row_bytes']} | {r['forward_ms']:.2f} | "
                  f"{r['reverse_ms']:.2f} | {r['bidirectional_ms']:.2f} | {r['forward_ns_per_tdn']:.3f} | "
                  f"{r['reverse_ns_per_tdn']:.3f} | {r['bidirectional_ns_per_tdn']:.3f} | "
                  f"{r['fused_vs_two_calls_per_round']:.2f}x | "
                  + (f"{r['fwd_bwd_ms']:.1f} | {r['fwd_bwd_ns_per_tdn']:.3f} |" if args.vjp else "- | - |"))
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
