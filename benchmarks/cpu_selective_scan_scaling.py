"""Thread scaling of the CPU fused selective scan (forward), with the memory-bandwidth ceiling.

    python benchmarks/cpu_selective_scan_scaling.py [--quick] [--threads 1,2,4,8,16]
        [--cpus 0,8,1,9,...] [--copies] [--keep-mapped | --fresh-copies] [--out benchmarks/results/cpu_selective_scan_scaling]

For each thread count k (1, 2, 4, 8, 16 by default, capped at os.cpu_count()) a fresh
subprocess pins itself to k CPUs (sched_setaffinity, before jax is imported, so XLA's
intra-op pool has k threads) and sets JAX_SELSCAN_CPU_THREADS=k (the kernel's own cap,
read on every call). In it:
  * kernel: jitted selective_scan forward, float32, Mamba-style options (B, C
    (batch, N, L); D; z; delta_bias + softplus), median of `repeats` after a warm-up;
  * ceiling: an elementwise pass o = a * b over float32 arrays of the kernel's size,
    split over k numpy threads (numpy drops the GIL), preallocated output: the
    bandwidth B_k (bytes read + written / time) those k cores reach; the kernel's
    bound is then bytes_kernel / B_k, bytes_kernel = u, delta, z, B, C read + out written.
  * with --copies: the machine's own ceiling for k threads. k single-thread processes, one
    pinned to each of the k CPUs, each run the forward on its 1/k share of the channels
    (D / k) at the same time (a file barrier starts their timed calls together, and each keeps
    calling for the same --window of seconds, so all k stay busy throughout). No work is
    shared, so whatever slows them against one such process alone (the all-core clock, the
    shared L3 and memory, a neighbour on the host) bounds every k-thread partition of the
    same work. With t_i copy i's median call, a free and perfectly balanced split would take
    k / sum(1 / t_i) ("balanced"); ceiling speed-up = t(1 thread) / balanced.
  * page faults per timed call, kernel and copies: the kernel's output at the large shape
    (128 MiB) is a fresh mapping on every call under glibc's defaults, the copies' (<= 32 MiB)
    are reused, so the ceiling is a no-fault one; --keep-mapped runs every child with glibc
    never unmapping freed memory, which compares like with like (docs/PERFORMANCE_CPU.md,
    session 44); --fresh-copies compares like with like the other way: the copies' outputs are
    fresh mappings too, so their ceiling includes the zeroing that the default kernel pays.
Prints and writes (JSON + Markdown): time, speedup vs 1 thread, GB/s, fraction of the
bandwidth bound (1.0 = at the memory ceiling), with date, machine and commit.
Shapes: (2, 2048, 8192, 16) and (1, 1536, 2048, 16) (--quick: smaller, fewer repeats).
Budget: about 2-3 minutes on a 16-core host (most of it data generation and jax start-up).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = [(2, 2048, 8192, 16), (1, 1536, 2048, 16)]
QUICK_SHAPES = [(1, 512, 2048, 16), (1, 256, 1024, 16)]


def mamba_inputs(batch, dim, length, n, seed=0):
    """float32 selective-scan arguments with Mamba's options: B, C (batch, N, L); D; z; delta_bias."""
    import numpy as np
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)

    def f(*s, scale=1.0, shift=0.0):
        x = rng.standard_normal(s, dtype=np.float32)
        x *= scale
        x += shift
        return jnp.asarray(x)

    return dict(u=f(batch, dim, length), delta=f(batch, dim, length, scale=0.5, shift=-1.0),
                A=-jnp.exp(f(dim, n, scale=0.5)), B=f(batch, n, length), C=f(batch, n, length),
                D=f(dim), z=f(batch, dim, length), delta_bias=f(dim, scale=0.1, shift=0.1))


