#!/usr/bin/env bash
# session 52 call D (ignored wrapper): the wheel of HEAD (.jss_commit; the defaults of notes 20.2 /
# 21.2 on) — GPU tests of the touched rules, the package benchmark at 65536 x 256, ls_small chains.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3 PKG_WHEEL=$(ls .whl_flip/*.whl)
python3 -m pip install -q --no-deps --force-reinstall "$PKG_WHEEL" > /dev/null 2>&1
timeout 90 python3 -P -m pytest -q tests/test_cuda_linear_scan.py -p no:cacheprovider \
  -k "row_walk or rows_per_warp or strided_whole or auto or deterministic or large" 2>&1 | tee $R/pytest.log | tail -3
LOGS=$R/logs STAGES="bench" BENCH_ARGS="--dtypes bfloat16,float32 --algos auto --shapes 256" bash scripts/gpu_check.sh 2>&1 | grep "GB/s\|copy" 
LS_SMALL_SHAPES="65536x256:1,131072x128:1,1024x1024:0" timeout 60 python3 -P cuda/tools/ls_small.py chain 2>&1 | tee $R/ls_chain.log | grep "us per"
