"""CPU benchmark of jax_selscan.linear_scan against lax.associative_scan.

For each shape (float32) it times, jitted, after warm-up, median of repeats
with block_until_ready:
  * jax_selscan.linear_scan(a, b, axis=...)                  (the FFI kernel)
  * jax.lax.associative_scan(affine_combine, (a, b), axis=...) (what users write)
  * a * b                                                     (memory-bandwidth reference)
and reports ms, GB/s at 12 bytes/element (read a and b, write h), the
fraction of the elementwise pass's bandwidth, and the speed-up.

    python benchmarks/cpu_linear_scan.py                    # default shapes
    python benchmarks/cpu_linear_scan.py --quick            # smaller, for a smoke test
    JAX_SELSCAN_CPU_ISA=avx2 python benchmarks/cpu_linear_scan.py --no-write

Writes benchmarks/results/cpu_linear_scan.{json,md} unless --no-write.
Run it from outside the source tree or with the package installed (it imports
the installed jax_selscan, which must have its compiled CPU kernels).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

import jax_selscan

HERE = os.path.dirname(os.path.abspath(__file__))
BYTES_PER_ELEMENT = 12  # float32: read a, read b, write h

# (name, shape, axis): the two layouts of the task brief.
SHAPES = [
    ("strided (L=4096, C=4096), axis=0", (4096, 4096), 0),
    ("rows (4096 rows, L=4096), axis=-1", (4096, 4096), -1),
]
EXTRA_SHAPES = [
    ("one long sequence (L=2^24)", (1 << 24,), 0),
    ("few channels (L=2^20, C=16), axis=0", (1 << 20, 16), 0),
    ("Mamba-like (B=8, D=1024, L=2048), axis=-1", (8, 1024, 2048), -1),
]
QUICK_SHAPES = [
    ("strided (L=1024, C=1024), axis=0", (1024, 1024), 0),
    ("rows (1024 rows, L=1024), axis=-1", (1024, 1024), -1),
]


def timeit(fn, args, repeats, warmup):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") or line.startswith("Model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit():
    try:
        root = os.path.dirname(HERE)
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "cpu_arm", "benchmarks"],
                               capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--assoc-repeats", type=int, default=5,
                    help="repeats for lax.associative_scan (slow)")
    ap.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    ap.add_argument("--extra", action="store_true", help="also time a few more shapes")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_linear_scan"),
                    help="output path without extension")
    ap.add_argument("--git-commit", default=None,
                    help="record this commit (e.g. when the package was built from an export)")
    args = ap.parse_args()

    if not jax_selscan.has_cpu_kernels:
        sys.exit("jax_selscan was installed without its CPU kernels (jax_selscan._cpu)")
    from jax_selscan import _cpu

    shapes = QUICK_SHAPES if args.quick else SHAPES + (EXTRA_SHAPES if args.extra else [])
    rng = np.random.default_rng(0)
    rows = []
    for name, shape, axis in shapes:
        a = jnp.asarray(rng.uniform(-0.99, 0.99, shape).astype(np.float32))
        b = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
        n = a.size
        scan = jax.jit(lambda a, b, axis=axis: jax_selscan.linear_scan(a, b, axis=axis))
        assoc = jax.jit(lambda a, b, axis=axis: jax.lax.associative_scan(
            jax_selscan.affine_combine, (a, b), axis=axis % a.ndim)[1])
        elem = jax.jit(lambda a, b: a * b)
        # Same result (a check that we time the right thing).
        err = float(jnp.max(jnp.abs(scan(a, b) - assoc(a, b))) / (jnp.max(jnp.abs(assoc(a, b))) + 1e-30))
        t_scan, t_scan_min = timeit(scan, (a, b), args.repeats, args.warmup)
        t_assoc, t_assoc_min = timeit(assoc, (a, b), args.assoc_repeats, 1)
        t_elem, t_elem_min = timeit(elem, (a, b), args.repeats, args.warmup)
        gbs = lambda t: BYTES_PER_ELEMENT * n / t / 1e9
        row = dict(name=name, shape=list(shape), axis=axis, dtype="float32", elements=n,
                   linear_scan_ms=t_scan * 1e3, linear_scan_min_ms=t_scan_min * 1e3,
                   associative_scan_ms=t_assoc * 1e3, associative_scan_min_ms=t_assoc_min * 1e3,
                   elementwise_ms=t_elem * 1e3, elementwise_min_ms=t_elem_min * 1e3,
                   linear_scan_GBps=gbs(t_scan), associative_scan_GBps=gbs(t_assoc),
                   elementwise_GBps=gbs(t_elem), fraction_of_elementwise=t_elem / t_scan,
                   speedup_vs_associative_scan=t_assoc / t_scan, max_rel_diff=err)
        rows.append(row)
        print(f"{name}: scan {t_scan*1e3:.2f} ms, assoc {t_assoc*1e3:.1f} ms, elementwise {t_elem*1e3:.2f} ms",
              flush=True)

    meta = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        machine=dict(cpu=cpu_model(), cores=len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(), arch=platform.machine(),
                     system=platform.platform()),
        jax_version=jax.__version__, jaxlib_version=jax.lib.__version__ if hasattr(jax, "lib") else "",
        python=platform.python_version(), cpu_isa=_cpu.isa(), supported_isas=list(_cpu.supported_isas()),
        git_commit=args.git_commit or git_commit(), command=" ".join([os.path.basename(sys.executable)] + sys.argv),
        repeats=args.repeats, warmup=args.warmup, assoc_repeats=args.assoc_repeats,
        bytes_per_element=BYTES_PER_ELEMENT,
    )

    head = ("| shape | linear_scan ms | GB/s | of elementwise | associative_scan ms | GB/s "
            "| elementwise a*b ms | GB/s | speed-up vs assoc |")
    sep = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    lines = [head, sep]
    for r in rows:
        lines.append(f"| {r['name']} | {r['linear_scan_ms']:.2f} | {r['linear_scan_GBps']:.2f} "
                     f"| {r['fraction_of_elementwise']:.2f} | {r['associative_scan_ms']:.1f} "
                     f"| {r['associative_scan_GBps']:.2f} | {r['elementwise_ms']:.2f} "
                     f"| {r['elementwise_GBps']:.2f} | {r['speedup_vs_associative_scan']:.1f}x |")
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\n{meta['machine']['cpu']}, {meta['machine']['cores']} cores, jax {meta['jax_version']}, "
          f"ISA {meta['cpu_isa']}, commit {meta['git_commit']}")

    if not args.no_write:
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out + ".json", "w") as f:
            json.dump(dict(meta=meta, results=rows), f, indent=2)
        with open(args.out + ".md", "w") as f:
            f.write("# CPU linear_scan benchmark\n\n")
            f.write(f"- date: {meta['date']}\n- machine: {meta['machine']['cpu']}, "
                    f"{meta['machine']['cores']} cores ({meta['machine']['system']})\n")
            f.write(f"- jax {meta['jax_version']}, Python {meta['python']}, kernel ISA "
                    f"{meta['cpu_isa']} (supported: {', '.join(meta['supported_isas'])})\n")
            f.write(f"- git commit: {meta['git_commit']}\n- command: `{meta['command']}`\n")
            f.write(f"- float32, median of {args.repeats} runs after {args.warmup} warm-up "
                    f"({args.assoc_repeats} for associative_scan); GB/s at "
                    f"{BYTES_PER_ELEMENT} bytes/element\n\n")
            f.write(table + "\n")
        print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
