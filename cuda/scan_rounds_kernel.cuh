// row_rounds: few long contiguous rows by a persistent grid in rounds; kernel and launcher.
#pragma once

#include "scan_block.cuh"
#include "scan_launch.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// row_rounds (contiguous layout, few long rows; chosen only by "auto"). The look-back
// kernels above are limited on one long row by the chain of inclusive prefixes: a tile's
// carry is a left fold from the nearest published inclusive prefix, so the frontier moves
// at most 32 tiles per L2 round trip. Here a persistent grid of G co-resident blocks
// (cooperative launch) takes the row-major tile sequence in ROUNDS: in round r block j owns
// tile g = r*G + j (row g / tpr, tile g % tpr of that row). Per round a block
//   1. scans its tile in registers and publishes the tile aggregate (one status word);
//   2. issues the loads of its tile of round r+1 (in flight during 3 and 4);
//   3. waits for ALL G aggregates of the round and folds them in one fixed order: lane l of
//      warp 0 folds slots [l*m, (l+1)*m) left to right (m = ceil(G/32)), then a Kogge-Stone
//      scan over the 32 lane folds. Block j takes the exclusive value at slot j; every block
//      computes the same round total (same inputs, same operations), so the prefix entering
//      round r+1 is carried in registers: no chain of prefixes between blocks, no frontier;
//   4. applies its carry and stores h.
// Rows: a segmented fold. A tile that starts a row publishes (1, h0[row]) o aggregate
// flagged ST_INC ("reset": the fold restarts there); other tiles publish ST_AGG.
// Determinism: every value is a fixed function of the inputs and of G (blocks per SM x SMs,
// fixed for a GPU and build), never of timing. Waiting for LATER slots of the round is safe
// only because all G blocks are resident: the launch is cooperative.
template <class S>
struct Seg {  // a segmented-scan element: the pair, and whether a row starts inside it
  Pair<S> p;
  bool reset;
};
template <class S>
__device__ __forceinline__ Seg<S> seg_identity() {
  return {identity<S>(), false};
}
// earlier first, later second; a later element that starts a row discards the earlier one
template <class S>
__device__ __forceinline__ Seg<S> seg_combine(const Seg<S>& e, const Seg<S>& l) {
  return l.reset ? l : Seg<S>{combine(e.p, l.p), e.reset};
}
template <class S>
__device__ __forceinline__ Seg<S> shfl_up(const Seg<S>& s, int d) {
  return {shfl_up(s.p, d), __shfl_up_sync(0xffffffffu, (int)s.reset, d) != 0};
}
template <class S>
__device__ __forceinline__ Seg<S> shfl_idx(const Seg<S>& s, int l) {
  return {shfl_idx(s.p, l), __shfl_sync(0xffffffffu, (int)s.reset, l) != 0};
}

// Slots per lane of the round fold (the round's slots are staged in shared memory, 32 lanes
// x this many): 5 per resident block per SM covers up to 160 SMs; the host caps G at
// 32 * rounds_max_m(MINB).
__host__ __device__ constexpr int rounds_max_m(int minb) { return 5 * minb; }