def child(k, shapes, repeats, share=1, barrier=None):
    """One thread count: returns a list of per-shape dicts (runs in its own process).
    share > 1: run D / share channels only; with a barrier (folder, this copy's index, copies,
    window seconds) wait there until all copies are ready, then call for the window's length."""
    import concurrent.futures as cf

    import numpy as np
    import jax

    from jax_selscan import _ffi
    from jax_selscan.selective_scan import selective_scan
    if not _ffi.HAS_CPU:
        raise SystemExit("the CPU extension is not built")

    def bandwidth(nbytes_target):
        n = max(1 << 20, nbytes_target // 12)  # o = a * b: 12 bytes per element
        a = np.full(n, 1.5, np.float32)
        b = np.full(n, 0.5, np.float32)
        o = np.empty_like(a)
        bounds = np.linspace(0, n, k + 1).astype(np.int64)

        def part(i):
            s, e = bounds[i], bounds[i + 1]
            np.multiply(a[s:e], b[s:e], out=o[s:e])

        with cf.ThreadPoolExecutor(k) as pool:
            list(pool.map(part, range(k)))  # warm-up (page faults)
            ts = []
            for _ in range(max(3, repeats)):
                t = time.perf_counter()
                list(pool.map(part, range(k)))
                ts.append(time.perf_counter() - t)
        return 12 * n / statistics.median(ts)

    def wait_for_all(tag):
        folder, index, copies, _ = barrier
        open(os.path.join(folder, f"{tag}.{index}"), "w").close()
        while sum(name.startswith(tag + ".") for name in os.listdir(folder)) < copies:
            time.sleep(0.001)

    rows = []
    for si, shape in enumerate(shapes):
        batch, dim, length, n = shape
        dim //= share
        x = mamba_inputs(batch, dim, length, n)
        fn = jax.jit(lambda x: selective_scan(**x, delta_softplus=True, direction="forward"))
        jax.block_until_ready(fn(x))
        ts = []
        flt0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        if barrier:
            # Every copy keeps calling until the same window has passed, so that none runs
            # its calls on a machine that the faster copies have already left.
            wait_for_all(f"shape{si}")
            end = time.perf_counter() + barrier[3]
            while time.perf_counter() < end or len(ts) < 3:
                t = time.perf_counter()
                jax.block_until_ready(fn(x))
                ts.append(time.perf_counter() - t)
        for _ in range(0 if barrier else repeats):
            t = time.perf_counter()
            jax.block_until_ready(fn(x))
            ts.append(time.perf_counter() - t)
        t_kernel = statistics.median(ts)
        # Page faults per timed call: > 0 where the output is a fresh mapping on every call (glibc
        # maps chunks over its limit, 32 MiB at most, afresh), which the copies' smaller outputs
        # are not; --keep-mapped makes both reuse their memory.
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - flt0) / len(ts)
        if share > 1:
            rows.append(dict(shape=dict(batch=batch, D=dim * share, L=length, N=n), share=share,
                             copies=barrier[2] if barrier else 1, share_ms=t_kernel * 1e3,
                             faults_per_call=faults,
                             share_runs_ms=[t * 1e3 for t in ts]))
            del x
            continue
        nbytes = 4 * (4 * batch * dim * length + 2 * batch * n * length)
        bw = bandwidth(4 * batch * dim * length * 3)
        rows.append(dict(shape=dict(batch=batch, D=dim, L=length, N=n), threads=k,
                         kernel_ms=t_kernel * 1e3, kernel_runs_ms=[t * 1e3 for t in ts],
                         faults_per_call=faults,
                         kernel_bytes=nbytes, kernel_GBps=nbytes / t_kernel / 1e9,
                         elementwise_GBps=bw / 1e9, bound_ms=nbytes / bw * 1e3,
                         fraction_of_bound=(nbytes / bw) / t_kernel))
        del x
    return rows


def allocator_env(keep_mapped, fresh_copies, is_copy):
    """glibc settings for a child: --keep-mapped for every child (freed memory never unmapped,
    so large outputs are reused); --fresh-copies for the copies only (every chunk over 128 KiB
    mapped afresh, so their outputs are new pages on every call, as the kernel's 128 MiB one is
    under the defaults; an explicit threshold also ends glibc's adaptive one)."""
    if keep_mapped:
        return dict(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(64 << 30))
    if fresh_copies and is_copy:
        return dict(MALLOC_MMAP_THRESHOLD_=str(128 << 10))
    return {}


def lscpu_model():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def add_ceilings(rows, ceilings):
    """Each --copies entry gets its balanced time, ceiling and the kernel's share of it."""
    for c in ceilings:
        r = [q for q in rows if q["shape"] == c["shape"] and q["threads"] == c["threads"]][0]
        one = [q for q in rows if q["shape"] == c["shape"] and q["threads"] == 1]
        # The copies' CPUs are not equally fast on a shared host, and a split that hands out work
        # dynamically (the kernel's) lets the fast ones do more: k shares finish together after
        # k / sum(1 / t_i), the time of a free, perfectly balanced k-thread split.
        c["balanced_ms"] = c["threads"] / sum(1.0 / t for t in c["share_together_all_ms"])
        c["ceiling_speedup"] = one[0]["kernel_ms"] / c["balanced_ms"] if one else float("nan")
        c["kernel_ms"], c["kernel_speedup"] = r["kernel_ms"], r["speedup_vs_1"]
        c["of_ceiling"] = c["balanced_ms"] / r["kernel_ms"]


def faults_cell(r):
    f = r.get("faults_per_call")
    return "—" if f is None else f"{f:.0f}"


