#!/usr/bin/env bash
# Cross-compiles the C++ tests for aarch64 and runs them under qemu-user
# (the NEON kernels; the generic ones are built, and tested natively on x86-64; JSS_TEST_ISAS=
# tests them here too). Needs g++-aarch64-linux-gnu and qemu-user:
#   apt-get install -y g++-aarch64-linux-gnu qemu-user
# Usage: cpu_arm/tests/run_cross_arm.sh [--full]   (default: --quick, fewer large cases)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/.."
out="${OUT_DIR:-${TMPDIR:-/tmp}/jax_selscan_cpu_tests_arm}"
CXX="${CXX:-aarch64-linux-gnu-g++}"
QEMU="${QEMU:-qemu-aarch64}"
SYSROOT="${SYSROOT:-/usr/aarch64-linux-gnu}"
mode="--quick"
[[ "${1:-}" == "--full" ]] && mode=""
# The kernel objects are compiled with the same command lines as in build_selective_tests.sh,
# so that with CXX="ccache aarch64-linux-gnu-g++" (as .ci/run does) they are compiled once.
flags=(-std=c++17 -O2 -Wall -Wextra -Wno-uninitialized -I"$src")
mkdir -p "$out"
$CXX "${flags[@]}" -DJSS_SIMD_GENERIC -DJSS_ISA_NAME=generic -c "$src/kernels_isa.cc" -o "$out/k_generic.o"
$CXX "${flags[@]}" -DJSS_ISA_NAME=neon -c "$src/kernels_isa.cc" -o "$out/k_neon.o"
$CXX "${flags[@]}" -pthread "$here/test_linear_scan.cc" "$src/driver.cc" "$src/dispatch.cc" \
  "$out/k_generic.o" "$out/k_neon.o" -o "$out/test_linear_scan"
# NEON only (JSS_TEST_ISAS: see tests/test_util.h; JSS_TEST_ISAS= tests every ISA)
JSS_TEST_ISAS="${JSS_TEST_ISAS-neon}" "$QEMU" -L "$SYSROOT" "$out/test_linear_scan" $mode
# The selective-scan tests (test_selective_scan --quick, test_exp2_ulp) the same way.
OUT_DIR="$out/selective" CXX_ARM="$CXX" QEMU="$QEMU" SYSROOT="$SYSROOT" bash "$here/build_selective_tests.sh" --arm
