// The kernel table of one ISA. This file is compiled once per ISA with that
// ISA's flags (see CMakeLists.txt): -DJSS_ISA_NAME=avx512 -mavx512f -mavx2
// -mfma -mf16c, -DJSS_ISA_NAME=avx2 -mavx2 -mfma -mf16c, -DJSS_ISA_NAME=neon,
// or -DJSS_ISA_NAME=generic -DJSS_SIMD_GENERIC. dispatch.cc picks one table at
// run time. Keep this translation unit free of standard-library templates:
// their out-of-line copies could be shared with code built for a lesser CPU.
#include "kernel_api.h"
#include "scan_kernels.h"

#ifndef JSS_ISA_NAME
#error "define JSS_ISA_NAME (avx512, avx2, neon or generic)"
#endif
#define JSS_CAT2(a, b) a##b
#define JSS_CAT(a, b) JSS_CAT2(a, b)

namespace jax_selscan {
namespace {

template <class T> void strided_fn(const ScanTask& t) { kernels::Scan<T>::strided(t); }
template <class T> void rows_fn(const ScanTask& t) { kernels::Scan<T>::rows(t); }

template <class T> void widen_fn(const uint16_t* src, int64_t n, float* dst) {
  using K = kernels::Scan<T>;
  const T* s = reinterpret_cast<const T*>(src);
  int64_t i = 0;
  for (; i + K::kVW <= n; i += K::kVW) simd::store(dst + i, kernels::VecIO<T>::load(s + i));
  ElemInfo<T>::to_lanes(s + i, n - i, dst + i);
}
template <class T> void narrow_fn(const float* src, int64_t n, uint16_t* dst) {
  using K = kernels::Scan<T>;
  T* d = reinterpret_cast<T*>(dst);
  int64_t i = 0;
  for (; i + K::kVW <= n; i += K::kVW) kernels::VecIO<T>::store(d + i, simd::load(src + i));
  ElemInfo<T>::from_lanes(src + i, n - i, d + i);
}

// Order: DType::kF32, kF64, kC64, kBF16, kF16. constexpr: no initialiser runs
// at load time (it would run this ISA's code on any CPU).
constexpr KernelTable kTable = {
    simd::kBackend,
    {strided_fn<float>, strided_fn<double>, strided_fn<c64_t>, strided_fn<bf16_t>, strided_fn<f16_t>},
    {rows_fn<float>, rows_fn<double>, rows_fn<c64_t>, rows_fn<bf16_t>, rows_fn<f16_t>},
    {kernels::Scan<float>::kR, kernels::Scan<double>::kR, kernels::Scan<c64_t>::kR,
     kernels::Scan<bf16_t>::kR, kernels::Scan<f16_t>::kR},
    {kernels::Scan<float>::kTile, kernels::Scan<double>::kTile, kernels::Scan<c64_t>::kTile,
     kernels::Scan<bf16_t>::kTile, kernels::Scan<f16_t>::kTile},
    {kernels::Scan<float>::kWide, kernels::Scan<double>::kWide, kernels::Scan<c64_t>::kWide,
     kernels::Scan<bf16_t>::kWide, kernels::Scan<f16_t>::kWide},
    {widen_fn<bf16_t>, widen_fn<f16_t>},
    {narrow_fn<bf16_t>, narrow_fn<f16_t>},
};

}  // namespace

const KernelTable* JSS_CAT(kernel_table_, JSS_ISA_NAME)() { return &kTable; }

}  // namespace jax_selscan
