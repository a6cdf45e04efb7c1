#!/usr/bin/env bash
# session 54 call A (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session54 after):
# HEAD's wheel (.whl_A) and scan_driver: the checks session 53's defaults never had on a GPU
# (notes 22.10): driver check of strided_whole / row_walk, sanitizers on strided_whole's NCV 2/4
# multi-round geometries and row_walk's capped launch, the > 2^31 strided_whole case, 500-run
# determinism of the auto cases; then the GPU tests of the linear scan.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_A/*.whl > /tmp/pipA.log 2>&1 &
LOGS=/tmp/glA OUT=$R DRIVER=.bin/scan_driver STAGES="driver sanitize big determinism" CHECK_ONLY=strided_whole \
  SAN_ONLY=strided_whole BIG_FILTER=whole DET_FILTER=auto SAN_LIMIT=100 bash scripts/gpu_check.sh > $R/checks_whole.log 2>&1
LOGS=/tmp/glA2 OUT=$R DRIVER=.bin/scan_driver STAGES="driver sanitize big" CHECK_ONLY=row_walk SAN_ONLY=row_walk BIG_FILTER=rows SAN_LIMIT=100 \
  bash scripts/gpu_check.sh > $R/checks_row_walk.log 2>&1
grep -h "===\|FAIL\|ERROR SUMMARY\|failures\|differing" $R/checks_*.log | tail -40
wait
timeout 240 python3 -P -m pytest -q tests/test_cuda_linear_scan.py tests/test_scan_mirrors*.py -p no:cacheprovider -rs 2>&1 | tee $R/pytest.log | tail -4
