// The CPU selective scan as a plain C++ function (no XLA types): the FFI
// handler (selective_scan_ffi.cc) and the C++ tests both call it.
#pragma once

#include <string>

#include "linear_scan_cpu.h"  // Executor, select_kernel_table
#include "selective_scan_api.h"

namespace jax_selscan {

// The selective-scan table compiled for the ISA called `name` (a KernelTable
// name), or null.
const SsTable* ss_table_named(const std::string& name);

// The table to use now (follows JAX_SELSCAN_CPU_ISA like the linear scan).
const SsTable* select_ss_table(std::string* error);

// Runs one call. Tasks are (batch row, tile of `lanes` channels of one group);
// they are spread over the executor's threads, each thread reusing one
// workspace. Bidirectional calls keep exp(delta A) of a task's leading blocks of lanes steps
// (lanes * dstate * lanes floats each; all of them when they fit) in a buffer of at most
// ss_default_da_bytes(): kSsMaxDABytes, or on Intel x86 half the L2 if that is more. Until
// session 35 a sequence over the limit kept none (PERFORMANCE_CPU). The buffer must stay in L2 (and then some) to
// beat recomputing: on Zen 4 (1 MiB L2), one core, D 128, N 16, the fused call was 1.14x of two
// calls at L 128 (128 KiB), 0.97x at L 256, 0.9x with 2 MiB; on an Intel core with 2 MiB of L2,
// 1.29x at 512 KiB, 1.24x at 1 MiB, 0.63x at 2 MiB (PERFORMANCE_CPU, session 25). The
// environment variable JAX_SELSCAN_SS_DA_BYTES overrides it.
constexpr int64_t kSsMaxDABytes = int64_t(128) << 10;
int64_t ss_default_da_bytes();
// Blocks of `lanes` steps whose exp(delta A) a bidirectional task keeps: as many as fit
// ss_default_da_bytes() (or JAX_SELSCAN_SS_DA_BYTES), at most all of them. Forward and backward.
int64_t ss_kept_da_blocks(int64_t lanes, int64_t dstate, int64_t length);
// Blocks whose prepared rows (3 lanes x lanes floats each) a bidirectional task on the channel
// path keeps for its forward pass: all, up to kSsMaxPrepBytes (JAX_SELSCAN_SS_PREP_BYTES
// overrides it, for tests), so that the scratch stays bounded at long L.
constexpr int64_t kSsMaxPrepBytes = int64_t(16) << 20;
int64_t ss_kept_prep_blocks(int64_t lanes, int64_t length);
// With fewer tasks than threads each task's sequence is split into pieces of at
// least this many steps, one per thread (JAX_SELSCAN_SS_PIECE_STEPS overrides it,
// for tests). The split changes results by float rounding only (see SsTask).
constexpr int64_t kSsMinPieceSteps = 4096;
void selective_scan_cpu(const SsParams& p, const SsTable& table, Executor& executor);

}  // namespace jax_selscan
