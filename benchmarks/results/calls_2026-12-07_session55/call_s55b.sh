#!/usr/bin/env bash
# session 55 call B (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session55 after):
# variant_bench of the working tree (notes 24.2: strided_pipe with 4-byte channel vectors,
# pipe_v4_*) beside auto, the narrow (v8) and wide pipes, two runs; strided shapes.
cd "$(dirname "$0")/.."
R=${OUT:-$PWD/out}; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee $R/gpu.txt
SH="1:65536:1024,1:65536:2048,1:65536:256,1:65536:512,1:131072:1024,1:16384:4096,1:4096:24576,1:32768:2048"
VO=auto,strided_pipe,strided_pipe_narrow,pipe_v4_s64_n3_f32w4,pipe_v4_s64_n3_f16w4,pipe_v4_s32_n6_f32w4,pipe_v4_s32_n3_f32w4
for run in 1 2; do
  echo "--- run $run"
  VB_SHAPES=$SH VB_ONLY=$VO timeout 200 .bin/variant_bench 2>&1 | grep -v "^#"
done | tee $R/vb_v4.log
