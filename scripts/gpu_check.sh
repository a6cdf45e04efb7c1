#!/usr/bin/env bash
# THE one GPU script: build + install the package, GPU tests, compute-sanitizer
# (memcheck, racecheck, synccheck) on a small standalone driver, determinism (500 runs),
# the > 2^31-element check and the benchmark. Everything lands under $OUT (default ./out).
#   STAGES="build driver pytest sanitize determinism big bench" scripts/gpu_check.sh
# Each stage has its own time limit so that a hang cannot eat the whole call.
set -u -o pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
STAGES=${STAGES:-"build driver pytest determinism big bench sanitize"}
ARCH=${ARCH:-90}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false
has() { [[ " $STAGES " == *" $1 "* ]]; }
status=0
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc in $(( $(date +%s) - t0 ))s"
  tail -n "${TAIL:-15}" "$OUT/$name.log"
  [[ $rc -ne 0 ]] && status=1
  return $rc
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -2
  git rev-parse HEAD 2>/dev/null
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

BIN=${BIN:-/tmp/jss_bin}
mkdir -p "$BIN"
if has driver || has sanitize || has determinism || has big || has bench; then
  # the standalone driver and the CUB baseline build in the background while pip builds
  ( nvcc -O2 -std=c++17 -arch=sm_$ARCH -lineinfo -Icuda cuda/tools/scan_driver.cu cuda/scan_f32.cu \
      cuda/scan_f64.cu cuda/scan_bf16.cu cuda/scan_f16.cu cuda/scan_c64.cu cuda/dispatch.cc -o "$BIN/scan_driver" \
      > "$OUT/build_driver.log" 2>&1
    nvcc -O3 -std=c++17 -arch=sm_$ARCH benchmarks/cub_affine_scan.cu -o "$BIN/cub_affine_scan" \
      >> "$OUT/build_driver.log" 2>&1 ) &
  BG=$!
fi

if has build; then
  PIPCMD=($PY -m pip install --no-build-isolation --no-deps -v . -C build-dir=/tmp/jss_build
          -C cmake.define.CMAKE_CUDA_ARCHITECTURES=$ARCH -C cmake.define.JAX_SELSCAN_CUDA=ON)
  step build 420 "${PIPCMD[@]}" || { echo "retrying without the CPU extension";
    step build_nocpu 420 "${PIPCMD[@]}" -C cmake.define.JAX_SELSCAN_CPU=OFF; }
fi
[[ -n "${BG:-}" ]] && wait $BG && echo "driver + cub built" || true
(cd /tmp && $PY -c "import jax_selscan as j; print('has_cuda_kernels', j.has_cuda_kernels)")

# the benchmark runs early so that a call cut short by its time limit still brings it back
has driver && step driver 240 "$BIN/scan_driver" check
has bench && TAIL=40 step bench 540 $PY -P benchmarks/gpu_linear_scan.py --out "$OUT" --cub "$BIN/cub_affine_scan" ${BENCH_ARGS:-}
has determinism && step determinism 240 "$BIN/scan_driver" determinism 500
has big && step big 300 "$BIN/scan_driver" big
has pytest && TAIL=25 step pytest 420 $PY -P -m pytest -q -x tests/test_cuda_linear_scan.py $(ls tests/test_scan_mirrors.py 2>/dev/null) -p no:cacheprovider
if has sanitize; then
  for tool in memcheck racecheck synccheck; do
    TAIL=6 step "sanitize_$tool" ${SAN_LIMIT:-150} compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/scan_driver" tiny
  done
fi
echo "gpu_check status=$status"
exit $status
