"""Is a multi-thread loss in the process or in the kernel? (CPU selective-scan forward)

    python benchmarks/cpu_selective_scan_threads_probe.py [--shape 2x2048x8192x16] [--threads 16]

In one process (JAX_PLATFORMS=cpu), alternating three times:
  * the kernel with k threads on the whole shape (JAX_SELSCAN_CPU_THREADS=k);
  * k Python threads, each calling the 1-thread kernel on its own D / k channels (copied
    beforehand), released together by a barrier.
Both run in the same address space, allocator and XLA thread pool. So if the second matches
`cpu_selective_scan_scaling.py --copies` (separate processes) and the first is slower, the
loss is inside the kernel's split. If both are slow, it comes from sharing one process
(output page faults, the pool). Prints medians in ms; nothing is written.

Each round also accounts for the k-thread kernel's calls (Linux): per call, the CPU time and the
run-queue wait of every thread that ran (/proc/self/task/*/schedstat), the process's minor page
faults and context switches. Busy CPUs x wall against the threads' CPU time tells idle workers
from slow ones; run-queue wait tells threads that were ready but had no CPU. --pin first pins
the k threads that ran a warm-up call each to its own CPU of the affinity mask.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time


def thread_times():
    """{tid: (ns on a CPU, ns ready on a run queue)} of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait = (int(v) for v in f.read().split()[:2])
        except (OSError, ValueError):
            continue
        out[int(tid)] = (run, wait)
    return out


def account(call, calls):
    """Runs call() `calls` times; per call: wall ms, the ms of CPU and of run-queue wait of each
    thread that ran > 2% of the wall time, minor page faults, voluntary / involuntary switches."""
    import jax
    t0, r0 = thread_times(), resource.getrusage(resource.RUSAGE_SELF)
    w = time.perf_counter()
    for _ in range(calls):
        jax.block_until_ready(call())
    wall = (time.perf_counter() - w) * 1e3 / calls
    t1, r1 = thread_times(), resource.getrusage(resource.RUSAGE_SELF)
    ran = sorted(((t1[t][0] - t0.get(t, (0, 0))[0]) / 1e6 / calls, (t1[t][1] - t0.get(t, (0, 0))[1]) / 1e6 / calls, t)
                 for t in t1)
    busy = [r for r in ran if r[0] > 0.02 * wall]
    return dict(wall=wall, busy=busy, minflt=(r1.ru_minflt - r0.ru_minflt) / calls,
                nvcsw=(r1.ru_nvcsw - r0.ru_nvcsw) / calls, nivcsw=(r1.ru_nivcsw - r0.ru_nivcsw) / calls)


def describe(a):
    busy = a["busy"]
    if not busy:
        return f"wall {a['wall']:.2f} ms (no per-thread times: /proc/self/task/*/schedstat unreadable)"
    cpu = sorted(b[0] for b in busy)
    return (f"wall {a['wall']:.2f} ms; {len(busy)} threads ran: CPU ms sum {sum(cpu):.1f} "
            f"(= {sum(cpu) / a['wall']:.2f} CPUs busy), per thread min {cpu[0]:.2f} median "
            f"{statistics.median(cpu):.2f} max {cpu[-1]:.2f}; run-queue wait sum "
            f"{sum(b[1] for b in busy):.2f} ms, max {max(b[1] for b in busy):.2f}; minor faults "
            f"{a['minflt']:.0f}, switches {a['nvcsw']:.0f} voluntary {a['nivcsw']:.0f} involuntary")


