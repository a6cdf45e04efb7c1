"""CPU mirror of the CUDA backward's reductions (`sum_jobs` in cuda/selective_scan_kernels.cuh,
planned by `Reductions::add` in cuda/selective_scan_launch.cuh), run without a GPU.

The mirror walks the kernel's grid block by block: which job a block belongs to, which tiles
it strides over, which outputs its threads own, and the order in which each output's terms
are added (float32, as on the device). It checks every output is written once with the right
sum, that the one-thread-per-output layout adds in sum_mid's order (q = 0, 1, ...), and that
deliberately broken variants of the index arithmetic are caught before the mirror is trusted.
"""
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _constant(name, path="cuda/selective_scan_kernels.cuh"):
    m = re.search(rf"constexpr int {name} = ([^;]+);", (ROOT / path).read_text())
    assert m, name
    return m.group(1)


K_WARPS = int(_constant("kSumWarps"))
K_UNROLL = int(_constant("kSumUnroll"))
K_THREADS = 32 * K_WARPS
assert _constant("kSumThreads") == "32 * kSumWarps"
# The launcher's choice of layout, as written in Reductions::add.
_ADD = (ROOT / "cuda/selective_scan_launch.cuh").read_text()
assert "total >= 32768 || Q < 2 * kSumWarps ? 1 : kSumWarps" in _ADD
SPLIT_OUTPUTS = 32768


