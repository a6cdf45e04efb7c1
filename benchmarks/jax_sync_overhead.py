"""Where the synchronised time of a jitted call goes beyond its device time, on a GPU: is it
the selective-scan handler or the GPU's clock between calls? Controls: a compute-bound
plain-JAX kernel of similar length; ours called twice in one jit; the SM clock sampled by
nvidia-smi during the synchronised and the pipelined loops (part 1, fp32). Then the host time
until a jitted call returns (dispatch) against its total, fp32 and bf16, for ours, a plain
elementwise function of the same arguments and a trivial call (part 2). Part 3: how the host
waits, side by side per call: `jax.block_until_ready`, or spinning on `Array.is_ready()` (a
public method), for our forward, our forward + backward, the jitted reference and the
compute-bound plain kernel, beside the pipelined time; with `--spinners K`, again while K
lowest-priority busy loops keep the host's cores out of their idle states (a test of whether
the waiting threads' wake-up from idle is what costs). Shape (8, 1536, 2048, 16).

    python3 -P benchmarks/jax_sync_overhead.py [--parts 1,2,3] [--spinners K]   (GPU machine)

Results: benchmarks/results/jax_sync_overhead_h200_2026-11-30.txt (parts 1-2) and
..._2026-12-03_session23.txt (part 3); discussed in docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md
sections 7.4 and 19.3."""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp

import jax_selscan as js

SHAPE = tuple(int(x) for x in os.environ.get("SYNC_SHAPE", "8,1536,2048,16").split(","))  # a smoke test: smaller


def make_args(dtype):
    """(u, delta, A, B, C, D, z, delta_bias) at SHAPE; activations in `dtype`, A/D/bias fp32."""
    b, D, L, N = SHAPE
    k = jax.random.split(jax.random.PRNGKey(0), 8)
    act = lambda x: x.astype(dtype)
    return (act(jax.random.normal(k[0], (b, D, L))),
            act(jax.random.normal(k[1], (b, D, L)) * 0.5 - 1.0),
            -jnp.exp(jax.random.normal(k[5], (D, N)) * 0.5),
            act(jax.random.normal(k[3], (b, N, L))),
            act(jax.random.normal(k[4], (b, N, L))),
            jax.random.normal(k[6], (D,)),
            act(jax.random.normal(k[2], (b, D, L))),
            jax.random.uniform(k[7], (D,)) * 0.5)


def scan(*a):
    return js.selective_scan(*a, delta_softplus=True)


def heavy_plain(u, d, *rest):  # compute-bound plain XLA, about as long as four of our calls
    x = u
    for _ in range(48):
        x = jnp.sin(x * 1.0001 + d)
    return x


class Clock:
    """SM clock samples from nvidia-smi every 20 ms while alive."""

    def __init__(self):
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits", "-lms", "20"],
                                  stdout=subprocess.PIPE, text=True)
        self.vals = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            try:
                self.vals.append(int(line.strip()))
            except ValueError:
                pass

    def stop(self):
        self.p.terminate()
        time.sleep(0.05)
        return self.vals


def pipelined_s(c, args, seconds=None, n=None):
    """Per-call seconds of back-to-back calls (for `seconds`, or `n` calls), one sync at the end."""
    count, t0 = 0, time.perf_counter()
    while (n is not None and count < n) or (seconds is not None and time.perf_counter() - t0 < seconds):
        r = c(*args)
        count += 1
    jax.block_until_ready(r)
    return (time.perf_counter() - t0) / count


def part1():
    args = make_args(jnp.float32)
    fns = (("ours", jax.jit(scan)),
           ("ours_twice", jax.jit(lambda u, *rest: scan(scan(u, *rest), *rest))),
           ("heavy_plain", jax.jit(heavy_plain)))
    med = lambda v: statistics.median(v) if v else -1
    for name, f in fns:
        c = f.lower(*args).compile()
        for _ in range(5):
            jax.block_until_ready(c(*args))
        ck = Clock()
        time.sleep(0.1)
        tt, t_end = [], time.perf_counter() + 1.5
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            tt.append(time.perf_counter() - t0)
        v_sync = ck.stop()
        ck = Clock()
        time.sleep(0.1)
        tp = pipelined_s(c, args, seconds=1.5)
        v_pipe = ck.stop()
        print(f"{name:12s} sync {statistics.median(tt)*1e6:7.1f} us (n={len(tt)})  pipelined {tp*1e6:7.1f} us  "
              f"SM clock MHz sync median {med(v_sync)} min {min(v_sync, default=-1)} | "
              f"pipelined median {med(v_pipe)} min {min(v_pipe, default=-1)}", flush=True)


