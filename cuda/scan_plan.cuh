// Host side of linear_scan: the tunings, the plan (which kernel family for which shape and
// device), the launches, and JSS_DEFINE_DTYPE, which a per-dtype .cu file expands.
#pragma once

#include "scan_tile_kernels.cuh"
#include "scan_tree_kernels.cuh"
#include "scan_rounds_kernel.cuh"
#include "scan_walk_kernels.cuh"
#include "scan_stage_kernels.cuh"
#include "strided_pipe.cuh"
#include "row_pipe.cuh"
#include "scan_whole_kernel.cuh"
#include "scan_launch.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// Host side: plan and launch.
template <class T>
struct Config {
  using S = typename Elem<T>::S;
  static constexpr int VEC = 16 / sizeof(T);
  static constexpr int THREADS = 256;
  static constexpr int ITEMS_REGS = 64 / sizeof(T) < VEC ? VEC : 64 / sizeof(T);  // 64 B per array
  static constexpr int ITEMS_SMALL = VEC;                                          // 16 B per array
  static constexpr int SVEC = sizeof(T) == 8 ? 2 : 4;  // strided: channels per thread
  static constexpr int TPT = 8;
  static constexpr int CW = 32 * SVEC;
  static constexpr int BIG_THREADS = 512;  // very long rows: 2x bigger tiles, half the look-backs
  static constexpr int LC = 8 * TPT;
  static constexpr int BLELLOCH_THREADS = 256;
  static constexpr int HS_THREADS = 1024;
  // walk kernels: ring depths (shared memory per warp: ROW_STAGES KB; SW_STAGES * SW_K *
  // 64 * VB bytes)
  static constexpr int ROW_STAGES = 6;
  static constexpr int SW_STAGES = 8;
  static constexpr int SW_K = 4;
  static constexpr size_t row_smem() { return size_t(ROW_STAGES) * 2 * 32 * 16; }
  static constexpr size_t sw_smem() { return size_t(SW_STAGES) * SW_K * 2 * 32 * WalkCfg<T>::VB; }
};


// row_pipe's geometry: 16-byte vectors per aggregator lane, ring slots, aggregator warps
// (64 KB per slot: 8192 fp32 / 16384 16-bit elements a tile; docs/PERFORMANCE_CUDA.md
// sections 11, 12; the variant bench times others)
template <class T>
struct RowPipeTune {
  static constexpr int NV = 8, NSLOT = 3, NA = 8;
  static constexpr bool BULK = std::is_same<T, float>::value;  // fp32: h by bulk copies (section 12.2)
  static constexpr int TILE = RowPipeCfg<T, NV, NSLOT, NA>::TILE;
};

// strided_pipe's geometry: steps per warp (LC = 4 x SPW) and ring slots, at most 227 KB of
// shared memory for every dtype (docs/PERFORMANCE_CUDA.md section 10), and the steps unrolled
// at a time in the fold (UF) and the walk (UW): 16-bit types walk 4 at a time, whose fully
// unrolled walk (8 channels a lane) overflowed the instruction cache (section 13); the variant
// bench times others.
template <class T>
struct PipeTune {
  static constexpr int SPW = 16, NSLOT = 3;
  static constexpr int UF = SPW, UW = sizeof(T) == 2 ? 4 : SPW;
  static constexpr int VB = kPipeLaneBytes;  // bytes of a lane's channel vector
};

// strided_pipe_narrow (16-bit types and fp32): the same pipeline on narrow tiles, 8-byte lane
// vectors (4 16-bit or 2 fp32 channels: tiles of 128 or 64), so twice the chains of PipeTune's
// tiles (section 16). 16-bit types: axes longer than 1024 steps take tiles of 128 steps (TALL:
// the bytes of a wide tile), shorter ones of 64 (a 128-step tile of a 32-step axis is mostly
// empty); each measured the faster where it runs. fp32 runs it only on long axes (auto, section
// 16.4), so it has one geometry, the tall one, and one kernel.
template <class T>
inline constexpr bool kHasNarrowPipe = sizeof(T) == 2 || std::is_same<T, float>::value;

