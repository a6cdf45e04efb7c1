"""python -m jax_selscan.bench: benchmark jax_selscan on this machine's default JAX backend.

In one run:
  * copy bandwidth: a jitted elementwise pass (y = x + 1) over a large float32 array
    (bytes read + written per second); every scan below is also compared with an
    elementwise pass over its own arrays (same size, so the same caches), the ceiling
    that a memory-bound scan can reach at that size;
  * linear_scan vs jax.lax.associative_scan (same affine combine), float32, scanned axis
    contiguous ("rows") and strided ("strided"), over a sweep of sizes; GB/s counts the
    minimal traffic (read a and b, write h: 12 bytes per element);
  * selective_scan vs selective_scan_ref (both jitted), forward and forward+backward, at
    Mamba-like shapes (batch, D, L, N) with z, D, delta_bias, softplus and
    time-varying B, C; GB/s counts the minimal traffic of a fused kernel (forward:
    read u, delta, z, B, C, write out);
  * mamba_ssm's selective_scan_fn (PyTorch, CUDA) at the same shapes when it is importable
    and a CUDA device is visible (skipped otherwise).
Times are medians over repeats after a warm-up call. Prints tables, writes JSON (--out)
and, when matplotlib is installed, a PNG plot (--png).

    python -m jax_selscan.bench            # default sweep for this backend (minutes)
    python -m jax_selscan.bench --quick    # tiny sizes (seconds): checks that it all runs
    python -m jax_selscan.bench --full     # the full sweep (longer, larger)
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np
import jax
import jax.numpy as jnp

from . import __version__, affine_combine, linear_scan, selective_scan, selective_scan_ref
from . import _ffi

SCHEMA = 2

# --- sizes per backend and mode --------------------------------------------------------------
# linear_scan cases: (layout, channels, length); rows = (C, L) scanning axis 1 (contiguous),
# strided = (L, C) scanning axis 0. selective_scan cases: (batch, D, L, N).
SIZES = {
    "quick": {
        "copy_elems": 1 << 20,
        "linear_scan": [("rows", 64, 1024), ("strided", 64, 1024)],
        "selective_scan": [(1, 32, 128, 4)],
    },
    "cpu": {
        "copy_elems": 1 << 24,
        "linear_scan": [(lay, c, l) for lay in ("rows", "strided")
                        for c, l in ((256, 1024), (256, 8192), (16, 1 << 16))],
        "selective_scan": [(2, 128, 512, 16), (2, 256, 1024, 16)],
    },
    "cpu_full": {
        "copy_elems": 1 << 26,
        "linear_scan": [(lay, c, l) for lay in ("rows", "strided")
                        for c, l in ((256, 1024), (256, 8192), (1024, 8192), (16, 1 << 16),
                                     (1, 1 << 22))],
        "selective_scan": [(2, 128, 512, 16), (2, 256, 1024, 16), (4, 512, 2048, 16)],
    },
    "gpu": {
        "copy_elems": 1 << 28,
        "linear_scan": [(lay, c, l) for lay in ("rows", "strided")
                        for c, l in ((4096, 4096), (2048, 12288), (256, 1 << 16))],
        "selective_scan": [(8, 1536, 2048, 16), (4, 2048, 4096, 16)],
    },
    "gpu_full": {
        "copy_elems": 1 << 28,
        "linear_scan": [(lay, c, l) for lay in ("rows", "strided")
                        for c, l in ((1024, 1024), (4096, 4096), (2048, 12288), (256, 1 << 16),
                                     (1, 1 << 22), (16384, 4096))],
        "selective_scan": [(8, 768, 1024, 16), (8, 1536, 2048, 16), (4, 2048, 4096, 16),
                           (2, 2560, 8192, 16)],
    },
}


# --- progress bar (stderr; no dependency) ----------------------------------------------------

class Progress:
    def __init__(self, total, enabled=True, width=28):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def step(self, label):
        """Show `label` as the item now running (the bar shows the items finished)."""
        if not self.enabled:
            return
        frac = self.done / self.total
        fill = int(round(frac * self.width))
        bar = "#" * fill + "." * (self.width - fill)
        line = (f"[{bar}] {self.done:3d}/{self.total} {time.perf_counter() - self.t0:6.1f}s "
                f"{label}")
        if self.tty:
            sys.stderr.write("\r" + line[:150].ljust(150))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.done += 1

    def close(self):
        if self.enabled:
            self.done = self.total
            self.step("done")
            if self.tty:
                sys.stderr.write("\n")


# --- timing ------------------------------------------------------------------------------------

@contextlib.contextmanager
def scoped_env(env, clear=()):
    """Environment variables set (and those named in `clear` removed) for the block, then
    restored: the kernels' knobs (JAX_SELSCAN_SS_*) are read per call and at trace time."""
    old = {k: os.environ.get(k) for k in (*clear, *env)}
    for k in clear:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# Pipelined timing (accelerators): each measurement issues calls back to back and synchronises
