#!/usr/bin/env bash
# session 55 call E (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session55 after):
# the > 2^31-element selective-scan tests now run their checks in fresh processes (95% of the GPU);
# those and the far-end helper's small test, then the whole file again (100-run determinism).
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_SELSCAN_BIG_TESTS=1 JAX_SELSCAN_DETERMINISM_RUNS=100
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_H/*.whl > /tmp/pipE.log 2>&1
timeout 150 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider -k "2_31 or far_end" --durations=5 2>&1 \
  | tee $R/big.log | tail -9
timeout 330 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider -rs 2>&1 | tee $R/ss_pytest.log | tail -4
