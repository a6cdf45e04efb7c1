"""The CUDA selective scan's launch plan measured side by side: the L split's chunk count and
the forward's lanes per row at the shapes with few rows, and the bidirectional call against two
directional calls. Pipelined per-call times (medians over passes that alternate the settings).

    python3 -P benchmarks/gpu_selective_scan_split.py --out DIR [--study plans|bidir|balance|sub|bwdsub|lanes]
                                                     (GPU machine, package installed)

The settings are the kernels' environment knobs (JAX_SELSCAN_SS_FWD_CHUNKS, _SS_FWD_LANES,
_SS_BWD_CHUNKS, _SS_FWD_SUB, _SS_BWD_SUB). The scratch an XLA call carries is sized at trace time from the same knobs,
so each setting is traced and compiled with its environment and called with it in place.
Writes DIR/gpu_selective_scan_split[_STUDY].json and .md (notes PERFORMANCE_SELECTIVE_SCAN_CUDA
14, 15).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_selscan as js
from jax_selscan.bench import scoped_env

KNOBS = ("JAX_SELSCAN_SS_FWD_CHUNKS", "JAX_SELSCAN_SS_FWD_LANES", "JAX_SELSCAN_SS_BWD_CHUNKS",
         "JAX_SELSCAN_SS_FWD_SUB", "JAX_SELSCAN_SS_BWD_SUB")
FEW_ROWS = [(1, 5120, 16384, 16), (1, 1536, 8192, 16), (2, 2560, 8192, 16)]
LANES_FWD_SHAPES = [(64, 768, 512, 16), (32, 1024, 1024, 16), (8, 1536, 2048, 16), (16, 1536, 2048, 16),
                    (12, 1536, 2048, 16), (8, 2560, 4096, 16), (4, 2048, 2048, 16), (1, 5120, 16384, 16)]


def studies(lanes_p=("4", "8")):
    """{name: (shapes, forward settings, forward + backward settings, bidirectional shapes)};
    a setting is (label, knobs). `lanes_p`: the lanes study's forced lanes per row."""
    plans_fwd = [("default", {})] + [(f"P{p} n{n}", {KNOBS[0]: n, KNOBS[1]: p})
                                     for p in ("4", "8") for n in ("1", "2", "3", "4", "6", "8")]
    plans_bwd = [("default", {})] + [(f"bwd n{n}", {KNOBS[2]: n}) for n in ("1", "2", "3", "4", "6")]
    # phase A's sub-chunks per chunk (PERFORMANCE_SELECTIVE_SCAN_CUDA 15)
    sub_fwd = [("default", {})] + [(f"sub{m}", {KNOBS[3]: m}) for m in ("1", "2", "4", "6")]
    sub_bwd = [("default", {})] + [(f"bwd sub{m}", {KNOBS[4]: m}) for m in ("1", "2", "3", "4")]
    # the lanes of every forward walk, the checkpointing one of a forward + backward included
    lanes = [("default", {})] + [(f"P{p}", {KNOBS[1]: p}) for p in lanes_p]
    # wave balance: 4224 rows make 132 row blocks, whose grids fill whole waves (forward: 4 chunks
    # on 528 slots; backward: 3 or 6 chunks on 396), against 5120 rows' 160 (PERFORMANCE_SELECTIVE_SCAN_CUDA 17)
    bal_fwd = [("default", {})] + [(f"P4 n{n}", {KNOBS[0]: n, KNOBS[1]: "4"}) for n in ("3", "4")]
    bal_bwd = [("default", {})] + [(f"bwd n{n}", {KNOBS[2]: n}) for n in ("3", "4", "5", "6", "7", "8")]
    return {"plans": (FEW_ROWS, plans_fwd, plans_bwd, [(8, 1536, 2048, 16), (1, 5120, 16384, 16)]),
            "balance": ([(1, 4224, 16384, 16), (1, 5120, 16384, 16), (2, 2560, 8192, 16)], bal_fwd, bal_bwd, []),
            "sub": (FEW_ROWS, sub_fwd, sub_bwd, []),
            "bwdsub": (FEW_ROWS, [("default", {})], sub_bwd, []),
            "bidir": ([], [], [], [(8, 1536, 2048, 16), (1, 5120, 16384, 16)]),
            "lanes": ([(64, 768, 512, 16), (8, 1536, 2048, 16)], lanes, lanes, []),
            # the forward alone over last-wave fills of 4 and 8 lanes from equal to far apart (notes 26)
            "lanes_fwd": (LANES_FWD_SHAPES, lanes, [], [])}


def knobs(env):
    """The kernels' knobs set to `env` (the others unset) for a block."""
    return scoped_env(env, clear=KNOBS)


