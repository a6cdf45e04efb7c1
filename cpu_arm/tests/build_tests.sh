#!/usr/bin/env bash
# Builds and runs the C++ tests with plain compiler commands (no CMake).
#   cpu_arm/tests/build_tests.sh [out_dir]        (CXX=clang++ to change compiler; CXX="ccache g++"
#   reuses the kernel objects between this and build_selective_tests.sh: same command lines)
# On x86-64 the kernel file is compiled three times (generic, AVX2, AVX-512);
# elsewhere twice at most (generic, and NEON on aarch64).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/.."
out="${1:-${TMPDIR:-/tmp}/jax_selscan_cpu_tests}"
CXX="${CXX:-g++}"
flags=(-std=c++17 -O2 -Wall -Wextra -Wno-uninitialized -I"$src")
mkdir -p "$out"
objs=()
isa() {  # name, extra flags...
  local name="$1"; shift
  $CXX "${flags[@]}" "$@" -DJSS_ISA_NAME="$name" -c "$src/kernels_isa.cc" -o "$out/k_$name.o"
  objs+=("$out/k_$name.o")
}
isa generic -DJSS_SIMD_GENERIC
case "$($CXX -dumpmachine)" in
  x86_64*) isa avx2 -mavx2 -mfma -mf16c; isa avx512 -mavx512f -mavx2 -mfma -mf16c ;;
  aarch64*) isa neon ;;
esac
$CXX "${flags[@]}" -pthread "$here/test_linear_scan.cc" "$src/driver.cc" "$src/dispatch.cc" \
  "${objs[@]}" -o "$out/test_linear_scan"
"$out/test_linear_scan" "$@"
