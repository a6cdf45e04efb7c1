"""Launch-bound linear_scan shapes (2^20 elements), on the GPU machine: where a call's time goes.

    python3 -P cuda/tools/ls_small.py chain   # per-call time in a jitted chain, beside
                                              # lax.associative_scan and the floor: a chain
                                              # of one fused elementwise kernel
    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        python3 -P cuda/tools/ls_small.py ncu | python3 cuda/tools/ncu_kernel_times.py
                                              # each kernel's own time (3 calls per case)

LS_SMALL_ALGOS="auto,lookback_regs,lax" picks the algorithms ("lax": lax.associative_scan, chains
of 32); LS_SMALL_SHAPES="1024x1024:0,1x1048576:1" the shapes ("AxB:axis"); LS_SMALL_FLOOR=0
leaves the floor out. The chains are benchmarks/gpu_linear_scan.py's (its chain, lax_step and
timeit: R dependent calls in one jit, median of 5, minus a trivial call's dispatch, over R).
"""
import os
import pathlib
import sys

import jax
import jax.numpy as jnp

from jax_selscan import linear_scan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
from gpu_linear_scan import chain, lax_step, timeit  # noqa: E402

ALGOS = os.environ.get("LS_SMALL_ALGOS", "auto,lax").split(",")
SHAPES = [(tuple(int(n) for n in s.split(":")[0].split("x")), int(s.split(":")[1]))
          for s in (os.environ.get("LS_SMALL_SHAPES") or "1024x1024:0,1x1048576:1").split(",")]
DTYPES = [jnp.dtype(d) for d in os.environ.get("LS_SMALL_DTYPES", "bfloat16,float32").split(",")]


def inputs(shape, axis, dt):
    k = jax.random.split(jax.random.PRNGKey(1), 3)
    a = jax.random.uniform(k[0], shape, minval=0.5, maxval=1.0).astype(dt)
    b = jax.random.normal(k[1], shape).astype(dt)
    h0 = jax.random.normal(k[2], shape[:axis] + shape[axis + 1:]).astype(dt)
    return a, b, h0


def main(mode):
    overhead = timeit(jax.jit(lambda x: x + 1), (jnp.zeros((8,), jnp.float32),), 1, 0.0)
    for shape, axis in SHAPES:
        for dt in DTYPES:
            a, b, h0 = inputs(shape, axis, dt)
            for algo in ALGOS:
                step = lambda a, x, h0, algo=algo: linear_scan(a, x, h0=h0, axis=axis, algorithm=algo)
                reps = 128
                if algo == "lax":  # in float32, as the package benchmark runs it
                    if mode == "ncu":
                        continue
                    step, reps = lax_step(axis), 32
                if mode == "ncu":
                    f = jax.jit(step)
                    for _ in range(3):
                        jax.block_until_ready(f(a, b, h0))
                    continue
                t = timeit(chain(step, reps), (a, b, h0), reps, overhead)
                print(f"{dt.name:8s} {shape} axis {axis} {algo:14s} {t * 1e6:7.2f} us per call")
            if mode == "chain" and os.environ.get("LS_SMALL_FLOOR", "1") == "1":  # same bytes, one kernel
                t = timeit(chain(lambda a, x, h0: a * x + 1, 128), (a, b, h0), 128, overhead)
                print(f"{dt.name:8s} {shape} axis {axis} {'a*x+1 (floor)':14s} {t * 1e6:7.2f} us per call")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "chain")
