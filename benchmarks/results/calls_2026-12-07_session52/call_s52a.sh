#!/usr/bin/env bash
# session 52 call A (ignored wrapper): .whl_flip = HEAD (.jss_commit) with kWholeByDefault = true
# and kRowsPerWarpByDefault = true; drivers in .bin built from that same tree. Logs under $OUT/ls:
# 1) driver checks (strided_whole; row_walk by the rule and forced 3 a warp); 2) variant_bench row
# shapes; 3) ls_small chains (default / whole=0 / whole=1); 4) the whole GPU test file (less the
# two tests that assert the gates are off); 5) memcheck / racecheck of both kernels.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
ROOT=${OUT:-$PWD/out}; R=$ROOT/ls; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)+kWholeByDefault=true+kRowsPerWarpByDefault=true"
export PY=python3 PKG_WHEEL=$(ls .whl_flip/*.whl) DRIVER=.bin/scan_driver
python3 -m pip install -q --no-deps --force-reinstall "$PKG_WHEEL" > /dev/null 2>&1 &
{ timeout 60 .bin/scan_driver check strided_whole; timeout 60 .bin/scan_driver check row_walk;
  JAX_SELSCAN_LS_ROWS_PER_WARP=3 timeout 60 .bin/scan_driver check row_walk; } > $R/driver.log 2>&1
grep -v " ok$" $R/driver.log | tail -6; grep -c " ok$" $R/driver.log
VB_SHAPES="65536:256:1,131072:128:1,32768:512:1,12288:2048:1,4096:16384:1" \
  VB_ONLY=auto,row_walk_s6,row_walk_s6_r0,row_walk_s6_r2,row_walk_s6_r4,row_walk_s6_r8,row_walk_s12_r4 \
  timeout 120 .bin/variant_bench > $R/variants_rows.log 2>&1; cat $R/variants_rows.log
wait
export LS_SMALL_SHAPES="1024x1024:0,4096x1024:0,2048x32x1024:1,65536x256:1"
timeout 150 python3 -P cuda/tools/ls_small.py chain > $R/ls_chain.log 2>&1; grep "us per" $R/ls_chain.log
for v in 0 1; do
  JAX_SELSCAN_LS_WHOLE=$v LS_SMALL_ALGOS=auto LS_SMALL_FLOOR=0 timeout 90 python3 -P cuda/tools/ls_small.py chain > $R/ls_whole$v.log 2>&1
  echo "--- JAX_SELSCAN_LS_WHOLE=$v"; grep "us per" $R/ls_whole$v.log
done
timeout 240 python3 -P -m pytest -q tests/test_cuda_linear_scan.py -p no:cacheprovider \
  --deselect tests/test_cuda_linear_scan.py::test_auto_rule_for_short_strided_scans \
  --deselect tests/test_cuda_linear_scan.py::test_row_walk_rows_per_warp_rule > $R/pytest.log 2>&1; tail -8 $R/pytest.log
for k in strided_whole row_walk; do
  JAX_SELSCAN_LS_ROWS_PER_WARP=3 OUT=/tmp/o2 LOGS=/tmp/l2 STAGES="sanitize" SAN_ONLY=$k SAN_LIMIT=60 \
    SAN_TOOLS="memcheck racecheck" bash scripts/gpu_check.sh 2>&1 | grep "===\|ERROR\|FAIL\|failures" | tail -8
done > $R/san.log 2>&1; cat $R/san.log
