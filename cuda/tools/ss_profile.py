"""One jitted forward and one forward + backward of the fused selective scan at
(8, 1536, 2048, 16), float32, for Nsight Compute on the GPU machine. The profile quoted in
docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md came from (package installed first):

    XLA_PYTHON_CLIENT_PREALLOCATE=false ncu --clock-control none \\
        -k regex:"fwd_kernel|bwd_kernel" --launch-count 3 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats \\
        --section MemoryWorkloadAnalysis python3 cuda/tools/ss_profile.py

(The round-3 profile: regex "fwd_staged|bwd_kernel", also --section ComputeWorkloadAnalysis
--section InstructionStats; SS_PROFILE_DTYPE=bfloat16 for 16-bit activations.)

Session 6's per-instruction profiles (PERFORMANCE_SELECTIVE_SCAN_CUDA.md section 6), per kernel
K in fwd_staged / bwd_staged:

    ncu --clock-control none -k regex:K -c 1 --set full --import-source yes -o K python3 -P cuda/tools/ss_profile.py
    ncu --import K.ncu-rep --page details > K_details.txt
    ncu --import K.ncu-rep --page source --csv --print-source sass > K_sass.csv

The SASS table's "Instructions Executed" and "Warp Stall Sampling" columns were summed per
opcode and per execution count (loop level) to find the costs quoted there
(`python3 cuda/tools/ncu_sass_summary.py K_sass.csv --list 20` does the per-level sums).

SS_PROFILE_SHAPE="b,D,L,N" picks another shape; SS_PROFILE_VJP=1 makes the second call the
benchmark's forward + backward (a jitted vjp giving every gradient, cotangent g) instead of
the grad of two arguments. Every kernel of such a call, with its time (section 14):

    SS_PROFILE_VJP=1 SS_PROFILE_SHAPE=64,768,512,16 ncu --clock-control none \
        --metrics gpu__time_duration.sum python3 -P cuda/tools/ss_profile.py
"""
import os

import jax
import jax.numpy as jnp

import jax_selscan as js

b, D, L, N = (int(x) for x in os.environ.get("SS_PROFILE_SHAPE", "8,1536,2048,16").split(","))
dt = jnp.dtype(os.environ.get("SS_PROFILE_DTYPE", "float32"))
k = jax.random.split(jax.random.PRNGKey(0), 8)
u = jax.random.normal(k[0], (b, D, L)).astype(dt)
delta = (jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0).astype(dt)
z = jax.random.normal(k[2], (b, D, L)).astype(dt)
B = jax.random.normal(k[3], (b, N, L)).astype(dt)
C = jax.random.normal(k[4], (b, N, L)).astype(dt)
A = -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5)
Dskip = jax.random.normal(k[6], (D,))
bias = jax.random.uniform(k[7], (D,)) * 0.5


def f(u, delta, z, B, C):
    return js.selective_scan(u, delta, A, B, C, D=Dskip, z=z, delta_bias=bias, delta_softplus=True)


fwd = jax.jit(f)
jax.block_until_ready(fwd(u, delta, z, B, C))
if os.environ.get("SS_PROFILE_VJP") == "1":
    def vjp_all(g, u, delta, A, B, C, Dskip, z, bias):
        full = lambda *x: js.selective_scan(*x, delta_softplus=True)
        return jax.vjp(full, u, delta, A, B, C, Dskip, z, bias)[1](g)
    g = jax.random.normal(jax.random.PRNGKey(1), (b, D, L)).astype(dt)
    jax.block_until_ready(jax.jit(vjp_all)(g, u, delta, A, B, C, Dskip, z, bias))
else:
    fwd_bwd = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1)))
    jax.block_until_ready(fwd_bwd(u, delta, z, B, C))
