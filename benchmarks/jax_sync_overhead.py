"""Where the synchronised time of a jitted call goes beyond its device time, on a GPU: is it
the selective-scan handler or the GPU's clock between calls? Controls: a compute-bound
plain-JAX kernel of similar length; ours called twice in one jit; the SM clock sampled by
nvidia-smi during the synchronised and the pipelined loops. Fp32 (8, 1536, 2048, 16).

    python3 -P benchmarks/jax_sync_overhead.py      (GPU machine, package installed)

Results: benchmarks/results/jax_sync_overhead_h200_2026-11-30.txt; discussed in
docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md section 7.4."""
import statistics
import subprocess
import threading
import time

import jax, jax.numpy as jnp
import jax_selscan as js
b, D, L, N = 8, 1536, 2048, 16
k = jax.random.split(jax.random.PRNGKey(0), 8)
dt = jnp.float32
u = jax.random.normal(k[0], (b, D, L)).astype(dt)
delta = (jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0).astype(dt)
z = jax.random.normal(k[2], (b, D, L)).astype(dt)
B = jax.random.normal(k[3], (b, N, L)).astype(dt)
C = jax.random.normal(k[4], (b, N, L)).astype(dt)
A = -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5)
Dk = jax.random.normal(k[6], (D,))
bias = jax.random.uniform(k[7], (D,)) * 0.5
args = (u, delta, A, B, C, Dk, z, bias)
ss = lambda u, d, A, B, C, Dk, z, bi: js.selective_scan(u, d, A, B, C, Dk, z, bi, delta_softplus=True)
ours = jax.jit(ss)
twice = jax.jit(lambda u, d, A, B, C, Dk, z, bi: ss(ss(u, d, A, B, C, Dk, z, bi), d, A, B, C, Dk, z, bi))
def heavy(u, d, *rest):
    x = u
    for i in range(48):
        x = jnp.sin(x * 1.0001 + d)
    return x
heavy = jax.jit(heavy)

class Clock:
    def __init__(self):
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-lms", "20"],
                                  stdout=subprocess.PIPE, text=True)
        self.vals = []
        self.t = threading.Thread(target=self._read, daemon=True); self.t.start()
    def _read(self):
        for line in self.p.stdout:
            try: self.vals.append(int(line.strip()))
            except ValueError: pass
    def stop(self):
        self.p.terminate(); time.sleep(0.05); return self.vals

for name, f in (("ours", ours), ("ours_twice", twice), ("heavy_plain", heavy)):
    c = f.lower(*args).compile()
    for _ in range(5): jax.block_until_ready(c(*args))
    ck = Clock(); time.sleep(0.1)
    tt = []
    t_end = time.perf_counter() + 1.5
    while time.perf_counter() < t_end:
        t0 = time.perf_counter(); jax.block_until_ready(c(*args)); tt.append(time.perf_counter() - t0)
    v_sync = ck.stop()
    ck = Clock(); time.sleep(0.1)
    n = 0; t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5:
        r = c(*args); n += 1
    jax.block_until_ready(r); tp = (time.perf_counter() - t0) / n
    v_pipe = ck.stop()
    med = lambda v: statistics.median(v) if v else -1
    print(f"{name:12s} sync {statistics.median(tt)*1e6:7.1f} us (n={len(tt)})  pipelined {tp*1e6:7.1f} us  "
          f"SM clock MHz sync median {med(v_sync)} min {min(v_sync, default=-1)} | pipelined median {med(v_pipe)} min {min(v_pipe, default=-1)}", flush=True)


# Part 2: the host time until the jitted call returns (dispatch) against the total, fp32 and bf16,
# for ours, a plain elementwise jitted function of the same arguments and a trivial call.
for dtn in ("float32", "bfloat16"):
    dt = jnp.dtype(dtn)
    k = jax.random.split(jax.random.PRNGKey(0), 8)
    u = jax.random.normal(k[0], (b, D, L)).astype(dt)
    delta = (jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0).astype(dt)
    z = jax.random.normal(k[2], (b, D, L)).astype(dt)
    B = jax.random.normal(k[3], (b, N, L)).astype(dt)
    C = jax.random.normal(k[4], (b, N, L)).astype(dt)
    A = -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5)
    Dk = jax.random.normal(k[6], (D,))
    bias = jax.random.uniform(k[7], (D,)) * 0.5
    args = (u, delta, A, B, C, Dk, z, bias)
    ours = jax.jit(lambda u, d, A, B, C, Dk, z, bi: js.selective_scan(u, d, A, B, C, Dk, z, bi, delta_softplus=True))
    plain = jax.jit(lambda u, d, A, B, C, Dk, z, bi: (u * d + z).astype(u.dtype))
    triv = jax.jit(lambda x: x + 1.0)
    x8 = jnp.zeros(8)
    for name, f, a in (("ours", ours, args), ("plain_elementwise", plain, args), ("trivial", triv, (x8,))):
        c = f.lower(*a).compile()
        for _ in range(5): jax.block_until_ready(c(*a))
        td, tt = [], []
        for _ in range(50):
            t0 = time.perf_counter(); r = c(*a); t1 = time.perf_counter(); jax.block_until_ready(r); t2 = time.perf_counter()
            td.append(t1 - t0); tt.append(t2 - t0)
        n = 50; t0 = time.perf_counter()
        for _ in range(n): r = c(*a)
        jax.block_until_ready(r); tp = (time.perf_counter() - t0) / n
        print(f"{dtn:9s} {name:18s} dispatch {statistics.median(td)*1e6:7.1f} us  total {statistics.median(tt)*1e6:7.1f} us  pipelined {tp*1e6:7.1f} us", flush=True)
