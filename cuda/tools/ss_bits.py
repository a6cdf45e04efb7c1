"""Bitwise fingerprints of the selective scan's outputs, to compare two builds of the kernels
that should give the same bits (a change of instructions, not of arithmetic): run it with each
wheel installed and diff the two outputs (PERFORMANCE_SELECTIVE_SCAN_CUDA 11).

    python3 -P cuda/tools/ss_bits.py > bits_a.txt    # (install the other wheel)
    python3 -P cuda/tools/ss_bits.py > bits_b.txt && diff bits_a.txt bits_b.txt

One line per (shape, dtype, direction; bidirectional runs the reverse walk too): a SHA-256 of
the forward's output and last state and of the gradients of u, delta, A, B, C, D, z and
delta_bias. The shapes cover every lane geometry of the staged kernels
(tests/test_cuda_selective_scan.py, STAGED_CASES), the main shape and a few-row shape whose forward and backward split along L.
"""
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

import jax_selscan as js

SHAPES = [(2, 64, 77, 16), (2, 4224, 40, 16), (1, 32, 29, 20), (1, 33, 50, 64), (1, 32, 35, 128),
          (8, 1536, 2048, 16), (1, 256, 4096, 16)]  # the last: 8 row blocks, split along L


def digest(*arrays):
    h = hashlib.sha256()
    for a in jax.tree_util.tree_leaves(arrays):
        h.update(np.asarray(jnp.asarray(a, jnp.float32)).tobytes())
    return h.hexdigest()[:16]


for b, d, length, n in SHAPES:
    k = jax.random.split(jax.random.PRNGKey(b * 7 + d + length + n), 8)
    for dt in (jnp.float32, jnp.bfloat16):
        u = jax.random.normal(k[0], (b, d, length)).astype(dt)
        delta = (jax.random.normal(k[1], (b, d, length)) * 0.5 - 1.0).astype(dt)
        z = jax.random.normal(k[2], (b, d, length)).astype(dt)
        B = jax.random.normal(k[3], (b, n, length)).astype(dt)
        C = jax.random.normal(k[4], (b, n, length)).astype(dt)
        A = -jnp.exp(jax.random.normal(k[5], (d, n)) * 0.5)
        D = jax.random.normal(k[6], (d,))
        bias = jax.random.uniform(k[7], (d,)) * 0.5
        for direction in ("forward", "bidirectional"):  # bidirectional runs both walks
            def f(u, delta, A, B, C, D, z, bias):
                return js.selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True,
                                         return_last_state=True, direction=direction)
            out = jax.jit(f)(u, delta, A, B, C, D, z, bias)
            loss = lambda *a: jnp.sum(jnp.sin(f(*a)[0].astype(jnp.float32)))
            grads = jax.jit(jax.grad(loss, argnums=tuple(range(8))))(u, delta, A, B, C, D, z, bias)
            print(f"{b}x{d}x{length}x{n} {jnp.dtype(dt).name:8s} {direction:13s} fwd {digest(out)} grad {digest(grads)}",
                  flush=True)