template <class T, bool TALL>
struct NarrowPipeTune {
  static_assert(kHasNarrowPipe<T>, "narrow tiles are for 16-bit types and fp32");
  static constexpr int SPW = TALL || sizeof(T) == 4 ? 32 : 16, NSLOT = 3, UF = SPW, UW = 4,
                       VB = kNarrowPipeLaneBytes;
};

// f(NarrowPipeTune<T, TALL>{}) with the geometry of this problem
template <class T, class F>
auto with_narrow_tune(const ScanProblem& p, F&& f) {
  return p.L > 1024 ? f(NarrowPipeTune<T, true>{}) : f(NarrowPipeTune<T, false>{});
}

// f(tune) with the tuning of the pipeline `algo` (kStridedPipe, or kStridedPipeNarrow for
// 16-bit types and fp32) for this problem: the one place that maps a pipe algorithm to its kernel's
// template arguments, for make_plan, device_algorithm and launch_t alike.
template <class T, class F>
auto with_pipe_tune(const ScanProblem& p, int algo, F&& f) {
  if constexpr (kHasNarrowPipe<T>) {
    if (algo == kStridedPipeNarrow) return with_narrow_tune<T>(p, f);
  }
  return f(PipeTune<T>{});
}


// row_stage's geometry (section 9.4: 8 warps x 2 lookback_regs tiles' items per thread,
// 64 KB of shared memory per block for every dtype); the variant bench times others.
template <class T>
struct RowStageTune {
  static constexpr int NW = 8, ITEMS = 2 * Config<T>::ITEMS_REGS, MINB = 2;
  static constexpr int TILE = NW * 32 * ITEMS;
  static constexpr size_t smem() { return 2 * size_t(TILE) * sizeof(T); }
};

// row_stage needs 16-byte vectors of a, b, h and a_prod (else make_plan takes lookback_regs)
template <class T>
bool row_stage_legal(const ScanProblem& p) {
  return p.inner == 1 && (align_bits(p) & 15) == 0 && p.L % Config<T>::VEC == 0;
}

template <class T>
cudaError_t row_stage_launch(const Dev& d, unsigned grid, cudaStream_t stream) {
  using TU = RowStageTune<T>;
  auto kernel = tile_stage_kernel<T, TU::NW, TU::ITEMS, TU::MINB>;
  static std::atomic<int> opted[64];  // the > 48 KB shared-memory opt-in, once per device
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (!opted[dev & 63].load(std::memory_order_relaxed)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)TU::smem());
    if (err != cudaSuccess) return err;
    opted[dev & 63].store(1, std::memory_order_relaxed);
  }
  kernel<<<grid, TU::NW * 32, TU::smem(), stream>>>(d);
  return cudaGetLastError();
}

struct Plan {
  int algo;
  bool strided;
  int tile;             // contiguous: elements per tile
  int kind;             // 0: regs big, 1: regs small (contiguous lookback_regs)
  int64_t nchains, nchunks, nct;
  int64_t rows_per_warp = 1;  // row_walk (row_walk_rows_per_warp)
  size_t nstatus;       // status records
  size_t status_bytes, status_reset_bytes;
  size_t carry_bytes;
  size_t total_bytes;
};