# once, so that dispatch and the host's wake-up from the final wait (150-560 us a call on the
# H200, docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md section 19.3) hide behind the device's work. About
# this long per measurement, in at most this many calls, whose outputs (allocated until the
# calls have run) take at most an eighth of the device's memory (2 GiB where it is not known).
PIPE_S = 0.02
PIPE_MAX_CALLS = 100


def _pipe_max_bytes():
    try:
        limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    except Exception:  # noqa: BLE001 -- backends without memory statistics
        limit = None
    return limit // 8 if limit else 2 << 30


def median_time(fn, *args, repeats, min_time=0.0, pipeline=False):
    """Median seconds per call of fn(*args) after a warm-up (compile) call; at least `repeats`
    measurements, more (up to 1000) until `min_time` seconds have been spent timing. With
    `pipeline`, a measurement is K calls back to back and one synchronisation (K from a second
    warm-up call's time, see PIPE_S); without, K = 1 (each call synchronised)."""
    jax.block_until_ready(fn(*args))
    calls = 1
    if pipeline:
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        out_bytes = sum(getattr(x, "nbytes", 0) for x in jax.tree.leaves(out))
        calls = max(1, int(min(PIPE_MAX_CALLS, _pipe_max_bytes() // max(out_bytes, 1),
                               PIPE_S / max(time.perf_counter() - t0, 1e-6))))
    times = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_time and len(times) < 1000):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / calls)
        out = None
    return float(np.median(times))


def _try(fn, *args, **kw):
    """median_time, or the error message (an out-of-memory on the reference, say)."""
    try:
        return median_time(fn, *args, **kw), None
    except Exception as e:  # noqa: BLE001 -- reported in the table and the JSON
        msg = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return None, msg


# --- the measurements --------------------------------------------------------------------------

def copy_bandwidth(n, repeats, min_time, pipeline=False):
    x = jax.random.normal(jax.random.PRNGKey(123), (n,), jnp.float32)
    t = median_time(jax.jit(lambda x: x + 1.0), x, repeats=repeats, min_time=min_time,
                    pipeline=pipeline)
    nbytes = 2 * x.size * 4
    return {"elements": n, "bytes": nbytes, "ms": t * 1e3, "GBps": nbytes / t / 1e9}


def bench_linear_scan(cases, repeats, min_time, copy_gbps, progress, pipeline=False):
    rows = []
    for i, (layout, channels, length) in enumerate(cases):
        shape, axis = ((channels, length), 1) if layout == "rows" else ((length, channels), 0)
        name = f"{layout} C={channels} L={length}"
        key_a, key_b = jax.random.split(jax.random.PRNGKey(i))
        a = jax.random.uniform(key_a, shape, jnp.float32, 0.5, 1.0)
        b = jax.random.normal(key_b, shape, jnp.float32)
        nbytes = 3 * a.size * 4
        fns = {
            "elementwise": jax.jit(lambda a, b: a * b),     # same traffic: the ceiling here
            "jax_selscan": jax.jit(lambda a, b: linear_scan(a, b, axis=axis)),
            "lax.associative_scan": jax.jit(
                lambda a, b: jax.lax.associative_scan(affine_combine, (a, b), axis=axis)[1]),
        }
        ms, errors = {}, {}
        for impl, f in fns.items():
            progress.step(f"linear_scan {name}: {impl}")
            t, err = _try(f, a, b, repeats=repeats, min_time=min_time, pipeline=pipeline)
            ms[impl] = None if t is None else t * 1e3
            if err:
                errors[impl] = err
        ours, lax_ms = ms["jax_selscan"], ms["lax.associative_scan"]
        gbps = {k: (nbytes / (v / 1e3) / 1e9 if v else None) for k, v in ms.items()}
        ew = gbps["elementwise"]
        rows.append({
            "case": name, "layout": layout, "shape": list(shape), "axis": axis,
            "dtype": "float32", "bytes": nbytes, "ms": ms, "GBps": gbps,
            "fraction_of_elementwise": {k: (v / ew if v and ew else None)
                                        for k, v in gbps.items()},
            "fraction_of_copy": {k: (v / copy_gbps if v else None) for k, v in gbps.items()},
            "speedup_vs_associative_scan": (lax_ms / ours if ours and lax_ms else None),
            "errors": errors,
        })
    return rows


