"""The arithmetic of `benchmarks/cpu_selective_scan_scaling.py --copies` on hand-made timings:
the balanced time is k over the sum of the copies' rates (not their median), and the kernel's
share of the ceiling does not depend on the 1-thread time."""
import importlib.util
import math
import pathlib

_PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_selective_scan_scaling.py"
_spec = importlib.util.spec_from_file_location("cpu_selective_scan_scaling", _PATH)
scaling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaling)

SHAPE = dict(batch=2, D=2048, L=8192, N=16)


def rows(t1, t4):
    out = []
    for k, t in ((1, t1), (4, t4)):
        out.append(dict(shape=SHAPE, threads=k, kernel_ms=t, speedup_vs_1=t1 / t, kernel_GBps=1.0,
                        elementwise_GBps=2.0, bound_ms=1.0, fraction_of_bound=0.5))
    return out


def ceiling(times):
    return dict(shape=SHAPE, threads=len(times), share_alone_ms=10.0, share_together_ms=sorted(times)[1],
                share_together_max_ms=max(times), share_together_all_ms=list(times), contention=1.0)


def test_balanced_time_is_k_over_the_summed_rates():
    c = ceiling([10.0, 20.0, 20.0, 40.0])  # rates 0.1 + 0.05 + 0.05 + 0.025 = 0.225 per ms
    scaling.add_ceilings(rows(100.0, 25.0), [c])
    assert math.isclose(c["balanced_ms"], 4 / 0.225)
    assert math.isclose(c["ceiling_speedup"], 100.0 / (4 / 0.225))
    assert math.isclose(c["of_ceiling"], (4 / 0.225) / 25.0)
    assert c["kernel_ms"] == 25.0 and math.isclose(c["kernel_speedup"], 4.0)


def test_share_of_the_ceiling_ignores_the_one_thread_time():
    a, b = ceiling([12.0, 18.0, 24.0, 12.0]), ceiling([12.0, 18.0, 24.0, 12.0])
    scaling.add_ceilings(rows(190.0, 30.0), [a])
    scaling.add_ceilings(rows(300.0, 30.0), [b])
    assert a["of_ceiling"] == b["of_ceiling"]
    assert a["ceiling_speedup"] < b["ceiling_speedup"]


def test_markdown_has_the_ceiling_table():
    r = rows(100.0, 25.0)
    c = ceiling([10.0, 10.0, 10.0, 10.0])
    scaling.add_ceilings(r, [c])
    meta = dict(date="d", machine="m", commit="c", jax="j", command="x", note="n")
    md = scaling.markdown(dict(meta=meta, rows=r, ceilings=[c]))
    line = [s for s in md.splitlines() if s.startswith("| 2, 2048, 8192, 16 | 4 | 10.00")]
    # balanced 10 ms: ceiling 100 / 10 = 10x; the kernel's 25 ms reaches 10 / 25 = 0.40 of it
    assert len(line) == 1 and "| 10.00x |" in line[0] and line[0].endswith("| 0.40 | — |")
    # the copies' page faults per call, where the run counted them
    md = scaling.markdown(dict(meta=meta, rows=r, ceilings=[dict(c, faults_per_call=3.2)]))
    assert [s for s in md.splitlines() if s.startswith("| 2, 2048, 8192, 16 | 4 | 10.00")][0].endswith("| 0.40 | 3 |")


def test_allocator_settings_of_the_children():
    """--fresh-copies reaches the copies only (the kernel keeps glibc's defaults, which it is
    compared under); --keep-mapped reaches every child and wins over --fresh-copies."""
    fresh = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
    keep = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(64 << 30)}
    assert scaling.allocator_env(False, True, is_copy=True) == fresh
    assert scaling.allocator_env(False, True, is_copy=False) == {}
    assert scaling.allocator_env(False, False, is_copy=True) == {}
    for copy in (False, True):
        assert scaling.allocator_env(True, False, is_copy=copy) == keep
        assert scaling.allocator_env(True, True, is_copy=copy) == keep


def test_threads_probe_accounts_cpu_time_per_thread():
    """The probe's per-call accounting (schedstat): a call that spins 20 ms on this thread shows
    this thread busy for about that long per call, on a wall time at least as long."""
    import os
    import time

    import pytest

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_selective_scan_threads_probe.py"
    spec = importlib.util.spec_from_file_location("cpu_selective_scan_threads_probe", path)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    me = os.getpid()  # the main thread's id is the process id
    if not probe.thread_times().get(me, (0, 0))[0]:
        pytest.skip("no /proc/self/task/*/schedstat here")

    def spin():
        t = time.perf_counter()
        while time.perf_counter() - t < 0.02:
            pass
        return 0

    a = probe.account(spin, 3)
    mine = [b for b in a["busy"] if b[2] == me]
    assert a["wall"] >= 19.0 and mine and 10.0 <= mine[0][0] <= a["wall"] * 1.1, a
    assert "1 threads ran" in probe.describe(dict(a, busy=mine))
