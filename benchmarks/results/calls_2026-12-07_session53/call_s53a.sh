#!/usr/bin/env bash
# session 53 call A (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# the wheel of HEAD (.jss_commit) and variant_bench of the working tree (section 22 variants).
# 1) variant_bench long-row shapes twice; 2) on an H200 only: the package benchmark, both dtypes.
cd "$(dirname "$0")/.."
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3 PKG_WHEEL=$(ls .whl_head/*.whl)
python3 -m pip install -q --no-deps --force-reinstall "$PKG_WHEEL" > $R/pip.log 2>&1 &
export VB_SHAPES="4096:16384:1,2048:32768:1,8192:8192:1,1024:65536:1,16384:4096:1,12288:2048:1,65536:256:1"
export VB_ONLY=auto,row_walk_s6,row_walk_s6_r2,row_walk_s6_r4,row_walk_s12_r4,row_walk_s6_o16,row_walk_s6_o8,row_walk_s12_r1,row_walk_s12_r2,row_walk_s4_r1,row_walk_s4_r2
for i in 1 2; do timeout 150 .bin/variant_bench > $R/variants_rows_$i.log 2>&1; done
cat $R/variants_rows_1.log; grep -c BAD $R/variants_rows_*.log
wait
if [[ "$GPU" == *H200* ]]; then
  LOGS=$R/logs STAGES="bench" BENCH_ARGS="--dtypes bfloat16,float32 --algos auto" timeout 300 bash scripts/gpu_check.sh 2>&1 | grep "GB/s\|copy\|rc=" | tail -40
fi