def inputs(shape, dtype, seed=0):
    b, D, L, N = shape
    k = jax.random.split(jax.random.PRNGKey(seed), 9)
    dt = jnp.dtype(dtype)
    return (jax.random.normal(k[0], (b, D, L)).astype(dt),
            (jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0).astype(dt),
            -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5),
            jax.random.normal(k[3], (b, N, L)).astype(dt),
            jax.random.normal(k[4], (b, N, L)).astype(dt),
            jax.random.normal(k[6], (D,)),
            jax.random.normal(k[2], (b, D, L)).astype(dt),
            jax.random.uniform(k[7], (D,)) * 0.5), jax.random.normal(k[8], (b, D, L)).astype(dt)


def compiled(kind, args, g):
    ss = lambda *x: js.selective_scan(*x, delta_softplus=True)
    if kind == "fwd":
        return jax.jit(ss).lower(*args).compile(), args
    f = lambda g, *x: jax.vjp(ss, *x)[1](g)
    return jax.jit(f).lower(g, *args).compile(), (g,) + args


def per_call_us(fn, args, calls):
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    for _ in range(calls):
        r = fn(*args)
    jax.block_until_ready(r)
    return (time.perf_counter() - t0) / calls * 1e6


def budgeted_us(fn, args, budget_ms):
    """Per-call µs over as many back-to-back calls (3 to 200) as fit in about budget_ms."""
    once = per_call_us(fn, args, 1)
    return per_call_us(fn, args, max(3, min(200, int(budget_ms * 1e3 / max(once, 1.0)))))


def sweep(shape, dtype, kind, settings, passes, budget_ms):
    """{label: median us} over `passes` passes, each timing every setting once."""
    args, g = inputs(shape, dtype)
    fns, ref = {}, None
    for label, env in settings:
        with knobs(env):
            fn, a = compiled(kind, args, g)
            out = jax.block_until_ready(fn(*a))
        # Every result (the output, or every gradient: the backward's plans change only the
        # gradients' summation order, which shows in dA, dB, dC, dD, ddelta_bias, not in du).
        leaves = [np.asarray(jnp.asarray(x, jnp.float32)) for x in jax.tree_util.tree_leaves(out)]
        if ref is None:
            ref = leaves
        # Every plan computes the same function: a plan that changed the result is a bug.
        err = max(float(np.max(np.abs(x - r)) / max(float(np.max(np.abs(r))), 1e-30))
                  for x, r in zip(leaves, ref))
        fns[label] = (fn, a, env, err)
    times = {label: [] for label, _ in settings}
    for _ in range(passes):
        for label, (fn, a, env, _) in fns.items():
            with knobs(env):
                times[label].append(budgeted_us(fn, a, budget_ms))
    return {label: {"us": statistics.median(v), "runs": v, "rel_diff_vs_first": fns[label][3]}
            for label, v in times.items()}


def bidirectional(shape, dtype, passes, budget_ms):
    """The fused call against two directional calls: their times added (the kernels alone), and
    one jit of forward + reverse (what a user writes instead: the two calls plus the sum)."""
    args, _ = inputs(shape, dtype)
    scan = lambda x, d: js.selective_scan(*x, delta_softplus=True, direction=d)
    bodies = {d: (lambda *x, d=d: scan(x, d)) for d in ("forward", "reverse", "bidirectional")}
    bodies["forward + reverse"] = lambda *x: scan(x, "forward") + scan(x, "reverse")
    fns = {d: jax.jit(f).lower(*args).compile() for d, f in bodies.items()}
    a, b = (np.asarray(jnp.asarray(fns[d](*args), jnp.float32)) for d in ("bidirectional", "forward + reverse"))
    t = {d: [] for d in fns}
    for _ in range(passes):
        for d, fn in fns.items():
            t[d].append(budgeted_us(fn, args, budget_ms))
    m = {d: statistics.median(v) for d, v in t.items()}
    return {"forward_us": m["forward"], "reverse_us": m["reverse"], "bidirectional_us": m["bidirectional"],
            "fwd_plus_rev_jit_us": m["forward + reverse"],
            "two_calls_over_bidirectional": (m["forward"] + m["reverse"]) / m["bidirectional"],
            "fwd_plus_rev_jit_over_bidirectional": m["forward + reverse"] / m["bidirectional"],
            "rel_diff_vs_fwd_plus_rev": float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))}


