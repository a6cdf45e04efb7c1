// Side-by-side timing of kernel variants (not part of the package): the walk kernels at
// several ring depths, the look-back kernels at other occupancies, and the dispatcher's
// choice ("auto") vs the old default (lookback_regs). CUDA events, median of N launches,
// inputs far larger than L2 (no rotation needed). GB/s count 12 B/element fp32, 6 bf16.
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -Icuda cuda/tools/variant_bench.cu \
//        cuda/dispatch.cc -o variant_bench && ./variant_bench [ncu]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "scan_kernels.cuh"
#include "cuda_check.h"
JSS_DEFINE_DTYPE(f32, float)
JSS_DEFINE_DTYPE(bf16, __nv_bfloat16)
namespace jss {  // the other dtypes are not benchmarked here
size_t scratch_bytes_f64(const ScanProblem&) { return 0; }
size_t scratch_bytes_f16(const ScanProblem&) { return 0; }
size_t scratch_bytes_c64(const ScanProblem&) { return 0; }
cudaError_t launch_f64(const ScanProblem&, void*, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launch_f16(const ScanProblem&, void*, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launch_c64(const ScanProblem&, void*, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t launched_algorithm_f64(const ScanProblem&, int&) { return cudaErrorNotSupported; }
cudaError_t launched_algorithm_f16(const ScanProblem&, int&) { return cudaErrorNotSupported; }
cudaError_t launched_algorithm_c64(const ScanProblem&, int&) { return cudaErrorNotSupported; }
}  // namespace jss

using namespace jss;

template <class T>
__global__ void fill(T* a, T* b, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u1 = (z & 0xffffff) / float(1 << 24), u2 = ((z >> 24) & 0xffffff) / float(1 << 24);
    a[i] = T(0.45f + 0.5f * u1);
    b[i] = T(u2 - 0.5f);
  }
}

static int g_reps = 15;
static float time_ms(const std::function<void()>& f) {
  cudaEvent_t s, e;
  CK(cudaEventCreate(&s));
  CK(cudaEventCreate(&e));
  f();
  CK(cudaDeviceSynchronize());
  std::vector<float> ts;
  for (int r = 0; r < g_reps; ++r) {
    CK(cudaEventRecord(s));
    f();
    CK(cudaEventRecord(e));
    CK(cudaEventSynchronize(e));
    float ms;
    CK(cudaEventElapsedTime(&ms, s, e));
    ts.push_back(ms);
  }
  CK(cudaGetLastError());
  std::sort(ts.begin(), ts.end());
  cudaEventDestroy(s);
  cudaEventDestroy(e);
  return ts[ts.size() / 2];
}

template <class T>
struct Bufs {
  T *a, *b, *h0, *h;
  void* scratch;
  size_t scratch_cap;
};

template <class T>
Dev make_dev(const ScanProblem& p, const Plan& pl, void* scratch) {
  using C = Config<T>;
  Dev d = dev_params(p);
  d.nchains = pl.nchains; d.nchunks = pl.nchunks; d.nct = pl.nct;
  char* base = static_cast<char*>(scratch);
  d.counter = reinterpret_cast<unsigned*>(base);
  d.status = base + 256;
  d.nstatus = pl.nstatus;
  d.carry = base + 256;
  d.vec = pl.strided ? p.inner % C::SVEC == 0 : p.L % C::VEC == 0;
  return d;
}

// rpw: rows per warp (0: the rule, row_walk_rows_per_warp(..., rule = true)); cap: the most
// one-warp blocks an SM holds (the ring's shared memory padded, capped_smem; 0: no cap, the
// package's rule since section 23; section 22); multi: the several-rows loop even
// for one row a warp (section 23: what one row a warp ran in sessions 51-53)
template <class T, int STAGES>
void row_walk(const ScanProblem& p, int64_t rpw, int cap = 0, bool multi = false) {
  ScanProblem q = p;
  q.algorithm = kRowWalk;
  Plan pl = make_plan<T>(q);
  Dev d = make_dev<T>(q, pl, nullptr);
  d.vec = p.L % (16 / sizeof(T)) == 0;
  d.rows_per_warp = rpw > 0 ? rpw : row_walk_rows_per_warp(p.outer, p.L, (int)sizeof(T), true);
  const int64_t warps = (p.outer + d.rows_per_warp - 1) / d.rows_per_warp;
  size_t smem = 0;
  CK(capped_smem(size_t(STAGES) * 1024, cap, smem));
  if (d.rows_per_warp > 1 || multi)
    row_walk_kernel<T, STAGES, true><<<(unsigned)warps, 32, smem>>>(d);
  else
    row_walk_kernel<T, STAGES, false><<<(unsigned)warps, 32, smem>>>(d);
}
template <class T, int STAGES, int K>
void strided_walk(const ScanProblem& p) {
  ScanProblem q = p;
  q.algorithm = kStridedWalk;
  Plan pl = make_plan<T>(q);
  Dev d = make_dev<T>(q, pl, nullptr);
  d.vec = p.inner % WalkCfg<T>::NCH == 0;
  const size_t smem = size_t(STAGES) * K * 64 * WalkCfg<T>::VB;
  if (smem > 48 * 1024) cudaFuncSetAttribute(strided_walk_kernel<T, STAGES, K>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  strided_walk_kernel<T, STAGES, K><<<(unsigned)pl.nchains, 32, smem>>>(d);
}
// A look-back tile of `tile` elements per row chunk: the kernel parameters, with the counter
// and status words reset on the stream; returns the number of tiles (the grid).
template <class T>
unsigned lb_tiles(const ScanProblem& p, void* scratch, int tile, Dev& d) {
  ScanProblem q = p;
  q.algorithm = kLookbackRegs;
  Plan pl = make_plan<T>(q);
  pl.tile = tile;
  pl.nchunks = (p.L + pl.tile - 1) / pl.tile;
  pl.nstatus = pl.nchains * pl.nchunks;
  d = make_dev<T>(q, pl, scratch);
  cudaMemsetAsync(scratch, 0, 256 + Status<typename Elem<T>::S>::reset_bytes(pl.nstatus));
  return (unsigned)(pl.nchains * pl.nchunks);
}
// the look-back tile (lookback_warp walk) at other geometries / occupancies, with options
// (TILE_STRIPED)
template <class T, int THREADS, int ITEMS, int CARRY, int MINB, int OPT>
void tile_opt(const ScanProblem& p, void* scratch) {
  Dev d;
  const unsigned grid = lb_tiles<T>(p, scratch, THREADS * ITEMS, d);
  tile_scan_kernel<T, THREADS, ITEMS, CARRY, MINB, OPT><<<grid, THREADS>>>(d);
}
// row_stage (session 9): the striped tile staged in shared memory by cp.async
template <class T, int NW, int ITEMS, int MINB>
void row_stage(const ScanProblem& p, void* scratch) {
  Dev d;
  const unsigned grid = lb_tiles<T>(p, scratch, NW * 32 * ITEMS, d);
  const size_t smem = 2 * size_t(NW * 32 * ITEMS) * sizeof(T);
  auto kernel = tile_stage_kernel<T, NW, ITEMS, MINB>;
  if (smem > 48 * 1024) CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  kernel<<<grid, NW * 32, smem>>>(d);
}
template <class T, int TPT, int MINB>
void strided_lb(const ScanProblem& p, void* scratch) {
  using C = Config<T>;
  ScanProblem q = p;
  q.algorithm = kLookbackRegs;
  Plan pl = make_plan<T>(q);
  pl.nchunks = (p.L + 8 * TPT - 1) / (8 * TPT);
  pl.nstatus = pl.nchains * pl.nchunks * C::CW;
  Dev d = make_dev<T>(q, pl, scratch);
  cudaMemsetAsync(scratch, 0, 256 + Status<typename Elem<T>::S>::reset_bytes(pl.nstatus));
  strided_kernel<T, TPT, CARRY_LB_SERIAL, MINB><<<(unsigned)(pl.nchains * pl.nchunks), 256>>>(d);
}

// strided_stage at another geometry: NW warps x SPW steps per warp, NBUF tiles per block
template <class T, int NW, int SPW, int NBUF>
void stage(const ScanProblem& p, void* scratch) {
  CK((stage_launch<T, NW, SPW, NBUF>(p, scratch, 0)));
}

// strided_pipe at another geometry: SPW steps per warp (LC = 4 x SPW), NSLOT ring slots,
// VB-byte channel vectors per lane (tiles of 32 x VB bytes of channels); false (not run) where
// its shared memory does not fit one block or its vectors are not legal for the shape
template <class T, int SPW, int NSLOT, int UF = SPW, int UW = SPW, int VB = 16>
bool pipe_fits(const ScanProblem& p) {
  bool fits = false;
  CK((pipe_fits_device<T, SPW, NSLOT, UF, UW, VB>(fits)));
  return fits && pipe_legal<T, VB>(p);
}
template <class T, int SPW, int NSLOT, int UF = SPW, int UW = SPW, int VB = 16>
void pipe(const ScanProblem& p, void* scratch) {
  CK((pipe_launch<T, SPW, NSLOT, UF, UW, VB>(p, scratch, 0)));
}
// row_pipe at another geometry: NA aggregator warps, NV 16-byte vectors per aggregator lane,
// NSLOT ring slots
template <class T, int NV, int NSLOT, int NA, bool BULK = false>
bool rpipe_fits() {  // fp32 (scanned in place) and 16-bit (re-walked) types
  bool fits = false;
  if constexpr (std::is_same<T, float>::value || sizeof(T) == 2)
    CK((row_pipe_fits_device<T, NV, NSLOT, NA, BULK>(fits)));
  return fits;
}
template <class T, int NV, int NSLOT, int NA, bool BULK = false>
void rpipe(const ScanProblem& p, void* scratch) {
  CK((row_pipe_launch<T, NV, NSLOT, NA, BULK>(p, scratch, 0)));
}
#ifdef JSS_PIPE_STATS
// One more launch with the kernel's counters on: per finished tile, the finisher's cycles
// waiting for the aggregators, in the look-back (+ publish + barrier), in the walk + stores;
// the producer's wait for a free slot, the aggregators' wait for a full one and their work
// (cycles of one thread per role and block); per channel and tile, how often the look-back
// read past its first words, spun on an empty word, moved a window further back.
static void pipe_stats(const std::string& name, const std::function<void()>& f, int cw) {
  unsigned long long z[16] = {0}, v[16];
  CK(cudaMemcpyToSymbol(g_pipe_stats, z, sizeof(z)));
  f();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpyFromSymbol(v, g_pipe_stats, sizeof(v)));
  const double n = v[0] ? (double)v[0] : 1, nc = n * cw;
  std::printf("   stats %-12s tiles %llu | fin wait %.0f lookback %.0f walk %.0f | producer wait %.0f | "
              "agg wait %.0f work %.0f cycles | per channel: past the first words %.3f, spins %.3f, "
              "windows back %.3f\n",
              name.c_str(), v[0], v[3] / n, v[4] / n, v[6] / n, v[7] / n, v[9] / n, v[10] / n, v[13] / nc,
              v[12] / nc, v[2] / nc);
}
#endif

// row_rounds at another geometry: THREADS x ITEMS per tile, MINB blocks per SM
template <class T, int THREADS, int ITEMS, int MINB>
void rounds(const ScanProblem& p, void* scratch) {
  CK((rounds_launch<T, THREADS, ITEMS, MINB>(p, scratch, 0)));
}

template <class T>
DType dt() { return sizeof(T) == 4 ? DType::F32 : DType::BF16; }

struct Shape { const char* name; int64_t o, L, i; };

template <class T>
void run_shape(const Shape& s, double copy_gbps, bool ncu) {
  const int64_t n = s.o * s.L * s.i;
  const double bytes = 3.0 * sizeof(T) * n;
  T *a, *b, *h0, *h, *ref;
  CK(cudaMalloc(&a, n * sizeof(T))); CK(cudaMalloc(&b, n * sizeof(T)));
  CK(cudaMalloc(&h, n * sizeof(T))); CK(cudaMalloc(&ref, n * sizeof(T)));
  CK(cudaMalloc(&h0, s.o * s.i * sizeof(T) + 16));
  fill<T><<<2048, 256>>>(a, b, n, 5);
  CK(cudaMemset(h0, 0, s.o * s.i * sizeof(T)));
  ScanProblem p;
  p.a = a; p.b = b; p.h0 = h0; p.h = h; p.outer = s.o; p.L = s.L; p.inner = s.i;
  // scratch big enough for any look-back variant here
  size_t sb = 256 + (size_t)n / 16 * 16 + (1 << 20);  // >= every variant here (stage: n/2 + flags at 32 steps)
  void* scratch; CK(cudaMalloc(&scratch, sb));
  auto named = [&](int algo) {
    return [&, algo]() {
      ScanProblem q = p; q.algorithm = algo;
      CK(launch_linear_scan(dt<T>(), q, scratch, 0));
    };
  };
  std::vector<std::pair<std::string, std::function<void()>>> vs;
  vs.push_back({"auto", named(kAuto)});
  vs.push_back({"lookback_regs", named(kLookbackRegs)});
  if (s.i == 1 && s.o < 512) {
    // session 9 (docs/PERFORMANCE_CUDA.md section 9): the blocked register tile (lookback_regs
    // before session 9) vs the striped one (lookback_regs now) at two block sizes
    constexpr int I = 64 / sizeof(T);
    vs.push_back({"blocked_256xI", [&] { tile_opt<T, 256, I, CARRY_LB_WARP, 1, 0>(p, scratch); }});
    vs.push_back({"blocked_512xI", [&] { tile_opt<T, 512, I, CARRY_LB_WARP, 1, 0>(p, scratch); }});
    vs.push_back({"striped_256xI", [&] { tile_opt<T, 256, I, CARRY_LB_WARP, 1, TILE_STRIPED>(p, scratch); }});
    vs.push_back({"striped_512xI", [&] { tile_opt<T, 512, I, CARRY_LB_WARP, 1, TILE_STRIPED>(p, scratch); }});
    vs.push_back({"striped_256xI_b2", [&] { tile_opt<T, 256, I, CARRY_LB_WARP, 2, TILE_STRIPED>(p, scratch); }});
    if (s.L % (16 / sizeof(T)) == 0) {  // row_stage: 16-byte vectors only
      vs.push_back({"stage_w4x2I_b4", [&] { row_stage<T, 4, 2 * I, 4>(p, scratch); }});
      vs.push_back({"stage_w4x2I_b6", [&] { row_stage<T, 4, 2 * I, 6>(p, scratch); }});
      vs.push_back({"stage_w8xI_b4", [&] { row_stage<T, 8, I, 4>(p, scratch); }});
      vs.push_back({"stage_w8x2I_b2", [&] { row_stage<T, 8, 2 * I, 2>(p, scratch); }});
      vs.push_back({"stage_w4x4I_b3", [&] { row_stage<T, 4, 4 * I, 3>(p, scratch); }});
      vs.push_back({"stage_w4xI_b8", [&] { row_stage<T, 4, I, 8>(p, scratch); }});
    }
  }
  if (s.i == 1 && s.L % (16 / sizeof(T)) == 0 && s.L >= 16384) {
    // session 11 (docs/PERFORMANCE_CUDA.md section 11): row_pipe
    // (the two-finisher-group variants measured then are refuted and gone: section 11.1);
    // session 12 (section 12): the same geometries for 16-bit rows, re-walked
#define JSS_RPIPE(NV, NSLOT, NA)                                          \
  if (rpipe_fits<T, NV, NSLOT, NA>())                                     \
    vs.push_back({"rpipe_a" #NA "v" #NV "_n" #NSLOT, [&] { rpipe<T, NV, NSLOT, NA>(p, scratch); }});
    JSS_RPIPE(8, 3, 8) JSS_RPIPE(16, 3, 4)
#undef JSS_RPIPE
    // section 12.2: fp32, the tile's h leaves by one bulk copy (TMA) from a staging region (the
    // package's; smaller tiles, two slots and the 16-bit staging measured slower and are gone)
    if constexpr (std::is_same<T, float>::value)
      vs.push_back({"rpipe_a8v8_n3_stg", [&] { rpipe<T, 8, 3, 8, true>(p, scratch); }});
    vs.push_back({"row_stage", named(kRowStage)});
  }
  if (s.i == 1 && s.o >= 512) {
    // session 51 (section 21): a warp walks rpw consecutive short rows (r0: the rule)
    vs.push_back({"row_walk_s6", [&] { row_walk<T, 6>(p, 1); }});
    vs.push_back({"row_walk_s6_r0", [&] { row_walk<T, 6>(p, 0); }});
    vs.push_back({"row_walk_s6_r2", [&] { row_walk<T, 6>(p, 2); }});
    vs.push_back({"row_walk_s6_r4", [&] { row_walk<T, 6>(p, 4); }});
    vs.push_back({"row_walk_s6_r8", [&] { row_walk<T, 6>(p, 8); }});
    vs.push_back({"row_walk_s12_r4", [&] { row_walk<T, 12>(p, 4); }});
    // section 22: the one-warp blocks an SM holds capped at c (shared memory padded; the rule
    // takes none since section 23), with rings of 4-12 stages (s12 alone holds ~17 an SM)
    vs.push_back({"row_walk_s6_m", [&] { row_walk<T, 6>(p, 1, 0, true); }});
    vs.push_back({"row_walk_s6_m_c16", [&] { row_walk<T, 6>(p, 1, 16, true); }});
    vs.push_back({"row_walk_s6_c24", [&] { row_walk<T, 6>(p, 1, 24); }});
    vs.push_back({"row_walk_s6_c20", [&] { row_walk<T, 6>(p, 1, 20); }});
    vs.push_back({"row_walk_s6_c16", [&] { row_walk<T, 6>(p, 1, 16); }});
    vs.push_back({"row_walk_s6_c12", [&] { row_walk<T, 6>(p, 1, 12); }});
    vs.push_back({"row_walk_s6_c10", [&] { row_walk<T, 6>(p, 1, 10); }});
    vs.push_back({"row_walk_s6_c8", [&] { row_walk<T, 6>(p, 1, 8); }});
    vs.push_back({"row_walk_s8_c16", [&] { row_walk<T, 8>(p, 1, 16); }});
    vs.push_back({"row_walk_s8_c12", [&] { row_walk<T, 8>(p, 1, 12); }});
    vs.push_back({"row_walk_s12_c12", [&] { row_walk<T, 12>(p, 1, 12); }});
    vs.push_back({"row_walk_s12_c8", [&] { row_walk<T, 12>(p, 1, 8); }});
    vs.push_back({"row_walk_s4_c16", [&] { row_walk<T, 4>(p, 1, 16); }});
    vs.push_back({"row_walk_s12_r1", [&] { row_walk<T, 12>(p, 1); }});
    vs.push_back({"row_walk_s12_r2", [&] { row_walk<T, 12>(p, 2); }});
    vs.push_back({"row_walk_s4_r1", [&] { row_walk<T, 4>(p, 1); }});
    vs.push_back({"row_walk_s4_r2", [&] { row_walk<T, 4>(p, 2); }});
    vs.push_back({"tile_lb_256x16_minb3", [&] { tile_opt<T, 256, 64 / sizeof(T), CARRY_LB_WARP, 3, 0>(p, scratch); }});
    vs.push_back({"tile_lb_256x16_minb4", [&] { tile_opt<T, 256, 64 / sizeof(T), CARRY_LB_WARP, 4, 0>(p, scratch); }});
    vs.push_back({"tile_lb_512x16_minb2", [&] { tile_opt<T, 512, 64 / sizeof(T), CARRY_LB_WARP, 2, 0>(p, scratch); }});
  } else if (s.i > 1) {
    // the package's strided kernel families, as auto would launch them
    vs.push_back({"strided_stage", named(kStridedStage)});
    vs.push_back({"strided_pipe", named(kStridedPipe)});
    if (kHasNarrowPipe<T>) vs.push_back({"strided_pipe_narrow", named(kStridedPipeNarrow)});
    vs.push_back({"strided_whole", named(kStridedWhole)});  // section 20
    if (p.inner % (16 / sizeof(T)) == 0 && p.L <= 1024) {  // section 22.5: channel vectors x steps a thread
      vs.push_back({"whole_n1s4", [&] { CK((whole_launch_ncv<T, 1, 4>(p, 0))); }});
      vs.push_back({"whole_n2s4", [&] { CK((whole_launch_ncv<T, 2, 4>(p, 0))); }});
      vs.push_back({"whole_n4s4", [&] { CK((whole_launch_ncv<T, 4, 4>(p, 0))); }});
      // _bN: registers budgeted for N blocks an SM, the package's bounds since section 23 (ptxas,
      // sm_90: bf16 147 -> 128 registers and 8 bytes of spills, 1 -> 2 blocks; fp32 91 -> 80,
      // 2 -> 3); the variants without _b keep ptxas's own choice, the package's before
      if constexpr (sizeof(T) == 2) {
        vs.push_back({"whole_n2s4_b2", [&] { CK((whole_launch_ncv<T, 2, 4, 2>(p, 0))); }});
        vs.push_back({"whole_n4s4_b2", [&] { CK((whole_launch_ncv<T, 4, 4, 2>(p, 0))); }});
      }
      if constexpr (sizeof(T) == 4) {  // 8 steps of 16-bit vectors spill (255 registers)
        vs.push_back({"whole_n2s4_b3", [&] { CK((whole_launch_ncv<T, 2, 4, 3>(p, 0))); }});
        vs.push_back({"whole_n4s4_b3", [&] { CK((whole_launch_ncv<T, 4, 4, 3>(p, 0))); }});
        vs.push_back({"whole_n2s8", [&] { CK((whole_launch_ncv<T, 2, 8>(p, 0))); }});
        vs.push_back({"whole_n4s8", [&] { CK((whole_launch_ncv<T, 4, 8>(p, 0))); }});
      }
    }
    vs.push_back({"stage_w8s8_b1", [&] { stage<T, 8, 8, 1>(p, scratch); }});
    vs.push_back({"stage_w8s4_b1", [&] { stage<T, 8, 4, 1>(p, scratch); }});
    vs.push_back({"stage_w8s12_b1", [&] { stage<T, 8, 12, 1>(p, scratch); }});
    vs.push_back({"stage_w16s4_b1", [&] { stage<T, 16, 4, 1>(p, scratch); }});
    vs.push_back({"stage_w8s4_b2", [&] { stage<T, 8, 4, 2>(p, scratch); }});
    vs.push_back({"stage_w8s6_b2", [&] { stage<T, 8, 6, 2>(p, scratch); }});
    vs.push_back({"stage_w8s8_b2", [&] { stage<T, 8, 8, 2>(p, scratch); }});
    vs.push_back({"stage_w4s8_b2", [&] { stage<T, 4, 8, 2>(p, scratch); }});
    // session 10 (docs/PERFORMANCE_CUDA.md section 10): the warp-specialised pipeline
#define JSS_PIPE(SPW, NSLOT) \
  if (pipe_fits<T, SPW, NSLOT>(p)) vs.push_back({"pipe_s" #SPW "_n" #NSLOT, [&] { pipe<T, SPW, NSLOT>(p, scratch); }});
    JSS_PIPE(16, 3) JSS_PIPE(16, 2) JSS_PIPE(12, 4) JSS_PIPE(8, 6)
#undef JSS_PIPE
    // session 13 (section 13): the fold (and the copies) unrolled UF steps at a time, the walk
    // UW (the writers role measured there is refuted and gone)
#define JSS_PIPE_U(SPW, NSLOT, UF, UW)                                                  \
  if (pipe_fits<T, SPW, NSLOT, UF, UW>(p))                                              \
    vs.push_back({"pipe_s" #SPW "_n" #NSLOT "_f" #UF "w" #UW, [&] { pipe<T, SPW, NSLOT, UF, UW>(p, scratch); }});
    JSS_PIPE_U(16, 3, 8, 8) JSS_PIPE_U(16, 3, 4, 4) JSS_PIPE_U(16, 3, 16, 4) JSS_PIPE_U(16, 3, 4, 16)
    JSS_PIPE_U(16, 3, 16, 8) JSS_PIPE_U(16, 3, 8, 16)
#undef JSS_PIPE_U
    // session 41 (section 16): narrow tiles, 8-byte vectors (32 x 8 bytes of channels: twice the
    // chains), as tall again (s32: the same bytes a tile) or as tall (s16)
#define JSS_PIPE_V8(SPW, NSLOT, UF, UW)                                                      \
  if (pipe_fits<T, SPW, NSLOT, UF, UW, 8>(p))                                                \
    vs.push_back({"pipe_v8_s" #SPW "_n" #NSLOT "_f" #UF "w" #UW, [&] { pipe<T, SPW, NSLOT, UF, UW, 8>(p, scratch); }});
    JSS_PIPE_V8(32, 3, 32, 4) JSS_PIPE_V8(32, 3, 32, 8) JSS_PIPE_V8(32, 3, 16, 8) JSS_PIPE_V8(16, 3, 16, 4)
    JSS_PIPE_V8(16, 6, 16, 8)
#undef JSS_PIPE_V8
    // session 55 (section 24.3, refuted at bf16 (65536, 1024)): 4-byte vectors (64 16-bit / 32 fp32
    // channels a tile: twice the narrow tiles' chains), 256 steps (s64: the narrow tile's bytes)
    // or 128 (half of them); s64 with UF = 32 (spills: 24-34%) and s32 with 6 slots measured and gone
#define JSS_PIPE_V4(SPW, NSLOT, UF, UW)                                                      \
  if (pipe_fits<T, SPW, NSLOT, UF, UW, 4>(p))                                                \
    vs.push_back({"pipe_v4_s" #SPW "_n" #NSLOT "_f" #UF "w" #UW, [&] { pipe<T, SPW, NSLOT, UF, UW, 4>(p, scratch); }});
    JSS_PIPE_V4(64, 3, 16, 4) JSS_PIPE_V4(32, 3, 32, 4)
#undef JSS_PIPE_V4
  }
  if (std::getenv("VB_PIPE_ONLY")) {  // only auto, lookback_regs and the pipeline variants
    std::vector<std::pair<std::string, std::function<void()>>> keep;
    for (auto& v : vs)
      if (v.first == "auto" || v.first == "lookback_regs" || v.first.rfind("pipe_", 0) == 0 ||
          v.first.rfind("rpipe_", 0) == 0 || v.first == "row_stage")
        keep.push_back(v);
    vs.swap(keep);
  }
  if (const char* only = std::getenv("VB_ONLY")) {  // a comma-separated list of variant names
    const std::string list = std::string(",") + only + ",";
    std::vector<std::pair<std::string, std::function<void()>>> keep;
    for (auto& v : vs)
      if (list.find("," + v.first + ",") != std::string::npos) keep.push_back(v);
    vs.swap(keep);
  }
  if (ncu) {  // one launch of each, for the profiler
    for (auto& v : vs) v.second();
    CK(cudaDeviceSynchronize());
  } else {
    // reference: lookback_regs; every variant must agree to rounding
    named(kLookbackRegs)();
    CK(cudaMemcpy(ref, h, n * sizeof(T), cudaMemcpyDeviceToDevice));
    std::vector<T> hr(std::min<int64_t>(n, 1 << 22)), hv(hr.size());
    CK(cudaMemcpy(hr.data(), ref, hr.size() * sizeof(T), cudaMemcpyDeviceToHost));
    std::printf("%-5s %-26s", sizeof(T) == 4 ? "f32" : "bf16", s.name);
    for (auto& v : vs) {
      CK(cudaMemset(h, 0xff, n * sizeof(T)));
      float ms = time_ms(v.second);
      CK(cudaMemcpy(hv.data(), h, hv.size() * sizeof(T), cudaMemcpyDeviceToHost));
      double e = 0, r = 0;
      for (size_t i = 0; i < hv.size(); ++i) {
        double x = (double)(float)hv[i], y = (double)(float)hr[i];
        e += (x - y) * (x - y); r += y * y;
      }
      const double rel = std::sqrt(e / (r + 1e-300));
      const double gbps = bytes / (ms * 1e-3) / 1e9;
      std::printf(" | %s %.0f (%.0f%%)%s", v.first.c_str(), gbps, 100 * gbps / copy_gbps,
                  rel < (sizeof(T) == 4 ? 1e-5 : 1e-2) ? "" : " BAD");
    }
    std::printf("\n");
#ifdef JSS_PIPE_STATS
    for (auto& v : vs)
      if (v.first.rfind("pipe_v8", 0) == 0) pipe_stats(v.first, v.second, 32 * 8 / (int)sizeof(T));
      else if (v.first.rfind("pipe_v4", 0) == 0) pipe_stats(v.first, v.second, 32 * 4 / (int)sizeof(T));
      else if (v.first.rfind("pipe_", 0) == 0) pipe_stats(v.first, v.second, StageCfg<T>::CW);
      else if (v.first.rfind("rpipe_", 0) == 0) pipe_stats(v.first, v.second, 1);
#endif
    fflush(stdout);
  }
  cudaFree(a); cudaFree(b); cudaFree(h); cudaFree(ref); cudaFree(h0); cudaFree(scratch);
}

int main(int argc, char** argv) {
  const bool ncu = argc > 1 && std::string(argv[1]) == "ncu";
  double copy = 1;
  if (!ncu) {
    const size_t nb = size_t(1) << 30;
    void *x, *y;
    CK(cudaMalloc(&x, nb)); CK(cudaMalloc(&y, nb));
    CK(cudaMemset(x, 1, nb));
    float ms = time_ms([&] { CK(cudaMemcpyAsync(y, x, nb, cudaMemcpyDeviceToDevice)); });
    copy = 2.0 * nb / (ms * 1e-3) / 1e9;
    std::printf("copy ceiling %.0f GB/s\n", copy);
    cudaFree(x); cudaFree(y);
  }
  const bool strided_only = std::getenv("VB_STRIDED") != nullptr;
  std::vector<Shape> shapes = {
      {"1 x 2^26", 1, 1 << 26, 1},          {"4096 x 16384", 4096, 16384, 1},
      {"12288 x 2048", 12288, 2048, 1},      {"65536 x 256", 65536, 256, 1},
      {"1024 x 65536", 1024, 65536, 1},      {"512 x 131072", 512, 131072, 1},
      {"(4096, 24576) ax0", 1, 4096, 24576}, {"(65536, 1024) ax0", 1, 65536, 1024},
      {"(1024, 1024) ax0", 1, 1024, 1024},   {"(16384, 4096) ax0", 1, 16384, 4096},
      {"1 x 2^20", 1, 1 << 20, 1},
  };
  if (std::getenv("VB_ROWS"))  // contiguous shapes with fewer rows than row_walk takes
    shapes = {{"1 x 2^26", 1, 1 << 26, 1},     {"1 x 2^20", 1, 1 << 20, 1},
              {"4 x 2^24", 4, 1 << 24, 1},     {"64 x 2^20", 64, 1 << 20, 1},
              {"256 x 65536", 256, 65536, 1},  {"511 x 8192", 511, 8192, 1},
              {"3 x 1000003", 3, 1000003, 1},  {"512 x 131072", 512, 131072, 1},
              {"1024 x 65536", 1024, 65536, 1}};
  if (strided_only)
    shapes = {{"(4096, 24576) ax0", 1, 4096, 24576}, {"(65536, 1024) ax0", 1, 65536, 1024},
              {"(16384, 4096) ax0", 1, 16384, 4096},  {"(1024, 1024) ax0", 1, 1024, 1024},
              {"(2048, 32, 1024) ax1", 2048, 32, 1024}};
  // VB_SHAPES="outer:L:inner,..." replaces the set (a strided (L, C) axis 0 is 1:L:C; rows x L is rows:L:1)
  if (const char* e = std::getenv("VB_SHAPES")) {
    static std::deque<std::string> names;  // Shape keeps a pointer to its name: no reallocation
    shapes.clear();
    for (std::string rest = e; !rest.empty();) {
      const size_t cut = rest.find(',');
      const std::string one = rest.substr(0, cut);
      rest = cut == std::string::npos ? "" : rest.substr(cut + 1);
      long long o = 0, l = 0, i = 0;
      if (std::sscanf(one.c_str(), "%lld:%lld:%lld", &o, &l, &i) != 3 || o < 1 || l < 1 || i < 1) {
        std::fprintf(stderr, "VB_SHAPES: '%s' is not outer:L:inner\n", one.c_str());
        return 2;
      }
      const std::string li = std::to_string(l) + ", " + std::to_string(i);
      names.push_back(i == 1 ? std::to_string(o) + " x " + std::to_string(l)
                             : o == 1 ? "(" + li + ") ax0" : "(" + std::to_string(o) + ", " + li + ") ax1");
      shapes.push_back({names.back().c_str(), o, l, i});
    }
  }
  if (ncu && !std::getenv("VB_SHAPES"))
    shapes = {{"(4096, 24576) ax0", 1, 4096, 24576}, {"(65536, 1024) ax0", 1, 65536, 1024}};
  if (ncu && std::getenv("VB_ROWS")) shapes = {{"256 x 65536", 256, 65536, 1}};
  if (ncu && std::getenv("VB_NCU_LONG_ROW")) shapes = {{"1 x 2^26", 1, 1 << 26, 1}};
  // ncu: fp32 only, or bf16 only with VB_NCU_BF16
  const bool ncu_bf16 = ncu && std::getenv("VB_NCU_BF16");
  if (!ncu_bf16)
    for (auto& s : shapes) run_shape<float>(s, copy, ncu);
  if (!ncu || ncu_bf16)
    for (auto& s : shapes) run_shape<__nv_bfloat16>(s, copy, ncu);
  return 0;
}
