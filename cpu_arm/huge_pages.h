// Transparent huge pages for XLA's fresh output buffers (host FFI handlers only).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>  // madvise
#endif

namespace jax_selscan {

// XLA hands a handler a fresh output buffer on most calls; first-touching it page by page
// cost about as much as a memory-bound kernel on a VM (≈ 0.26 ms per MB; docs/PERFORMANCE_CPU.md,
// linear_scan round 5). Asking for transparent huge pages on its 2 MiB-aligned interior (where
// THP is "madvise") cuts the faults 512-fold. Advisory only: no result changes, and nothing
// happens where THP is "never" or off Linux. Buffers under 4 MiB are left alone.
inline void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (data == nullptr || bytes < 2 * kHuge) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace jax_selscan
