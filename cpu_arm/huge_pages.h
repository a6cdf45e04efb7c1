// XLA's fresh output buffers on the host (FFI handlers only): transparent huge pages, and
// their first touch spread over the threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>  // madvise
#include <unistd.h>    // sysconf
#endif

#include "linear_scan_cpu.h"  // Executor

namespace jax_selscan {

constexpr uintptr_t kHugePage = uintptr_t(2) << 20;

// XLA hands a handler a fresh output buffer on most calls; first-touching it page by page
// cost about as much as a memory-bound kernel on a VM (≈ 0.26 ms per MB; docs/PERFORMANCE_CPU.md,
// linear_scan round 5). Asking for transparent huge pages on its 2 MiB-aligned interior (where
// THP is "madvise") cuts the faults 512-fold. Advisory only: no result changes, and nothing
// happens where THP is "never" or off Linux. Buffers under 4 MiB are left alone.
inline void advise_huge_pages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (data == nullptr || bytes < 2 * kHugePage) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// The threads of a call write neighbouring parts of one output, so several of them fault on
// the same 2 MiB page at once, and Linux zeroes a whole huge page for each of them before it
// takes the page-table lock: all but one of those pages are thrown away (docs/PERFORMANCE_CPU.md,
// "fresh output pages"). Faulting the buffer in first, one 2 MiB stretch per item of a
// parallel_for (MADV_POPULATE_WRITE: the pages are mapped writable, their contents untouched),
// zeroes each page once, on all threads. Skipped for one thread, for buffers under 4 MiB,
// where the kernel lacks MADV_POPULATE_WRITE (Linux < 5.14), and with JAX_SELSCAN_CPU_PREFAULT=0.
inline void prepare_output(void* data, size_t bytes, Executor& executor) {
  advise_huge_pages(data, bytes);
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  if (data == nullptr || bytes < 2 * kHugePage || executor.num_threads() <= 1) return;
  if (const char* env = std::getenv("JAX_SELSCAN_CPU_PREFAULT"); env != nullptr && env[0] == '0') return;
  // madvise takes whole pages: the system's size (64 KiB on some Arm kernels), not 4 KiB
  static const uintptr_t kPage = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes + kPage - 1) & ~(kPage - 1);
  const uintptr_t first = begin & ~(kHugePage - 1);  // stretch i: [first + i * 2 MiB, + 2 MiB)
  const int64_t stretches = static_cast<int64_t>((end - first + kHugePage - 1) / kHugePage);
  executor.parallel_for(stretches, [&](int64_t i) {
    uintptr_t lo = first + static_cast<uintptr_t>(i) * kHugePage, hi = lo + kHugePage;
    if (lo < begin) lo = begin;
    if (hi > end) hi = end;
    // Advisory too: on failure (EINVAL from an older kernel, ENOMEM) the kernel's own writes fault.
    if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
  });
#else
  (void)executor;
#endif
}

}  // namespace jax_selscan