def thp():
    """The host's transparent-huge-page settings (the handlers' advice needs madvise or always)."""
    out = []
    for f in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{f}") as h:
                out.append(f"{f} {h.read().strip()}")
        except OSError:
            out.append(f"{f} unknown")
    return ", ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="2x2048x8192x16", help="BATCHxDxLxN")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--calls", type=int, default=5, help="calls per Python thread per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pin", action="store_true", help="pin the kernel's k worker threads, one per CPU")
    ap.add_argument("--grad", action="store_true", help="time forward + backward instead")
    ap.add_argument("--also-env", default="", metavar="NAME=VALUE",
                    help="each round also accounts the k-thread kernel with this variable set (read per call)")
    args = ap.parse_args()
    import jax
    import jax.numpy as jnp
    from jax_selscan import selective_scan
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under python -P
    from cpu_selective_scan_scaling import mamba_inputs

    b, d, l, n = (int(v) for v in args.shape.split("x"))
    k = args.threads
    if d % k:
        raise SystemExit(f"--threads {k} must divide D = {d}")
    x = mamba_inputs(b, d, l, n)
    fwd = lambda x: selective_scan(**x, delta_softplus=True, direction="forward")  # noqa: E731
    # --grad: forward + backward (the gradients of every input: the backward's outputs too)
    fn = jax.jit(jax.grad(lambda x: jnp.sum(fwd(x) ** 2)) if args.grad else fwd)
    per_channel = {"A", "D", "delta_bias"}  # leading axis D; u, delta, z: (b, D, L); B, C shared
    s = d // k
    shares = [{key: jnp.array(v[i * s:(i + 1) * s] if key in per_channel else
                              v[:, i * s:(i + 1) * s] if key in ("u", "delta", "z") else v, copy=True)
               for key, v in x.items()} for i in range(k)]

    def median_ms(g, reps=7):
        jax.block_until_ready(g())
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            jax.block_until_ready(g())
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    # The kernel reads its thread cap on every call.
    os.environ["JAX_SELSCAN_CPU_THREADS"] = "1"
    for sh in shares:
        jax.block_until_ready(fn(sh))
    print(f"one share (D = {s}) alone, 1 thread: {median_ms(lambda: fn(shares[0])):.2f} ms", flush=True)
    print(f"THP: {thp()}; malloc env: " + " ".join(f"{v}={os.environ[v]}" for v in sorted(os.environ)
                                                  if v.startswith("MALLOC_")), flush=True)
    if args.pin:
        os.environ["JAX_SELSCAN_CPU_THREADS"] = str(k)
        workers = [b[2] for b in account(lambda: fn(x), 1)["busy"]][-k:]
        cpus = sorted(os.sched_getaffinity(0))
        for tid, cpu in zip(workers, cpus):
            os.sched_setaffinity(tid, {cpu})
        print(f"pinned threads {workers} to CPUs {cpus[:len(workers)]}", flush=True)
    for rnd in range(args.rounds):
        os.environ["JAX_SELSCAN_CPU_THREADS"] = str(k)
        print(f"round {rnd}: kernel, {k} threads: {median_ms(lambda: fn(x)):.2f} ms", flush=True)
        print(f"round {rnd}: kernel, {k} threads, accounted over 10 calls: "
              + describe(account(lambda: fn(x), 10)), flush=True)
        if args.also_env:
            name, value = args.also_env.split("=", 1)
            old = os.environ.get(name)
            os.environ[name] = value
            jax.block_until_ready(fn(x))
            print(f"round {rnd}: kernel, {k} threads, {name}={value}, accounted over 10 calls: "
                  + describe(account(lambda: fn(x), 10)), flush=True)
            if old is None:
                del os.environ[name]
            else:
                os.environ[name] = old
        os.environ["JAX_SELSCAN_CPU_THREADS"] = "1"
        print(f"round {rnd}: kernel, 1 thread, accounted over 2 calls: "
              + describe(account(lambda: fn(x), 2)), flush=True)
        barrier, res = threading.Barrier(k + 1), [0.0] * k

        def work(i):
            barrier.wait()
            ts = []
            for _ in range(args.calls):
                t = time.perf_counter()
                jax.block_until_ready(fn(shares[i]))
                ts.append(time.perf_counter() - t)
            res[i] = statistics.median(ts) * 1e3

        threads = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        barrier.wait()
        for t in threads:
            t.join()
        wall = (time.perf_counter() - t0) * 1e3 / args.calls
        balanced = k / sum(1.0 / r for r in res)
        print(f"round {rnd}: {k} Python threads x 1-thread share: wall / call {wall:.2f} ms, "
              f"balanced {balanced:.2f}, median {statistics.median(res):.2f}, slowest {max(res):.2f}", flush=True)


if __name__ == "__main__":
    main()
