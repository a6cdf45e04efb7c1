// Host-side pieces shared by the selective-scan forward and backward drivers
// (selective_scan_cpu.cc, selective_scan_bwd_cpu.cc): ISA table lookup and
// scratch buffers. Baseline target only (not for the per-ISA kernel files).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <new>
#include <string>

#include "linear_scan_cpu.h"  // kernel_table_named, select_kernel_table

// The tables of one family compiled into this build, best first:
// JSS_ISA_TABLES(ss_table_) is ss_table_avx512(), ss_table_avx2(), ss_table_generic() on x86-64.
#if defined(__x86_64__) || defined(_M_X64)
#define JSS_ISA_TABLES(prefix) prefix##avx512(), prefix##avx2(), prefix##generic()
#elif defined(__aarch64__)
#define JSS_ISA_TABLES(prefix) prefix##neon(), prefix##generic()
#else
#define JSS_ISA_TABLES(prefix) prefix##generic()
#endif

namespace jax_selscan {

// The table in `all` for the ISA called `name` ("scalar" is "generic"), or null
// when there is none or this CPU lacks that ISA.
template <class Table>
const Table* isa_table_named(std::initializer_list<const Table*> all, const std::string& name) {
  const std::string n = name == "scalar" ? "generic" : name;
  for (const Table* t : all)
    if (n == t->name && kernel_table_named(n) != nullptr) return t;  // CPU support checked there
  return nullptr;
}

// The table of the ISA the linear scan would use now (JAX_SELSCAN_CPU_ISA), found
// by `named`; on failure null and, for a missing table, "no <what> kernel for <isa>".
template <class Table>
const Table* select_isa_table(const Table* (*named)(const std::string&), const char* what, std::string* error) {
  const KernelTable* k = select_kernel_table(error);
  if (k == nullptr) return nullptr;
  const Table* t = named(k->name);
  if (t == nullptr && error != nullptr) *error = std::string("no ") + what + " kernel for " + k->name;
  return t;
}

// Scratch floats, 64-byte aligned, size rounded up to whole cache lines. Throws
// std::bad_alloc when the memory is not there (the FFI handlers turn that into an error),
// so no kernel ever runs on a null buffer.
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float, FreeDeleter>;
inline FloatBuffer alloc_floats(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  float* p = static_cast<float*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64));
  if (p == nullptr) throw std::bad_alloc();
  return FloatBuffer(p);
}

// L split, the carry between pieces: the state (adjoint) x entering a piece leaves it as
// end + prod * x, prod being dA's product over the piece (0 once dropped below 2^-30). A NaN
// or +-Inf x stays so instead (every dA > 0): the dropped 0 would otherwise make it finite.
inline float ss_carry(float x, float end, float prod) {
  return std::isfinite(x) ? end + prod * x : x + end;
}

// Whether n floats are all finite (an entering state or adjoint the split may not drop).
inline bool ss_all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return false;
  return true;
}

// The fields every L-split piece sets, forward (SsTask) and backward (SsBwdTask) alike.
template <class Task>
inline void set_split_piece(Task& t, float* work, int phase, bool reverse, int64_t piece, int64_t pieces) {
  t.work = work;
  t.split = 1;
  t.phase = phase;
  t.reverse = reverse ? 1 : 0;
  t.piece = piece;
  t.pieces = pieces;
}

}  // namespace jax_selscan