def markdown(res):
    m = res["meta"]
    out = ["# CPU selective_scan thread scaling (forward, float32)\n",
           f"- date: {m['date']}\n- machine: {m['machine']}\n- commit: {m['commit']} (jax {m['jax']})\n"
           f"- command: `{m['command']}`\n- {m['note']}\n"
           f"- CPUs taken in the order {m.get('cpu_order', 'ascending')}\n",
           "| batch, D, L, N | threads | kernel ms | speed-up vs 1 | kernel GB/s | elementwise GB/s "
           "| bandwidth bound ms | of bound | page faults / call |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    def line(shape, *cells):
        return f"| {shape['batch']}, {shape['D']}, {shape['L']}, {shape['N']} | " + " | ".join(cells) + " |"

    for r in res["rows"]:
        out.append(line(r["shape"], f"{r['threads']}", f"{r['kernel_ms']:.1f}", f"{r['speedup_vs_1']:.2f}x",
                        f"{r['kernel_GBps']:.1f}", f"{r['elementwise_GBps']:.1f}", f"{r['bound_ms']:.1f}",
                        f"{r['fraction_of_bound']:.2f}", faults_cell(r)))
    out.append("\n`of bound` = (kernel bytes / elementwise bandwidth at that thread count) / kernel time: "
               "1.0 means the kernel moves its bytes as fast as a plain elementwise pass on those cores.")
    if res.get("ceilings"):
        out += ["\n## The machine's ceiling: k independent single-thread copies (--copies)\n",
                "Each copy runs the forward on D / k channels, one copy pinned to each of the k CPUs, "
                "all at once; `alone` is one such copy with the machine otherwise idle. contention = "
                "at once (median copy) / alone: how much the k busy cores slow each other with no work "
                "shared. balanced = k / Σ 1/t_i over the copies' times t_i: when the whole of D would be "
                "done if the k CPUs, at the speeds they showed, shared it perfectly and for free. "
                "ceiling = t(1 thread, all of D) / balanced. kernel / ceiling = balanced / t(k threads): "
                "independent of the 1-thread time, the noisiest figure on a shared host.\n",
                "| batch, D, L, N | k | 1/k alone ms | k at once ms (median / slowest) | contention | "
                "balanced ms | ceiling | kernel ms | kernel speed-up | kernel / ceiling | "
                "page faults / call (median copy) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in res["ceilings"]:
            out.append(line(c["shape"], f"{c['threads']}", f"{c['share_alone_ms']:.2f}",
                            f"{c['share_together_ms']:.2f} / {c['share_together_max_ms']:.2f}",
                            f"{c['contention']:.2f}x", f"{c['balanced_ms']:.2f}", f"{c['ceiling_speedup']:.2f}x",
                            f"{c['kernel_ms']:.2f}", f"{c['kernel_speedup']:.2f}x", f"{c['of_ceiling']:.2f}",
                            faults_cell(c)))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small shapes, 3 repeats")
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_selective_scan_scaling"))
    ap.add_argument("--cpus", default="",
                    help="the order in which CPUs are taken (k threads pin to the first k), e.g. "
                         "0,8,1,9,... to put two threads on different cores where 0-1 are SMT siblings; "
                         "default: the affinity mask, ascending")
    ap.add_argument("--copies", action="store_true",
                    help="also measure the machine's ceiling for each k > 1: k independent single-thread "
                         "processes on 1/k of the channels each, at once, against one such process alone")
    ap.add_argument("--window", type=float, default=1.5,
                    help="seconds for which every copy keeps calling (--copies); its median call is its time")
    alloc = ap.add_mutually_exclusive_group()  # the children's glibc settings (allocator_env)
    alloc.add_argument("--keep-mapped", action="store_true",
                       help="children run with glibc never unmapping freed memory (MALLOC_MMAP_MAX_=0, "
                            "a 64 GiB trim threshold): outputs over glibc's 32 MiB limit are then reused "
                            "instead of mapped and zeroed afresh on every call, as the copies' smaller ones are")
    alloc.add_argument("--fresh-copies", action="store_true",
                       help="the copies (--copies) run with glibc mapping every chunk over 128 KiB afresh "
                            "(MALLOC_MMAP_THRESHOLD_=131072), so their outputs are new, zero-filled pages on "
                            "every call, as the kernel's 128 MiB output is under glibc's defaults: a "
                            "ceiling for the default setting that includes Linux's zeroing")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--share", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--barrier", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    repeats = 3 if args.quick else 5
    if args.child:
        barrier = None
        if args.barrier:
            folder, index, copies, window = args.barrier.rsplit(":", 3)
            barrier = (folder, int(index), int(copies), float(window))
        print(json.dumps(child(args.child, shapes, repeats, args.share, barrier)))
        return
    ncpu = os.cpu_count() or 1
    counts = sorted({min(int(t), ncpu) for t in args.threads.split(",") if t.strip()})
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(ncpu))
    if args.cpus:
        cpus = [int(c) for c in args.cpus.split(",") if c.strip()]
        counts = [k for k in counts if k <= len(cpus)]

    def start(pin, threads, extra=()):
        """A child process pinned to the CPUs `pin` with `threads` kernel threads."""
        env = dict(os.environ, JAX_SELSCAN_CPU_THREADS=str(threads))
        env.update(allocator_env(args.keep_mapped, args.fresh_copies, "--share" in extra))
        # Pin before the interpreter imports jax: XLA sizes its intra-op pool by the affinity mask.
        pre = f"import os; os.sched_setaffinity(0, {pin!r}); " if hasattr(os, "sched_setaffinity") else ""
        # sys.path[0] as when running this file (not the cwd: from the repo root the
        # source tree's jax_selscan, without the built extension, would shadow the installed one).
        argv = [__file__, "--child", str(threads)] + (["--quick"] if args.quick else []) + list(extra)
        code = (pre + f"import sys, runpy; sys.path[0] = {HERE!r}; sys.argv = {argv!r}"
                + "; runpy.run_path(" + repr(__file__) + ", run_name='__main__')")
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def result(proc, what):
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"{what} failed:\n{err[-3000:]}")
        return json.loads(out.strip().splitlines()[-1])

    rows, ceilings = [], []
    t_start = time.time()
    for k in counts:
        got = result(start(cpus[:k], k), f"thread count {k}")
        for r in got:
            print(f"threads {k:2d}  {r['shape']}  kernel {r['kernel_ms']:.1f} ms  "
                  f"{r['kernel_GBps']:.1f} GB/s  elementwise {r['elementwise_GBps']:.1f} GB/s  "
                  f"of bound {r['fraction_of_bound']:.2f}", flush=True)
        rows += got
        if args.copies and k > 1 and any(shape[1] % k for shape in shapes):
            print(f"copies {k:2d}  skipped: {k} does not divide every shape's D", flush=True)
        elif args.copies and k > 1:
            alone = result(start(cpus[:1], 1, ["--share", str(k)]), f"share 1/{k} alone")
            with tempfile.TemporaryDirectory() as folder:
                procs = [start(cpus[i:i + 1], 1, ["--share", str(k), "--barrier", f"{folder}:{i}:{k}:{args.window}"])
                         for i in range(k)]
                together = [result(p, f"copy {i} of {k}") for i, p in enumerate(procs)]
            for si, a in enumerate(alone):
                times = [c[si]["share_ms"] for c in together]
                c = dict(shape=a["shape"], threads=k, share_alone_ms=a["share_ms"],
                         faults_per_call=statistics.median(q[si].get("faults_per_call", 0.0) for q in together),
                         share_together_ms=statistics.median(times), share_together_max_ms=max(times),
                         share_together_all_ms=times)
                c["contention"] = c["share_together_ms"] / c["share_alone_ms"]
                print(f"copies {k:2d}  {a['shape']}  1/{k} alone {c['share_alone_ms']:.2f} ms, {k} at once "
                      f"{c['share_together_ms']:.2f} ms (slowest {max(times):.2f})", flush=True)
                ceilings.append(c)
    for r in rows:
        one = [q for q in rows if q["shape"] == r["shape"] and q["threads"] == counts[0]][0]
        r["speedup_vs_1"] = one["kernel_ms"] / r["kernel_ms"] * (1 if counts[0] == 1 else float("nan"))
    commit = os.environ.get("JSS_COMMIT") or subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    import jax
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                machine=f"{lscpu_model()}, {ncpu} logical CPUs ({platform.machine()})",
                commit=commit + (" (+ local changes)" if dirty else ""), jax=jax.__version__,
                command=" ".join(["python"] + sys.argv), thread_counts=counts, cpu_order=cpus,
                wall_s=round(time.time() - t_start, 1),
                note=f"medians of {repeats} runs after a warm-up (compile excluded); one process "
                     "per thread count, pinned to that many CPUs, JAX_SELSCAN_CPU_THREADS set"
                     + ("; --keep-mapped: MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=64 GiB in every child"
                        if args.keep_mapped else "")
                     + ("; --fresh-copies: MALLOC_MMAP_THRESHOLD_=128 KiB in the copies only"
                        if args.fresh_copies else ""))
    add_ceilings(rows, ceilings)
    res = dict(meta=meta, rows=rows, ceilings=ceilings)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(res, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
