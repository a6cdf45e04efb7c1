"""Example 2: switch an S5/LRU layer from `jax.lax.associative_scan` to
`jax_selscan.associative_scan` by changing one import line.

examples/lru.py is ordinary S5/LRU code with ``from jax.lax import associative_scan``.
This script builds its jax_selscan twin by taking lru.py's source, replacing exactly
that one line with ``from jax_selscan import associative_scan`` (it checks that
nothing else differs) and importing the result as a second module. Then it shows:

1. the same outputs (forward and gradients, complex64 recurrence, float32 tolerance);
2. the fast path is taken: the jaxpr holds the `jax_selscan_linear_scan` primitive,
   and, where the package's kernels are built for this backend, the lowered and the
   compiled HLO hold the custom call (else the primitive lowers to its pure-JAX fallback, and it says so);
3. the time of both, jitted, forward and forward+backward.

    python examples/lru_drop_in.py [--batch 8 --length 4096 --d-model 64 --d-hidden 128]
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import os
import sys
import time
import types

import numpy as np
import jax
import jax.numpy as jnp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lru  # noqa: E402  (the "before": jax.lax.associative_scan)

import jax_selscan  # noqa: E402

BEFORE = "from jax.lax import associative_scan"
AFTER = "from jax_selscan import associative_scan"
PRIMITIVE = "jax_selscan_linear_scan"


def switched_module(name="lru_selscan") -> types.ModuleType:
    """lru.py with its one import line switched to jax_selscan, imported as `name`."""
    src = open(lru.__file__).read()
    lines = src.splitlines(keepends=True)
    assert sum(line.strip() == BEFORE for line in lines) == 1, "lru.py must import it once"
    new = "".join(AFTER + "\n" if line.strip() == BEFORE else line for line in lines)
    changed = [d for d in difflib.ndiff(src.splitlines(), new.splitlines()) if d[:2] in ("- ", "+ ")]
    assert changed == ["- " + BEFORE, "+ " + AFTER], changed
    spec = importlib.util.spec_from_loader(name, loader=None, origin=lru.__file__)
    module = importlib.util.module_from_spec(spec)
    exec(compile(new, lru.__file__, "exec"), module.__dict__)
    return module


def make_inputs(key, batch, length, d_model, d_hidden):
    k1, k2, k3 = jax.random.split(key, 3)
    params = [lru.init_lru(k1, d_model, d_hidden), lru.init_lru(k2, d_model, d_hidden)]
    u = jax.random.normal(k3, (batch, length, d_model), jnp.float32)
    return params, u


def loss_fn(model):
    return lambda params, u: jnp.mean(model(params, u) ** 2)


def custom_calls(hlo_text: str) -> int:
    """Custom calls to the package's kernels in HLO text: lowered StableHLO
    (`stablehlo.custom_call @name(` or `call_target_name = "name"`, by jax version) or
    compiled HLO (`custom-call(...), custom_call_target="name"`)."""
    return sum(1 for line in hlo_text.splitlines()
               if ("custom_call" in line or "custom-call" in line) and PRIMITIVE in line)


def fast_path_report(fast, params, u) -> dict:
    """Is the jax_selscan primitive in the jaxpr, and the custom call in the compiled HLO?"""
    jaxpr = str(jax.make_jaxpr(fast.model)(params, u))
    grad_jaxpr = str(jax.make_jaxpr(jax.grad(loss_fn(fast.model)))(params, u))
    lowered = jax.jit(fast.model).lower(params, u)
    hlo = lowered.as_text()
    compiled_hlo = lowered.compile().as_text() or ""
    lax_hlo = jax.jit(lru.model).lower(params, u).as_text()
    backend = jax.default_backend()
    kernels = (jax_selscan.has_cpu_kernels if backend == "cpu"
               else jax_selscan.has_cuda_kernels if backend in ("gpu", "cuda") else False)
    return {
        "primitive_in_jaxpr": jaxpr.count(PRIMITIVE),
        "primitive_in_grad_jaxpr": grad_jaxpr.count(PRIMITIVE),
        "kernels_for_backend": bool(kernels),
        "custom_call_in_hlo": custom_calls(hlo) > 0,
        "custom_call_count": custom_calls(hlo),
        "custom_call_count_compiled": custom_calls(compiled_hlo),
        "lax_version_has_custom_call": PRIMITIVE in lax_hlo,
    }


def compare(fast, params, u) -> dict:
    """Largest differences (forward and gradient) between the two modules, scaled."""
    y_lax = jax.jit(lru.model)(params, u)
    y_fast = jax.jit(fast.model)(params, u)
    g_lax = jax.jit(jax.grad(loss_fn(lru.model)))(params, u)
    g_fast = jax.jit(jax.grad(loss_fn(fast.model)))(params, u)

    def rel(x, y):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        return float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))

    grad_rel = max(rel(a, b) for a, b in zip(jax.tree_util.tree_leaves(g_fast),
                                             jax.tree_util.tree_leaves(g_lax)))
    return {"output_rel_err": rel(y_fast, y_lax), "grad_rel_err": grad_rel,
            "outputs": (np.asarray(y_fast), np.asarray(y_lax))}


def time_fn(fn, *args, repeats=10):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def timings(fast, params, u, repeats=10) -> dict:
    out = {}
    for name, mod in (("lax.associative_scan", lru), ("jax_selscan.associative_scan", fast)):
        out[name] = {
            "forward_ms": 1e3 * time_fn(jax.jit(mod.model), params, u, repeats=repeats),
            "fwd_bwd_ms": 1e3 * time_fn(jax.jit(jax.grad(loss_fn(mod.model))), params, u,
                                        repeats=repeats),
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--d-hidden", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args(argv)
    fast = switched_module()
    print(f"the one changed line:\n  - {BEFORE}\n  + {AFTER}")
    params, u = make_inputs(jax.random.PRNGKey(0), args.batch, args.length, args.d_model,
                            args.d_hidden)
    print(f"backend {jax.default_backend()}; u {u.shape} float32, hidden {args.d_hidden} complex64")

    rep = fast_path_report(fast, params, u)
    print(f"jaxpr: {rep['primitive_in_jaxpr']} x {PRIMITIVE} (grad jaxpr: "
          f"{rep['primitive_in_grad_jaxpr']}); lax version: none")
    if rep["kernels_for_backend"]:
        print(f"HLO: {rep['custom_call_count']} custom calls to {PRIMITIVE}* when lowered, "
              f"{rep['custom_call_count_compiled']} in the compiled executable")
    else:
        print("this jax_selscan build has no kernel for this backend: the primitive lowers to "
              "its pure-JAX fallback (no custom call in the HLO)")

    cmp = compare(fast, params, u)
    print(f"max |y_fast - y_lax| / max|y_lax| = {cmp['output_rel_err']:.2e}; "
          f"gradients: {cmp['grad_rel_err']:.2e} (tolerance 1e-3)")
    t = timings(fast, params, u, args.repeats)
    a, b = t["lax.associative_scan"], t["jax_selscan.associative_scan"]
    print(f"\n{'jitted, median ms':22s} {'lax':>10s} {'jax_selscan':>12s} {'speed-up':>9s}")
    for k, name in (("forward_ms", "forward"), ("fwd_bwd_ms", "forward+backward")):
        print(f"{name:22s} {a[k]:10.2f} {b[k]:12.2f} {a[k] / b[k]:8.2f}x")
    ok = cmp["output_rel_err"] < 1e-3 and cmp["grad_rel_err"] < 1e-3
    print("outputs agree" if ok else "OUTPUTS DIFFER")
    return {"fast_path": rep, "compare": {k: v for k, v in cmp.items() if k != "outputs"},
            "timings": t}


if __name__ == "__main__":
    main()
