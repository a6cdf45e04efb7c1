#!/usr/bin/env bash
# session 55 call D (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session55 after):
# call C's one failure (test_more_than_2_31_elements_staged_backward: XLA's allocator out of memory
# asking for 36 GiB on the 80 GB H100, after the whole file): the three > 2^31-element tests in
# sequence, then the failing one alone, in fresh processes.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_SELSCAN_BIG_TESTS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
python3 -m pip install -q --no-deps --force-reinstall .whl_H/*.whl > /tmp/pipD.log 2>&1
echo "--- the three big tests in sequence"
timeout 200 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider -k "more_than_2_31" --durations=5 2>&1 \
  | tee $R/big_seq.log | grep -v "^ \|^$" | tail -12
echo "--- the staged backward alone"
timeout 150 python3 -P -m pytest -q tests/test_cuda_selective_scan.py -p no:cacheprovider -k "more_than_2_31_elements_staged_backward" 2>&1 \
  | tee $R/big_alone.log | tail -3
