#!/usr/bin/env bash
# session 54 call C (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session54 after):
# notes 23.3's two changes: (a) row_walk's one-row loop back, (b) strided_whole's MINB bounds.
# .whl_C = the working tree with both; .whl_A = 6ed2743's package (before). 1) driver check and
# the three sanitizers on row_walk (one-row and, forced, several-rows loops) and strided_whole;
# 2) variant_bench: one-row loop vs several-rows loop with one row, caps; whole MINB variants;
# 3) ls_small chains, .whl_A and .whl_C in turn, twice; 4) package benchmark (.whl_C); 5) GPU tests.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu_c.txt
{
for rpw in 1 3; do
  export JAX_SELSCAN_LS_ROWS_PER_WARP=$rpw
  echo "--- row_walk, JAX_SELSCAN_LS_ROWS_PER_WARP=$rpw"
  timeout 60 .bin/scan_driver check row_walk | tail -1
  for t in memcheck racecheck synccheck; do timeout 60 compute-sanitizer --tool $t --error-exitcode 9 .bin/scan_driver tiny row_walk 2>&1 | tail -1; done
done
unset JAX_SELSCAN_LS_ROWS_PER_WARP
echo "--- strided_whole"
timeout 60 .bin/scan_driver check strided_whole | tail -1
for t in memcheck racecheck synccheck; do timeout 90 compute-sanitizer --tool $t --error-exitcode 9 .bin/scan_driver tiny strided_whole 2>&1 | tail -1; done
timeout 60 .bin/scan_driver determinism 500 auto | grep -c " ok"
} > $R/checks_c.log 2>&1
cat $R/checks_c.log
VB_SHAPES="4096:16384:1,8192:8192:1,16384:4096:1,12288:2048:1,32768:1024:1,65536:256:1" \
  VB_ONLY=auto,row_walk_s6,row_walk_s6_c16,row_walk_s6_m,row_walk_s6_m_c16 timeout 90 .bin/variant_bench > $R/vb_rows.log 2>&1
VB_SHAPES="1:1024:1024,1:1024:4096,1:256:8192,1:1024:16384,64:1024:1024,1:1000:65536" \
  VB_ONLY=auto,whole_n2s4,whole_n4s4,whole_n2s4_b3,whole_n4s4_b3,whole_n2s4_b2,whole_n4s4_b2 timeout 60 .bin/variant_bench > $R/vb_whole.log 2>&1
cat $R/vb_rows.log
for i in 1 2; do
  for w in A C; do
    python3 -m pip install -q --no-deps --force-reinstall .whl_$w/*.whl > /dev/null 2>&1
    echo "--- whl_$w run $i"
    LS_SMALL_FLOOR=0 LS_SMALL_ALGOS=auto LS_SMALL_SHAPES="1024x1024:0,1024x4096:0,1024x16384:0,64x1024x1024:1,12288x2048:1,4096x16384:1" \
      timeout 70 python3 -P cuda/tools/ls_small.py chain 2>&1 | grep "us per"
  done
done > $R/ls_ab.log 2>&1
tail -14 $R/ls_ab.log
timeout 200 python3 -P benchmarks/gpu_linear_scan.py --out $R --cub .bin/cub_affine_scan --dtypes float32,bfloat16 --algos auto \
  > $R/bench.log 2>&1; echo "bench rc=$?"
timeout 150 python3 -P -m pytest -q tests/test_cuda_linear_scan.py tests/test_scan_mirrors*.py -p no:cacheprovider \
  -k "row_walk or whole or rows_per_warp or warps_per_sm or determinis or auto" 2>&1 | tee $R/pytest.log | tail -3
