"""CPU selective_scan benchmark: the fused kernel vs plain-JAX formulations.

    python benchmarks/cpu_selective_scan.py [--quick] [--out benchmarks/results/cpu_selective_scan]

Shapes (batch, D, L, N), float32, Mamba-style options (B, C (batch, N, L); D; z;
delta_bias with softplus). Times are medians of `repeats` runs after one warm-up
(compile excluded); the three kernel directions run in turn in each round, and the fused
call's speed-up is also given as the median of the per-round ratios. Rows:
  kernel forward / reverse / bidirectional    selective_scan (the CPU FFI kernel)
  kernel forward + reverse (two calls)        two separate jitted calls, medians summed
  lax.scan forward                            the best plain-JAX formulation we know:
                                              lax.scan over L carrying the (batch, D, N)
                                              state, nothing of size L*N materialised
  selective_scan_ref forward                  the materialised reference (associative scan)
  kernel fwd + bwd                            jax.vjp of selective_scan w.r.t. all eight inputs
                                              (ones as the cotangent): the fused forward and
                                              the fused CPU backward kernel
  lax.scan fwd + bwd                          the same through the lax.scan formulation
The lax.scan and reference rows run only where they finish in reasonable time.
Also runs the SISO C++ benchmark (cpu_arm/tests/bench_selective_siso.cc) when
a compiler is available. Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax

from jax_selscan import _ffi
from jax_selscan.reference import selective_scan_ref
from jax_selscan.selective_scan import selective_scan

SHAPES = [(1, 1536, 2048, 16), (8, 768, 1024, 16), (2, 2048, 8192, 16)]
QUICK_SHAPES = [(1, 256, 512, 16)]
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def make(shape, seed=0):
    batch, dim, length, n = shape
    rng = np.random.default_rng(seed)
    f = lambda *s, scale=1.0, shift=0.0: jnp.asarray(rng.standard_normal(s) * scale + shift,
                                                     jnp.float32)
    return dict(u=f(batch, dim, length), delta=f(batch, dim, length, scale=0.5, shift=-1.0),
                A=-jnp.exp(f(dim, n, scale=0.5)), B=f(batch, n, length), C=f(batch, n, length),
                D=f(dim), z=f(batch, dim, length), delta_bias=f(dim, scale=0.1, shift=0.1))


def lax_scan_forward(u, delta, A, B, C, D, z, delta_bias):
    """Plain JAX, no (L, N) materialisation: scan over L with the (batch, D, N) state."""
    delta = jax.nn.softplus(delta + delta_bias[:, None])
    xs = (jnp.moveaxis(u, 2, 0), jnp.moveaxis(delta, 2, 0), jnp.moveaxis(B, 2, 0),
          jnp.moveaxis(C, 2, 0))

    def step(h, x):
        ut, dt, bt, ct = x                        # (b, D), (b, D), (b, N), (b, N)
        h = jnp.exp(dt[..., None] * A) * h + (dt * ut)[..., None] * bt[:, None, :]
        return h, jnp.einsum("bdn,bn->bd", h, ct)

    h0 = jnp.zeros(u.shape[:2] + (A.shape[1],), u.dtype)
    _, ys = lax.scan(step, h0, xs)
    y = jnp.moveaxis(ys, 0, 2) + D[:, None] * u
    return y * jax.nn.silu(z)


def timeit_rounds(fns, x, repeats):
    """Each fn once per round, in turn, `repeats` rounds after a warm-up of each: a slow spell
    of a shared machine falls on all of them alike. Returns (medians ms, per-round seconds)."""
    for f in fns:
        jax.block_until_ready(f(x))                # compile + warm-up
    ts = [[] for _ in fns]
    for _ in range(repeats):
        for f, t_list in zip(fns, ts):
            t = time.perf_counter()
            jax.block_until_ready(f(x))
            t_list.append(time.perf_counter() - t)
    return [statistics.median(t) * 1e3 for t in ts], ts


def timeit(fn, x, repeats):
    (ms,), (ts,) = timeit_rounds([fn], x, repeats)
    return ms, ts


def fwd_bwd(f):
    """jit of x -> gradients of f(**x) w.r.t. every array in x (cotangent: ones)."""
    def g(x):
        out, vjp = jax.vjp(lambda x: f(**x), x)
        return vjp(jnp.ones_like(out))
    return jax.jit(g)


def kernel(direction):
    return jax.jit(lambda x: selective_scan(**x, delta_softplus=True, direction=direction))


def siso(out_dir):
    """Build and run the SISO C++ benchmark; returns its JSON line or None."""
    src = os.path.join(ROOT, "cpu_arm")
    exe = os.path.join(out_dir, "bench_selective_siso")
    objs = []
    try:
        for name, flags in [("generic", ["-DJSS_SIMD_GENERIC"]),
                            ("avx2", ["-mavx2", "-mfma", "-mf16c"]),
                            ("avx512", ["-mavx512f", "-mavx2", "-mfma", "-mf16c"])]:
            if platform.machine() not in ("x86_64", "AMD64") and name != "generic":
                continue
            for f in ("kernels_isa.cc", "selective_scan_isa.cc"):
                o = os.path.join(out_dir, f"{name}_{f}.o")
                subprocess.run(["g++", "-std=c++17", "-O2", "-Wno-uninitialized", "-I", src,
                                f"-DJSS_ISA_NAME={name}", *flags, "-c",
                                os.path.join(src, f), "-o", o], check=True)
                objs.append(o)
        subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", "-I", src,
                        os.path.join(src, "tests", "bench_selective_siso.cc"),
                        *[os.path.join(src, f) for f in ("driver.cc", "dispatch.cc",
                                                         "selective_scan_cpu.cc")],
                        *objs, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print("SISO benchmark skipped:", e, file=sys.stderr)
        return None
    print(out.strip())
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_selective_scan"))
    ap.add_argument("--shapes", default=None,
                    help='a subset, e.g. "1,1536,2048,16;8,768,1024,16" (batch, D, L, N)')
    args = ap.parse_args()
    if not _ffi.HAS_CPU:
        sys.exit("the CPU extension is not built")
    from jax_selscan import _cpu
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = [tuple(int(v) for v in sh.split(",")) for sh in args.shapes.split(";")]
    rows = []
    for shape in shapes:
        x = make(shape)
        big = shape[0] * shape[1] * shape[2] > 8 * 10**6
        reps = 9 if big else 31
        r = dict(shape=dict(zip(("batch", "D", "L", "N"), shape)), repeats=reps)
        dirs = ("forward", "reverse", "bidirectional")
        meds, runs = timeit_rounds([kernel(d) for d in dirs], x, reps)
        for d, m, t in zip(dirs, meds, runs):
            r[f"kernel_{d}_ms"], r[f"kernel_{d}_runs"] = m, t
        r["kernel_two_calls_ms"] = r["kernel_forward_ms"] + r["kernel_reverse_ms"]
        r["fused_speedup_vs_two_calls"] = r["kernel_two_calls_ms"] / r["kernel_bidirectional_ms"]
        # The same ratio per round (forward, reverse and fused timed back to back), median.
        r["fused_speedup_per_round"] = statistics.median(
            (f + v) / b for f, v, b in zip(*runs))
        # Plain JAX: the lax.scan formulation everywhere (1 repeat at the largest shape);
        # the materialised reference only where its (batch, D, L, N) tensors stay small.
        r["lax_scan_forward_ms"], _ = timeit(jax.jit(lambda x: lax_scan_forward(**x)), x,
                                             1 if big else 3)
        r["speedup_vs_lax_scan"] = r["lax_scan_forward_ms"] / r["kernel_forward_ms"]
        r["kernel_fwd_bwd_ms"], r["kernel_fwd_bwd_runs"] = timeit(
            fwd_bwd(lambda **a: selective_scan(**a, delta_softplus=True)), x, reps)
        r["lax_scan_fwd_bwd_ms"], _ = timeit(fwd_bwd(lax_scan_forward), x, 1 if big else 3)
        r["fwd_bwd_speedup_vs_lax_scan"] = r["lax_scan_fwd_bwd_ms"] / r["kernel_fwd_bwd_ms"]
        if shape[0] * shape[1] * shape[2] * shape[3] <= 2**26:
            ref = jax.jit(lambda x: selective_scan_ref(**x, delta_softplus=True))
            r["ref_forward_ms"], _ = timeit(ref, x, 2)
            r["speedup_vs_ref"] = r["ref_forward_ms"] / r["kernel_forward_ms"]
        else:
            r["ref_forward_ms"] = None
            r["ref_skipped"] = "materialises 4 x batch*D*L*N float32 (> 1 GiB): not run"
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("_runs")}), flush=True)
    meta = run_meta(threads=f"XLA intra-op pool ({os.cpu_count()} cores)",
                    note="shared machine: medians, noisy; compile excluded")
    meta["machine"] += f"; kernel ISA {_cpu.isa()}"
    s = siso(tempfile.mkdtemp(prefix="jss_siso_")) if not args.quick else None
    result = dict(meta=meta, rows=rows, siso=s)
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))


def run_meta(**extra):
    """Date, machine, commit (JSS_COMMIT or git HEAD), jax version and command of this run."""
    commit = os.environ.get("JSS_COMMIT") or subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{platform.machine()} {os.cpu_count()} cores, {_cpu_model()}",
                commit=commit, jax=jax.__version__, command=" ".join(["python"] + sys.argv), **extra)


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def markdown(res):
    m = res["meta"]
    out = [f"# CPU selective_scan benchmark\n",
           f"- date: {m['date']}\n- machine: {m['machine']}\n- commit: {m['commit']} (jax {m['jax']})\n"
           f"- command: `{m['command']}`\n- {m['note']}; float32; B, C (batch, N, L); D, z, "
           f"delta_bias, softplus\n",
           "| batch, D, L, N | fwd ms | rev ms | bidi (fused) ms | fwd + rev (2 calls) ms | fused speed-up "
           "| per round "
           "| lax.scan fwd ms | kernel vs lax.scan | ref fwd ms | kernel vs ref "
           "| kernel fwd+bwd ms | lax.scan fwd+bwd ms | fwd+bwd vs lax.scan |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        s = r["shape"]
        ref = "not run" if r["ref_forward_ms"] is None else f"{r['ref_forward_ms']:.0f}"
        sp = "-" if r["ref_forward_ms"] is None else f"{r['speedup_vs_ref']:.0f}x"
        out.append(f"| {s['batch']}, {s['D']}, {s['L']}, {s['N']} | {r['kernel_forward_ms']:.1f} | "
                   f"{r['kernel_reverse_ms']:.1f} | {r['kernel_bidirectional_ms']:.1f} | "
                   f"{r['kernel_two_calls_ms']:.1f} | {r['fused_speedup_vs_two_calls']:.2f}x | "
                   f"{r['fused_speedup_per_round']:.2f}x | "
                   f"{r['lax_scan_forward_ms']:.0f} | {r['speedup_vs_lax_scan']:.1f}x | {ref} | {sp} | "
                   f"{r['kernel_fwd_bwd_ms']:.1f} | {r['lax_scan_fwd_bwd_ms']:.0f} | "
                   f"{r['fwd_bwd_speedup_vs_lax_scan']:.1f}x |")
    if res.get("siso"):
        s = res["siso"]
        out.append(f"\nSISO (batch 1, D 1, N 1, L = {s['length']}), one core: scalar C++ loop "
                   f"{s['scalar_ms']:.2f} ms, kernel ({s['isa']}) {s['kernel_ms']:.2f} ms: "
                   f"{s['speedup']:.1f}x.\n")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
