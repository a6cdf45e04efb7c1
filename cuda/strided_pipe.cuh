// strided_pipe: the strided layout's look-back tile as a persistent, warp-specialised
// pipeline ("auto" for strided scans longer than 1024 steps with float state;
// docs/PERFORMANCE_CUDA.md section 10). Builds on strided_stage (scan_stage_kernels.cuh), whose
// tile geometry and staged fold and walk it shares.
//
// Why: strided_stage's block runs its phases one after another (load -> walk -> publish ->
// look back -> fold -> walk + store), so its loads are in flight only in the first phase;
// prefetching the next tile in the same block (strided_stage NBUF = 2) made every aggregate
// wait for that block's previous look-back, and chains of such waits ran in waves. Here the
// roles are separate warps of one persistent block, joined by a ring of NSLOT tiles in
// shared memory:
//   producer   (1 warp)  claims tile ids (one atomic counter: ids in start order, so every
//                        predecessor of a claimed tile is claimed by a running block) and
//                        lands each tile in a free slot with cp.async; the copies arrive
//                        on the slot's `full` mbarrier;
//   aggregator (4 warps) as soon as a slot is full: the warps' step aggregates per channel,
//                        the tile's aggregate published (a chain's first tile publishes its
//                        inclusive prefix at once); never waits for a look-back;
//   finisher   (4 warps) the tiles in claim order: look back, publish the inclusive prefix,
//                        walk the slot again with the carry and store h; frees the slot
//                        (`empty` mbarrier).
// A tile's aggregate depends only on its own loads, and the producer keeps loads in flight
// while the finisher looks back. No deadlock: the lowest tile without an inclusive prefix has
// every predecessor inclusive, and its block's finisher reaches it (that block's earlier
// tiles have lower ids).
//
// Tile geometry: CW = 32 lanes x one VB-byte vector of channels (VB = 16 as strided_stage;
// 8 gives narrow tiles of twice the chains, docs/PERFORMANCE_CUDA.md section 16), LC = 4 * SPW
// steps (warp w of a role owns steps [w*SPW, (w+1)*SPW)); tile id = k * nchains + chain as in
// strided_stage. A slot is [LC][a, b][32 lanes] VB-byte vectors.
//
// Status: one 16-byte word {flag, 0, a, b} per tile and channel (Status<float>: published and
// read in one access, float state only), so a channel's look-back needs no fence and reads
// flag and value in one round trip. Each finisher thread looks back over its own channels'
// words: the nearest inclusive prefix j, then aggregates j+1 .. k-1 folded in order (the
// canonical left fold of scan_kernels.cuh's header: the same bits whatever the
// timing).
//
// Synchronisation inside the block (mbarriers; arrive = release, wait = acquire, CTA scope):
//   full[s]    33 arrivals: the producer's 32 lanes by cp.async.mbarrier.arrive.noinc (each
//              when its copies have landed) + lane 0 after writing s_ids[s];
//   scanned[s] 1 arrival: aggregator thread 0 after the role's named barrier (s_agg[s]; the
//              aggregators' reads of the slot and of s_ids[s] are done), waited for by the
//              finishers and by the producer before the refill;
//   empty[s]   128 arrivals: every finisher thread after its last read of slot s (waited for
//              by the producer before the refill, and by the aggregators before they rewrite
//              s_agg[s]).
// The u-th use of slot s (u = i / NSLOT for the block's i-th tile) waits for phase parity
// u & 1 of full / scanned, and the producer's refill for parity (u - 1) & 1 of empty (a phase
// never completes twice ahead of its waiter: each refill waits for the last use's empty).
// The finisher's exclusive prefixes in shared memory are double buffered by tile parity: a
// finisher thread reaches tile i+2's named barrier only after every finisher thread has passed
// tile i+1's, so after it finished reading tile i's.
//
// Code size: the three roles run different code on every SM sub-partition at once, so the hot
// code must stay small (section 13 of docs/PERFORMANCE_CUDA.md: unrolled, the bf16 kernel's
// overflowed the instruction cache). The producer's loop over the four warps' steps is not
// unrolled (that was ~1100 instructions a tile); UF (the aggregators' fold and the producer's
// copies) and UW (the finishers' walk) unroll the loops over a tile's steps that many at a time.
#pragma once

#include "scan_launch.cuh"
#include "scan_stage_kernels.cuh"

