"""python -m jax_selscan.bench: time linear_scan against jax.lax.associative_scan here.

Measures, in one run on the default backend: an elementwise pass over the same
arrays (the memory ceiling, 12 bytes/element like the scan), jax_selscan's
linear_scan, and lax.associative_scan with the same combine; medians over repeats.
Prints a table and writes JSON (--out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

from . import affine_combine, linear_scan
from . import _ffi

# (name, shape, axis): rows = scanned axis contiguous; strided = channels contiguous.
QUICK = [("rows 64x1024", (64, 1024), 1), ("strided 1024x64", (1024, 64), 0)]
FULL = [
    ("rows 4096x4096", (4096, 4096), 1),
    ("strided L4096xC4096", (4096, 4096), 0),
    ("rows 12288x2048", (12288, 2048), 1),
    ("1 row x 2^22", (1, 2**22), 1),
    ("strided L65536xC256", (65536, 256), 0),
]


def median_time(fn, *args, repeats):
    jax.block_until_ready(fn(*args))  # compile + warm up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_linear_scan(cases, repeats, dtype=jnp.float32, progress=True):
    rows = []
    for i, (name, shape, axis) in enumerate(cases):
        if progress:
            print(f"[{i + 1}/{len(cases)}] {name} ...", file=sys.stderr, flush=True)
        key_a, key_b = jax.random.split(jax.random.PRNGKey(i))
        a = jax.random.uniform(key_a, shape, dtype, 0.5, 1.0)
        b = jax.random.normal(key_b, shape, dtype)
        nbytes = 3 * a.size * a.dtype.itemsize  # read a and b, write h
        fns = {
            "elementwise": jax.jit(lambda a, b: a * b),
            "jax_selscan": jax.jit(lambda a, b: linear_scan(a, b, axis=axis)),
            "lax.associative_scan": jax.jit(
                lambda a, b: jax.lax.associative_scan(affine_combine, (a, b), axis=axis)[1]),
        }
        t = {k: median_time(f, a, b, repeats=repeats) for k, f in fns.items()}
        rows.append({
            "case": name, "shape": list(shape), "axis": axis, "dtype": jnp.dtype(dtype).name,
            "ms": {k: v * 1e3 for k, v in t.items()},
            "GBps": {k: nbytes / v / 1e9 for k, v in t.items()},
            "fraction_of_elementwise": t["elementwise"] / t["jax_selscan"],
            "speedup_vs_associative_scan": t["lax.associative_scan"] / t["jax_selscan"],
        })
    return rows


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats (seconds)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--out", default="jax_selscan_bench.json", help="JSON results file")
    args = parser.parse_args(argv)
    cases = QUICK if args.quick else FULL
    repeats = args.repeats or (3 if args.quick else 10)
    rows = bench_linear_scan(cases, repeats)
    print(f"backend={jax.default_backend()} kernels: cpu={_ffi.HAS_CPU} cuda={_ffi.HAS_CUDA}")
    print(f"{'case':24s} {'ours ms':>9s} {'GB/s':>8s} {'%elementwise':>13s} {'assoc ms':>9s} {'speed-up':>9s}")
    for r in rows:
        print(f"{r['case']:24s} {r['ms']['jax_selscan']:9.3f} {r['GBps']['jax_selscan']:8.1f} "
              f"{100 * r['fraction_of_elementwise']:12.0f}% {r['ms']['lax.associative_scan']:9.3f} "
              f"{r['speedup_vs_associative_scan']:8.1f}x")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "devices": [str(d) for d in jax.devices()]},
        "jax": jax.__version__, "commit": _commit(), "command": " ".join(sys.argv),
        "linear_scan": rows,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
