// The interface between the driver (planning, threads) and the per-ISA kernels.
// Plain structs only (no inline code): this header is included by translation
// units built with different -m flags.
#pragma once

#include <cstdint>

namespace jax_selscan {

enum class DType : int32_t { kF32 = 0, kF64 = 1, kC64 = 2, kBF16 = 3, kF16 = 4 };
constexpr int kNumDTypes = 5;

enum class Mode : int32_t {
  kScan = 0,       // initial state from h0 (storage dtype; zero when h0 is null); writes h (and p)
  kScanFromState,  // initial state from st_h / st_p (lanes); writes h (and p)
  kReduce,         // initial state h = 0, p = 1; writes nothing but the final (h, p) to st_h / st_p
};

// `count` independent sequences of `n` steps each. Sequence i, step t lives at
// element offset  i * seq_stride + t * ld  from a / b / h / p (t = 0 is the
// first element in memory; with `reverse` the walk starts at t = n - 1).
// The strided kernel takes ld = inner, seq_stride = 1 (channels side by side);
// the rows kernel takes ld = 1 (each sequence contiguous).
// The state of sequence i lives in "slot" slot0 + i * slot_stride: h0[slot] in
// the storage dtype, st_h / st_p at lanes [slot * lanes_per_element, ...).
struct ScanTask {
  const void* a;
  const void* b;
  void* h;
  void* p;  // running product of a (nullptr: not wanted). kReduce ignores h and p.
  int64_t n, ld, count, seq_stride;
  const void* h0;
  void* st_h;
  void* st_p;
  int64_t slot0, slot_stride;
  Mode mode;
  bool reverse;
};

using KernelFn = void (*)(const ScanTask&);

struct KernelTable {
  const char* name;                  // "avx512", "avx2", "neon", "generic"
  KernelFn strided[kNumDTypes];      // indexed by DType
  KernelFn rows[kNumDTypes];
  int32_t rows_per_group[kNumDTypes];  // sequences the rows kernel does at once
  int32_t tile[kNumDTypes];            // channels the strided kernel walks at once
  int32_t wide[kNumDTypes];            // ... in its wide-block mode (count >= wide / 8)
  // This ISA's vector conversions between float and 16-bit patterns
  // ([0]: bf16, [1]: f16), exported so the tests can compare them bit for bit.
  void (*widen16[2])(const uint16_t* src, int64_t n, float* dst);
  void (*narrow16[2])(const float* src, int64_t n, uint16_t* dst);
};

// One table per compiled ISA (kernels_isa.cc); which exist depends on the target.
const KernelTable* kernel_table_generic();
#if defined(__x86_64__) || defined(_M_X64)
const KernelTable* kernel_table_avx2();
const KernelTable* kernel_table_avx512();
#endif
#if defined(__aarch64__)
const KernelTable* kernel_table_neon();
#endif

}  // namespace jax_selscan
