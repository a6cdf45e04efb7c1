#!/usr/bin/env bash
# session 54 call D (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session54 after):
# call C cut to the device time left. .whl_C = the working tree (notes 23.3 (a) row_walk's one-row
# loop back, (b) strided_whole's MINB bounds); .whl_A = 6ed2743's package (before).
# 1) driver check + sanitizers on row_walk's two loops and strided_whole; 2) variant_bench;
# 3) ls_small chains .whl_A / .whl_C in turn; 4) the package benchmark with .whl_C.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu_d.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_A/*.whl > /dev/null 2>&1 &
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
} > $R/checks_d.log 2>&1
cat $R/checks_d.log
VB_SHAPES="4096:16384:1,12288:2048:1,16384:4096:1,32768:1024:1" \
  VB_ONLY=auto,row_walk_s6,row_walk_s6_c16,row_walk_s6_m,row_walk_s6_m_c16 timeout 45 .bin/variant_bench > $R/vb_rows.log 2>&1
VB_SHAPES="1:1024:4096,1:1024:16384,64:1024:1024" \
  VB_ONLY=auto,whole_n2s4,whole_n4s4,whole_n4s4_b3,whole_n2s4_b2,whole_n4s4_b2 timeout 30 .bin/variant_bench > $R/vb_whole.log 2>&1
cat $R/vb_rows.log $R/vb_whole.log
wait
for w in A C; do
  python3 -m pip install -q --no-deps --force-reinstall .whl_$w/*.whl > /dev/null 2>&1
  echo "--- whl_$w"
  LS_SMALL_FLOOR=0 LS_SMALL_ALGOS=auto LS_SMALL_SHAPES="1024x4096:0,64x1024x1024:1,12288x2048:1,4096x16384:1" \
    LS_SMALL_DTYPES=bfloat16,float32 timeout 45 python3 -P cuda/tools/ls_small.py chain 2>&1 | grep "us per"
done > $R/ls_ab.log 2>&1
cat $R/ls_ab.log
timeout 110 python3 -P benchmarks/gpu_linear_scan.py --out $R --cub .bin/cub_affine_scan --dtypes bfloat16,float32 --algos auto \
  > $R/bench.log 2>&1; echo "bench rc=$?"
