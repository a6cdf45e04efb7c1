#!/usr/bin/env bash
# session 57 call B (run right after call A on the same warm H100; the one-line command given to the
# device tool, written out): the package of d4f3f10 (wheel m0 of call A, JSS_SS_FWD_OVERLAP=0, i.e.
# main's kernels) beside mamba_ssm 2.3.2.post1 (built by call A in /tmp/mamba_build) and the reference,
# at the benchmark's four shapes, both dtypes.
cd "$(dirname "$0")/../../.."
cp .bin/s57/m0.whl /tmp/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl
python3 -m pip install -q --no-deps --force-reinstall /tmp/jax_selscan-0.1.0-cp312-cp312-linux_x86_64.whl
export JSS_COMMIT=$(cat .jss_commit) XLA_PYTHON_CLIENT_PREALLOCATE=false
mkdir -p $OUT/b
timeout 200 python3 -P benchmarks/gpu_selective_scan.py --out $OUT/b --mamba-dir /tmp/mamba_build --impls ours,mamba,ref \
  --reps 10 --budget 190 --shape-budget 45 > $OUT/b/log.txt 2>&1
