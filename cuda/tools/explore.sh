#!/usr/bin/env bash
# Exploratory GPU call: build the variant bench and the driver, check correctness of every
# kernel (driver check), time the variants side by side, profile three kernels with ncu.
set -u -o pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; B=/tmp/jss_x; mkdir -p $B
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/env.txt" 2>&1
F="--expt-relaxed-constexpr -std=c++17 -arch=sm_90 -Icuda"
nvcc -O3 $F -lineinfo cuda/tools/variant_bench.cu cuda/dispatch.cc -o $B/vb > "$OUT/build.log" 2>&1 &
nvcc -O2 $F -lineinfo cuda/tools/scan_driver.cu cuda/scan_f32.cu cuda/scan_f64.cu cuda/scan_bf16.cu cuda/scan_f16.cu \
  cuda/scan_c64.cu cuda/dispatch.cc -o $B/drv >> "$OUT/build.log" 2>&1
wait; tail -3 "$OUT/build.log"
timeout 150 $B/drv check > "$OUT/check.log" 2>&1; echo "check rc=$?"; grep -E "FAIL|failures" "$OUT/check.log" | tail -5
timeout 200 $B/vb 2>&1 | tee "$OUT/bench.log"
S="--clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
for ks in "row_walk_kernel 1" "strided_walk_kernel 0" "tile_scan_kernel 4"; do set -- $ks; k=$1
  timeout 60 ncu $S -k regex:$k -s $2 -c 1 $B/vb ncu > "$OUT/ncu_$k.txt" 2>&1
  grep -E "DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Duration|Block Limit|Stall|Warp Cycles Per Issued" "$OUT/ncu_$k.txt" | head -14
done
timeout 60 $B/drv determinism 50 2>&1 | tail -12
