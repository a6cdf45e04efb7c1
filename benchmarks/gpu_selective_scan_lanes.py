"""The staged CUDA forward's two geometries for N <= 16 side by side (JAX_SELSCAN_SS_FWD_LANES=8:
8 lanes of 2 states, 256-thread blocks; =4: 4 lanes of 4 states, 128-thread blocks), pipelined
per-call times (medians of 3 passes of 40 calls, alternating), forward and forward-with-checkpoints
(the forward of a vjp), at the two benchmark shapes where the default picks 8 lanes.

    python3 -P benchmarks/gpu_selective_scan_lanes.py      (GPU machine, package installed)

Results: benchmarks/results/gpu_selective_scan_lanes_h200_2026-11-30.txt (notes section 7.3)."""
import os
import statistics
import time

import jax, jax.numpy as jnp
import jax_selscan as js
for shape in ((8, 1536, 2048, 16), (8, 2560, 4096, 16)):
    b, D, L, N = shape
    for dtn in ("bfloat16", "float32"):
        dt = jnp.dtype(dtn)
        k = jax.random.split(jax.random.PRNGKey(0), 8)
        args = (jax.random.normal(k[0], (b, D, L)).astype(dt), (jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0).astype(dt),
                -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5), jax.random.normal(k[3], (b, N, L)).astype(dt),
                jax.random.normal(k[4], (b, N, L)).astype(dt), jax.random.normal(k[6], (D,)),
                jax.random.normal(k[2], (b, D, L)).astype(dt), jax.random.uniform(k[7], (D,)) * 0.5)
        f = jax.jit(lambda *a: js.selective_scan(*a, delta_softplus=True)).lower(*args).compile()
        g = jax.jit(lambda *a: jax.vjp(lambda *x: js.selective_scan(*x, delta_softplus=True), *a)[0]).lower(*args).compile()
        res = {}
        for rep in range(3):
            for lanes in ("8", "4"):
                os.environ["JAX_SELSCAN_SS_FWD_LANES"] = lanes
                for name, c in (("fwd", f), ("fwd_ckpt", g)):
                    for _ in range(3): jax.block_until_ready(c(*args))
                    n = 40; t0 = time.perf_counter()
                    for _ in range(n): r = c(*args)
                    jax.block_until_ready(r)
                    res.setdefault((name, lanes), []).append((time.perf_counter() - t0) / n * 1e6)
        out0 = {l: None for l in "84"}
        for lanes in "84":
            os.environ["JAX_SELSCAN_SS_FWD_LANES"] = lanes
            out0[lanes] = jnp.asarray(f(*args), jnp.float32)
        same = float(jnp.max(jnp.abs(out0["8"] - out0["4"])))
        del os.environ["JAX_SELSCAN_SS_FWD_LANES"]
        print(shape, dtn, " ".join(f"{n}/P{l}: {statistics.median(v):7.1f} us" for (n, l), v in sorted(res.items())), f"max|P8-P4| {same:.2e}", flush=True)