namespace jss {

constexpr int PIPE_GROUP = 4;   // warps per role (aggregators, finishers)
constexpr int PIPE_FIRST = 2;   // the look-back's first read: the nearest words
constexpr int PIPE_WINDOW = 8;  // its later reads, all words loaded at once (per thread)

template <class T, int SPW, int NSLOT, int VB = 16>
struct PipeCfg {
  using S = typename Elem<T>::S;
  static constexpr int V = VecB<T, VB>::N;
  static constexpr int CW = 32 * V;
  static constexpr int LC = PIPE_GROUP * SPW;
  static constexpr int THREADS = (2 * PIPE_GROUP + 1) * 32;
  static constexpr int PRODUCER = 2 * PIPE_GROUP;  // the producer's warp
  static constexpr int PER = (CW + PIPE_GROUP * 32 - 1) / (PIPE_GROUP * 32);  // channels per role thread
  static constexpr size_t slot_bytes = size_t(LC) * 2 * 32 * VB;
  static constexpr size_t agg_bytes = size_t(PIPE_GROUP) * CW * sizeof(Pair<S>);
  // slots, s_agg per slot, s_excl x 2, mbarriers (3 per slot), ids per slot
  static constexpr size_t smem() {
    return NSLOT * (slot_bytes + agg_bytes) + 2 * CW * sizeof(Pair<S>) + 3 * NSLOT * 8 + NSLOT * 4;
  }
  static_assert(NSLOT >= 2, "the aggregators' next slot must not be the one being read");
};

// Optional counters for the variant bench (nvcc -DJSS_PIPE_STATS): per-role cycles and the
// look-back's extra reads, summed over the grid (PERFORMANCE_CUDA section 10).
#ifdef JSS_PIPE_STATS
__device__ unsigned long long g_pipe_stats[16];
#define JSS_PIPE_STAT(i, v) atomicAdd(&g_pipe_stats[i], (unsigned long long)(v))
#define JSS_PIPE_CLOCK(t) const long long t = clock64()
#else
#define JSS_PIPE_STAT(i, v) \
  do {                      \
  } while (0)
#define JSS_PIPE_CLOCK(t) \
  do {                    \
  } while (0)
#endif

// mbarrier primitives (sm_80+; try_wait on sm_90, test_wait before).
__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
  unsigned done = 0;
  while (!done) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_u32(b)), "r"(parity) : "memory");
#else
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_u32(b)), "r"(parity) : "memory");
#endif
  }
}
// Named barrier of one role's 128 threads (ids 1, 2; 0 is __syncthreads).
__device__ __forceinline__ void group_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(PIPE_GROUP * 32) : "memory");
}

// ---- the look-back of one channel over its own status words
// A window holds the words of chunks hi, hi - 1, ..., hi - m + 1, all loaded before any is
// inspected. Chunks before the first are the virtual inclusive prefix (1, h0), whose h0 is
// read only if the fold starts there.
constexpr uint32_t ST_UNREAD = 3;  // a window slot that was not loaded
constexpr uint32_t ST_H0 = 4;      // a chunk before the first

template <int W>
struct Window {
  Pair<float> v[W];
  uint32_t f[W];
};

// Loads the m <= W nearest words; rec(c): the word of chunk c.
template <int W, class Rec>
__device__ __forceinline__ void window_load(const Status<float>& st, int64_t hi, int m, const Rec& rec,
                                            Window<W>& win) {
#pragma unroll
  for (int u = 0; u < W; ++u) {
    if (u >= m) win.f[u] = ST_UNREAD;
    else if (hi - u >= 0) win.f[u] = st.load(rec(hi - u), win.v[u]);
    else win.f[u] = ST_H0;
  }
}

// 0: acc = the fold from the nearest inclusive word (at index near) through chunk hi; 1: an
// empty word nearer than any inclusive one (spin); 2: more words needed (unread, or all
// aggregates). h0(): the chain's (1, h0).
template <int W, class H0>
__device__ __forceinline__ int window_fold(const Window<W>& win, const H0& h0, Pair<float>& acc, int& near) {
  near = -1;
  int bad = -1;
  uint32_t badf = ST_UNREAD;
#pragma unroll
  for (int u = W - 1; u >= 0; --u) {  // the nearest inclusive and the nearest empty / unread
    if (win.f[u] == ST_INC || win.f[u] == ST_H0) near = u;
    if (win.f[u] == ST_INVALID || win.f[u] == ST_UNREAD) {
      bad = u;
      badf = win.f[u];
    }
  }
  if (near < 0 || (bad >= 0 && bad < near)) return badf == ST_INVALID ? 1 : 2;
  acc = win.v[0];
  bool at_h0 = win.f[0] == ST_H0;
#pragma unroll
  for (int u = 1; u < W; ++u)  // v[near] without a dynamically indexed (local-memory) array
    if (u == near) {
      acc = win.v[u];
      at_h0 = win.f[u] == ST_H0;
    }
  if (at_h0) acc = h0();
#pragma unroll
  for (int u = W - 1; u >= 0; --u)
    if (u < near) acc = combine(acc, win.v[u]);
  return 0;
}