def _selective_inputs(batch, dim, length, dstate, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 8)
    f32 = jnp.float32
    return dict(
        u=jax.random.normal(k[0], (batch, dim, length), f32),
        delta=jax.random.normal(k[1], (batch, dim, length), f32) * 0.5 - 1.0,
        A=-jnp.exp(jax.random.normal(k[2], (dim, dstate), f32) * 0.5),
        B=jax.random.normal(k[3], (batch, dstate, length), f32),
        C=jax.random.normal(k[4], (batch, dstate, length), f32),
        D=jax.random.normal(k[5], (dim,), f32),
        z=jax.random.normal(k[6], (batch, dim, length), f32),
        delta_bias=jax.random.normal(k[7], (dim,), f32) * 0.1,
    )


def _selective_fns(scan):
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")

    def fwd(*xs):
        return scan(*xs[:5], D=xs[5], z=xs[6], delta_bias=xs[7], delta_softplus=True)

    def loss(*xs):
        return jnp.sum(fwd(*xs) * xs[-1])          # last arg: the output cotangent

    grad = jax.grad(loss, argnums=tuple(range(len(names))))
    return jax.jit(fwd), jax.jit(grad), names


def selective_scan_bytes(batch, dim, length, dstate, itemsize=4):
    """Minimal traffic of a fused kernel: forward reads u, delta, z, B, C and writes out
    (small D/N-sized arrays ignored); backward additionally reads them and dout and
    writes du, ddelta, dz, dB, dC."""
    bdl, bnl = batch * dim * length, batch * dstate * length
    fwd = (4 * bdl + 2 * bnl) * itemsize
    bwd = (4 * bdl + 2 * bnl + 3 * bdl + 2 * bnl) * itemsize
    return fwd, fwd + bwd


def _mamba_ssm_available():
    if importlib.util.find_spec("mamba_ssm") is None or importlib.util.find_spec("torch") is None:
        return False, "mamba_ssm not importable"
    try:
        import torch
        if not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return False, f"mamba_ssm import failed: {type(e).__name__}: {e}"
    return True, None


def _mamba_ssm_times(inputs, repeats):
    """(forward ms, forward+backward ms) of mamba_ssm's selective_scan_fn, CUDA events."""
    import torch
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    t = {k: torch.from_dlpack(np.asarray(v).copy()).cuda() for k, v in inputs.items()}
    grads = {k: v.clone().requires_grad_(True) for k, v in t.items()}
    dout = torch.randn_like(t["u"])

    def fwd(x):
        return selective_scan_fn(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], z=x["z"],
                                 delta_bias=x["delta_bias"], delta_softplus=True)

    def fwd_bwd():
        out = fwd(grads)
        torch.autograd.grad(out, list(grads.values()), dout)

    res = []
    for f in (lambda: fwd(t), fwd_bwd):
        with torch.no_grad() if f is not fwd_bwd else torch.enable_grad():
            f()
            torch.cuda.synchronize()
            ms = []
            for _ in range(repeats):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                f()
                e.record()
                torch.cuda.synchronize()
                ms.append(s.elapsed_time(e))
        res.append(float(np.median(ms)))
    return res


