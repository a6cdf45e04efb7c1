// Host-side interface of the CUDA linear_scan kernels (plain C++, no CUDA syntax),
// shared by the FFI handlers (ffi_module.cc) and the per-dtype kernel files.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace jss {

// Index into primitives.ALGORITHMS on the Python side: keep in sync.
enum Algorithm : int {
  kAuto = 0,
  kBlelloch = 1,
  kThreePass = 2,
  kLookbackSerial = 3,
  kLookbackWarp = 4,
  kLookbackRegs = 5,
  kHillisSteele = 6,
  kNumAlgorithms = 7,  // the named algorithms (what the FFI accepts)
  // Internal kernels that only "auto" resolves to (no inter-block communication):
  kRowWalk = 7,      // contiguous: one warp walks one whole row
  kStridedWalk = 8,  // strided: one warp walks 32 (64 for 16-bit types) channels through L
  // Internal, with inter-block communication (a look-back over one flag per tile):
  kStridedStage = 9,  // strided: (L-chunk x 32-lane channel tile, StageCfg<T>::CW) staged in smem
  kRowRounds = 10,    // contiguous, few long rows: co-resident blocks fold each round's tiles
  kRowStage = 11,     // contiguous, few long rows: lookback_regs' tile staged in shared memory
  kStridedPipe = 12,  // strided: strided_stage's tile in a persistent warp-specialised pipeline
  kRowPipe = 13,      // contiguous, few long fp32 rows: tiles scanned in place in that kind of pipeline
  kStridedPipeNarrow = 14,  // strided, 16-bit types and fp32: strided_pipe on 8-byte vectors (tiles of 128 / 64 channels)
  kStridedWhole = 15,  // strided, short axes: one block per channel tile through the whole axis (no scratch)
  kNumInternal = 16,
};

enum class DType { F32, F64, BF16, F16, C64 };

// The strided pipelines' tiles are 32 lanes wide, each lane a vector of this many bytes of
// channels (PipeTune / NarrowPipeTune in scan_plan.cuh use these); "auto" counts chains of
// such tiles (dispatch.cc), so both sides take the widths from here.
constexpr int kPipeLaneBytes = 16, kNarrowPipeLaneBytes = 8;
constexpr int64_t pipe_tile_channels(int lane_bytes, int elem_bytes) { return 32 * lane_bytes / elem_bytes; }

// The array is seen as (outer, L, inner), row-major. Element (o, t, c) lives at
// (o * L + t) * inner + c. h0 is (outer, inner). aprod may be null.
struct ScanProblem {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* h0 = nullptr;
  void* h = nullptr;
  void* aprod = nullptr;
  int64_t outer = 0, L = 0, inner = 0;
  bool reverse = false;
  int algorithm = kAuto;
};

// Which kernel family "auto" resolves to for this shape and element size (never kAuto).
int resolve_algorithm(const ScanProblem& p, int elem_bytes = 4);
// "auto" among the tiled kernels only (what it picks where strided_whole cannot run)
int resolve_tiled_algorithm(const ScanProblem& p, int elem_bytes = 4);
// row_walk: the consecutive rows one warp walks (1 unless the rows are short and many);
// rule=true: the rule itself, whether or not it is on by default and whatever the environment.
int64_t row_walk_rows_per_warp(int64_t outer, int64_t L, int elem_bytes, bool rule = false);
// row_walk: the most of its one-warp blocks an SM may hold at once: 0 (no cap, the default since
// session 54) unless JAX_SELSCAN_LS_ROW_WARPS_PER_SM forces one (measurements).
int row_walk_warps_per_sm();

// Scratch bytes the launch needs (tile status words, carries, the tile counter); 0 if none.
size_t scratch_bytes(DType t, const ScanProblem& p);

// Resets the scratch on `stream` (cudaMemsetAsync) and launches the kernels. `scratch`
// must hold scratch_bytes(t, p) bytes, 256-byte aligned. Returns the first CUDA error.
cudaError_t launch_linear_scan(DType t, const ScanProblem& p, void* scratch, cudaStream_t stream);

// The kernel family the launch runs on the current device ("auto" resolved, then the
// fallback of a GPU whose blocks cannot have a pipeline's shared memory). Test hook.
cudaError_t launched_algorithm(DType t, const ScanProblem& p, int& algo);

// Per-dtype entry points (one translation unit each, compiled in parallel).
#define JSS_DECLARE_DTYPE(NAME)                                                   \
  size_t scratch_bytes_##NAME(const ScanProblem& p);                              \
  cudaError_t launched_algorithm_##NAME(const ScanProblem& p, int& algo);         \
  cudaError_t launch_##NAME(const ScanProblem& p, void* scratch, cudaStream_t stream);
JSS_DECLARE_DTYPE(f32)
JSS_DECLARE_DTYPE(f64)
JSS_DECLARE_DTYPE(bf16)
JSS_DECLARE_DTYPE(f16)
JSS_DECLARE_DTYPE(c64)
#undef JSS_DECLARE_DTYPE

}  // namespace jss