// The exclusive prefix of chunk k, in two steps so that a thread with several channels has all
// their first reads in flight at once (lookback_first for each, then lookback_finish for each).
// First the PIPE_FIRST nearest words (or a whole window where the channel's last look-back went
// further: the distance changes slowly along a run of tiles); failing that, windows of W from
// k - 1 back, spinning on empty words, and the windows skipped on the way folded again (their
// words are valid and only ever turn from aggregate to inclusive, which the fold takes as it
// is: bit for bit what folding would give).
template <int W, class Rec>
__device__ __forceinline__ void lookback_first(const Status<float>& st, int64_t k, const Rec& rec, bool wide,
                                               Window<W>& win) {
  window_load<W>(st, k - 1, wide ? W : PIPE_FIRST, rec, win);
}
template <int W, class Rec, class H0>
__device__ Pair<float> lookback_finish(const Status<float>& st, int64_t k, const Rec& rec, const H0& h0,
                                       Window<W>& win, bool& wide) {
  using P = Pair<float>;
  P acc;
  int near;
  int r = window_fold<W>(win, h0, acc, near);
  wide = r != 0 || near >= PIPE_FIRST;
  if (r == 0) return acc;
  JSS_PIPE_STAT(13, 1);
  int64_t hi = k - 1;
  while (true) {
    window_load<W>(st, hi, W, rec, win);
    r = window_fold<W>(win, h0, acc, near);
    if (r == 0) break;
    if (r == 2) {
      hi -= W;
      JSS_PIPE_STAT(2, 1);
    } else {
      JSS_PIPE_STAT(12, 1);
    }
  }
  for (int64_t c = hi + 1; c <= k - 1; ++c) {
    P p;
    const uint32_t fc = st.load(rec(c), p);
    acc = fc == ST_INC ? p : combine(acc, p);
  }
  return acc;
}