template <class T, int THREADS, int ITEMS, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) row_rounds_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NW = THREADS / 32;
  constexpr int TILE = THREADS * ITEMS;
  constexpr int GMAX = 32 * rounds_max_m(MINB);
  constexpr int SPT = (GMAX + THREADS - 1) / THREADS;  // slots polled per thread
  __shared__ P s_warp[NW];
  __shared__ P s_carry;
  __shared__ P s_slot[GMAX];
  __shared__ bool s_reset[GMAX];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t G = gridDim.x, j = blockIdx.x;
  const int64_t tpr = d.nchunks, ntiles = d.nchains * tpr;
  const int m = (int)((G + 31) / 32);  // slots per lane in the round fold
  const Status<S> st(d.status, d.nstatus);
  const T* a0 = static_cast<const T*>(d.a);
  const T* b0 = static_cast<const T*>(d.b);

  P x[ITEMS], xn[ITEMS];
  if (j < ntiles) {
    const int64_t row = j / tpr, k = j % tpr;
    load_items<T, ITEMS>(d, a0 + row * d.L, b0 + row * d.L, k * TILE + (int64_t)tid * ITEMS, x);
  }
  Seg<S> carry = seg_identity<S>();  // the prefix entering the round (warp 0; the first tile starts a row)
  uint32_t* count = static_cast<uint32_t*>(d.carry);  // per round: tiles published
  for (int64_t r0 = 0, g = j, rr = 0; g < ntiles; r0 += G, g += G, ++rr) {
    const int64_t row = g / tpr, k = g % tpr;
    // 1. local scan: serial in the thread, Kogge-Stone in the warp, warp totals in order
    P ex;
    const P w = thread_warp_scan<S, ITEMS>(x, lane, ex);
    if (lane == 31) s_warp[warp] = w;
    __syncthreads();
    const P wp = earlier_warps<S, NW>(s_warp, warp);
    const P h0p = h0_pair<T>(d, row);
    if (tid == 0) {
      P t = s_warp[0];
#pragma unroll
      for (int q = 1; q < NW; ++q) t = combine(t, s_warp[q]);
      if (k == 0) st.publish((size_t)g, ST_INC, combine(h0p, t));
      else st.publish((size_t)g, ST_AGG, t);
      red_release_add(count + rr, 1u);  // after the slot: a reader that counts nr finds all slots
    }
    // 2. the next round's tile: loads issued now, consumed after the wait
    const int64_t gn = g + G;
    if (gn < ntiles) {
      const int64_t rn = gn / tpr, kn = gn % tpr;
      load_items<T, ITEMS>(d, a0 + rn * d.L, b0 + rn * d.L, kn * TILE + (int64_t)tid * ITEMS, xn);
    }
    // 3. the round's fold. One thread waits until the round's counter reaches nr (polling
    // one word: 264 blocks x 256 threads spinning on the slots themselves measured ~10 us
    // per round); then all threads stage the slots in shared memory; warp 0 folds them.
    const int64_t nr = ntiles - r0 < G ? ntiles - r0 : G;  // slots in this round
    if (tid == 0)
      while (ld_acquire(count + rr) < (uint32_t)nr) __nanosleep(32);
    __syncthreads();
    {
      P p[SPT];
      uint32_t f[SPT];
#pragma unroll
      for (int q = 0; q < SPT; ++q) {
        const int64_t s = tid + (int64_t)q * THREADS;
        f[q] = ST_AGG;
        if (s < nr) f[q] = st.load((size_t)(r0 + s), p[q]);
      }
#pragma unroll
      for (int q = 0; q < SPT; ++q) {
        const int64_t s = tid + (int64_t)q * THREADS;
        if (s < nr) {
          while (f[q] == ST_INVALID) f[q] = st.load((size_t)(r0 + s), p[q]);
          s_slot[s] = p[q];
          s_reset[s] = f[q] == ST_INC;
        }
      }
    }
    __syncthreads();
    if (warp == 0) {
      const int jl = (int)(j / m);  // the lane whose slots hold slot j
      Seg<S> acc = seg_identity<S>(), part = seg_identity<S>();
      for (int q = 0; q < m; ++q) {
        const int s = lane * m + q;
        if (s == j) part = acc;  // lane jl: the fold of its slots before j
        if (s < nr) acc = seg_combine(acc, Seg<S>{s_slot[s], s_reset[s]});
      }
      Seg<S> incl = acc;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        Seg<S> u = shfl_up(incl, o);
        if (lane >= o) incl = seg_combine(u, incl);
      }
      Seg<S> excl = shfl_up(incl, 1);
      if (lane == 0) excl = seg_identity<S>();
      const Seg<S> mine = shfl_idx(seg_combine(excl, part), jl);
      const Seg<S> total = shfl_idx(incl, 31);
      if (lane == 0) s_carry = k == 0 ? h0p : seg_combine(carry, mine).p;
      carry = seg_combine(carry, total);
    }
    __syncthreads();
    // 4. apply and store
    const P pre = combine(combine(s_carry, wp), ex);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) x[i] = combine(pre, x[i]);
    store_items<T, ITEMS>(d, static_cast<T*>(d.h) + row * d.L,
                          d.aprod ? static_cast<T*>(d.aprod) + row * d.L : nullptr,
                          k * TILE + (int64_t)tid * ITEMS, x);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) x[i] = xn[i];
  }
}

// row_rounds host side, for any geometry (the variant bench launches several; the package
// uses RoundsTune<T>).
template <class T>
struct RoundsTune {  // prediction in docs/PERFORMANCE_CUDA.md section 6 (not yet measured)
  static constexpr int THREADS = 256, ITEMS = 16, MINB = 2;
};

template <int THREADS, int ITEMS>
struct RoundsGeom {
  static constexpr int TILE = THREADS * ITEMS;
  int64_t tpr, ntiles;
  explicit RoundsGeom(const ScanProblem& p) {
    tpr = (p.L + TILE - 1) / TILE;
    ntiles = p.outer * tpr;
  }
};

// counter, status words, then one uint32 per round (at most one round per tile)
template <class T, int THREADS, int ITEMS>
size_t rounds_scratch(const ScanProblem& p) {
  const size_t n = (size_t)RoundsGeom<THREADS, ITEMS>(p).ntiles;
  return 256 + Status<typename Elem<T>::S>::bytes(n) + round_up(n * 4, 256);
}

template <class T, int THREADS, int ITEMS, int MINB>
cudaError_t rounds_launch(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  using S = typename Elem<T>::S;
  const RoundsGeom<THREADS, ITEMS> g(p);
  if (g.ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  auto kernel = row_rounds_kernel<T, THREADS, ITEMS, MINB>;
  static std::atomic<int> resident[64];
  int res = 0;  // co-resident blocks: the cooperative grid's ceiling
  cudaError_t err = resident_blocks(kernel, THREADS, 0, resident, res);
  if (err != cudaSuccess) return err;
  int64_t grid = res < 32 * rounds_max_m(MINB) ? res : 32 * rounds_max_m(MINB);
  if (grid > g.ntiles) grid = g.ntiles;
  Dev d = dev_params(p);
  d.nchains = p.outer;
  d.nchunks = g.tpr;
  d.vec = (align_bits(p) & 15) == 0 && p.L % (16 / sizeof(T)) == 0;
  char* base = static_cast<char*>(scratch);  // (the first 256 bytes: unused here)
  d.status = base + 256;
  d.nstatus = (size_t)g.ntiles;
  d.carry = base + 256 + Status<S>::bytes(d.nstatus);  // the round counters
  const int64_t nrounds = (g.ntiles + grid - 1) / grid;
  // every launch starts from empty status words and zero counters (also a graph replay)
  err = cudaMemsetAsync(base, 0, 256 + Status<S>::reset_bytes(d.nstatus), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(d.carry, 0, (size_t)nrounds * 4, stream);
  if (err != cudaSuccess) return err;
  // cooperative: the driver guarantees that all `grid` blocks are resident together, which
  // the round fold (waiting for later slots of the round) relies on
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, d);
}

}  // namespace jss
