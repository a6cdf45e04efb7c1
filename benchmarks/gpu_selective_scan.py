"""Benchmark of Mamba's selective scan on one GPU, in one process:

  * jax_selscan.selective_scan, jitted (whatever backend it lowers to: the custom calls
    found in its lowered module are recorded),
  * jax_selscan.selective_scan_ref, jitted (plain JAX, lax.associative_scan),
  * mamba_ssm's CUDA kernels (selective_scan_cuda) through a small torch wrapper module
    `mamba_ref` (selective_scan_fn) found in --mamba-dir, when given and importable,
    fed with copies of the same numpy inputs as torch CUDA tensors.

For each shape (batch, D, L, N) and dtype: forward time and forward+backward time (JAX:
jit of jax.vjp with the cotangent g, returning out and the 8 gradients; torch:
out.backward(g)), medians of wall-clock times around synchronised single calls; the
effective GB/s of the forward over the bytes a fused forward must move (read u, delta,
z, B, C; write out; plus the small A, D, delta_bias) and its fraction of a device copy
measured in the same run (jitted x + 1 over 1 GiB float32, read + write counted);
max relative errors (max|a - b| / max|b|) of the forwards against the reference
evaluated in float32 and against each other, and of the gradients; whether two
forward+backward calls give bitwise identical gradients; and XLA's memory analysis
(temp + argument + output bytes) of the compiled forward and forward+backward, beside
the bytes of their inputs and outputs (torch: the inputs plus the allocator's peak growth
over one forward+backward).

Inputs follow Mamba: u, delta, z, B, C in the benchmarked dtype, B and C (batch, N, L)
(G = 1), A = -exp(0.5 randn) (D, N), D and delta_bias (D,) in float32, delta_softplus=True.

    python -P benchmarks/gpu_selective_scan.py --out DIR [--mamba-dir /tmp/mamba_build]
        [--quick] [--shapes 2x64x128x16,...] [--dtypes float32,bfloat16] [--reps 20]

Writes DIR/gpu_selective_scan_<gpu>_<date>.{json,md} (rewritten after every shape, so a
run cut short still leaves what it measured). Every implementation, shape and stage runs
in its own try/except: a failure is recorded as its error string. A per-shape time
guard (--shape-budget) and a whole-run guard (--budget) skip what is left, noting it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave room for torch

import numpy as np
import jax
import jax.numpy as jnp

import jax_selscan
from jax_selscan import selective_scan, selective_scan_ref
from jax_selscan.bench import scoped_env

SHAPES = [(8, 1536, 2048, 16), (8, 2560, 4096, 16), (1, 5120, 16384, 16), (64, 768, 512, 16)]
MEMORY_SHAPE = (8, 1536, 2048, 16)
ARG_NAMES = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
IMPLS = ("ours", "ours_rows", "mamba", "ref")
# ours = the default kernels (round 3, "staged"); ours_rows: the same jitted calls with
# JAX_SELSCAN_SS_FWD=rows and JAX_SELSCAN_SS_BWD=rows (round 1; the variables are read by the
# extension at every launch).
VARIANTS = {"ours_rows": "rows"}
OURS = ("ours",) + tuple(VARIANTS)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- small helpers ---------------------------------------------------------------------------

def err_str(e):
    s = f"{type(e).__name__}: {e}"
    return s if len(s) < 600 else s[:600] + " ..."


def median(xs):
    return float(np.median(xs)) if xs else None


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        dims = tuple(int(v) for v in item.lower().split("x"))
        if len(dims) != 4 or min(dims) < 1:
            raise SystemExit(f"--shapes: {item!r} is not BATCHxDxLxN")
        shapes.append(dims)
    return shapes


def shape_name(shape):
    return "x".join(str(v) for v in shape)


def gpu_slug(kind):
    s = re.sub(r"nvidia", "", kind.lower())
    s = re.sub(r"[^a-z0-9]+", "_", s).strip("_")
    return s or "device"


def git_commit():
    if os.environ.get("JSS_COMMIT"):
        return os.environ["JSS_COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def jaxlib_version():
    try:
        import jaxlib
        return getattr(jaxlib, "__version__", None) or jaxlib.version.__version__
    except Exception:
        return None


def fwd_bytes(shape, itemsize):
    """Bytes a fused forward must move: read u, delta, z (batch, D, L), B, C (batch, N, L),
    A (D, N), D, delta_bias (D,); write out (batch, D, L)."""
    b, d, length, n = shape
    return itemsize * (4 * b * d * length + 2 * b * n * length) + 4 * (d * n + 2 * d)


_BASE = {}


def make_inputs(shape, dtype_name, seed):
    """numpy inputs: the big arrays in the benchmarked dtype, A, D, delta_bias in float32.

    The float32 draws are kept for the next dtype of the same shape (the bfloat16 inputs
    are the float32 ones rounded), and dropped when another shape is asked for."""
    key = (tuple(shape), seed)
    if key not in _BASE:
        _BASE.clear()
        _BASE[key] = _draw(shape, seed)
    arrays, g = _BASE[key]
    dtype = np.dtype(jnp.dtype(dtype_name))
    arrays = dict(arrays)
    for k in ("u", "delta", "B", "C", "z"):
        arrays[k] = arrays[k].astype(dtype, copy=False)
    return [arrays[k] for k in ARG_NAMES], g.astype(dtype, copy=False)


def _draw(shape, seed):
    b, d, length, n = shape
    rng = np.random.default_rng(seed)
    f32 = np.float32

    def randn(*s, scale=1.0):
        x = rng.standard_normal(s, dtype=f32)
        if scale != 1.0:
            x *= f32(scale)
        return x

    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), d)).astype(f32)
    arrays = dict(
        u=randn(b, d, length),
        delta=randn(b, d, length, scale=0.5),
        A=-np.exp(randn(d, n, scale=0.5)),
        B=randn(b, n, length),
        C=randn(b, n, length),
        D=randn(d),
        z=randn(b, d, length),
        delta_bias=np.log(np.expm1(dt)).astype(f32),   # softplus(delta_bias) = dt, as Mamba initialises
    )
    return arrays, randn(b, d, length)


def nbytes(arrays):
    return int(sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays))


def memory_stats(compiled):
    try:
        m = compiled.memory_analysis()
    except Exception as e:
        return {"error": err_str(e)}
    if m is None:
        return {"error": "memory_analysis() returned None"}
    out = {}
    for key in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                "alias_size_in_bytes", "generated_code_size_in_bytes"):
        v = getattr(m, key, None)
        if v is not None:
            out[key] = int(v)
    if all(k in out for k in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes")):
        out["total_bytes"] = (out["temp_size_in_bytes"] + out["argument_size_in_bytes"]
                              + out["output_size_in_bytes"])
    return out


def custom_calls(lowered):
    try:
        text = lowered.as_text()
    except Exception:
        return None
    names = set(re.findall(r"stablehlo\.custom_call\s+@([\w.\-]+)", text))
    names |= set(re.findall(r'custom_call_target\s*=\s*"([^"]+)"', text))
    return sorted(names)


# The pipelined passes: about this long, in at most this many calls (the outputs of every
# queued call stay allocated until it has run, so the cap bounds the memory of short calls).
PIPE_BUDGET_S = 0.06
PIPE_MAX_CALLS = 200


def timed(call, sync, reps, warmup, budget_s):
    """Median wall-clock seconds of `call()` followed by `sync(result)`.

    Returns (median, times, first_result, last_result, pipelined). The first (warm-up)
    call's time sets the number of timed repeats: at most `reps`, at least 3, about
    `budget_s` in all; a first call slower than 0.25 s counts as the whole warm-up.
    `pipelined`: calls issued back to back with one sync at the end, per call (the second of
    two such passes): the device time when dispatch overlaps the previous call (JAX's ~80 us
    and torch's launch overheads hide behind the kernels). As many calls as fill about
    PIPE_BUDGET_S (at least the synchronised repeats, at most PIPE_MAX_CALLS), so that the
    pass's fixed costs (the first dispatch, the final synchronisation: 150-280 us for a
    jitted call, notes 7.4) are spread over enough calls.
    """
    t0 = time.perf_counter()
    first = call()
    sync(first)
    t_first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1) if t_first < 0.25 else 0):
        sync(call())
    n = int(max(3, min(reps, budget_s / max(t_first, 1e-6))))
    times, last = [], None
    for _ in range(n):
        last = None
        t0 = time.perf_counter()
        last = call()
        sync(last)
        times.append(time.perf_counter() - t0)
    # Two passes, the second one kept: the first pass of the first shape measured 4.5 ms
    # against 2.8 synchronised (fwd+bwd fp32, session 4), consistent with the extension's
    # scratch pool growing to its high-water mark while many calls are queued.
    npipe = int(max(n, min(PIPE_MAX_CALLS, PIPE_BUDGET_S / max(median(times), 1e-6))))
    for _ in range(2):
        t0 = time.perf_counter()
        for _ in range(npipe):
            res = call()
        sync(res)
        pipelined = (time.perf_counter() - t0) / npipe
    res = None
    return median(times), times, first, last, pipelined


def jax_sync(x):
    jax.block_until_ready(x)


@jax.jit
def _rel_err(a, b):
    a = a.astype(jnp.float32)
    b = b.astype(jnp.float32)
    return jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(b)), 1e-30)


def rel_err(a, b):
    """max|a - b| / max|b| in float32 on the default device (a, b: jax or numpy arrays)."""
    return float(_rel_err(jnp.asarray(a), jnp.asarray(b)))


def _bits(x):
    x = jnp.asarray(x)
    size = jnp.dtype(x.dtype).itemsize
    return jax.lax.bitcast_convert_type(x, {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[size])


def jax_bitwise_equal(xs, ys):
    return all(bool(jnp.array_equal(_bits(x), _bits(y))) for x, y in zip(xs, ys))


def torch_bitwise_equal(torch, xs, ys):
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    return all(torch.equal(x.contiguous().view(ints[x.element_size()]),
                           y.contiguous().view(ints[y.element_size()])) for x, y in zip(xs, ys))


# --- the device copy ceiling ------------------------------------------------------------------

def _median_call_s(f, x, reps):
    """Median seconds of a synchronised call f(x), after one warm-up call."""
    jax.block_until_ready(f(x))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        ts.append(time.perf_counter() - t0)
    return median(ts)


def copy_ceiling(mib, reps=20):
    """The copy rate of a jitted x + 1.0, synchronised per call (as the synchronised columns) and
    pipelined (`timed`: calls back to back, one sync, the second of two passes): the
    synchronised figure carries JAX's per-call synchronisation (notes 7.4) and varied by 2x
    between runs, so each of our GB/s columns is set against the copy timed the same way."""
    n = mib * (1 << 20) // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda v: v + 1.0)
    t, _, _, _, tp = timed(lambda: f(x), jax.block_until_ready, reps, warmup=1, budget_s=float("inf"))
    del x
    return dict(GBps=2 * n * 4 / t / 1e9, GBps_pipe=2 * n * 4 / tp / 1e9, bytes=2 * n * 4, seconds=t,
                seconds_pipe=tp, method="jitted x + 1.0, float32, read + write")


def dispatch_overhead_us(reps=50):
    return _median_call_s(jax.jit(lambda v: v + 1.0), jnp.zeros(8), reps) * 1e6


# --- mamba_ssm (torch) ------------------------------------------------------------------------

def load_mamba(mamba_dir, device):
    """(torch, mamba_ref module, note). torch/mamba_ref None when unavailable."""
    if not mamba_dir:
        return None, None, "mamba_ssm skipped: no --mamba-dir given"
    try:
        import torch
    except Exception as e:
        return None, None, f"mamba_ssm skipped: torch does not import ({err_str(e)})"
    if device == "cuda" and not torch.cuda.is_available():
        return torch, None, "mamba_ssm skipped: torch sees no CUDA device"
    path = os.path.abspath(mamba_dir)
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        import mamba_ref
    except Exception as e:
        return torch, None, f"mamba_ssm skipped: mamba_ref does not import from {path} ({err_str(e)})"
    if not hasattr(mamba_ref, "selective_scan_fn"):
        return torch, None, f"mamba_ssm skipped: {path}/mamba_ref.py has no selective_scan_fn"
    return torch, mamba_ref, f"mamba_ssm from {getattr(mamba_ref, '__file__', path)}"


def torch_copy_GBps(torch, device, mib, reps=20):
    n = mib * (1 << 20) // 4
    x = torch.ones(n, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        y.copy_(x)
        sync()
        ts.append(time.perf_counter() - t0)
    del x, y
    return 2 * n * 4 / median(ts) / 1e9


# --- one shape ------------------------------------------------------------------------------

class Guard:
    def __init__(self, shape_budget, run_deadline):
        self.deadline = min(time.perf_counter() + shape_budget, run_deadline)

    def left(self):
        return self.deadline - time.perf_counter()

    def expired(self):
        return self.left() <= 0


def bench_jax_impl(fn, jargs, jg, rec, opts, guard, keep):
    """Compile, measure and record one JAX implementation; returns (fwd out, grads) or Nones."""
    fwd = jax.jit(lambda *a: fn(*a, delta_softplus=True))

    def fwdbwd_fn(u, delta, A, B, C, D, z, db, g):
        out, vjp = jax.vjp(lambda *a: fn(*a, delta_softplus=True), u, delta, A, B, C, D, z, db)
        return out, vjp(g)

    out = grads = None
    budget = opts.measure_budget
    # forward
    try:
        t0 = time.perf_counter()
        lowered = fwd.lower(*jargs)
        if keep == "ours":
            rec["custom_calls"] = custom_calls(lowered)
        compiled = lowered.compile()
        rec["fwd_compile_s"] = time.perf_counter() - t0
        rec["fwd_memory"] = memory_stats(compiled)
        t, ts, first, out, pipe = timed(lambda: compiled(*jargs), jax_sync, opts.reps, opts.warmup,
                                        min(budget, max(guard.left(), 0.5)))
        rec["fwd_s"], rec["fwd_times_s"], rec["fwd_pipe_s"] = t, ts, pipe
        first = compiled = None  # free (the lambdas above capture these names)
    except Exception as e:
        rec["fwd_error"] = err_str(e)
        out = None
    # forward + backward
    if guard.expired():
        rec["fwdbwd_error"] = "skipped: shape time guard"
        return out, None
    try:
        t0 = time.perf_counter()
        lowered = jax.jit(fwdbwd_fn).lower(*jargs, jg)
        if keep == "ours":
            rec["custom_calls_fwdbwd"] = custom_calls(lowered)
        compiled = lowered.compile()
        rec["fwdbwd_compile_s"] = time.perf_counter() - t0
        rec["fwdbwd_memory"] = memory_stats(compiled)
        t, ts, first, last, pipe = timed(lambda: compiled(*jargs, jg), jax_sync, opts.reps, opts.warmup,
                                         min(budget, max(guard.left(), 0.5)))
        rec["fwdbwd_s"], rec["fwdbwd_times_s"], rec["fwdbwd_pipe_s"] = t, ts, pipe
        rec["deterministic"] = jax_bitwise_equal(first[1], last[1]) and jax_bitwise_equal([first[0]], [last[0]])
        grads = last[1]
        first = last = compiled = None
    except Exception as e:
        rec["fwdbwd_error"] = err_str(e)
    return out, grads


def bench_mamba(torch, mamba_ref, device, nargs, ng, rec, opts, guard):
    """Measure mamba_ssm's kernels on torch copies of the numpy inputs; returns numpy (out, grads)."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def to_torch(a):
        a = np.asarray(a)
        if a.dtype == np.dtype(jnp.bfloat16):
            return torch.from_numpy(a.astype(np.float32)).to(device).to(torch.bfloat16)
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    def to_numpy(t):
        return t.detach().float().cpu().numpy()

    targs = [to_torch(a) for a in nargs]
    tg = to_torch(ng)
    fn = mamba_ref.selective_scan_fn
    out_np = grads_np = None
    try:
        with torch.no_grad():
            t, ts, first, out, pipe = timed(lambda: fn(*targs, delta_softplus=True), lambda r: sync(),
                                            opts.reps, opts.warmup, min(opts.measure_budget, max(guard.left(), 0.5)))
        rec["fwd_s"], rec["fwd_times_s"], rec["fwd_pipe_s"] = t, ts, pipe
        out_np = to_numpy(out)
        first = out = None
    except Exception as e:
        rec["fwd_error"] = err_str(e)
    if guard.expired():
        rec["fwdbwd_error"] = "skipped: shape time guard"
        return out_np, None
    leaves = [a.detach().clone().requires_grad_(True) for a in targs]

    def step():
        for leaf in leaves:
            leaf.grad = None
        o = fn(*leaves, delta_softplus=True)
        o.backward(tg)
        return [leaf.grad for leaf in leaves]

    try:
        t, ts, first, last, pipe = timed(step, lambda r: sync(), opts.reps, opts.warmup,
                                         min(opts.measure_budget, max(guard.left(), 0.5)))
        rec["fwdbwd_s"], rec["fwdbwd_times_s"], rec["fwdbwd_pipe_s"] = t, ts, pipe
        rec["deterministic"] = torch_bitwise_equal(torch, first, last)
        grads_np = [to_numpy(x) for x in last]
        first = last = None
        if device == "cuda":
            for leaf in leaves:
                leaf.grad = None
            gc.collect()
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            sync()
            peak = torch.cuda.max_memory_allocated()
            args_bytes = sum(t.numel() * t.element_size() for t in leaves + [tg])
            # comparable with XLA's temp + argument + output: the inputs (8 args + g) plus
            # what one fwd+bwd allocated on top of everything already resident
            rec["fwdbwd_torch_peak_bytes"] = int(peak - base + args_bytes)
            rec["fwdbwd_torch_allocator_peak_bytes"] = int(peak)
            rec["fwdbwd_torch_resident_before_bytes"] = int(base)
    except Exception as e:
        rec["fwdbwd_error"] = err_str(e)
    leaves = targs = tg = None
    return out_np, grads_np