def plan(jobs, cap=1 << 24):
    """Reductions::add for each (x, outer, Q, inner): the job's layout and its block count."""
    out = []
    for x, outer, Q, inner in jobs:
        total = outer * inner
        split = 1 if total >= SPLIT_OUTPUTS or Q < 2 * K_WARPS else K_WARPS
        per = K_THREADS if split == 1 else 32
        tiles = -(-total // per)
        out.append(dict(x=x.reshape(-1), outer=outer, Q=Q, inner=inner, split=split,
                        blocks=min(tiles, cap), out=np.full(total, np.nan, np.float32),
                        writes=np.zeros(total, np.int64)))
    return out


def sum_terms(x, base, inner, q0, dq, Q, step=None):
    """The kernel's sum_terms for a vector of threads (base: each thread's src offset); `step`
    overrides the stride between load batches (a broken variant)."""
    step = dq * K_UNROLL if step is None else step
    acc = np.zeros(len(base), np.float32)
    while q0 < Q:
        v = []
        for k in range(K_UNROLL):
            q = q0 + k * dq
            v.append(x[base + q * inner] if q < Q else np.zeros_like(acc))
        for k in range(K_UNROLL):
            acc = (acc + v[k]).astype(np.float32)
        q0 += step
    return acc


def run(jobs, bug=None):
    """The grid of sum_jobs, block by block; fills each job's `out` and counts writes."""
    grid = sum(j["blocks"] for j in jobs)
    for blk0 in range(grid):
        blk, j = blk0, 0
        if bug == "job_boundary":
            while j < len(jobs) - 1 and blk > jobs[j]["blocks"]:
                blk -= jobs[j]["blocks"]
                j += 1
        else:
            while j < len(jobs) - 1 and blk >= jobs[j]["blocks"]:
                blk -= jobs[j]["blocks"]
                j += 1
        jb = jobs[j]
        total = jb["outer"] * jb["inner"]
        per = K_THREADS if jb["split"] == 1 else 32
        tiles = -(-total // per)
        stride = jb["blocks"] + (1 if bug == "tile_stride" else 0)
        for t in range(blk, tiles, stride):
            if jb["split"] == 1:
                idx = t * per + np.arange(K_THREADS)
                idx = idx[idx < total]
                o, i = idx // jb["inner"], idx % jb["inner"]
                if bug == "swap_oi":
                    o, i = idx % jb["outer"], idx // jb["outer"]
                base = o * jb["Q"] * jb["inner"] + i
                s = sum_terms(jb["x"], base, jb["inner"], 0, 1, jb["Q"])
            else:
                idx = t * per + np.arange(32)
                live = idx < total
                o, i = idx // jb["inner"], idx % jb["inner"]
                base = np.where(live, o * jb["Q"] * jb["inner"] + i, 0)
                part = []
                for w in range(K_WARPS):
                    step = K_UNROLL if bug == "q_step" else None
                    part.append(sum_terms(jb["x"], base, jb["inner"], w, K_WARPS, jb["Q"], step=step))
                s = part[0]
                for w in range(1, K_WARPS):
                    s = (s + part[w]).astype(np.float32)
                idx, s = idx[live], s[live]
            jb["out"][idx] = s
            jb["writes"][idx] += 1
    return jobs


def make_jobs(rng, shapes, cap=1 << 24):
    jobs = [(rng.standard_normal((outer, Q, inner)).astype(np.float32), outer, Q, inner)
            for outer, Q, inner in shapes]
    return plan(jobs, cap), jobs


def check(planned, originals):
    """Every output written once; each equal to its float64 sum within float32 summation error."""
    for jb, (x, outer, Q, inner) in zip(planned, originals):
        if not np.all(jb["writes"] == 1):
            return False
        ref = x.astype(np.float64).sum(axis=1).reshape(-1)
        bound = 2 * Q * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).sum(axis=1).reshape(-1) + 1e-30
        if not np.all(np.abs(jb["out"] - ref) <= bound):
            return False
    return True


# The backward's jobs at a few geometries: (outer, Q, inner) for dA (1, batch*chunks, D*N),
# dB / dC of varying B/C (batch*groups, D/32, N*L), dD and ddelta_bias (1, batch*chunks, D),
# dh0 (1, ndir, R*N); both layouts, job boundaries and partial tiles.
SHAPES = [
    [(1, 64, 96 * 16), (4, 3, 16 * 37), (4, 3, 16 * 37), (1, 64, 96), (1, 64, 96), (1, 2, 8 * 96 * 16)],
    [(1, 17, 5 * 7), (2, 5, 16 * 1030), (1, 40, 33)],
    [(1, 9, 1000), (1, 16, 31), (1, 128, 5)],
]


@pytest.mark.parametrize("shapes", SHAPES)
def test_mirror_matches_float64(shapes):
    rng = np.random.default_rng(len(shapes))
    planned, orig = make_jobs(rng, shapes)
    assert {j["split"] for j in planned} == {1, K_WARPS}
    assert check(run(planned), orig)


def test_mirror_strides_over_tiles_when_blocks_are_capped():
    rng = np.random.default_rng(1)
    planned, orig = make_jobs(rng, SHAPES[0], cap=3)
    assert any(-(-j["outer"] * j["inner"] // (K_THREADS if j["split"] == 1 else 32)) > j["blocks"] for j in planned)
    assert check(run(planned), orig)


def test_one_thread_layout_is_sum_mid_order():
    """Split 1 adds q = 0, 1, ... to 0 as sum_mid did: bitwise the same float32 sums."""
    rng = np.random.default_rng(2)
    planned, orig = make_jobs(rng, [(2, 5, 16 * 1030)])
    assert planned[0]["split"] == 1
    run(planned)
    x = orig[0][0]
    seq = np.zeros((x.shape[0], x.shape[2]), np.float32)
    for q in range(x.shape[1]):
        seq = (seq + x[:, q, :]).astype(np.float32)
    assert np.array_equal(planned[0]["out"], seq.reshape(-1))


def test_split_layout_order_depends_only_on_the_shape():
    """Split 8: warp w sums q = w, w + 8, ... in order, then the 8 partials in warp order."""
    rng = np.random.default_rng(3)
    planned, orig = make_jobs(rng, [(1, 40, 33)])
    assert planned[0]["split"] == K_WARPS
    run(planned)
    x = orig[0][0][0]  # (Q, inner)
    parts = []
    for w in range(K_WARPS):
        acc = np.zeros(x.shape[1], np.float32)
        for q in range(w, x.shape[0], K_WARPS):
            acc = (acc + x[q]).astype(np.float32)
        parts.append(acc)
    s = parts[0]
    for w in range(1, K_WARPS):
        s = (s + parts[w]).astype(np.float32)
    assert np.array_equal(planned[0]["out"], s)


@pytest.mark.parametrize("bug", ["job_boundary", "tile_stride", "swap_oi", "q_step"])
def test_broken_mirrors_are_caught(bug):
    rng = np.random.default_rng(4)
    shapes = SHAPES[0] if bug != "swap_oi" else [(3, 5, 16 * 700)]
    cap = 3 if bug == "tile_stride" else 1 << 24
    planned, orig = make_jobs(rng, shapes, cap=cap)
    with np.errstate(invalid="ignore"):
        assert not check(run(planned, bug=bug), orig)
