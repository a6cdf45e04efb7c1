// Host dispatch of linear_scan over dtypes, and the choice behind algorithm="auto".
#include <algorithm>
#include <cstdlib>

#include "linear_scan.h"

namespace jss {

// strided_whole (one block per channel tile through the whole axis, no look-back) where the
// tiled kernels' chain of look-backs, not memory, bounds a call: docs/PERFORMANCE_CUDA.md
// section 20. JAX_SELSCAN_LS_WHOLE=0 / =1 turns it off / on wherever it can run (measurements).
// "auto" takes it for axes of L <= 1024 (forced at L = 4096 it lost: fp32 25 -> 36 us a call,
// section 20.2). With whole 32-byte sectors (section 22.6) it beat the tiled kernels at every fp32
// shape measured, 2^20 to 2^26 elements (section 22.8, kernel alone on an H100, % of copy):
// (1024, 2048) axis 0 46 -> 61-68%, (256, 8192) 47 -> 72%, (1024, 16384) 72 -> 83%, (2048, 32,
// 1024) axis 1 88 -> 99%; in 16-bit types up to 2^22 elements ((1024, 2048) 24 -> 35%, (1024,
// 4096) 42 -> 48%) and lost from 2^24 ((1024, 16384) 62 -> 50%, (2048, 32, 1024) 70 -> 44%: one
// block an SM, 139-147 registers), hence that bound for them.
static bool whole_wanted(const ScanProblem& p, int elem_bytes) {
  if (p.inner <= 1 || !(elem_bytes == 4 || elem_bytes == 2)) return false;
  if (const char* e = std::getenv("JAX_SELSCAN_LS_WHOLE")) {
    if (e[0] == '0') return false;
    if (e[0] == '1') return true;
  }
  // (outer x inner <= 2^32 keeps its grid, about outer x inner / 8 blocks, below 2^31)
  return p.L <= 1024 && p.outer * p.inner <= (int64_t(1) << 32) &&
         (elem_bytes == 4 || p.outer * p.L * p.inner <= (int64_t(1) << 22));
}

int resolve_algorithm(const ScanProblem& p, int elem_bytes) {
  return whole_wanted(p, elem_bytes) ? kStridedWhole : resolve_tiled_algorithm(p, elem_bytes);
}

// A row_walk warp walks `rows_per_warp` consecutive rows, its cp.async ring running on across
// them (docs/PERFORMANCE_CUDA.md section 21). Measured on an H100 (section 21.2, kernel alone):
// a warp does best with about 2 KB of a and b per unit it walks, i.e. rows of 1 KB take 2 a
// warp, rows of 512 B take 4 (bf16 65536 x 256: 71 -> 79% of copy; bf16 131072 x 128: 39 ->
// 61%; fp32 131072 x 128: 78 -> 92%), and rows of >= 2 KB one (filling the 6-stage ring
// instead, session 51's rule, lost 1-3 points at rows of 2-4 KB). At least 16384 warps remain
// (about 4 waves of the 32 one-warp blocks an SM holds, on 132 SMs).
// JAX_SELSCAN_LS_ROWS_PER_WARP=n forces n (measurements).
constexpr int64_t kRowWalkBytesPerWarpRow = 2048;  // a and b together
int64_t row_walk_rows_per_warp(int64_t outer, int64_t L, int elem_bytes, bool rule) {
  if (!rule) {
    if (const char* e = std::getenv("JAX_SELSCAN_LS_ROWS_PER_WARP")) {
      const long long n = std::atoll(e);
      if (n >= 1) return n;
    }
  }
  const int64_t row_bytes = std::max<int64_t>(1, 2 * L * elem_bytes);
  const int64_t fill = (kRowWalkBytesPerWarpRow + row_bytes - 1) / row_bytes;
  return std::max<int64_t>(1, std::min<int64_t>(fill, outer / 16384));
}

// row_walk's one-warp blocks an SM, capped by padding each block's ring (capped_smem): no cap
// by default. Session 53 (docs/PERFORMANCE_CUDA.md section 22) measured a cap of 16-24 taking
// bf16 4096 x 16384 from 74 to 89% of copy on an H100, but that loss was the several-rows loop's
// (section 23): with one row a warp on its own loop again, a cap of 16 against none measured
// within 1 point at every long-row shape on an H100 (bf16 4096 x 16384 87 / 87%, 12288 x 2048
// 87 / 88%, 16384 x 4096 95 / 94%), and the H200's best run of these shapes (session 49: 84%,
// 90%) had none. JAX_SELSCAN_LS_ROW_WARPS_PER_SM=n forces a cap of n (measurements; 0: none).
int row_walk_warps_per_sm() {
  if (const char* e = std::getenv("JAX_SELSCAN_LS_ROW_WARPS_PER_SM")) {
    char* end = nullptr;
    const long n = std::strtol(e, &end, 10);
    if (end != e && n >= 0) return static_cast<int>(n);
  }
  return 0;
}

int resolve_tiled_algorithm(const ScanProblem& p, int elem_bytes) {
  // From the H200 measurements in docs/PERFORMANCE_CUDA.md (section 4, CUDA events, fp32 /
  // bf16, % of the 4240 GB/s copy):
  //  * contiguous rows, outer >= 512: row_walk (one warp walks a row; no look-back).
  //    4096x16384 86% (lookback_regs 51%), 12288x2048 90% (54%), 65536x256 91% (19%;
  //    lookback_warp ~25%), 1024x65536 90% (51%), 512x131072 68% (52%).
  //  * fewer rows: the look-back tile kernels as before (lookback_warp for L <= 512).
  //  * strided: strided_walk measured slower at every strided shape tried ((4096, 24576):
  //    68% vs 80%; (65536, 1024): 3% vs 61%), so auto never picks it.
  //  * strided (section 5, CUDA events, strided_stage w8s8 vs lookback_regs, % of 4233 GB/s):
  //    16-bit types: strided_stage everywhere: (4096, 24576) bf16 47% vs 36%, (65536, 1024)
  //    39% vs 29%, (16384, 4096) 42% vs 35%, (1024, 1024) 9% vs 8%, (2048, 32, 1024) axis 1
  //    32% vs 20%. 4-byte types: strided_stage for L <= 1024 ((1024, 1024) 22% vs 17%,
  //    (2048, 32, 1024) 67% vs 52%), lookback_regs for longer axes ((4096, 24576) 73% vs
  //    79%, (65536, 1024) 55% vs 61%, (16384, 4096) 59% vs 68%). 8-byte types (f64, c64):
  //    not measured, lookback_regs as before.
  //    strided_stage falls back to lookback_regs where its 16-byte vectors are not legal.
  //  * contiguous, fewer rows (section 6): row_rounds (a fixed-order fold per round of
  //    co-resident blocks) measured SLOWER than lookback_regs at every shape tried (1 x 2^26
  //    fp32 33% vs 41%, 64 x 2^20 33% vs 45%, bf16 24% vs 37%), so auto keeps lookback_regs.
  //  * contiguous, fewer rows, long (section 9.4): row_stage (the tile staged in shared memory)
  //    for L >= 65536 and >= 2^22 elements: 1 x 2^26 fp32 61% vs 45%, 64 x 2^20 69% vs 49%,
  //    256 x 65536 64% vs 50%, bf16 58% vs 43% (1 x 2^26); shorter rows or fewer tiles measured
  //    no gain or a loss (511 x 8192 bf16 27% vs 32%, 1 x 2^20 18% vs 22%). It needs 16-byte
  //    vectors; make_plan falls back to lookback_regs without them.
  //  * contiguous fp32, fewer than 1024 long rows (section 11, variant bench, % of copy, row_pipe
  //    vs auto before): 1 x 2^26 79% vs 60%, 4 x 2^24 81% vs 58%, 64 x 2^20 83% vs 69%, 512 x
  //    131072 82% vs 68% (row_walk: 512 warps cannot keep enough loads in flight), 256 x 65536
  //    64% vs 64%; row_walk stays ahead from 1024 rows (1024 x 65536 91% vs 82%, 4096 x 16384
  //    88% vs 82%). make_plan falls back to lookback_regs without 16-byte vectors.
  //  * 16-bit types, the same rows (section 12.1): row_pipe re-walking its 16-bit slot, bf16 vs
  //    row_stage: 1 x 2^26 70% vs 58%, 4 x 2^24 72% vs 58%, 64 x 2^20 71% vs 65%, 256 x 65536
  //    50% vs 49%, 512 x 131072 70% vs 72% (the one loss, kept for a simple rule). 8-byte types
  //    keep row_stage.
  if (p.inner == 1 && (elem_bytes == 4 || elem_bytes == 2) && p.outer < 1024 && p.L >= 65536 &&
      p.outer * p.L >= (int64_t(1) << 22))
    return kRowPipe;
  if (p.inner == 1) {
    if (p.outer >= 512) return kRowWalk;
    if (p.L >= 65536 && p.outer * p.L >= (int64_t(1) << 22)) return kRowStage;
    if (p.L <= 512) return kLookbackWarp;
    return kLookbackRegs;
  }
  //  * strided, longer axes (section 10, variant bench, % of copy, strided_pipe vs auto before):
  //    fp32 (4096, 24576) 87% vs 79%, (65536, 1024) 76% vs 61%, (16384, 4096) 83% vs 69%; bf16
  //    66% vs 49%, 47% vs 41%, 60% vs 43%. At L <= 1024 it lost ((1024, 1024) 17% vs 22%,
  //    (2048, 32, 1024) fp32 62% vs 69%), so those keep the rule above. Float state only
  //    (elem_bytes 4 or 2; complex64 is 8); make_plan falls back without 16-byte vectors.
  //  * strided, longer axes, few channel tiles (session 23, variant bench, % of copy, strided_pipe
  //    vs strided_stage, section 15): with at most 2 chains of tiles (outer x channel tiles of 128
  //    fp32 / 256 16-bit channels) the pipeline's look-backs serialise its few chains and the
  //    staged tile wins: fp32 (8192, 128) 11% vs 18%, (16384, 256) 27% vs 35%, (65536, 256) 40%
  //    vs 47%; bf16 4% vs 8%, 14% vs 18%, 21% vs 29%, and (65536, 512) (2 chains) 35% vs 36%.
  //    From 3 chains the pipeline: fp32 (65536, 512) 66% vs 55%, (32768, 512) 59% vs 50%;
  //    bf16 (65536, 768) 45% vs 39%; (4096, 4096) 70% vs 52% fp32, 45% vs 35% bf16.
  //  * 16-bit types, narrow tiles (session 42, variant bench on an H100, % of its 3000 GB/s
  //    copy, section 16: strided_pipe_narrow = 128-channel tiles of 64 steps for L <= 1024, of
  //    128 steps beyond). L <= 1024, from 3 chains of 128-channel tiles: bf16 (2048, 32, 1024)
  //    axis 1 70% vs strided_stage 45% (the 256-channel pipe 60%), (64, 1024, 2048) axis 1 79%
  //    vs 60%, (8192, 64, 512) axis 1 87% vs 77%, (1024, 1024) 13-14% either way. L > 1024 with
  //    3-8 chains of 128-channel tiles (the 128-step tiles; auto with them in section 16.3):
  //    (65536, 512) 65% vs strided_stage 48%, (65536, 768) 71% vs the 256-channel pipe 60%,
  //    (65536, 1024) 74% vs 67%; with more chains the wide tiles stay ((32768, 2048) 75-76%
  //    either way, (4096, 24576) 88% vs 79%).
  //  * narrow tiles at few chains (session 43, section 16.4, auto vs strided_stage): L > 1024,
  //    2 chains of 128-channel 16-bit tiles, bf16 (65536, 256) 44% vs 38%; fp32 on 64-channel
  //    tiles (8-byte vectors of 2 floats, 128 steps) where the wide tiles make at most 2 chains
  //    and the narrow ones at least 2: (65536, 256) 69% vs 57%, (65536, 128) 46% vs 42%,
  //    (16384, 256) 42% either way, (8192, 128) 19% vs 22% (1 M elements, about 20 us). One
  //    narrow chain stays staged ((65536, 64) fp32 25% vs 26%). With more wide chains fp32 keeps
  //    the wide pipe (narrow vs wide: (65536, 512) 79% vs 77%, (65536, 1024) 85% vs 90%).
  const int64_t ncw = pipe_tile_channels(kNarrowPipeLaneBytes, elem_bytes);  // a narrow tile's channels
  const int64_t narrow_chains = p.outer * ((p.inner + ncw - 1) / ncw);
  if (elem_bytes == 2 && (p.L <= 1024 ? narrow_chains >= 3 : narrow_chains >= 2 && narrow_chains <= 8))
    return kStridedPipeNarrow;
  if (p.L > 1024 && elem_bytes <= 4) {
    const int64_t cw = pipe_tile_channels(kPipeLaneBytes, elem_bytes);  // a wide pipe tile's channels
    const int64_t chains = p.outer * ((p.inner + cw - 1) / cw);
    if (chains > 2) return kStridedPipe;
    return elem_bytes == 4 && narrow_chains >= 2 ? kStridedPipeNarrow : kStridedStage;
  }
  if (elem_bytes == 2 || (elem_bytes == 4 && p.L <= 1024)) return kStridedStage;
  return kLookbackRegs;
}

size_t scratch_bytes(DType t, const ScanProblem& p) {
  switch (t) {
    case DType::F32: return scratch_bytes_f32(p);
    case DType::F64: return scratch_bytes_f64(p);
    case DType::BF16: return scratch_bytes_bf16(p);
    case DType::F16: return scratch_bytes_f16(p);
    case DType::C64: return scratch_bytes_c64(p);
  }
  return 0;
}

cudaError_t launched_algorithm(DType t, const ScanProblem& p, int& algo) {
  switch (t) {
    case DType::F32: return launched_algorithm_f32(p, algo);
    case DType::F64: return launched_algorithm_f64(p, algo);
    case DType::BF16: return launched_algorithm_bf16(p, algo);
    case DType::F16: return launched_algorithm_f16(p, algo);
    case DType::C64: return launched_algorithm_c64(p, algo);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_linear_scan(DType t, const ScanProblem& p, void* scratch, cudaStream_t stream) {
  switch (t) {
    case DType::F32: return launch_f32(p, scratch, stream);
    case DType::F64: return launch_f64(p, scratch, stream);
    case DType::BF16: return launch_bf16(p, scratch, stream);
    case DType::F16: return launch_f16(p, scratch, stream);
    case DType::C64: return launch_c64(p, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jss
