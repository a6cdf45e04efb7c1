#!/usr/bin/env bash
# session 53 call D (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# variant_bench of the working tree (section 22.5: strided_whole's channel vectors x steps a thread).
# 1) variant_bench at (1024, 1024) and (1024, 4096) axis 0, twice; 2) ncu --set full of the
# strided kernels at (1024, 1024), fp32 and bf16 (CSV details).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
V=auto,strided_stage,strided_pipe_narrow,strided_whole,whole_n1s4,whole_n2s4,whole_n4s4,whole_n2s8,whole_n4s8
for i in 1 2; do VB_SHAPES="1:1024:1024,1:1024:4096" VB_ONLY=$V timeout 60 .bin/variant_bench; done > $R/variants_whole.log 2>&1
cat $R/variants_whole.log
for bf in 0 1; do
  env VB_SHAPES=1:1024:1024 VB_ONLY=$V $([[ $bf == 1 ]] && echo VB_NCU_BF16=1) timeout 120 \
    ncu --clock-control none --set full --csv --page details -k regex:"whole|stage|pipe" .bin/variant_bench ncu \
    > $R/ncu_whole_$bf.csv 2> $R/ncu_whole_$bf.err
  echo "ncu $bf rc=$?"; grep '"Duration"' $R/ncu_whole_$bf.csv | cut -d, -f5,13- | head -12
done