def bench_shape(shape, dtype_name, opts, ctx, run_deadline):
    t_start = time.perf_counter()
    guard = Guard(opts.shape_budget, run_deadline)
    itemsize = np.dtype(jnp.dtype(dtype_name)).itemsize
    entry = dict(shape=list(shape), shape_name=shape_name(shape), dtype=dtype_name,
                 fwd_bytes=fwd_bytes(shape, itemsize), impls={}, accuracy={}, ratios={}, notes=[])
    seed = int(np.prod(shape)) % 100003
    nargs, ng = make_inputs(shape, dtype_name, seed)
    entry["seed"] = seed
    entry["fwd_in_out_bytes"] = nbytes(nargs) + nbytes([ng])             # 8 args; out (shape of g)
    entry["fwdbwd_in_out_bytes"] = 2 * nbytes(nargs) + 2 * nbytes([ng])  # 8 args + g; out + 8 grads
    jargs = [jnp.asarray(a) for a in nargs]
    jg = jnp.asarray(ng)
    outs, grads = {}, {}
    impls = [i for i in IMPLS if i in opts.impls]
    for impl in impls:
        rec = entry["impls"].setdefault(impl, {})
        if guard.expired():
            rec["error"] = "skipped: shape time guard" if time.perf_counter() < run_deadline else "skipped: run time guard"
            continue
        try:
            if impl == "ours":
                outs[impl], grads[impl] = bench_jax_impl(selective_scan, jargs, jg, rec, opts, guard, "ours")
            elif impl in VARIANTS:
                with scoped_env({k: VARIANTS[impl] for k in ("JAX_SELSCAN_SS_FWD", "JAX_SELSCAN_SS_BWD")}):
                    outs[impl], grads[impl] = bench_jax_impl(selective_scan, jargs, jg, rec, opts, guard, impl)
            elif impl == "ref":
                outs[impl], grads[impl] = bench_jax_impl(selective_scan_ref, jargs, jg, rec, opts, guard, "ref")
            elif impl == "mamba":
                if ctx["mamba"] is None:
                    rec["error"] = ctx["mamba_note"]
                    continue
                outs[impl], grads[impl] = bench_mamba(ctx["torch"], ctx["mamba"], opts.torch_device,
                                                      nargs, ng, rec, opts, guard)
                if opts.torch_device == "cuda":
                    ctx["torch"].cuda.empty_cache()
        except Exception as e:
            rec["error"] = err_str(e)
            traceback.print_exc()
        gc.collect()
        for key, ceil in (("", "copy_GBps"), ("_pipe", "copy_GBps_pipe")):
            t = rec.get(f"fwd{key}_s")
            if t:
                rec[f"fwd_GBps{key}"] = entry["fwd_bytes"] / t / 1e9
                if ctx.get(ceil):
                    rec[f"fwd_frac_copy{key}"] = rec[f"fwd_GBps{key}"] / ctx[ceil]

    # accuracy: forwards against the reference evaluated in float32, and against each other
    acc = entry["accuracy"]
    try:
        ref32 = None
        if dtype_name == "float32" and outs.get("ref") is not None:
            ref32 = outs["ref"]
        elif "ref" in impls and not guard.expired():
            # the reference on the same (rounded) input values, evaluated in float32
            f32 = [a.astype(jnp.float32) for a in jargs]
            ref32 = jax.jit(lambda *a: selective_scan_ref(*a, delta_softplus=True))(*f32)
            del f32
        for impl in OURS + ("mamba", "ref"):
            if ref32 is not None and outs.get(impl) is not None:
                acc[f"{impl}_vs_ref_f32_fwd"] = rel_err(outs[impl], ref32)
        if outs.get("ours") is not None and outs.get("mamba") is not None:
            acc["ours_vs_mamba_fwd"] = rel_err(outs["ours"], outs["mamba"])
        del ref32
        for other in ("ref", "mamba"):
            if grads.get("ours") is not None and grads.get(other) is not None:
                per = {("d" + n): rel_err(a, b) for n, a, b in zip(ARG_NAMES, grads["ours"], grads[other])}
                acc[f"ours_vs_{other}_grads"] = per
                acc[f"ours_vs_{other}_grads_max"] = max(per.values())
    except Exception as e:
        acc["error"] = err_str(e)
        traceback.print_exc()

    for mine in OURS:
        ours = entry["impls"].get(mine, {})
        for other in ("mamba", "ref"):
            o = entry["impls"].get(other, {})
            for stage in ("fwd", "fwdbwd"):
                if ours.get(f"{stage}_s") and o.get(f"{stage}_s"):
                    entry["ratios"][f"{mine}_vs_{other}_{stage}"] = o[f"{stage}_s"] / ours[f"{stage}_s"]
                if ours.get(f"{stage}_pipe_s") and o.get(f"{stage}_pipe_s"):
                    entry["ratios"][f"{mine}_vs_{other}_{stage}_pipe"] = (o[f"{stage}_pipe_s"] /
                                                                          ours[f"{stage}_pipe_s"])
    del jargs, jg, outs, grads, nargs, ng
    gc.collect()
    entry["seconds_spent"] = time.perf_counter() - t_start
    return entry