def write_markdown(res, stem):
    """stem.md from the results (also: regenerate it from a run's JSON)."""
    lines = [f"# selective_scan launch plans on {res.get('gpu', res['device'])}", "",
             f"date {res['date']}, commit {res['commit']}, jax {res['jax']}, command "
             f"`{res['command']}`", "",
             "Pipelined per-call µs, medians over passes that alternate the settings; (8, 1536, 2048)-style "
             "shapes are (batch, D, L, N), z, delta_bias and softplus on. `Pp nk`: P lanes per row, k L chunks "
             "(the forward's knobs); `bwd nk`: the backward's chunks with the default forward; `subm` / `bwd subm`: "
             "m sub-chunks per chunk in phase A of the forward's / backward's L split; `Pp` alone: every forward "
             "walk on p lanes per row.", ""]
    for key, title in (("fwd", "forward"), ("fwd_bwd", "forward + backward")):
        if not res[key]:
            continue
        labels = list(res[key][0]["times"])
        lines += [f"## {title}", "", "| shape | dtype | " + " | ".join(labels) + " |",
                  "|---|---|" + "---:|" * len(labels)]
        for e in res[key]:
            best = min(v["us"] for v in e["times"].values())
            cells = [(f"**{v['us']:.0f}**" if v["us"] == best else f"{v['us']:.0f}") for v in e["times"].values()]
            lines.append(f"| {'x'.join(map(str, e['shape']))} | {e['dtype']} | " + " | ".join(cells) + " |")
        worst = max(v["rel_diff_vs_first"] for e in res[key] for v in e["times"].values())
        lines += ["", f"Largest relative difference of a plan's result (output; fwd+bwd: each gradient) "
                  f"from the default's: {worst:.1e}.", ""]
    if res["bidir"]:
        lines += ["## bidirectional against two directional calls", "",
                  "| shape | dtype | forward µs | reverse µs | bidirectional µs | (fwd + rev) / bidirectional | "
                  "jit(fwd + rev) µs | jit(fwd + rev) / bidirectional | rel. diff |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for e in res["bidir"]:
        lines.append(f"| {'x'.join(map(str, e['shape']))} | {e['dtype']} | {e['forward_us']:.0f} | {e['reverse_us']:.0f} | "
                     f"{e['bidirectional_us']:.0f} | {e['two_calls_over_bidirectional']:.2f}x | "
                     f"{e['fwd_plus_rev_jit_us']:.0f} | {e['fwd_plus_rev_jit_over_bidirectional']:.2f}x | "
                     f"{e['rel_diff_vs_fwd_plus_rev']:.1e} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--budget-ms", type=float, default=60.0, help="time per timed batch of calls")
    ap.add_argument("--study", default="plans", choices=sorted(studies()),
                    help="plans: chunks and lanes at few rows, bidirectional (bidir: that alone); sub: phase A's sub-chunks (bwdsub: "
                         "the backward's only); "
                         "lanes: the forward's lanes with and without the backward; lanes_fwd: the forward's alone, at more shapes")
    ap.add_argument("--lanes", default="4,8",
                    help="lanes study: the lanes per row to force, comma-separated (an experimental "
                         "build may take others)")
    opt = ap.parse_args()
    os.makedirs(opt.out, exist_ok=True)
    shapes, fwd_settings, bwd_settings, bidir_shapes = studies(tuple(opt.lanes.split(",")))[opt.study]
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("JAX_SELSCAN_COMMIT", ""), "jax": jax.__version__,
           "device": str(jax.devices()[0].device_kind), "passes": opt.passes, "study": opt.study, "fwd": [], "fwd_bwd": [], "bidir": []}
    try:
        res["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm", "--format=csv,noheader"],
                                    capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    for shape in shapes:
        for dtype in ("float32", "bfloat16"):
            for kind, key, settings in (("fwd", "fwd", fwd_settings), ("fwd_bwd", "fwd+bwd", bwd_settings)):
                if not settings:
                    continue
                r = sweep(shape, dtype, kind, settings, opt.passes, opt.budget_ms)
                res[kind].append({"shape": shape, "dtype": dtype, "times": r})
                print(key, shape, dtype, " ".join(f"{k}: {v['us']:.0f}" for k, v in r.items()), flush=True)
    for shape in bidir_shapes:
        for dtype in ("float32", "bfloat16"):
            r = bidirectional(shape, dtype, opt.passes, opt.budget_ms)
            res["bidir"].append({"shape": shape, "dtype": dtype, **r})
            print("bidir", shape, dtype, {k: round(v, 2) for k, v in r.items()}, flush=True)
    stem = os.path.join(opt.out, "gpu_selective_scan_split" + ("" if opt.study == "plans" else "_" + opt.study))
    res["command"] = (f"python3 -P benchmarks/gpu_selective_scan_split.py --study {opt.study}"
                      f"{' --lanes ' + opt.lanes if opt.study.startswith('lanes') else ''} --passes {opt.passes} "
                      f"--budget-ms {opt.budget_ms:g}")
    with open(stem + ".json", "w") as f:
        json.dump(res, f, indent=1)
    write_markdown(res, stem)


if __name__ == "__main__":
    main()
