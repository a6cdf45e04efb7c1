#!/usr/bin/env bash
# session 53 call H (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# the wheel of the working tree with section 22.8's rules (.whl_w3) and variant_bench of it.
# 1) variant_bench auto / strided_whole at call G's shapes; 2) GPU tests (strided_whole, auto,
# rules, determinism, large); 3) ls_small chains, default and JAX_SELSCAN_LS_WHOLE=0.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)+whole_rules" PY=python3
python3 -m pip install -q --no-deps --force-reinstall .whl_w3/*.whl > /dev/null 2>&1 &
VB_SHAPES="1:1024:1024,1:1024:2048,1:1024:4096,1:512:4096,1:256:8192,16:256:1024,1:1024:16384,64:256:1024,2048:32:1024" \
  VB_ONLY=auto,strided_whole timeout 90 .bin/variant_bench 2>&1 | tee $R/variants_auto.log
wait
timeout 150 python3 -P -m pytest -q tests/test_cuda_linear_scan.py tests/test_scan_mirrors_whole.py -p no:cacheprovider \
  -k "strided_whole or auto or rule or whole or deterministic or large" 2>&1 | tee $R/pytest.log | tail -3
for w in default 0; do
  echo "--- JAX_SELSCAN_LS_WHOLE=$w"
  JAX_SELSCAN_LS_WHOLE=$([[ $w == 0 ]] && echo 0) LS_SMALL_SHAPES="1024x1024:0,1024x4096:0,256x8192:0,64x256x1024:1,2048x32x1024:1" \
    timeout 120 python3 -P cuda/tools/ls_small.py chain 2>&1 | tee $R/ls_chain_$w.log | grep "us per" | grep -v floor
done
