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
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="2x2048x8192x16", help="BATCHxDxLxN")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--calls", type=int, default=5, help="calls per Python thread per round")
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
    fn = jax.jit(lambda x: selective_scan(**x, delta_softplus=True, direction="forward"))
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
    for rnd in range(3):
        os.environ["JAX_SELSCAN_CPU_THREADS"] = str(k)
        print(f"round {rnd}: kernel, {k} threads: {median_ms(lambda: fn(x)):.2f} ms", flush=True)
        os.environ["JAX_SELSCAN_CPU_THREADS"] = "1"
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