def part2():
    for dtn in ("float32", "bfloat16"):
        args = make_args(jnp.dtype(dtn))
        x8 = jnp.zeros(8)
        cases = (("ours", jax.jit(scan), args),
                 ("plain_elementwise", jax.jit(lambda u, d, A, B, C, Dk, z, bi: (u * d + z).astype(u.dtype)), args),
                 ("trivial", jax.jit(lambda x: x + 1.0), (x8,)))
        for name, f, a in cases:
            c = f.lower(*a).compile()
            for _ in range(5):
                jax.block_until_ready(c(*a))
            td, tt = [], []
            for _ in range(50):
                t0 = time.perf_counter()
                r = c(*a)
                t1 = time.perf_counter()
                jax.block_until_ready(r)
                td.append(t1 - t0)
                tt.append(time.perf_counter() - t0)
            tp = pipelined_s(c, a, n=50)
            print(f"{dtn:9s} {name:18s} dispatch {statistics.median(td)*1e6:7.1f} us  total "
                  f"{statistics.median(tt)*1e6:7.1f} us  pipelined {tp*1e6:7.1f} us", flush=True)


def wait_poll(r):
    """Spin until every leaf of r is ready (Array.is_ready), then block (a no-op by then)."""
    leaves = jax.tree_util.tree_leaves(r)
    while not all(x.is_ready() for x in leaves):
        pass
    return jax.block_until_ready(r)


def idle_states():
    """The host's cpuidle states of CPU 0 (name: exit latency us), read-only; '' if hidden."""
    import glob
    out = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cpuidle/state*")):
        try:
            name = open(d + "/name").read().strip()
            lat = open(d + "/latency").read().strip()
            out.append(f"{name}:{lat}us")
        except OSError:
            pass
    return " ".join(out)


def part3(label=""):
    for dtn in ("float32", "bfloat16"):
        args = make_args(jnp.dtype(dtn))
        def fwd_bwd(*a):  # every gradient, as the package benchmark's fwd+bwd
            y, vjp = jax.vjp(scan, *a)
            return y, vjp(jnp.ones_like(y))
        ref = lambda *a: js.selective_scan_ref(*a, delta_softplus=True)
        cases = (("ours_fwd", scan), ("ours_fwd_bwd", fwd_bwd), ("ref_fwd", ref), ("heavy_plain", heavy_plain))
        for name, f in cases:
            c = jax.jit(f).lower(*args).compile()
            for _ in range(5):
                jax.block_until_ready(c(*args))
            res = {}
            for _round in range(2):  # the two waits interleaved, twice, against drift
                for wname, wait in (("block_until_ready", jax.block_until_ready), ("poll_is_ready", wait_poll)):
                    tt, t_end = [], time.perf_counter() + 0.4
                    while time.perf_counter() < t_end or len(tt) < 20:
                        t0 = time.perf_counter()
                        wait(c(*args))
                        tt.append(time.perf_counter() - t0)
                    res.setdefault(wname, []).extend(tt)
            tp = pipelined_s(c, args, seconds=0.5)
            med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
            print(f"{label}{dtn:9s} {name:13s} block_until_ready {med['block_until_ready']:8.1f} us  poll_is_ready "
                  f"{med['poll_is_ready']:8.1f} us  pipelined {tp*1e6:8.1f} us  (n={len(res['poll_is_ready'])})", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--spinners", type=int, default=0, help="part 3 again beside this many nice-19 busy loops")
    opt = ap.parse_args()
    parts = opt.parts.split(",")
    print(f"# jax {jax.__version__}, {jax.devices()[0].device_kind}, shape {SHAPE}, host cores {os.cpu_count()}, "
          f"cpuidle states of cpu0: {idle_states() or 'not readable'}", flush=True)
    for k, fn in (("1", part1), ("2", part2), ("3", part3)):
        if k in parts:
            fn()
    if "3" in parts and opt.spinners > 0:
        # `nice` execs the loop (no Python code between fork and exec: JAX is multithreaded)
        spin = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"], close_fds=False)
                for _ in range(opt.spinners)]
        try:
            time.sleep(0.5)
            part3(label=f"[{opt.spinners} spinners] ")
        finally:
            for q in spin:
                q.kill()
