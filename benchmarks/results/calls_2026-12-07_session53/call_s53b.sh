#!/usr/bin/env bash
# session 53 call B (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# the wheel of the working tree with row_walk's warps-per-SM cap (.whl_cap; section 22.2) and
# variant_bench of the same tree. 1) variant_bench: caps x rings at long-row shapes, twice;
# 2) the GPU tests of row_walk and auto; 3) the package benchmark's row shapes with the cap
# (default) and without (JAX_SELSCAN_LS_ROW_WARPS_PER_SM=0), both dtypes.
cd "$(dirname "$0")/.."
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$GPU"
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)+row_walk_cap" PY=python3 PKG_WHEEL=$(ls .whl_cap/*.whl)
python3 -m pip install -q --no-deps --force-reinstall "$PKG_WHEEL" > $R/pip.log 2>&1 &
export VB_SHAPES="4096:16384:1,8192:8192:1,16384:4096:1,12288:2048:1,32768:1024:1,65536:512:1,2048:32768:1,65536:256:1"
export VB_ONLY=auto,row_walk_s6,row_walk_s6_c24,row_walk_s6_c20,row_walk_s6_c16,row_walk_s6_c12,row_walk_s6_c10,row_walk_s6_c8,row_walk_s8_c16,row_walk_s8_c12,row_walk_s12_r1,row_walk_s12_c12,row_walk_s12_c8,row_walk_s4_c16
for i in 1 2; do timeout 150 .bin/variant_bench > $R/variants_caps_$i.log 2>&1; done
grep -c BAD $R/variants_caps_*.log
wait
timeout 150 python3 -P -m pytest -q tests/test_cuda_linear_scan.py -p no:cacheprovider \
  -k "row_walk or rows_per_warp or warps_per_sm or auto or deterministic or large" 2>&1 | tee $R/pytest.log | tail -3
for cap in default 0; do
  for shp in 16384 2048; do
    JAX_SELSCAN_LS_ROW_WARPS_PER_SM=$([[ $cap == 0 ]] && echo 0 || echo "") timeout 120 \
      python3 -P benchmarks/gpu_linear_scan.py --out $R/bench_${cap}_$shp --dtypes bfloat16,float32 --algos auto --shapes $shp \
      > $R/bench_${cap}_$shp.log 2>&1
    echo "--- cap $cap, $shp"; grep "GB/s\|copy" $R/bench_${cap}_$shp.log | tail -6
  done
done