template <class T, int SPW, int NSLOT, int UF, int UW, int VB>
__global__ void __launch_bounds__(PipeCfg<T, SPW, NSLOT, VB>::THREADS, 1) strided_pipe_kernel(Dev d) {
  using C = PipeCfg<T, SPW, NSLOT, VB>;
  using U = VecWord<VB>;
  using E = Elem<T>;
  using P = Pair<float>;
  static_assert(std::is_same<typename E::S, float>::value, "packed status words: float state only");
  constexpr int V = C::V, CW = C::CW, LC = C::LC, PER = C::PER, GT = PIPE_GROUP * 32;
  constexpr int W = PIPE_WINDOW;
  extern __shared__ uint4 smem_pipe[];
  U* s_slot = reinterpret_cast<U*>(smem_pipe);                                        // [NSLOT][LC][2][32]
  P* s_agg = reinterpret_cast<P*>(reinterpret_cast<char*>(smem_pipe) + NSLOT * C::slot_bytes);  // [NSLOT][4][CW]
  P* s_excl = s_agg + NSLOT * PIPE_GROUP * CW;                                        // [2][CW]
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_excl + 2 * CW);                      // full, scanned, empty
  uint64_t* full = bars;
  uint64_t* scanned = bars + NSLOT;
  uint64_t* empty = bars + 2 * NSLOT;
  unsigned* s_ids = reinterpret_cast<unsigned*>(bars + 3 * NSLOT);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t L = d.L, inner = d.inner, nchains = d.nchains;
  const unsigned ntiles = (unsigned)(d.nchains * d.nchunks);
  const int64_t step = d.reverse ? -inner : inner;
  const Status<float> st(d.status, d.nstatus);  // word of (tile id, channel ch): id * CW + ch

  if (tid == 0) {
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(full + s, 33);
      mbar_init(scanned + s, 1);
      mbar_init(empty + s, GT);
    }
  }
  __syncthreads();

  // Element offset of the first of the steps [p0, p0 + SPW) of tile id for this lane, and how
  // many of them lie inside [0, L).
  auto first_off = [&](unsigned id, int64_t p0, int& n, bool& active) -> int64_t {
    const int64_t chain = id % nchains, k = id / nchains;
    const int64_t o = chain / d.nct, ct = chain % d.nct;
    const int64_t c0 = ct * CW + (int64_t)lane * V;
    const int64_t pp = k * LC + p0, rem = L - pp;
    n = rem <= 0 ? 0 : (rem < SPW ? (int)rem : SPW);
    active = c0 < inner;
    const int64_t q0 = d.reverse ? L - 1 - pp : pp;
    return n > 0 ? (o * L + q0) * inner + c0 : 0;
  };
  // (1, h0) of channel ch of a chain's tile (the identity past the last channel)
  auto h0_of = [&](int64_t chain, int ch) -> P {
    const int64_t o = chain / d.nct, c = (chain % d.nct) * CW + ch;
    return c < inner ? h0_pair<T>(d, o * inner + c) : identity<float>();
  };

  if (warp == C::PRODUCER) {  // ---- producer
    const T* A = static_cast<const T*>(d.a);
    const T* B = static_cast<const T*>(d.b);
    for (int i = 0;; ++i) {
      const int s = i % NSLOT;
      JSS_PIPE_CLOCK(t0);
      if (i >= NSLOT) {
        mbar_wait(empty + s, ((i / NSLOT) - 1) & 1);
        // the aggregators' reads of the slot and its id came before the finishers' (so this
        // returns at once); waited for directly, as for the aggregators' s_agg below
        mbar_wait(scanned + s, ((i / NSLOT) - 1) & 1);
      }
      if (lane == 0) JSS_PIPE_STAT(7, clock64() - t0);
      unsigned id = 0;
      if (lane == 0) id = atomicAdd(d.counter, 1u);
      id = __shfl_sync(0xffffffffu, id, 0);
      if (lane == 0) s_ids[s] = id;  // >= ntiles: the end marker
      if (id < ntiles) {
        U* dst = s_slot + (size_t)s * LC * 64;
#pragma unroll 1
        for (int w = 0; w < PIPE_GROUP; ++w) {
          int n;
          bool active;
          const int64_t off = first_off(id, (int64_t)w * SPW, n, active);
          if (active) {
            const T* pa = A + off;
            const T* pb = B + off;
#pragma unroll UF
            for (int j = 0; j < SPW; ++j) {
              if (j < n) {
                cp_async<VB>(dst + (w * SPW + j) * 64 + lane, pa);
                cp_async<VB>(dst + (w * SPW + j) * 64 + 32 + lane, pb);
              }
              pa += step;
              pb += step;
            }
          }
        }
      }
      mbar_arrive_cp_async(full + s);
      if (lane == 0) mbar_arrive(full + s);
      if (id >= ntiles) break;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }

  if (warp < PIPE_GROUP) {  // ---- aggregators
    const int w = warp;
    for (int i = 0;; ++i) {
      const int s = i % NSLOT;
      JSS_PIPE_CLOCK(t0);
      mbar_wait(full + s, (i / NSLOT) & 1);
      JSS_PIPE_CLOCK(t1);
      if (tid == 0) JSS_PIPE_STAT(9, t1 - t0);
      const unsigned cur = s_ids[s];
      if (cur >= ntiles) {  // the end marker: pass it on to the finishers
        if (tid == 0) mbar_arrive(scanned + s);
        break;
      }
      int n;
      bool active;
      first_off(cur, (int64_t)w * SPW, n, active);
      P x[V];
      staged_fold<T, SPW, UF, VB>(s_slot + ((size_t)s * LC + w * SPW) * 64, active ? n : 0, lane, x);
      P* sa = s_agg + (size_t)s * PIPE_GROUP * CW;
      // The finishers' reads of this slot's last aggregates came before the producer's refill,
      // so this wait returns at once; it states the order directly (racecheck does not follow
      // it through the producer's asynchronous arrivals).
      if (i >= NSLOT) mbar_wait(empty + s, ((i / NSLOT) - 1) & 1);
#pragma unroll
      for (int e = 0; e < V; ++e) sa[w * CW + lane * V + e] = x[e];
      group_sync(1);
      const int64_t chain = cur % nchains, k = cur / nchains;
#pragma unroll
      for (int m = 0; m < PER; ++m) {
        const int ch = tid + m * GT;
        if (ch < CW) {
          P t = sa[ch];
#pragma unroll
          for (int q = 1; q < PIPE_GROUP; ++q) t = combine(t, sa[q * CW + ch]);
          // a chain's first tile publishes its inclusive prefix at once
          if (k == 0) st.publish((size_t)cur * CW + ch, ST_INC, combine(h0_of(chain, ch), t));
          else st.publish((size_t)cur * CW + ch, ST_AGG, t);
        }
      }
      // every aggregator thread is done with s_agg[s], the slot and s_ids[s] (the finishers,
      // then the producer, take them over)
      group_sync(1);
      if (tid == 0) mbar_arrive(scanned + s);
      if (tid == 0) JSS_PIPE_STAT(10, clock64() - t1);
    }
    return;
  }

  // ---- finishers
  const int w = warp - PIPE_GROUP, ftid = tid - GT;
  T* H = static_cast<T*>(d.h);
  T* AP = static_cast<T*>(d.aprod);
  bool wide[PER];  // per channel: its last look-back went past the nearest words
#pragma unroll
  for (int m = 0; m < PER; ++m) wide[m] = false;
  for (int i = 0;; ++i) {
    const int s = i % NSLOT, par = i & 1;
    JSS_PIPE_CLOCK(t0);
    mbar_wait(scanned + s, (i / NSLOT) & 1);
    // (not needed by the protocol: every thread has waited itself; with it, compute-sanitizer's
    // racecheck also sees the aggregators' s_agg writes ordered before the reads below)
    group_sync(2);
    JSS_PIPE_CLOCK(t1);
    if (ftid == 0) JSS_PIPE_STAT(3, t1 - t0);
    const unsigned cur = s_ids[s];
    if (cur >= ntiles) break;
    const int64_t chain = cur % nchains, k = cur / nchains;
    const P* sa = s_agg + (size_t)s * PIPE_GROUP * CW;
    P* ex = s_excl + par * CW;
    // 1. the exclusive prefix of each channel (look-back), published inclusive; the first
    // reads of all of this thread's channels issued together
    if (k == 0) {
#pragma unroll
      for (int m = 0; m < PER; ++m) {
        const int ch = ftid + m * GT;
        if (ch < CW) ex[ch] = h0_of(chain, ch);
      }
    } else {
      Window<W> win[PER];
#pragma unroll
      for (int m = 0; m < PER; ++m) {
        const int ch = ftid + m * GT;
        auto rec = [&](int64_t c) { return (size_t)(c * nchains + chain) * CW + ch; };
        if (ch < CW) lookback_first<W>(st, k, rec, wide[m], win[m]);
      }
#pragma unroll
      for (int m = 0; m < PER; ++m) {
        const int ch = ftid + m * GT;
        if (ch < CW) {
          auto h0 = [&] { return h0_of(chain, ch); };
          auto rec = [&](int64_t c) { return (size_t)(c * nchains + chain) * CW + ch; };
          const P e = lookback_finish<W>(st, k, rec, h0, win[m], wide[m]);
          ex[ch] = e;
          P t = sa[ch];
#pragma unroll
          for (int q = 1; q < PIPE_GROUP; ++q) t = combine(t, sa[q * CW + ch]);
          st.publish((size_t)cur * CW + ch, ST_INC, combine(e, t));
        }
      }
    }
    group_sync(2);
    JSS_PIPE_CLOCK(t2);
    if (ftid == 0) JSS_PIPE_STAT(4, t2 - t1);
    // 2. the second walk: prefix = excl o (earlier warps' aggregates), then the steps
    int n;
    bool active;
    const int64_t off = first_off(cur, (int64_t)w * SPW, n, active);
    if (active && n > 0) {
      const U* src = s_slot + ((size_t)s * LC + w * SPW) * 64;
      P cv[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int ch = lane * V + e;
        P acc = ex[ch];
#pragma unroll
        for (int q = 0; q < PIPE_GROUP; ++q)
          if (q < w) acc = combine(acc, sa[q * CW + ch]);
        cv[e] = acc;
      }
      staged_walk<T, SPW, UW, VB>(src, n, lane, step, cv, H + off, AP ? AP + off : nullptr);
    }
    mbar_arrive(empty + s);
    if (ftid == 0) {
      JSS_PIPE_STAT(6, clock64() - t2);
      JSS_PIPE_STAT(0, 1);
    }
  }
}

