#!/usr/bin/env bash
# session 53 call E (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# the wheel of the working tree with whole_ncv >= 2 (.whl_w2; section 22.6) and variant_bench of it.
# 1) GPU tests of strided_whole / auto / the rules; 2) variant_bench (1024, 1024); 3) ls_small
# chains, default and JAX_SELSCAN_LS_WHOLE=0; 4) the package benchmark at (L=1024, C=1024).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)+whole_ncv2" PY=python3
python3 -m pip install -q --no-deps --force-reinstall .whl_w2/*.whl > /dev/null 2>&1 &
VB_SHAPES="1:1024:1024" VB_ONLY=auto,strided_whole,whole_n1s4,whole_n2s4,whole_n2s8 timeout 60 .bin/variant_bench 2>&1 | tee $R/variants.log
wait
timeout 150 python3 -P -m pytest -q tests/test_cuda_linear_scan.py tests/test_scan_mirrors_whole.py -p no:cacheprovider \
  -k "strided_whole or auto or rule or warps_per_sm or deterministic or whole" 2>&1 | tee $R/pytest.log | tail -3
for w in default 0; do
  echo "--- JAX_SELSCAN_LS_WHOLE=$w"
  JAX_SELSCAN_LS_WHOLE=$([[ $w == 0 ]] && echo 0) LS_SMALL_SHAPES="1024x1024:0,512x2048:0" timeout 90 \
    python3 -P cuda/tools/ls_small.py chain 2>&1 | tee $R/ls_chain_$w.log | grep "us per"
done
timeout 120 python3 -P benchmarks/gpu_linear_scan.py --out $R --dtypes float32,bfloat16 --algos auto --shapes "L=1024," 2>&1 | tee $R/bench.log | grep "GB/s\|copy"
