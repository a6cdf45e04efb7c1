#!/usr/bin/env bash
# Builds and runs the selective-scan C++ tests (test_selective_scan: forward and
# backward; test_exp2_ulp)
# with plain compiler commands, natively or, with --arm, cross-compiled for
# aarch64 and run under qemu-user (needs g++-aarch64-linux-gnu and qemu-user).
#   cpu_arm/tests/build_selective_tests.sh          x86-64: AVX-512, AVX2, generic (each forced in turn)
#   cpu_arm/tests/build_selective_tests.sh --arm    aarch64: NEON and generic under qemu (quick cases)
# Emulated runs check correctness only; their timings mean nothing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="$here/.."
arm=0
[[ "${1:-}" == "--arm" ]] && arm=1
if [[ $arm == 1 ]]; then
  out="${OUT_DIR:-${TMPDIR:-/tmp}/jax_selscan_ss_tests_arm}"
  CXX="${CXX_ARM:-aarch64-linux-gnu-g++}"
  QEMU="${QEMU:-qemu-aarch64}"
  SYSROOT="${SYSROOT:-/usr/aarch64-linux-gnu}"
  runner=("$QEMU" -L "$SYSROOT")
else
  out="${OUT_DIR:-${TMPDIR:-/tmp}/jax_selscan_ss_tests}"
  CXX="${CXX:-g++}"
  runner=()
fi
flags=(-std=c++17 -O2 -Wall -Wextra -Wno-uninitialized -I"$src")
mkdir -p "$out"
objs=()
isa() {  # name, extra flags...
  local name="$1"; shift
  $CXX "${flags[@]}" "$@" -DJSS_ISA_NAME="$name" -c "$src/kernels_isa.cc" -o "$out/k_$name.o" &
  $CXX "${flags[@]}" "$@" -DJSS_ISA_NAME="$name" -c "$src/selective_scan_isa.cc" -o "$out/ss_$name.o" &
  wait
  $CXX "${flags[@]}" "$@" -DJSS_ISA_NAME="$name" -c "$src/selective_scan_bwd_isa.cc" -o "$out/ssb_$name.o"
  objs+=("$out/k_$name.o" "$out/ss_$name.o" "$out/ssb_$name.o")
}
isa generic -DJSS_SIMD_GENERIC
case "$($CXX -dumpmachine)" in
  x86_64*) isa avx2 -mavx2 -mfma -mf16c; isa avx512 -mavx512f -mavx2 -mfma -mf16c ;;
  aarch64*) isa neon ;;
esac
core=("$src/driver.cc" "$src/dispatch.cc" "$src/selective_scan_cpu.cc" "$src/selective_scan_bwd_cpu.cc")
$CXX "${flags[@]}" -pthread "$here/test_selective_scan.cc" "${core[@]}" "${objs[@]}" -o "$out/test_selective_scan"
$CXX "${flags[@]}" -pthread "$here/test_exp2_ulp.cc" "${core[@]}" "${objs[@]}" -o "$out/test_exp2_ulp"
if [[ $arm == 1 ]]; then
  JSS_TEST_ISAS="${JSS_TEST_ISAS-neon}" "${runner[@]}" "$out/test_selective_scan" --quick  # NEON only
  "${runner[@]}" "$out/test_exp2_ulp" --stride "${EXP2_STRIDE:-997}"
else
  "$out/test_selective_scan"
  "$out/test_exp2_ulp" --stride "${EXP2_STRIDE:-1}"
fi