def bench_selective_scan(cases, repeats, min_time, copy_gbps, progress, with_mamba_ssm,
                         pipeline=False):
    rows = []
    ours_fwd, ours_grad, _ = _selective_fns(selective_scan)
    ref_fwd, ref_grad, _ = _selective_fns(selective_scan_ref)
    for i, (batch, dim, length, dstate) in enumerate(cases):
        inputs = _selective_inputs(batch, dim, length, dstate, seed=100 + i)
        args = list(inputs.values())
        dout = jax.random.normal(jax.random.PRNGKey(7 + i), (batch, dim, length), jnp.float32)
        fwd_bytes, total_bytes = selective_scan_bytes(batch, dim, length, dstate)
        name = f"b={batch} D={dim} L={length} N={dstate}"
        ms, errors = {}, {}
        progress.step(f"selective_scan {name}: elementwise")
        t, err = _try(jax.jit(lambda u, d, z: u * d + z), inputs["u"], inputs["delta"],
                      inputs["z"], repeats=repeats, min_time=min_time, pipeline=pipeline)
        ew_gbps = 16 * batch * dim * length / t / 1e9 if t else None
        for key, f, xs in (("ours_fwd", ours_fwd, args), ("ref_fwd", ref_fwd, args),
                           ("ours_fwd_bwd", ours_grad, args + [dout]),
                           ("ref_fwd_bwd", ref_grad, args + [dout])):
            progress.step(f"selective_scan {name}: {key}")
            t, err = _try(f, *xs, repeats=repeats, min_time=min_time, pipeline=pipeline)
            ms[key] = None if t is None else t * 1e3
            if err:
                errors[key] = err
        if with_mamba_ssm:
            progress.step(f"selective_scan {name}: mamba_ssm")
            try:
                ms["mamba_ssm_fwd"], ms["mamba_ssm_fwd_bwd"] = _mamba_ssm_times(inputs, repeats)
            except Exception as e:  # noqa: BLE001
                errors["mamba_ssm"] = f"{type(e).__name__}: {e}"[:200]
        gbps = {k: ((fwd_bytes if k.endswith("_fwd") else total_bytes) / (v / 1e3) / 1e9
                    if v else None) for k, v in ms.items()}
        sp = lambda a, b: (ms[a] / ms[b] if ms.get(a) and ms.get(b) else None)
        rows.append({
            "case": name, "batch": batch, "D": dim, "L": length, "N": dstate, "dtype": "float32",
            "options": "z, D, delta_bias, delta_softplus, B/C (batch, N, L)",
            "bytes_fwd": fwd_bytes, "bytes_fwd_bwd": total_bytes, "ms": ms, "GBps": gbps,
            "elementwise_GBps": ew_gbps,
            "fraction_of_elementwise": {k: (v / ew_gbps if v and ew_gbps else None)
                                        for k, v in gbps.items()},
            "fraction_of_copy": {k: (v / copy_gbps if v else None) for k, v in gbps.items()},
            "speedup_vs_ref": {"fwd": sp("ref_fwd", "ours_fwd"),
                               "fwd_bwd": sp("ref_fwd_bwd", "ours_fwd_bwd")},
            "speedup_vs_mamba_ssm": {"fwd": sp("mamba_ssm_fwd", "ours_fwd"),
                                     "fwd_bwd": sp("mamba_ssm_fwd_bwd", "ours_fwd_bwd")},
            "errors": errors,
        })
    return rows


# --- machine description -------------------------------------------------------------------------

