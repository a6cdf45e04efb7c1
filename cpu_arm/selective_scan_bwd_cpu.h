// The CPU selective-scan backward as a plain C++ function (no XLA types): the FFI
// handler (selective_scan_ffi.cc) and the C++ tests both call it.
#pragma once

#include <string>

#include "linear_scan_cpu.h"  // Executor
#include "selective_scan_bwd_api.h"

namespace jax_selscan {

// The backward table compiled for the ISA called `name` (a KernelTable name), or null.
const SsBwdTable* ss_bwd_table_named(const std::string& name);

// The table to use now (follows JAX_SELSCAN_CPU_ISA like the forward).
const SsBwdTable* select_ss_bwd_table(std::string* error);

// Runs one backward call. Tasks are (batch row, tile of `lanes` channels of one
// group), claimed dynamically by at most executor.num_threads() workers (one
// workspace each; calls below 2^16 batch*D*L*N stay on the calling thread;
// JAX_SELSCAN_CPU_THREADS caps the threads through the executor). Every gradient
// summed over channels, batch or time is added up from per-task partials in task
// order afterwards, so the results are bitwise independent of the thread count.
// The tile size depends on the ISA (lanes), so different ISAs differ by rounding.
void selective_scan_bwd_cpu(const SsBwdParams& q, const SsBwdTable& table, Executor& executor);

// Slabs per group (varying B / C): work items and [L][N] partials per (batch row,
// group); fixed so that results do not depend on the threads.
constexpr int64_t kSsBwdSlabs = 32;

}  // namespace jax_selscan