template <class T>
Plan make_plan(const ScanProblem& p) {
  using C = Config<T>;
  using S = typename C::S;
  Plan pl{};
  pl.algo = p.algorithm == kAuto ? resolve_algorithm(p, (int)sizeof(T)) : p.algorithm;
  pl.strided = p.inner > 1;
  if (pl.algo == kStridedWhole && !stage_legal<T>(p)) pl.algo = resolve_tiled_algorithm(p, (int)sizeof(T));
  if (pl.algo == kStridedWhole) {  // no scratch at all
    const int64_t nvec = whole_vectors<T>(p);
    const int ncv = whole_ncv(p.L, nvec, p.outer);
    pl.nct = (nvec + ncv - 1) / ncv;  // blocks per outer index
    pl.nchains = p.outer * pl.nct;
    pl.nchunks = 1;
    pl.total_bytes = 0;
    return pl;
  }
  if (pl.algo == kStridedStage && !stage_legal<T>(p)) pl.algo = kLookbackRegs;
  if (pl.algo == kStridedPipeNarrow && !kHasNarrowPipe<T>) pl.algo = kStridedPipe;
  if constexpr (kHasNarrowPipe<T>) {
    if (pl.algo == kStridedPipeNarrow && !pipe_legal<T, NarrowPipeTune<T, true>::VB>(p))
      pl.algo = stage_legal<T>(p) ? kStridedStage : kLookbackRegs;
  }
  if (pl.algo == kStridedPipe && !pipe_legal<T, PipeTune<T>::VB>(p))
    pl.algo = stage_legal<T>(p) ? kStridedStage : kLookbackRegs;
  if (pl.algo == kStridedPipe || pl.algo == kStridedPipeNarrow) {
    size_t own = 0;
    auto take = [&](const auto& g) {
      pl.nct = g.nct;
      pl.nchains = g.nchains;
      pl.nchunks = g.nchunks;
      own = g.total();
    };
    with_pipe_tune<T>(p, pl.algo, [&](auto tu) { take(PipeGeom<T, decltype(tu)::SPW, decltype(tu)::VB>(p)); });
    // A GPU whose blocks cannot have the ring's shared memory runs lookback_regs instead
    // (device_algorithm), in this same scratch: plan for the larger of the two.
    ScanProblem q = p;
    q.algorithm = kLookbackRegs;
    const size_t fallback = make_plan<T>(q).total_bytes;
    pl.total_bytes = own > fallback ? own : fallback;
    return pl;
  }
  if (pl.algo == kStridedStage) {
    using TU = StageTune<T>;
    const StageGeom<T, TU::NW, TU::SPW> g(p);
    pl.nct = g.nct;
    pl.nchains = g.nchains;
    pl.nchunks = g.nchunks;
    pl.total_bytes = g.total();
    return pl;
  }
  if (pl.algo == kRowRounds && pl.strided) pl.algo = kLookbackRegs;
  if (pl.algo == kRowRounds) {
    using TU = RoundsTune<T>;
    const RoundsGeom<TU::THREADS, TU::ITEMS> g(p);
    pl.nct = 1;
    pl.nchains = p.outer;
    pl.nchunks = g.tpr;
    pl.total_bytes = rounds_scratch<T, TU::THREADS, TU::ITEMS>(p);
    return pl;
  }
  // row_pipe: fp32 (scanned in place) or 16-bit (re-walked) rows with 16-byte vectors; else
  // row_stage's rule
  if (pl.algo == kRowPipe && !(std::is_same<T, float>::value || sizeof(T) == 2)) pl.algo = kRowStage;
  if (pl.algo == kRowStage && !row_stage_legal<T>(p)) pl.algo = kLookbackRegs;
  if (pl.algo == kRowPipe && !row_stage_legal<T>(p)) pl.algo = kLookbackRegs;
  if (pl.algo == kRowPipe) {
    const RowPipeGeom<RowPipeTune<T>::TILE> g(p);
    pl.nct = 1;
    pl.nchains = g.nchains;
    pl.nchunks = g.nchunks;
    pl.total_bytes = g.total();
    return pl;
  }
  if (pl.algo == kRowWalk && pl.strided) pl.algo = kStridedWalk;
  if (pl.algo == kStridedWalk && !pl.strided) pl.algo = kRowWalk;
  if (pl.algo == kRowWalk || pl.algo == kStridedWalk) {  // no scratch at all
    pl.nct = pl.strided ? (p.inner + WalkCfg<T>::CWW - 1) / WalkCfg<T>::CWW : 1;
    pl.nchains = p.outer * pl.nct;
    pl.nchunks = 1;
    if (!pl.strided) pl.rows_per_warp = row_walk_rows_per_warp(p.outer, p.L, (int)sizeof(T));
    pl.total_bytes = 0;
    return pl;
  }
  int64_t tiles_per_chain_len;
  if (!pl.strided) {
    pl.nct = 1;
    pl.nchains = p.outer;
    switch (pl.algo) {
      case kBlelloch: pl.tile = 2 * C::BLELLOCH_THREADS; break;
      case kHillisSteele: pl.tile = C::HS_THREADS; break;
      case kLookbackSerial:
      case kLookbackWarp: pl.tile = C::THREADS; break;
      case kRowStage: pl.tile = RowStageTune<T>::TILE; break;
      default:
        // three_pass always uses the big tile; lookback_regs takes the small one for short rows
        pl.kind = (pl.algo == kThreePass || p.L >= C::THREADS * C::ITEMS_REGS) ? 0 : 1;
        if (pl.algo == kLookbackRegs && p.L >= (int64_t(1) << 19)) pl.kind = 2;
        pl.tile = pl.kind == 2 ? C::BIG_THREADS * C::ITEMS_REGS
                               : C::THREADS * (pl.kind == 0 ? C::ITEMS_REGS : C::ITEMS_SMALL);
        break;
    }
    tiles_per_chain_len = pl.tile;
  } else {
    pl.nct = (p.inner + C::CW - 1) / C::CW;
    pl.nchains = p.outer * pl.nct;
    pl.tile = C::LC;
    tiles_per_chain_len = C::LC;
  }
  pl.nchunks = (p.L + tiles_per_chain_len - 1) / tiles_per_chain_len;
  const size_t ntiles = (size_t)pl.nchains * pl.nchunks;
  const size_t per_tile = pl.strided ? C::CW : 1;
  const bool lookback = pl.algo == kLookbackSerial || pl.algo == kLookbackWarp || pl.algo == kLookbackRegs ||
                        pl.algo == kRowStage;
  size_t off = 256;  // the tile counter
  if (lookback) {
    pl.nstatus = ntiles * per_tile;
    pl.status_bytes = Status<S>::bytes(pl.nstatus);
    pl.status_reset_bytes = Status<S>::reset_bytes(pl.nstatus);
    off += pl.status_bytes;
  } else {
    pl.carry_bytes = round_up(ntiles * per_tile * sizeof(Pair<S>), 256);
    off += pl.carry_bytes;
  }
  pl.total_bytes = off;
  return pl;
}

