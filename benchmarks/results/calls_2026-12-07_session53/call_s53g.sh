#!/usr/bin/env bash
# session 53 call G (ignored wrapper; copied to benchmarks/results/calls_2026-12-07_session53 after):
# variant_bench of fab12f2's tree: strided_whole (the package's launch) against auto at short
# strided axes of 2^20-2^26 elements (section 22.7), twice.
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name --format=csv,noheader
R=${OUT:-$PWD/out}; mkdir -p $R
export VB_SHAPES="1:1024:1024,1:1024:2048,1:1024:4096,1:512:4096,1:256:8192,16:256:1024,1:1024:16384,64:256:1024,2048:32:1024"
export VB_ONLY=auto,strided_whole,whole_n2s4,whole_n4s4,whole_n4s8
for i in 1 2; do timeout 120 .bin/variant_bench; done 2>&1 | tee $R/variants_whole_sizes.log
