"""Benchmark of the CUDA linear_scan kernels on one GPU, in one run:

  * device-to-device copy bandwidth (the ceiling; CuPy, timed with CUDA events),
  * every algorithm of jax_selscan.linear_scan (and "auto"),
  * jax.lax.associative_scan, jitted (what users write today),
  * CUB DeviceScan::InclusiveScan with the affine-pair operator, pack + scan + unpack
    (benchmarks/cub_affine_scan.cu, contiguous shapes only), when its binary is given.

GB/s count 12 bytes per fp32 element (read a, b; write h) and 6 per bf16 element.
Timing: a jitted chain of R dependent calls (the output feeds the next call's b), wall
clock with block_until_ready, median of 5, minus the measured dispatch time of a trivial
jitted call, divided by R. R makes a chain of ours last about --chain-ms (20 ms by default;
3 ms before session 13, when the 85-190 us of dispatch and synchronisation that varies from
run to run moved the results by several points). Writes JSON and Markdown (date, GPU,
commit, command).

    python benchmarks/gpu_linear_scan.py --out DIR [--cub PATH] [--quick] [--algos auto,lookback_regs]
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
from jax import lax

import jax_selscan
from jax_selscan import linear_scan

ALGOS = ("auto", "lookback_regs", "lookback_warp", "lookback_serial", "three_pass", "blelloch", "hillis_steele")
# (name, shape, axis)
SHAPES = [
    ("1 x 2^26", (1, 1 << 26), 1),
    ("4096 x 16384", (4096, 16384), 1),
    ("12288 x 2048", (12288, 2048), 1),
    ("(L=4096, C=24576) axis 0", (4096, 24576), 0),
    ("(L=65536, C=1024) axis 0", (65536, 1024), 0),
    ("1 x 2^20", (1, 1 << 20), 1),
    ("(L=1024, C=1024) axis 0", (1024, 1024), 0),
    ("65536 x 256", (65536, 256), 1),
]


def timeit(fn, args, reps, overhead):
    out = fn(*args)
    jax.block_until_ready(out)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return max(float(np.median(ts)) - overhead, 1e-9) / reps


def chain(step, reps):
    def f(a, b, h0):
        x = b
        for _ in range(reps):
            x = step(a, x, h0)
        return x
    return jax.jit(f)


def combine(e, l):
    return l[0] * e[0], l[0] * e[1] + l[1]


def lax_step(axis):
    def step(a, b, h0):
        dt = a.dtype
        a32, b32 = a.astype(jnp.float32), b.astype(jnp.float32)
        _, h = lax.associative_scan(combine, (a32, b32), axis=axis)
        return h.astype(dt)
    return step


def copy_gbps():
    try:
        import cupy as cp
    except Exception:
        return None
    n = 1 << 28  # 1 GiB of float32
    x = cp.ones(n, cp.float32)
    y = cp.empty_like(x)
    s, e = cp.cuda.Event(), cp.cuda.Event()
    y[...] = x
    ts = []
    for _ in range(20):
        s.record()
        cp.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, n * 4, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) / 1e3)
    t = float(np.median(ts))
    del x, y
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * n * 4 / t / 1e9


def run_cub(path, rows, L, dtype):
    try:
        r = subprocess.run([path, str(rows), str(L), dtype], capture_output=True, text=True, timeout=120)
        return json.loads(r.stdout.strip().splitlines()[-1])["seconds"]
    except Exception as e:  # pragma: no cover
        print("cub failed:", e, file=sys.stderr)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--cub", default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--algos", default=None, help="comma-separated subset of the algorithms (default: all)")
    ap.add_argument("--shapes", default=None, help="only the shapes whose name contains this")
    ap.add_argument("--chain-ms", type=float, default=20.0, help="target length of a chain of our calls")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = jax.devices()[0]
    commit = os.environ.get("JSS_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=getattr(dev, "device_kind", str(dev)), jax=jax.__version__, commit=commit or "unknown",
                command=" ".join([os.path.basename(sys.executable)] + sys.argv), host=platform.node())
    ceiling = copy_gbps()
    meta["copy_GBps"] = ceiling
    print(f"copy ceiling: {ceiling:.0f} GB/s" if ceiling else "copy ceiling: n/a", flush=True)
    tiny = jax.jit(lambda x: x + 1)
    z = jnp.zeros(8)
    overhead = timeit(tiny, (z,), 1, 0.0)
    meta["dispatch_overhead_us"] = overhead * 1e6
    meta["chain_ms"] = args.chain_ms
    rows = []
    shapes = SHAPES[:3] + SHAPES[5:6] if args.quick else SHAPES
    if args.shapes:
        shapes = [s for s in shapes if args.shapes in s[0]]
    key = jax.random.PRNGKey(0)
    for dname in args.dtypes.split(","):
        dtype = jnp.dtype(dname)
        bpe = 3 * dtype.itemsize
        for name, shape, axis in shapes:
            n = int(np.prod(shape))
            k1, k2 = jax.random.split(jax.random.fold_in(key, n))
            a = jax.random.uniform(k1, shape, jnp.float32, 0.0, 0.5).astype(dtype)
            b = jax.random.normal(k2, shape, jnp.float32).astype(dtype)
            h0 = jnp.zeros(shape[:axis] + shape[axis + 1:], dtype)
            est = n * bpe / 4e12
            reps = int(np.clip(np.ceil(args.chain_ms * 1e-3 / est), 3, 256))
            res = {}
            algos = ALGOS if not args.quick else ("auto", "lookback_regs", "three_pass")
            if args.algos:
                algos = tuple(args.algos.split(","))
            for algo in algos:
                step = lambda a, b, h0, algo=algo: linear_scan(a, b, axis=axis, h0=h0, algorithm=algo)
                try:
                    res[algo] = timeit(chain(step, reps), (a, b, h0), reps, overhead)
                except Exception as e:  # pragma: no cover
                    print(f"  {algo} failed: {e}", flush=True)
            lreps = int(np.clip(reps // 4, 1, 16))  # lax's chains: compile time grows with their length
            res["lax.associative_scan"] = timeit(chain(lax_step(axis), lreps), (a, b, h0), lreps, overhead)
            if args.cub and axis == len(shape) - 1:
                res["cub"] = run_cub(args.cub, n // shape[-1], shape[-1], dname)
            for impl, t in res.items():
                if t is None:
                    continue
                gbps = n * bpe / t / 1e9
                row = dict(dtype=dname, shape=name, dims=list(shape), axis=axis, elements=n, impl=impl,
                           seconds=t, GBps=gbps, frac_copy=(gbps / ceiling if ceiling else None))
                rows.append(row)
            best_default = res.get("auto")
            for impl, t in res.items():
                if t is None:
                    continue
                r = [x for x in rows if x["shape"] == name and x["dtype"] == dname and x["impl"] == impl][0]
                r["speedup_of_auto"] = (t / best_default) if best_default else None
            line = " ".join(f"{k}={n * bpe / v / 1e9:.0f}" for k, v in res.items() if v)
            print(f"{dname:9s} {name:28s} GB/s: {line}", flush=True)
            del a, b, h0
    out = dict(meta=meta, rows=rows)
    with open(os.path.join(args.out, "gpu_linear_scan.json"), "w") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(args.out, "gpu_linear_scan.md"), "w") as f:
        f.write(f"# linear_scan on {meta['gpu']}\n\n")
        f.write(f"date {meta['date']}, commit {meta['commit']}, jax {meta['jax']}, command `{meta['command']}`\n\n")
        f.write(f"copy ceiling {ceiling:.0f} GB/s (read + write); dispatch overhead subtracted "
                f"{meta['dispatch_overhead_us']:.1f} us per chain\n\n" if ceiling else "copy ceiling n/a\n\n")
        f.write("| dtype | shape | impl | time (us) | GB/s | of copy | auto is faster by |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            fc = f"{r['frac_copy']:.0%}" if r["frac_copy"] else "-"
            sp = f"{r['speedup_of_auto']:.2f}x" if r.get("speedup_of_auto") else "-"
            f.write(f"| {r['dtype']} | {r['shape']} | {r['impl']} | {r['seconds'] * 1e6:.1f} | {r['GBps']:.0f} | {fc} | {sp} |\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
