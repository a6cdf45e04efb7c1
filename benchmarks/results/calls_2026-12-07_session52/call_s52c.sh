#!/usr/bin/env bash
# session 52 call C (ignored wrapper): the package benchmark (README table) on the wheel in
# .whl_flip (HEAD with both linear-scan gates on), auto beside lax / CUB / copy.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
export JSS_COMMIT="$(cat .jss_commit)+kWholeByDefault=true+kRowsPerWarpByDefault=true"
export PY=python3 PKG_WHEEL=$(ls .whl_flip/*.whl)
LOGS=${OUT:-$PWD/out}/logs STAGES="build bench" BENCH_ARGS="--dtypes bfloat16,float32 --algos auto" bash scripts/gpu_check.sh
