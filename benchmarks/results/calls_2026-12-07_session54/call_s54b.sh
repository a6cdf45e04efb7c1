#!/usr/bin/env bash
# session 54 call B (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session54 after):
# HEAD's wheel (.whl_A): the package benchmark (auto, lax.associative_scan, the CUB path, copy);
# then variant_bench: row_walk's warps-an-SM cap sweep at the long 16-bit rows (notes 22.3) and
# strided_whole's steps a thread (S = 4 vs 8) over fp32 shapes of <= 1024 steps (notes 22.10).
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
export JSS_COMMIT="$(cat .jss_commit)" PY=python3
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu_b.txt
python3 -c "import jax_selscan" 2>/dev/null || python3 -m pip install -q --no-deps --force-reinstall .whl_A/*.whl > /dev/null 2>&1
timeout 330 python3 -P benchmarks/gpu_linear_scan.py --out $R --cub .bin/cub_affine_scan --dtypes float32,bfloat16 --algos auto \
  > $R/bench.log 2>&1; echo "bench rc=$?"; grep "copy ceiling" $R/*.md | head -2
VB_SHAPES="1:1024:1024,1:1024:2048,1:1024:4096,1:512:4096,1:256:8192,1:1024:16384,2048:32:1024,64:1024:1024,1:1000:65536" \
  VB_ONLY=auto,strided_whole,whole_n2s4,whole_n4s4,whole_n2s8,whole_n4s8,whole_n2s4_b2,whole_n4s4_b2,whole_n2s4_b3,whole_n4s4_b3 timeout 150 .bin/variant_bench > $R/vb_whole.log 2>&1
VB_SHAPES="4096:16384:1,8192:8192:1,16384:4096:1,12288:2048:1,32768:1024:1" \
  VB_ONLY=auto,row_walk_s6_c0,row_walk_s6_c24,row_walk_s6_c16,row_walk_s6_c12,row_walk_s6_c8 timeout 100 .bin/variant_bench > $R/vb_cap.log 2>&1
grep -h "float32\|bfloat16\|%" $R/vb_whole.log | head -5
# 1 x 2^20 (launch-bound): per-call time in a chain, and each kernel's own time under ncu
LS_SMALL_SHAPES="1x1048576:1,1024x1024:0" LS_SMALL_ALGOS="auto,lookback_regs,lookback_warp,three_pass,lax" \
  timeout 120 python3 -P cuda/tools/ls_small.py chain 2>&1 | tee $R/ls_chain.log | grep "us per"
LS_SMALL_SHAPES="1x1048576:1,1024x1024:0" LS_SMALL_ALGOS="auto,lookback_regs,lookback_warp,three_pass" \
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv python3 -P cuda/tools/ls_small.py ncu \
  2>/dev/null | python3 cuda/tools/ncu_kernel_times.py > $R/ls_ncu.log 2>&1; tail -30 $R/ls_ncu.log
