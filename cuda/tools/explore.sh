#!/usr/bin/env bash
# One GPU call for round 3 (strided_stage), prioritised so that a cut-short call still
# brings back the most important numbers: binaries carried in .devbin (built here with
# nvcc 13.0 for sm_90; rebuilt on the device if they do not run), the package built in the
# background meanwhile. Order: driver quick check (every kernel), the strided variants side
# by side (CUDA events), 500-run determinism of strided_stage, memcheck / racecheck /
# synccheck of strided_stage, ncu on two variants, then the JAX benchmark of the strided
# shapes (auto vs lookback_regs vs lax) and the GPU pytest of "auto".
set -u -o pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"; B=.devbin; T0=$(date +%s)
el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
python3 -m pip install --no-build-isolation --no-deps -q . -C build-dir=/tmp/jss_build \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90 -C cmake.define.JAX_SELSCAN_CPU=OFF > /tmp/pip.log 2>&1 &
PIP=$!
exec > >(tee "$OUT/explore.log") 2>&1  # not a { } | tee pipeline: "wait $PIP" needs this shell
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
if ! timeout 20 $B/drv tiny strided_stage > /tmp/tiny.log 2>&1; then
  el "carried binaries failed ($(tail -1 /tmp/tiny.log)); building here"; B=/tmp/jss_x; mkdir -p $B
  F="--expt-relaxed-constexpr -std=c++17 -arch=sm_90 -Icuda -lineinfo"
  nvcc -O3 $F cuda/tools/variant_bench.cu cuda/dispatch.cc -o $B/vb &
  nvcc -O2 $F cuda/tools/scan_driver.cu cuda/scan_f32.cu cuda/scan_f64.cu cuda/scan_bf16.cu cuda/scan_f16.cu \
    cuda/scan_c64.cu cuda/dispatch.cc -o $B/drv; wait %2 2>/dev/null; wait
fi
timeout 45 $B/drv quick > /tmp/check.log 2>&1; el "driver quick rc=$?"
grep -E "FAIL" /tmp/check.log | head -10; grep -c strided_stage /tmp/check.log; tail -1 /tmp/check.log
VB_STRIDED=1 timeout 60 $B/vb 2>&1; el "variants done"
timeout 40 $B/drv determinism 500 C= 2>&1 | grep -E "strided_stage|auto"; el "determinism done"
for tool in memcheck racecheck synccheck; do
  timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 $B/drv tiny strided_stage > /tmp/san_$tool.log 2>&1
  el "sanitize $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|check:' /tmp/san_$tool.log | tr '\n' ' ')"
done
S="--clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats"
timeout 25 ncu $S -k regex:strided_stage -c 1 $B/vb ncu > /tmp/ncu1.txt 2>&1
timeout 25 ncu $S -k regex:strided_stage --launch-skip 5 -c 1 $B/vb ncu > /tmp/ncu2.txt 2>&1
grep -hE "strided_stage_kernel|DRAM Throughput|Achieved Occupancy|Theoretical Occ|Duration|Warp Cycles Per Issued" /tmp/ncu1.txt /tmp/ncu2.txt | sed 's/  */ /g'
el "ncu done"; wait $PIP; el "pip rc=$? $(tail -1 /tmp/pip.log)"
(cd /tmp && python3 -c "import jax_selscan as j; print('has_cuda_kernels', j.has_cuda_kernels)")
PYTHONUNBUFFERED=1 timeout 75 python3 -P benchmarks/gpu_linear_scan.py --out "$OUT" --algos auto,lookback_regs --shapes axis 2>&1 | grep -v Warn
el "bench done"
PYTHONUNBUFFERED=1 timeout 60 python3 -P -m pytest -q -x tests/test_cuda_linear_scan.py -k "auto" -p no:cacheprovider 2>&1 | tail -4
el "end"
cat /tmp/check.log /tmp/san_*.log /tmp/pip.log > "$OUT/details.log" 2>/dev/null; cp /tmp/ncu1.txt /tmp/ncu2.txt "$OUT/" 2>/dev/null
