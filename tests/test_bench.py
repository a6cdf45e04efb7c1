"""`python -m jax_selscan.bench --quick` runs, and its JSON says what the README promises."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax_selscan
from jax_selscan import bench


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """Run the command once (in a subprocess, as a user would) and load its JSON."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results" / "bench.json"  # a folder that does not exist yet: the command makes it
    env = dict(os.environ)
    # the same jax_selscan as this test session imports (source tree or installed)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(jax_selscan.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("JAX_ENABLE_X64", None)
    proc = subprocess.run([sys.executable, "-m", "jax_selscan.bench", "--quick", "--out", str(out)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out) as f:
        return json.load(f), proc, tmp


def test_quick_json_metadata(quick):
    res, proc, _ = quick
    assert res["schema"] == bench.SCHEMA
    assert res["mode"] == "quick"
    assert res["date"][:2] == "20"
    m = res["machine"]
    assert m["backend"] in ("cpu", "gpu", "cuda", "rocm", "tpu")
    assert m["cpu_cores"] >= 1 and m["cpu_model"]
    assert m["devices"] and m["device_count"] >= 1
    if m["backend"] != "cpu":
        assert m["gpu_name"]
    import jax
    assert res["jax"] == jax.__version__
    assert res["jax_selscan"] == jax_selscan.__version__
    assert res["kernels"] == {"cpu": jax_selscan.has_cpu_kernels,
                              "cuda": jax_selscan.has_cuda_kernels}
    assert res["commit"] is None or len(res["commit"]) == 40
    assert "jax_selscan.bench" in res["command"] and "--quick" in res["command"]
    if res["machine"]["backend"] == "cpu":
        assert "not a CUDA backend" in res["mamba_ssm_skipped"]
    assert res["timing"] == ("synchronised" if m["backend"] == "cpu" else "pipelined")


def test_quick_json_measurements(quick):
    res, _, _ = quick
    copy = res["copy"]
    assert copy["GBps"] > 0 and copy["ms"] > 0
    assert copy["bytes"] == 2 * 4 * copy["elements"]
    ls = res["linear_scan"]
    assert {r["layout"] for r in ls} == {"rows", "strided"}
    for r in ls:
        assert not r["errors"], r["errors"]
        for impl in ("jax_selscan", "lax.associative_scan"):
            assert r["ms"][impl] > 0
            assert r["GBps"][impl] == pytest.approx(r["bytes"] / r["ms"][impl] / 1e6, rel=1e-9)
            assert r["fraction_of_copy"][impl] == pytest.approx(
                r["GBps"][impl] / copy["GBps"], rel=1e-9)
        assert r["ms"]["elementwise"] > 0
        assert r["fraction_of_elementwise"]["jax_selscan"] == pytest.approx(
            r["GBps"]["jax_selscan"] / r["GBps"]["elementwise"], rel=1e-9)
        assert r["speedup_vs_associative_scan"] == pytest.approx(
            r["ms"]["lax.associative_scan"] / r["ms"]["jax_selscan"], rel=1e-9)
        c, l = (r["shape"] if r["axis"] == 1 else r["shape"][::-1])
        assert r["bytes"] == 12 * c * l
    ss = res["selective_scan"]
    assert ss
    for r in ss:
        assert not r["errors"], r["errors"]
        for k in ("ours_fwd", "ref_fwd", "ours_fwd_bwd", "ref_fwd_bwd"):
            assert r["ms"][k] > 0
        assert r["speedup_vs_ref"]["fwd"] == pytest.approx(
            r["ms"]["ref_fwd"] / r["ms"]["ours_fwd"], rel=1e-9)
        assert r["elementwise_GBps"] > 0
        assert r["fraction_of_elementwise"]["ours_fwd"] == pytest.approx(
            r["GBps"]["ours_fwd"] / r["elementwise_GBps"], rel=1e-9)
        b, d, l, n = r["batch"], r["D"], r["L"], r["N"]
        assert r["bytes_fwd"] == (4 * b * d * l + 2 * b * n * l) * 4


def test_quick_prints_table_and_progress(quick):
    res, proc, tmp = quick
    assert "copy bandwidth" in proc.stdout
    assert "linear_scan" in proc.stdout and "selective_scan" in proc.stdout
    for r in res["linear_scan"]:
        assert r["case"] in proc.stdout
    assert "/12" in proc.stderr and "done" in proc.stderr      # the progress bar (12 items)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in proc.stdout
    else:
        assert (tmp / "results" / "bench.png").stat().st_size > 1000


def test_tables_survive_missing_measurements():
    """A failed measurement (say, the reference out of memory) prints '-' and keeps going."""
    import io
    res = {
        "jax_selscan": "0", "jax": "0", "commit": None,
        "machine": {"backend": "cpu", "cpu_model": "x", "cpu_cores": 2},
        "kernels": {"cpu": False, "cuda": False},
        "copy": {"elements": 1, "GBps": 1.0},
        "linear_scan": [{"case": "c", "ms": {"jax_selscan": 1.0, "lax.associative_scan": None},
                         "GBps": {"jax_selscan": 1.0, "lax.associative_scan": None},
                         "fraction_of_copy": {"jax_selscan": 1.0, "lax.associative_scan": None},
                         "speedup_vs_associative_scan": None}],
        "selective_scan": [{"case": "s", "ms": {"ours_fwd": 1.0}, "GBps": {"ours_fwd": 1.0},
                            "fraction_of_copy": {"ours_fwd": 0.5},
                            "speedup_vs_ref": {"fwd": None, "fwd_bwd": None},
                            "errors": {"ref_fwd": "RESOURCE_EXHAUSTED"}}],
    }
    buf = io.StringIO()
    bench.print_tables(res, file=buf)
    assert "RESOURCE_EXHAUSTED" in buf.getvalue()


@pytest.mark.parametrize("pipeline", [False, True])
def test_median_time_counts_calls(pipeline, monkeypatch):
    """Per-call seconds: a pipelined measurement divides by the calls it issued (a fake clock
    advancing 1 s per call makes every measurement exactly 1 s a call)."""
    clock = {"t": 0.0, "calls": 0}

    def fn(x):
        clock["t"] += 1.0
        clock["calls"] += 1
        return x

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(bench, "PIPE_S", 5.0)  # 5 calls a measurement (1 s each)
    assert bench.median_time(fn, 1.0, repeats=3, pipeline=pipeline) == 1.0
    per_measurement = 5 if pipeline else 1
    assert clock["calls"] == 1 + pipeline + 3 * per_measurement


def test_median_time_caps_queued_output_bytes(monkeypatch):
    """A pipelined measurement queues no more calls than _pipe_max_bytes() of outputs allow."""
    clock = {"t": 0.0, "calls": 0}
    out = np.zeros(1000, np.float32)                      # 4000 bytes a call

    def fn(x):
        clock["t"] += 1.0
        clock["calls"] += 1
        return out

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(bench, "PIPE_S", 50.0)            # would be 50 calls a measurement
    monkeypatch.setattr(bench, "_pipe_max_bytes", lambda: 12000)  # 3 outputs
    assert bench.median_time(fn, 1.0, repeats=2, pipeline=True) == 1.0
    assert clock["calls"] == 2 + 2 * 3
