// The CPU linear scan as a plain C++ function (no XLA types): the FFI handlers
// (ffi_module.cc) and the C++ tests both call it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kernel_api.h"

namespace jax_selscan {

// Where parallel work runs. parallel_for(n, fn) calls fn(0 .. n-1), each once,
// possibly concurrently, and returns when all are done.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual int64_t num_threads() const = 0;
  virtual void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) = 0;
};

class InlineExecutor final : public Executor {
 public:
  int64_t num_threads() const override { return 1; }
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
};

// The array seen as (outer, L, inner) in row-major order, scanned along L.
struct LinearScanArgs {
  DType dtype;
  const void* a;
  const void* b;
  const void* h0;  // (outer, inner); may be null (zeros)
  void* h;
  void* a_prod;  // may be null
  int64_t outer, length, inner;
  bool reverse;
};

// Below this many elements a call runs on the calling thread only (handing
// work to other threads costs more than it saves).
constexpr int64_t kMinParallelElements = int64_t(1) << 16;

void linear_scan_cpu(const LinearScanArgs& args, const KernelTable& kernels, Executor& executor);

// ---- ISA dispatch (dispatch.cc) ------------------------------------------------
// Kernel tables this CPU can run, best first (the generic one always last).
std::vector<const KernelTable*> supported_kernel_tables();
// Table for a name ("avx512", "avx2", "neon", "generic"), or null when this
// build or this CPU lacks it.
const KernelTable* kernel_table_named(const std::string& name);
// The table to use now: JAX_SELSCAN_CPU_ISA when set (read on every call, so
// it can be changed at run time), otherwise the best supported. On an unknown
// or unsupported name returns null and fills *error.
const KernelTable* select_kernel_table(std::string* error);

}  // namespace jax_selscan