def _git_commit():
    """HEAD of the repository this file runs from; None for an installed copy, unless
    JAX_SELSCAN_COMMIT names the commit it was built from (set by scripts that install)."""
    if os.environ.get("JAX_SELSCAN_COMMIT"):
        return os.environ["JAX_SELSCAN_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=here,
                             capture_output=True, text=True, check=True, timeout=10).stdout.strip()
        if os.path.realpath(os.path.join(top, "jax_selscan")) != os.path.realpath(here):
            return None                     # an installed copy inside some other repository
        return sha
    except Exception:  # noqa: BLE001
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    devs = jax.devices()
    info = {
        "backend": jax.default_backend(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "devices": [getattr(d, "device_kind", str(d)) for d in devs],
        "device_count": len(devs),
    }
    if info["backend"] != "cpu":
        info["gpu_name"] = getattr(devs[0], "device_kind", str(devs[0]))
    return info


def describe(info):
    if info["backend"] == "cpu":
        return f"CPU: {info['cpu_model']} ({info['cpu_cores']} cores)"
    return f"{info['backend'].upper()}: {info['gpu_name']} (x{info['device_count']})"


# --- output ------------------------------------------------------------------------------------

def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def print_tables(result, file=sys.stdout):
    p = lambda *a: print(*a, file=file)
    m = result["machine"]
    p(f"\njax_selscan {result['jax_selscan']} | jax {result['jax']} | {describe(m)} | "
      f"kernels: cpu={result['kernels']['cpu']} cuda={result['kernels']['cuda']} | "
      f"commit {result['commit'] or 'unknown'}")
    c = result["copy"]
    p(f"copy bandwidth (y = x + 1, {c['elements']} float32): {c['GBps']:.1f} GB/s")
    if result.get("timing") == "pipelined":
        p("timing: pipelined (each measurement: calls back to back, one sync; per call)")
    p("\nlinear_scan (float32), median ms; GB/s = 12 bytes/element; % elem = of an elementwise "
      "a*b on the same arrays (same traffic); % copy = of the copy bandwidth above")
    p(f"{'case':28s} {'ours ms':>9s} {'GB/s':>8s} {'% elem':>7s} {'% copy':>7s} {'lax ms':>9s} "
      f"{'lax GB/s':>9s} {'speed-up':>9s}")
    for r in result["linear_scan"]:
        ms, gb, fr = r["ms"], r["GBps"], r["fraction_of_copy"]
        fe = r.get("fraction_of_elementwise", {})
        ours, lax_ = "jax_selscan", "lax.associative_scan"
        p(f"{r['case']:28s} {_f(ms[ours], '9.3f')} {_f(gb[ours], '8.1f')} "
          f"{_f(fe.get(ours) and 100 * fe[ours], '6.0f')}% "
          f"{_f(fr[ours] and 100 * fr[ours], '6.0f')}% {_f(ms[lax_], '9.3f')} "
          f"{_f(gb[lax_], '9.1f')} {_f(r['speedup_vs_associative_scan'], '8.2f')}x")
    p("\nselective_scan vs selective_scan_ref (float32, jitted), median ms; GB/s = minimal "
      "fused-kernel traffic; % elem = of an elementwise u*delta+z pass over the same inputs")
    has_m = any("mamba_ssm_fwd" in r["ms"] for r in result["selective_scan"])
    head = (f"{'case':28s} {'pass':8s} {'ours ms':>9s} {'GB/s':>7s} {'% elem':>7s} {'% copy':>7s} "
            f"{'ref ms':>9s} {'speed-up':>9s}")
    p(head + (f" {'mamba_ssm ms':>13s}" if has_m else ""))
    for r in result["selective_scan"]:
        for ps in ("fwd", "fwd_bwd"):
            ms, gb, fr = r["ms"], r["GBps"], r["fraction_of_copy"]
            fe = r.get("fraction_of_elementwise", {})
            o = f"ours_{ps}"
            line = (f"{r['case']:28s} {ps:8s} {_f(ms.get(o), '9.3f')} {_f(gb.get(o), '7.1f')} "
                    f"{_f(fe.get(o) and 100 * fe[o], '6.1f')}% "
                    f"{_f(fr.get(o) and 100 * fr[o], '6.1f')}% {_f(ms.get('ref_' + ps), '9.3f')} "
                    f"{_f(r['speedup_vs_ref'][ps], '8.2f')}x")
            if has_m:
                line += f" {_f(ms.get('mamba_ssm_' + ps), '13.3f')}"
            p(line)
        for k, e in r["errors"].items():
            p(f"    {k}: {e}")
    if result.get("mamba_ssm_skipped"):
        p(f"mamba_ssm: skipped ({result['mamba_ssm_skipped']})")


def plot(result, path):
    """Two panels: linear_scan GB/s (ours, lax, copy line) and selective_scan times."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    ls = result["linear_scan"]
    x = np.arange(len(ls))
    impls = [("jax_selscan", "jax_selscan.linear_scan"),
             ("lax.associative_scan", "lax.associative_scan")]
    if all("elementwise" in r["GBps"] for r in ls):
        impls.append(("elementwise", "elementwise a*b, same arrays"))
    w = 0.8 / len(impls)
    for j, (impl, lab) in enumerate(impls):
        ax1.bar(x + (j - (len(impls) - 1) / 2) * w, [r["GBps"][impl] or 0 for r in ls], w,
                label=lab)
    ax1.axhline(result["copy"]["GBps"], color="k", ls="--", lw=1,
                label="copy bandwidth (large array)")
    ax1.set_xticks(x, [r["case"] for r in ls], rotation=30, ha="right", fontsize=7)
    ax1.set_ylabel("GB/s (12 bytes / element)")
    ax1.set_title("linear_scan, float32")
    ax1.legend(fontsize=8)
    ss = result["selective_scan"]
    labels, keys = [], [("ours_fwd", "ours fwd"), ("ref_fwd", "ref fwd"),
                         ("ours_fwd_bwd", "ours fwd+bwd"), ("ref_fwd_bwd", "ref fwd+bwd")]
    if any("mamba_ssm_fwd" in r["ms"] for r in ss):
        keys += [("mamba_ssm_fwd", "mamba_ssm fwd"), ("mamba_ssm_fwd_bwd", "mamba_ssm fwd+bwd")]
    x = np.arange(len(ss))
    w = 0.8 / len(keys)
    for j, (k, lab) in enumerate(keys):
        ax2.bar(x + (j - (len(keys) - 1) / 2) * w, [r["ms"].get(k) or 0 for r in ss], w, label=lab)
        labels.append(lab)
    ax2.set_xticks(x, [r["case"] for r in ss], rotation=15, ha="right", fontsize=7)
    ax2.set_yscale("log")
    ax2.set_ylabel("ms (median)")
    ax2.set_title("selective_scan vs selective_scan_ref, float32")
    ax2.legend(fontsize=7)
    fig.suptitle(f"jax_selscan bench, {describe(result['machine'])}, {result['date'][:10]}, "
                 f"commit {(result['commit'] or 'unknown')[:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --- main --------------------------------------------------------------------------------------

def run(mode="default", repeats=None, min_time=None, progress=True, mamba_ssm=True):
    """Run the benchmark; returns the result dict (what --out writes)."""
    backend = jax.default_backend()
    if mode == "quick":
        sizes = SIZES["quick"]
    else:
        family = "cpu" if backend == "cpu" else "gpu"
        sizes = SIZES[family + ("_full" if mode == "full" else "")]
    repeats = repeats or (3 if mode == "quick" else 10)
    min_time = 0.0 if mode == "quick" else (0.5 if min_time is None else min_time)
    with_m, why = (_mamba_ssm_available() if mamba_ssm and backend != "cpu"
                   else (False, "not a CUDA backend" if mamba_ssm else "disabled (--no-mamba-ssm)"))
    n_items = (1 + 3 * len(sizes["linear_scan"])
               + (5 + with_m) * len(sizes["selective_scan"]))
    bar = Progress(n_items, enabled=progress)
    bar.step("copy bandwidth")
    pipeline = backend != "cpu"   # see PIPE_S; on the CPU a call's work is the host's anyway
    copy = copy_bandwidth(sizes["copy_elems"], repeats, min_time, pipeline)
    result = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "jax": jax.__version__,
        "jaxlib": getattr(__import__("jaxlib"), "__version__", None),
        "jax_selscan": __version__,
        "kernels": {"cpu": _ffi.HAS_CPU, "cuda": _ffi.HAS_CUDA},
        "commit": _git_commit(),
        "command": " ".join([os.path.basename(sys.executable), "-m", "jax_selscan.bench"]
                            + sys.argv[1:]) if sys.argv and sys.argv[0].endswith("bench.py")
                   else " ".join(sys.argv),
        "mode": mode, "repeats": repeats, "min_time_s": min_time,
        "timing": "pipelined" if pipeline else "synchronised",
        "copy": copy,
    }
    result["linear_scan"] = bench_linear_scan(sizes["linear_scan"], repeats, min_time,
                                              copy["GBps"], bar, pipeline)
    result["selective_scan"] = bench_selective_scan(sizes["selective_scan"], repeats, min_time,
                                                    copy["GBps"], bar, with_m, pipeline)
    if not with_m:
        result["mamba_ssm_skipped"] = why
    bar.close()
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m jax_selscan.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="tiny sizes, 3 repeats (seconds)")
    mode.add_argument("--full", action="store_true", help="the full sweep (larger sizes)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per measurement")
    ap.add_argument("--min-time", type=float, default=None,
                    help="keep timing each measurement for at least this many seconds")
    ap.add_argument("--out", default="jax_selscan_bench.json", help="JSON results file")
    ap.add_argument("--png", default=None,
                    help="plot file (default: --out with .png); needs matplotlib")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--no-mamba-ssm", action="store_true", help="do not time mamba_ssm")
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "full" if args.full else "default"
    result = run(mode, args.repeats, args.min_time, progress=not args.no_progress,
                 mamba_ssm=not args.no_mamba_ssm)
    print_tables(result)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}")
    if not args.no_plot:
        png = args.png or os.path.splitext(args.out)[0] + ".png"
        if plot(result, png):
            print(f"wrote {png}")
        else:
            print("matplotlib not installed: no plot")
    return result


if __name__ == "__main__":
    main()