# --- output ---------------------------------------------------------------------------------

def fmt_ms(s):
    return f"{s * 1e3:.3f}" if s else "-"


def fmt_x(v):
    return f"{v:.2f}x" if v else "-"


def fmt_e(v):
    return f"{v:.1e}" if v is not None else "-"


def fmt_mib(b):
    return f"{b / 2**20:.1f}" if b is not None else "-"


def write_outputs(outdir, stem, meta, results):
    data = dict(meta=meta, results=results)
    with open(os.path.join(outdir, stem + ".json"), "w") as f:
        json.dump(data, f, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    ceiling = meta.get("copy", {}).get("GBps")
    L = []
    L.append(f"# selective_scan on {meta['gpu']}\n")
    L.append(f"date {meta['date']}, commit {meta['commit']}, jax {meta['jax']}, "
             f"torch {meta.get('torch') or '-'}, jax_selscan has_cuda_kernels={meta['has_cuda_kernels']}, "
             f"command `{meta['command']}`\n")
    line = (f"copy ceiling: {ceiling:.0f} GB/s synchronised, {meta['copy'].get('GBps_pipe', 0):.0f} GB/s pipelined "
            f"({meta['copy']['method']}, {meta['copy']['bytes'] / 2**20:.0f} MiB moved)"
            if ceiling else "copy ceiling: n/a")
    if meta.get("torch_copy_GBps"):
        line += f"; torch copy_: {meta['torch_copy_GBps']:.0f} GB/s"
    line += f"; JAX dispatch of a trivial jitted call: {meta.get('dispatch_overhead_us', 0):.0f} us (not subtracted)."
    L.append(line + "\n")
    calls = sorted({c for e in results for c in (e["impls"].get("ours", {}).get("custom_calls") or [])})
    calls_b = sorted({c for e in results for c in (e["impls"].get("ours", {}).get("custom_calls_fwdbwd") or [])})
    L.append(f"ours lowers to custom calls: fwd {', '.join(calls) or 'none'}; fwd+bwd {', '.join(calls_b) or 'none'}\n")
    L.append(f"mamba: {meta.get('mamba_note')}\n")
    L.append("Times: medians of wall-clock times of synchronised single calls (warm-up first; repeats "
             f"up to {meta['reps']}). fwd+bwd = forward plus the backward for cotangent g (JAX: jit of vjp; "
             "torch: out.backward(g)). GB/s: bytes a fused forward must move (read u, delta, z, B, C; "
             "write out) over the forward time, synchronised / pipelined, and its fraction of the copy ceiling timed "
             "the same way. Ratios: the other's time over ours (> 1: ours faster). "
             f"pipelined: per-call time of calls issued back to back with one sync at the end (dispatch "
             f"overlapped with the previous call; about {PIPE_BUDGET_S * 1e3:g} ms of calls, at least the "
             f"synchronised repeats, at most {PIPE_MAX_CALLS}).\n")
    L.append("## Times\n")
    L.append("| dtype | shape (b, D, L, N) | impl | fwd ms | fwd+bwd ms | fwd ms pipelined | "
             "fwd+bwd ms pipelined | fwd GB/s (sync / pipelined) | of copy (sync / pipelined) | deterministic | note |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for e in results:
        for impl, r in e["impls"].items():
            note = r.get("error") or "; ".join(x for x in (r.get("fwd_error"), r.get("fwdbwd_error")) if x) or ""
            note = note.replace("|", "/").replace("\n", " ")[:160]
            gb = " / ".join(f"{r[k]:.0f}" if r.get(k) else "-" for k in ("fwd_GBps", "fwd_GBps_pipe"))
            fc = " / ".join(f"{r[k]:.0%}" if r.get(k) else "-" for k in ("fwd_frac_copy", "fwd_frac_copy_pipe"))
            det = {True: "yes", False: "NO"}.get(r.get("deterministic"), "-")
            L.append(f"| {e['dtype']} | {e['shape_name']} | {impl} | {fmt_ms(r.get('fwd_s'))} | "
                     f"{fmt_ms(r.get('fwdbwd_s'))} | {fmt_ms(r.get('fwd_pipe_s'))} | "
                     f"{fmt_ms(r.get('fwdbwd_pipe_s'))} | {gb} | {fc} | {det} | {note} |")
    L.append("\n## Ratios (other's time / ours)\n")
    L.append("| dtype | shape | vs mamba fwd | vs mamba fwd+bwd | vs ref fwd | vs ref fwd+bwd | "
             "pipelined: vs mamba fwd | vs mamba fwd+bwd | vs ref fwd | vs ref fwd+bwd |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in results:
        r = e["ratios"]
        cells = [fmt_x(r.get(f"ours_vs_{o}_{st}{p}")) for p in ("", "_pipe") for o in ("mamba", "ref")
                 for st in ("fwd", "fwdbwd")]
        L.append(f"| {e['dtype']} | {e['shape_name']} | " + " | ".join(cells) + " |")
    L.append("\n## Accuracy (max|a - b| / max|b|)\n")
    L.append("| dtype | shape | ours vs ref(f32) | mamba vs ref(f32) | ref vs ref(f32) | ours vs mamba | "
             "grads ours vs ref (max) | grads ours vs mamba (max) |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|")
    for e in results:
        a = e["accuracy"]
        L.append(f"| {e['dtype']} | {e['shape_name']} | {fmt_e(a.get('ours_vs_ref_f32_fwd'))} | "
                 f"{fmt_e(a.get('mamba_vs_ref_f32_fwd'))} | {fmt_e(a.get('ref_vs_ref_f32_fwd'))} | "
                 f"{fmt_e(a.get('ours_vs_mamba_fwd'))} | {fmt_e(a.get('ours_vs_ref_grads_max'))} | "
                 f"{fmt_e(a.get('ours_vs_mamba_grads_max'))} |")
    L.append("\n## Memory (MiB): XLA memory analysis of the compiled calls (temp + argument + output); "
             "torch: the inputs plus the allocator's peak growth over one fwd+bwd\n")
    L.append("| dtype | shape | impl | fwd temp | fwd total | fwd in+out | fwd+bwd temp | fwd+bwd total | "
             "fwd+bwd in+out | fwd+bwd total / in+out |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for e in results:
        for impl, r in e["impls"].items():
            fm, bm = r.get("fwd_memory", {}), r.get("fwdbwd_memory", {})
            btot = bm.get("total_bytes", r.get("fwdbwd_torch_peak_bytes"))
            ratio = f"{btot / e['fwdbwd_in_out_bytes']:.2f}" if btot else "-"
            L.append(f"| {e['dtype']} | {e['shape_name']} | {impl} | {fmt_mib(fm.get('temp_size_in_bytes'))} | "
                     f"{fmt_mib(fm.get('total_bytes'))} | {fmt_mib(e['fwd_in_out_bytes'])} | "
                     f"{fmt_mib(bm.get('temp_size_in_bytes'))} | {fmt_mib(btot)} | "
                     f"{fmt_mib(e['fwdbwd_in_out_bytes'])} | {ratio} |")
    notes = [(e["dtype"], e["shape_name"], n) for e in results for n in e.get("notes", [])]
    if notes or meta.get("notes"):
        L.append("\n## Notes\n")
        for n in meta.get("notes", []):
            L.append(f"- {n}")
        for d, s, n in notes:
            L.append(f"- {d} {s}: {n}")
    with open(os.path.join(outdir, stem + ".md"), "w") as f:
        f.write("\n".join(L) + "\n")


# --- main -----------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out", help="output folder")
    ap.add_argument("--mamba-dir", default=None, help="folder with mamba_ref.py and selective_scan_cuda*.so "
                    "(a build of mamba_ssm's selective_scan_cuda kept outside git, e.g. third_party/build_mamba.sh OUTDIR)")
    ap.add_argument("--quick", action="store_true", help="fewer repeats, only the first shape")
    ap.add_argument("--shapes", default=None, help="comma-separated BATCHxDxLxN, e.g. 2x64x128x16")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--impls", default=",".join(IMPLS), help="subset of ours,mamba,ref")
    ap.add_argument("--reps", type=int, default=None, help="timed repeats (default 20, --quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 2, --quick 1)")
    ap.add_argument("--measure-budget", type=float, default=2.5,
                    help="seconds of timed repeats per measurement at most (fewer repeats, >= 3, for slow calls)")
    ap.add_argument("--shape-budget", type=float, default=60.0, help="seconds per (shape, dtype) before skipping its rest")
    ap.add_argument("--budget", type=float, default=225.0, help="seconds for the whole run before skipping the rest")
    ap.add_argument("--copy-mib", type=int, default=None, help="MiB for the copy ceiling (default 1024 on GPU, 64 on CPU)")
    ap.add_argument("--torch-device", default="cuda", help="torch device for mamba (cuda; cpu only to test the plumbing)")
    opts = ap.parse_args(argv)
    opts.reps = opts.reps or (5 if opts.quick else 20)
    opts.warmup = opts.warmup or (1 if opts.quick else 2)
    opts.impls = tuple(i.strip() for i in opts.impls.split(",") if i.strip())
    shapes = parse_shapes(opts.shapes) if opts.shapes else (SHAPES[:1] if opts.quick else SHAPES)
    dtypes = [d.strip() for d in opts.dtypes.split(",") if d.strip()]
    os.makedirs(opts.out, exist_ok=True)
    t_run = time.perf_counter()
    run_deadline = t_run + opts.budget

    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", str(dev))
    now = datetime.datetime.now(datetime.timezone.utc)
    meta = dict(date=now.isoformat(timespec="seconds"), gpu=kind, platform=dev.platform, jax=jax.__version__,
                jaxlib=jaxlib_version(),
                jax_selscan=getattr(jax_selscan, "__version__", None), jax_selscan_file=jax_selscan.__file__,
                has_cuda_kernels=bool(jax_selscan.has_cuda_kernels), has_cpu_kernels=bool(jax_selscan.has_cpu_kernels),
                commit=git_commit(), command=" ".join([os.path.basename(sys.executable)] + sys.argv),
                host=platform.node(), python=platform.python_version(), reps=opts.reps, warmup=opts.warmup,
                shapes=[list(s) for s in shapes], dtypes=dtypes, impls=list(opts.impls), notes=[])
    stem = f"gpu_selective_scan_{gpu_slug(kind)}_{now.strftime('%Y-%m-%d')}"
    print(f"{kind} ({dev.platform}), jax {jax.__version__}, jax_selscan from {jax_selscan.__file__}, "
          f"has_cuda_kernels={jax_selscan.has_cuda_kernels}, commit {meta['commit']}", flush=True)

    ctx = {}
    copy_mib = opts.copy_mib or (1024 if dev.platform == "gpu" else 64)
    try:
        meta["copy"] = copy_ceiling(copy_mib)
        ctx["copy_GBps"], ctx["copy_GBps_pipe"] = meta["copy"]["GBps"], meta["copy"]["GBps_pipe"]
        print(f"copy ceiling {meta['copy']['GBps']:.0f} GB/s synchronised, {meta['copy']['GBps_pipe']:.0f} "
              f"pipelined ({copy_mib} MiB float32, read + write)", flush=True)
    except Exception as e:
        meta["copy"] = {"error": err_str(e)}
        meta["notes"].append(f"copy ceiling failed: {err_str(e)}")
    try:
        meta["dispatch_overhead_us"] = dispatch_overhead_us()
    except Exception as e:
        meta["notes"].append(f"dispatch overhead failed: {err_str(e)}")

    torch, mamba, note = (None, None, "mamba_ssm not requested (--impls)")
    if "mamba" in opts.impls:
        torch, mamba, note = load_mamba(opts.mamba_dir, opts.torch_device)
    ctx.update(torch=torch, mamba=mamba, mamba_note=note)
    meta["mamba_note"] = note
    print(note, flush=True)
    if torch is not None:
        meta["torch"] = torch.__version__
        meta["torch_cuda"] = getattr(torch.version, "cuda", None)
        if mamba is not None:
            meta["mamba_extension"] = getattr(mamba, "EXTENSION_FILE", None)
            try:
                meta["torch_copy_GBps"] = torch_copy_GBps(torch, opts.torch_device, copy_mib)
                torch.cuda.empty_cache() if opts.torch_device == "cuda" else None
            except Exception as e:
                meta["notes"].append(f"torch copy failed: {err_str(e)}")

    results = []
    for shape in shapes:
        for dtype_name in dtypes:
            label = f"{dtype_name:8s} {shape_name(shape):18s}"
            if time.perf_counter() > run_deadline:
                results.append(dict(shape=list(shape), shape_name=shape_name(shape), dtype=dtype_name, impls={},
                                    accuracy={}, ratios={}, fwd_bytes=0, fwd_in_out_bytes=0, fwdbwd_in_out_bytes=0,
                                    notes=["skipped: run time guard (--budget)"]))
                print(f"{label} skipped: run time guard", flush=True)
                continue
            try:
                entry = bench_shape(shape, dtype_name, opts, ctx, run_deadline)
            except Exception as e:
                traceback.print_exc()
                entry = dict(shape=list(shape), shape_name=shape_name(shape), dtype=dtype_name, impls={},
                             accuracy={}, ratios={}, fwd_bytes=0, fwd_in_out_bytes=0, fwdbwd_in_out_bytes=0,
                             notes=[f"failed: {err_str(e)}"])
            results.append(entry)
            parts = []
            for impl, r in entry["impls"].items():
                if r.get("fwd_s") or r.get("fwdbwd_s"):
                    parts.append(f"{impl} fwd {fmt_ms(r.get('fwd_s'))} ms fwd+bwd {fmt_ms(r.get('fwdbwd_s'))} ms")
                else:
                    parts.append(f"{impl}: {(r.get('error') or r.get('fwd_error') or '?')[:80]}")
            rat = entry.get("ratios", {})
            print(f"{label} " + " | ".join(parts)
                  + (f" | vs mamba {fmt_x(rat.get('ours_vs_mamba_fwd'))}/{fmt_x(rat.get('ours_vs_mamba_fwdbwd'))}"
                     if rat.get("ours_vs_mamba_fwd") else "")
                  + f" | ours err vs ref32 {fmt_e(entry.get('accuracy', {}).get('ours_vs_ref_f32_fwd'))}"
                  + f" ({entry.get('seconds_spent', 0):.0f}s)", flush=True)
            for impl, r in entry["impls"].items():
                for k in ("error", "fwd_error", "fwdbwd_error"):
                    if r.get(k):
                        print(f"    {impl} {k}: {r[k][:300]}", flush=True)
            meta["seconds"] = time.perf_counter() - t_run
            write_outputs(opts.out, stem, meta, results)
            jax.clear_caches()
            gc.collect()
            if torch is not None and opts.torch_device == "cuda":
                torch.cuda.empty_cache()
    _BASE.clear()
    meta["seconds"] = time.perf_counter() - t_run
    write_outputs(opts.out, stem, meta, results)
    print(f"wrote {os.path.join(opts.out, stem)}.{{json,md}} in {meta['seconds']:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