template <class T>
size_t scratch_bytes_t(const ScanProblem& p) {
  if (p.outer == 0 || p.L == 0 || p.inner == 0) return 0;
  return make_plan<T>(p).total_bytes;
}

// The kernel family a launch of the planned algorithm runs on the current device: the plan's,
// or the fallback where one block cannot have a pipeline's shared memory (strided_pipe ->
// lookback_regs, row_pipe -> row_stage). The one place of that decision: launch_t dispatches
// on it, and launched_algorithm (a test hook: a fallback is correct, so only this can show
// that the fast kernel runs) reports it.
template <class T>
cudaError_t device_algorithm(const ScanProblem& p, int planned, int& algo) {
  algo = planned;
  bool fits = true;
  cudaError_t err = cudaSuccess;
  if (planned == kStridedPipe || planned == kStridedPipeNarrow) {
    err = with_pipe_tune<T>(p, planned, [&](auto tu) {
      using TU = decltype(tu);
      return pipe_fits_device<T, TU::SPW, TU::NSLOT, TU::UF, TU::UW, TU::VB>(fits);
    });
    if (!fits) algo = kLookbackRegs;
  }
  if constexpr (std::is_same<T, float>::value || sizeof(T) == 2) {
    if (planned == kRowPipe) {
      using TU = RowPipeTune<T>;
      err = row_pipe_fits_device<T, TU::NV, TU::NSLOT, TU::NA, TU::BULK>(fits);
      if (!fits) algo = kRowStage;
    }
  }
  return err;
}

template <class T>
cudaError_t launched_algorithm_t(const ScanProblem& p, int& algo) {
  return device_algorithm<T>(p, make_plan<T>(p).algo, algo);
}

