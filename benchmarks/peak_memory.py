"""Peak memory (XLA memory analysis: temp + argument + output) of the jitted forward + backward at
(8, 1536, 2048, 16), fp32 and bf16, over its inputs and outputs, with the benchmark's inputs and
memory_stats. Every scratch buffer of the kernels is an XLA buffer, so all of it is counted
(measured on the H200, 2026-11-30: 1.374x fp32, 1.753x bf16; PERFORMANCE_SELECTIVE_SCAN_CUDA 8.8).

    python3 -P benchmarks/peak_memory.py      (GPU machine, package installed; from the repo root)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import gpu_selective_scan as gs  # noqa: E402
import jax_selscan as js  # noqa: E402


def fwdbwd(u, delta, A, B, C, D, z, db, g):
    out, vjp = jax.vjp(lambda *a: js.selective_scan(*a, delta_softplus=True), u, delta, A, B, C, D, z, db)
    return out, vjp(g)


for dt in ("float32", "bfloat16"):
    args, g = gs.make_inputs((8, 1536, 2048, 16), dt, 0)
    m = gs.memory_stats(jax.jit(fwdbwd).lower(*map(jnp.asarray, args), jnp.asarray(g)).compile())
    io = 2 * gs.nbytes(args) + 2 * gs.nbytes([g])  # in: 8 args + g; out: out + 8 gradients
    print(dt, m, "total / in+out = %.3f" % (m["total_bytes"] / io))
