#!/usr/bin/env bash
# session 55 call C (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session55 after):
# the whole selective-scan GPU test file on HEAD's package (.whl_H: its selective scan is the
# package's since 7f7a182; the backward's FFI binding, refactored in bc20643 / 6a3d608, has not had
# the whole file since), > 2^31-element tests on, 100-run determinism; then ss_driver's checks
# and memcheck / racecheck (synccheck if time is left).
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_H/*.whl > /tmp/pipC.log 2>&1
JAX_SELSCAN_BIG_TESTS=1 JAX_SELSCAN_DETERMINISM_RUNS=100 timeout 400 python3 -P -m pytest -q \
  tests/test_cuda_selective_scan.py tests/test_selective_scan_lowering.py -p no:cacheprovider -rs --durations=12 2>&1 \
  | tee $R/ss_pytest.log | tail -30
echo "pytest rc=${PIPESTATUS[0]}"
{
timeout 60 .bin/ss_driver 2>&1 | tail -4
for t in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $t --error-exitcode 9 .bin/ss_driver > /tmp/san_$t.log 2>&1; rc=$?
  tail -2 /tmp/san_$t.log; echo "$t rc=$rc"
done
} > $R/ss_san.log 2>&1
cat $R/ss_san.log
