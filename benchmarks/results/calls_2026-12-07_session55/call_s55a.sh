#!/usr/bin/env bash
# session 55 call A (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session55 after):
# HEAD's wheel (.whl_H: session 54's one-row row_walk loop without a cap, strided_whole's MINB
# bounds, never run through the package on an H200) and scan driver: driver check + sanitizers of
# row_walk (one row, 3 rows a warp) and strided_whole; variant_bench's one-row / several-rows loops;
# the GPU tests of the linear scan with the mirrors; the package benchmark.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_H/*.whl > /tmp/pipA.log 2>&1 &
{
for rpw in 1 3; do
  echo "--- row_walk, JAX_SELSCAN_LS_ROWS_PER_WARP=$rpw"
  JAX_SELSCAN_LS_ROWS_PER_WARP=$rpw timeout 30 .bin/scan_driver check row_walk | tail -1
  for t in memcheck racecheck synccheck; do
    JAX_SELSCAN_LS_ROWS_PER_WARP=$rpw timeout 30 compute-sanitizer --tool $t --error-exitcode 9 .bin/scan_driver tiny row_walk 2>&1 | tail -1
  done
done
echo "--- strided_whole"
timeout 30 .bin/scan_driver check strided_whole | tail -1
for t in memcheck racecheck synccheck; do timeout 30 compute-sanitizer --tool $t --error-exitcode 9 .bin/scan_driver tiny strided_whole 2>&1 | tail -1; done
echo "--- determinism, auto cases, 500 runs"
timeout 60 .bin/scan_driver determinism 500 auto 2>&1 | tail -4
} > $R/checks.log 2>&1
cat $R/checks.log
VB_SHAPES="4096:16384:1,12288:2048:1,16384:4096:1,32768:1024:1,65536:256:1" \
  VB_ONLY=auto,row_walk_s6,row_walk_s6_c16,row_walk_s6_m timeout 60 .bin/variant_bench > $R/vb_rows.log 2>&1
grep -v "^#" $R/vb_rows.log | head -40
wait
timeout 280 python3 -P -m pytest -q tests/test_cuda_linear_scan.py tests/test_scan_mirrors*.py -p no:cacheprovider -rs 2>&1 | tee $R/pytest.log | tail -4
timeout 150 python3 -P benchmarks/gpu_linear_scan.py --out $R --cub .bin/cub_affine_scan --dtypes float32,bfloat16 --algos auto \
  > $R/bench.log 2>&1; echo "bench rc=$?"; grep "copy ceiling" $R/*.md | head -2