template <class T>
cudaError_t launch_t(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  using C = Config<T>;
  if (p.outer == 0 || p.L == 0 || p.inner == 0) return cudaSuccess;
  const Plan pl = make_plan<T>(p);
  const int64_t ntiles = pl.nchains * pl.nchunks;
  if (ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  if (pl.algo == kStridedWhole) return whole_launch<T>(p, stream);
  if (pl.algo == kStridedStage) {
    using TU = StageTune<T>;
    return stage_launch<T, TU::NW, TU::SPW, TU::NBUF>(p, scratch, stream);
  }
  if (pl.algo == kStridedPipe || pl.algo == kStridedPipeNarrow || pl.algo == kRowPipe) {
    int algo = pl.algo;
    const cudaError_t err = device_algorithm<T>(p, pl.algo, algo);
    if (err != cudaSuccess) return err;
    if (algo == kStridedPipe || algo == kStridedPipeNarrow)
      return with_pipe_tune<T>(p, algo, [&](auto tu) {
        using TU = decltype(tu);
        return pipe_launch<T, TU::SPW, TU::NSLOT, TU::UF, TU::UW, TU::VB>(p, scratch, stream);
      });
    if constexpr (std::is_same<T, float>::value || sizeof(T) == 2) {
      if (algo == kRowPipe) {
        using TU = RowPipeTune<T>;
        return row_pipe_launch<T, TU::NV, TU::NSLOT, TU::NA, TU::BULK>(p, scratch, stream);
      }
      static_assert(RowStageTune<T>::TILE == RowPipeTune<T>::TILE, "the fallback uses row_pipe's status words");
    }
    // A GPU with less shared memory per block than the ring needs (an A100 has 163 KB; not run
    // on such a GPU here). strided_pipe (and _narrow) -> lookback_regs: make_plan sized the
    // scratch for the larger of the two. row_pipe (192 KB; fp32 224 KB with the staging region of
    // the bulk copies) -> row_stage (64 KB), whose tile (8192 fp32 / 16384 16-bit elements)
    // and one status word per tile are row_pipe's, so the scratch planned here holds its
    // status words. make_plan never plans row_pipe for other types (it plans row_stage).
    ScanProblem q = p;
    q.algorithm = algo;
    return launch_t<T>(q, scratch, stream);
  }
  if (pl.algo == kRowRounds) {
    using TU = RoundsTune<T>;
    return rounds_launch<T, TU::THREADS, TU::ITEMS, TU::MINB>(p, scratch, stream);
  }
  if (pl.algo == kRowWalk || pl.algo == kStridedWalk) {
    Dev d = dev_params(p);
    d.nchains = pl.nchains;
    d.nchunks = 1;
    d.nct = pl.nct;
    if (pl.algo == kRowWalk) {
      d.vec = (align_bits(p) & 15) == 0 && p.L % C::VEC == 0;
      d.rows_per_warp = pl.rows_per_warp;
      const int64_t warps = (pl.nchains + pl.rows_per_warp - 1) / pl.rows_per_warp;
      size_t smem = 0;  // the ring (padded only where JAX_SELSCAN_LS_ROW_WARPS_PER_SM forces a cap)
      const cudaError_t err = capped_smem(C::row_smem(), row_walk_warps_per_sm(), smem);
      if (err != cudaSuccess) return err;
      if (pl.rows_per_warp > 1)
        row_walk_kernel<T, C::ROW_STAGES, true><<<(unsigned)warps, 32, smem, stream>>>(d);
      else
        row_walk_kernel<T, C::ROW_STAGES, false><<<(unsigned)warps, 32, smem, stream>>>(d);
    } else {
      d.vec = (align_bits(p) & (WalkCfg<T>::VB - 1)) == 0 && p.inner % WalkCfg<T>::NCH == 0;
      strided_walk_kernel<T, C::SW_STAGES, C::SW_K><<<(unsigned)pl.nchains, 32, C::sw_smem(), stream>>>(d);
    }
    return cudaGetLastError();
  }
  Dev d = dev_params(p);
  d.nchains = pl.nchains;
  d.nchunks = pl.nchunks;
  d.nct = pl.nct;
  char* base = static_cast<char*>(scratch);
  d.counter = reinterpret_cast<unsigned*>(base);
  d.status = base + 256;
  d.nstatus = pl.nstatus;
  d.carry = base + 256;
  const bool aligned = (align_bits(p) & 15) == 0;
  d.vec = aligned && (pl.strided ? p.inner % C::SVEC == 0 : p.L % C::VEC == 0);
  const unsigned grid = (unsigned)ntiles;
  cudaError_t err = cudaSuccess;
  const bool lookback = pl.algo == kLookbackSerial || pl.algo == kLookbackWarp || pl.algo == kLookbackRegs ||
                        pl.algo == kRowStage;
  if (lookback) {
    // Reset the counter and the status flags on the stream before every launch, so that a
    // replay (e.g. of a captured graph) starts from a clean state.
    err = cudaMemsetAsync(base, 0, 256 + pl.status_reset_bytes, stream);
    if (err != cudaSuccess) return err;
  }
  if (pl.strided) {
    if (lookback) {
      strided_kernel<T, C::TPT, CARRY_LB_SERIAL><<<grid, 256, 0, stream>>>(d);
    } else {
      strided_kernel<T, C::TPT, CARRY_REDUCE><<<grid, 256, 0, stream>>>(d);
      carry_scan_kernel<T, 128><<<(unsigned)(pl.nchains * C::CW), 128, 0, stream>>>(d, C::CW);
      strided_kernel<T, C::TPT, CARRY_ARRAY><<<grid, 256, 0, stream>>>(d);
    }
    return cudaGetLastError();
  }
  switch (pl.algo) {
    case kLookbackSerial:
      tile_scan_kernel<T, C::THREADS, 1, CARRY_LB_SERIAL><<<grid, C::THREADS, 0, stream>>>(d);
      break;
    case kLookbackWarp:
      tile_scan_kernel<T, C::THREADS, 1, CARRY_LB_WARP><<<grid, C::THREADS, 0, stream>>>(d);
      break;
    case kRowStage:
      return row_stage_launch<T>(d, grid, stream);
    case kLookbackRegs:  // striped tiles (docs/PERFORMANCE_CUDA.md section 9.1)
      if (pl.kind == 2)
        tile_scan_kernel<T, C::BIG_THREADS, C::ITEMS_REGS, CARRY_LB_WARP, 1, TILE_STRIPED>
            <<<grid, C::BIG_THREADS, 0, stream>>>(d);
      else if (pl.kind == 0)
        tile_scan_kernel<T, C::THREADS, C::ITEMS_REGS, CARRY_LB_WARP, 1, TILE_STRIPED><<<grid, C::THREADS, 0, stream>>>(d);
      else  // ITEMS_SMALL = one vector per thread: the striped and blocked layouts coincide
        tile_scan_kernel<T, C::THREADS, C::ITEMS_SMALL, CARRY_LB_WARP><<<grid, C::THREADS, 0, stream>>>(d);
      break;
    case kThreePass:
      tile_scan_kernel<T, C::THREADS, C::ITEMS_REGS, CARRY_REDUCE><<<grid, C::THREADS, 0, stream>>>(d);
      carry_scan_kernel<T, 128><<<(unsigned)pl.nchains, 128, 0, stream>>>(d, 1);
      tile_scan_kernel<T, C::THREADS, C::ITEMS_REGS, CARRY_ARRAY><<<grid, C::THREADS, 0, stream>>>(d);
      break;
    case kBlelloch:
      tile_scan_kernel<T, C::BLELLOCH_THREADS, 2, CARRY_REDUCE><<<grid, C::BLELLOCH_THREADS, 0, stream>>>(d);
      carry_scan_kernel<T, 128><<<(unsigned)pl.nchains, 128, 0, stream>>>(d, 1);
      blelloch_kernel<T, C::BLELLOCH_THREADS><<<grid, C::BLELLOCH_THREADS, 0, stream>>>(d);
      break;
    case kHillisSteele:
      tile_scan_kernel<T, C::HS_THREADS, 1, CARRY_REDUCE><<<grid, C::HS_THREADS, 0, stream>>>(d);
      carry_scan_kernel<T, 128><<<(unsigned)pl.nchains, 128, 0, stream>>>(d, 1);
      hillis_steele_kernel<T, C::HS_THREADS><<<grid, C::HS_THREADS, 0, stream>>>(d);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace jss

#define JSS_DEFINE_DTYPE(NAME, T)                                                          \
  namespace jss {                                                                          \
  size_t scratch_bytes_##NAME(const ScanProblem& p) { return scratch_bytes_t<T>(p); }      \
  cudaError_t launched_algorithm_##NAME(const ScanProblem& p, int& algo) {                 \
    return launched_algorithm_t<T>(p, algo);                                               \
  }                                                                                        \
  cudaError_t launch_##NAME(const ScanProblem& p, void* scratch, cudaStream_t stream) {    \
    return launch_t<T>(p, scratch, stream);                                                \
  }                                                                                        \
  }
