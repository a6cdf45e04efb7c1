#!/usr/bin/env bash
# session 53 call C (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# the wheel of the working tree with the refined cap (.whl_cap2; section 22.3: 16 an SM for rows of
# >= 4 KB of a, 24 for 2-4 KB) and variant_bench of the same tree.
# 1) the whole GPU test file of linear_scan; 2) variant_bench at rows of 2-8 sub-chunks;
# 3) the package benchmark, every shape, both dtypes, auto (with CUB and lax).
cd "$(dirname "$0")/.."
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3 PKG_WHEEL=$(ls .whl_cap2/*.whl)
python3 -m pip install -q --no-deps --force-reinstall "$PKG_WHEEL" > /dev/null 2>&1 &
VB_SHAPES="32768:1024:1,16384:1536:1,65536:512:1,32768:768:1,12288:2048:1,4096:16384:1" \
  VB_ONLY=auto,row_walk_s6,row_walk_s6_c24,row_walk_s6_c16 timeout 100 .bin/variant_bench > $R/variants_rule.log 2>&1
cat $R/variants_rule.log
wait
timeout 240 python3 -P -m pytest -q tests/test_cuda_linear_scan.py -p no:cacheprovider > $R/pytest.log 2>&1; tail -3 $R/pytest.log
LOGS=$R/logs STAGES="bench" BENCH_ARGS="--dtypes bfloat16,float32 --algos auto" timeout 280 bash scripts/gpu_check.sh 2>&1 | grep "GB/s\|copy\|rc=" | tail -24
rm -rf $R/logs
