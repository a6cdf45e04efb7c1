"""An S5/LRU-style layer: a complex diagonal linear recurrence, written the usual way
with `jax.lax.associative_scan` (as in the S5 and LRU papers' JAX code).

    x[t] = lambda * x[t-1] + B u[t]        lambda = exp(-exp(nu) + i theta), complex, diagonal
    y[t] = Re(C x[t]) + D * u[t]

This file is the "before" of examples/lru_drop_in.py, which switches it to
jax_selscan by replacing the one import line below with

    from jax_selscan import associative_scan

and changes nothing else.
"""
import jax
import jax.numpy as jnp

from jax.lax import associative_scan


def init_lru(key, d_model, d_hidden, r_min=0.9, r_max=0.999, max_phase=6.283):
    """LRU initialisation: |lambda| uniform on the ring [r_min, r_max], phases in [0, max_phase]."""
    k = jax.random.split(key, 6)
    u1 = jax.random.uniform(k[0], (d_hidden,), jnp.float32)
    u2 = jax.random.uniform(k[1], (d_hidden,), jnp.float32)
    nu_log = jnp.log(-0.5 * jnp.log(u1 * (r_max ** 2 - r_min ** 2) + r_min ** 2))
    theta_log = jnp.log(max_phase * u2)
    gamma_log = jnp.log(jnp.sqrt(1 - jnp.abs(jnp.exp(-jnp.exp(nu_log) + 1j * jnp.exp(theta_log))) ** 2))
    scale_b, scale_c = (2 * d_model) ** -0.5, d_hidden ** -0.5
    return {
        "nu_log": nu_log, "theta_log": theta_log, "gamma_log": gamma_log,
        "B_re": jax.random.normal(k[2], (d_hidden, d_model), jnp.float32) * scale_b,
        "B_im": jax.random.normal(k[3], (d_hidden, d_model), jnp.float32) * scale_b,
        "C_re": jax.random.normal(k[4], (d_model, d_hidden), jnp.float32) * scale_c,
        "C_im": jax.random.normal(k[5], (d_model, d_hidden), jnp.float32) * scale_c,
        "D": jnp.ones((d_model,), jnp.float32),
    }


def binary_operator(q_i, q_j):
    """The S5 combine for a diagonal recurrence: (A_i, b_i) then (A_j, b_j)."""
    A_i, b_i = q_i
    A_j, b_j = q_j
    return A_j * A_i, A_j * b_i + b_j


def lru_layer(params, u):
    """One sequence u (L, d_model) -> y (L, d_model). vmap over the batch."""
    lam = jnp.exp(-jnp.exp(params["nu_log"]) + 1j * jnp.exp(params["theta_log"]))
    B = (params["B_re"] + 1j * params["B_im"]) * jnp.exp(params["gamma_log"])[:, None]
    C = params["C_re"] + 1j * params["C_im"]
    Bu = jax.vmap(lambda v: B @ v)(u.astype(jnp.complex64))               # (L, d_hidden)
    lams = jnp.broadcast_to(lam, Bu.shape)
    _, x = associative_scan(binary_operator, (lams, Bu))
    y = jax.vmap(lambda v: (C @ v).real)(x)
    return y + params["D"] * u


def model(params, u):
    """A small stack: two LRU layers with a GELU in between, over a batch (batch, L, d)."""
    def one(seq):
        h = lru_layer(params[0], seq)
        return lru_layer(params[1], jax.nn.gelu(h)) + seq
    return jax.vmap(one)(u)