// Host side. Scratch: the tile counter, then one 16-byte status word per tile and channel
// (all reset before every launch: +0.25 B per element at LC = 64). A persistent grid: the
// blocks that fit at once (one per SM at this shared memory), never more than tiles.
template <class T, int SPW, int VB = 16>
struct PipeGeom {
  static constexpr int CW = PipeCfg<T, SPW, 2, VB>::CW, LC = PIPE_GROUP * SPW;
  int64_t nct, nchains, nchunks, ntiles;
  size_t nstatus;
  explicit PipeGeom(const ScanProblem& p) {
    nct = (p.inner + CW - 1) / CW;
    nchains = p.outer * nct;
    nchunks = (p.L + LC - 1) / LC;
    ntiles = nchains * nchunks;
    nstatus = (size_t)ntiles * CW;
  }
  size_t total() const { return 256 + Status<float>::bytes(nstatus); }
};

// float state (fp32, bf16, f16) with VB-byte channel vectors (else the plan falls back)
template <class T, int VB = 16>
bool pipe_legal(const ScanProblem& p) {
  return std::is_same<typename Elem<T>::S, float>::value && p.inner > 1 && (align_bits(p) & (VB - 1)) == 0 &&
         p.inner % VecB<T, VB>::N == 0;
}

// Whether the current device lets one block of `kernel` have `dynamic` bytes of shared memory
// on top of the kernel's static shared memory (asked once per device and cache; the H100 / H200
// allow 227 KB, an A100 163 KB). The static part is asked of the compiled kernel: row_pipe's
// fp32 ring and staging region leave 2 KB, so no fixed margin can stand in for it (a 4 KB one
// once sent it to its fallback on the H200: docs/PERFORMANCE_CUDA.md 12.2).
template <class K>
cudaError_t smem_fits_device(K kernel, size_t dynamic, std::atomic<int> (&cache)[64], bool& fits) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int v = cache[dev & 63].load(std::memory_order_relaxed);  // 0: not asked, 1: fits, 2: not
  if (v == 0) {
    int optin = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (err != cudaSuccess) return err;
    cudaFuncAttributes fa{};
    err = cudaFuncGetAttributes(&fa, kernel);
    if (err != cudaSuccess) return err;
    v = (size_t)optin >= dynamic + fa.sharedSizeBytes ? 1 : 2;
    cache[dev & 63].store(v, std::memory_order_relaxed);
  }
  fits = v == 1;
  return cudaSuccess;
}

