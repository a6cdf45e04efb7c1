#!/usr/bin/env bash
# session 53 call F (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# same-run A/B of strided_whole's NCV rule in the package: the wheel with NCV = 1 at L = 1024
# (.whl_cap2, 8763e57's sources) against NCV >= 2 (.whl_w2), ls_small chains, each wheel twice
# in turn; then the whole package benchmark with .whl_w2 (is (1024, 1024) the same in that context?).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)+whole_ncv2" PY=python3
for i in 1 2; do
  for w in whl_cap2 whl_w2; do
    python3 -m pip install -q --no-deps --force-reinstall .$w/*.whl > /dev/null 2>&1
    echo "--- $w run $i"
    LS_SMALL_SHAPES="1024x1024:0" timeout 60 python3 -P cuda/tools/ls_small.py chain 2>&1 | grep "us per" | grep -v floor
  done
done 2>&1 | tee $R/ab_chain.log
LOGS=$R/logs STAGES="bench" BENCH_ARGS="--dtypes bfloat16,float32 --algos auto" timeout 280 bash scripts/gpu_check.sh 2>&1 | grep "GB/s\|copy\|rc=" | tail -20
rm -rf $R/logs