template <class T, int SPW, int NSLOT, int UF = SPW, int UW = SPW, int VB = 16>
cudaError_t pipe_fits_device(bool& fits) {
  if constexpr (!std::is_same<typename Elem<T>::S, float>::value) {
    fits = false;  // make_plan never asks for it
    return cudaSuccess;
  } else {
    static std::atomic<int> cache[64];
    return smem_fits_device(strided_pipe_kernel<T, SPW, NSLOT, UF, UW, VB>, PipeCfg<T, SPW, NSLOT, VB>::smem(), cache,
                            fits);
  }
}

template <class T, int SPW, int NSLOT, int UF = SPW, int UW = SPW, int VB = 16>
cudaError_t pipe_launch(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  if constexpr (!std::is_same<typename Elem<T>::S, float>::value) {
    return cudaErrorInvalidValue;  // make_plan never asks for it
  } else {
    using C = PipeCfg<T, SPW, NSLOT, VB>;
    const PipeGeom<T, SPW, VB> g(p);
    if (g.ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
    auto kernel = strided_pipe_kernel<T, SPW, NSLOT, UF, UW, VB>;
    static std::atomic<int> resident[64];
    int res = 0;
    cudaError_t err = resident_blocks(kernel, C::THREADS, C::smem(), resident, res);
    if (err != cudaSuccess) return err;
    Dev d = dev_params(p);
    d.nchains = g.nchains;
    d.nchunks = g.nchunks;
    d.nct = g.nct;
    d.vec = true;
    char* base = static_cast<char*>(scratch);
    d.counter = reinterpret_cast<unsigned*>(base);
    d.status = base + 256;
    d.nstatus = g.nstatus;
    err = cudaMemsetAsync(base, 0, 256 + Status<float>::reset_bytes(g.nstatus), stream);
    if (err != cudaSuccess) return err;
    const int64_t grid = g.ntiles < res ? g.ntiles : res;
    kernel<<<(unsigned)grid, C::THREADS, C::smem(), stream>>>(d);
    return cudaGetLastError();
  }
}

}  // namespace jss
