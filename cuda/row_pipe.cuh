// row_pipe: few long contiguous rows as a persistent, warp-specialised pipeline (the roles,
// ring and mbarriers of strided_pipe.cuh, over contiguous tiles; docs/PERFORMANCE_CUDA.md
// sections 11, 12). Builds on strided_pipe.cuh, whose mbarrier primitives and role
// size it uses.
//
// Why: row_stage's block loads, scans, looks back and stores one after the other, so its
// loads are in flight only in the first phase. Here a producer warp keeps a ring of NSLOT
// tiles loading while other warps scan and finish earlier ones:
//   producer   (1 warp)  claims tile ids (one atomic counter: ids in start order, so every
//                        predecessor of a claimed tile is claimed by a running block) and
//                        lands each tile in a free slot with cp.async (`full` mbarrier);
//   aggregator (NA warps) as soon as the slot is full: each lane folds its run of NV vectors,
//                        the runs are scanned over the tile and the tile's total published (a
//                        row's first tile: its inclusive prefix); never waits for a look-back.
//                        fp32: the tile is then scanned in place (every element's (a, b)
//                        replaced by its tile-local inclusive prefix). 16-bit types: the slot
//                        stays as landed and each run's tile-local exclusive prefix goes to
//                        s_lex (float prefixes of a 16-bit tile would need twice the slot);
//   finisher   (4 warps) the tiles in claim order: a look-back window of 128 status words
//                        (one per thread), the left fold from the nearest inclusive word,
//                        the tile's inclusive prefix published; then fp32: h = carry o prefix
//                        for every element, written to a staging region and sent by one bulk
//                        copy (BULK; with a_prod stored directly); 16-bit: each thread re-walks
//                        whole runs from carry o s_lex (h = a h + b), writing h over the slot,
//                        then the tile stored in row order; frees the slot.
// The finisher, whose latency per tile sets the rate (section 11: the first version, with
// the scan in the finisher, ran slower than row_stage), does one FMA per element either way.
// No deadlock, as for strided_pipe: an aggregate never waits, and the lowest tile without an
// inclusive prefix has every predecessor inclusive.
//
// Tile: TILE = NA warps x 32 lanes x NV 16-byte vectors of one row. Aggregator lane l of warp w
// scans the run of vectors (w * 32 + l) * NV + [0, NV) (row order); the producer and the
// finishers' stores walk the tile in row order, 512 contiguous bytes per warp access; rp_swz
// places the vectors in the slot so that both orders are free of bank conflicts. Logical
// position p is physical p (forward) or L - 1 - p (reverse: each vector's elements read back to
// front, and written back in place in the same order).
//
// Status: one 16-byte word {flag, 0, a, b} per tile (Status<float>), read and written in one
// access. The fold from the nearest inclusive word through k-1 is the canonical left fold
// of scan_kernels.cuh's header (one thread, in order): the same bits whatever the timing.
//
// Synchronisation inside the block (arrive = release, wait = acquire, CTA scope):
//   full[s]    33 arrivals: the producer's lanes by cp.async.mbarrier.arrive.noinc + lane 0
//              after writing s_ids[s];
//   scanned[s] 1 arrival: aggregator thread 0, after the role's named barrier that follows
//              every aggregator's writes (slot or s_lex[s], and s_tot[s]); waited for by the
//              finishers and (before a refill) by the producer;
//   empty[s]   128 arrivals: every finisher thread after its last access to slot s.
// The u-th use of slot s waits for parity u & 1 of full / scanned, the refill for parity
// (u - 1) & 1 of empty. The finishers' exclusive prefix in shared memory is double buffered
// by tile parity (a thread reaches tile i+2 only after all have passed tile i+1's first
// barrier, so after they read tile i's); the window masks by round parity.
#pragma once

#include "strided_pipe.cuh"

namespace jss {

template <class T, int NV, int NSLOT, int NA = PIPE_GROUP>
struct RowPipeCfg {
  static constexpr int VEC = 16 / sizeof(T);
  static constexpr bool IN_PLACE = std::is_same<T, float>::value;  // else 16-bit, re-walked
  static constexpr int RUNS = NA * 32;                 // aggregator lanes: one run of NV vectors each
  static constexpr int TILE = RUNS * NV * VEC;         // elements of a row per tile
  static constexpr int NVT = TILE / VEC;               // 16-byte vectors of a (and of b)
  static constexpr int FIN = NA;                       // the finishers' first warp
  static constexpr int PRODUCER = NA + PIPE_GROUP;
  static constexpr int THREADS = (PRODUCER + 1) * 32;
  static constexpr int WIN = PIPE_GROUP * 32;  // look-back window: a word per finisher thread
  static constexpr int LEX = IN_PLACE ? 1 : NSLOT;     // slots of run prefixes (16-bit only)
  static constexpr size_t ring() { return size_t(NSLOT) * 2 * NVT * 16; }
  // the ring, and with BULK the staging region of one tile's h
  static constexpr size_t smem(bool bulk = false) { return ring() + (bulk ? size_t(NVT) * 16 : 0); }
  static_assert(NSLOT >= 2, "a slot must be loading while another is finished");
  static_assert(NV % 8 == 0, "the swizzle permutes aligned groups of 8 vectors inside a lane's run");
  static_assert(RUNS % WIN == 0, "every finisher thread re-walks the same number of runs");
};

// Where vector v of a tile (row order) lives in its slot. Aggregator lane l reads its NV
// vectors v = l * NV + j in step j; without the swizzle the 8 lanes of a 16-byte access phase
// would hit the same 16-byte bank group (8-way conflicts). XOR-ing the low 3 bits with
// (v / NV) & 7 spreads them, keeps each lane's run inside itself, and leaves 8 consecutive
// vectors (the producer's and the finishers' row-order accesses) a permutation of one group.
template <int NV>
__device__ __forceinline__ int rp_swz(int v) {
  return v ^ ((v / NV) & 7);
}

// Named barrier of n threads (ids 1: aggregators, 2: finishers; 0 is __syncthreads).
__device__ __forceinline__ void role_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}

// BULK (fp32): the tile's h leaves shared memory by one bulk copy (the TMA unit, sm_90) from
// a staging region of its own, so the stores drain while the finishers look back for the next
// tile and the slot is free as soon as it has been read. The threads write h in row order
// (physical order for the reverse direction), fence the generic-proxy writes for the async
// proxy, and one thread issues the copy; before the next tile's h is written it waits until
// the copy has read the region.
// The package also builds sm_80 code (an A100), where these instructions do not exist; there
// the ring does not fit a block, launch_t runs row_stage, and the traps are never reached.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define JSS_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define JSS_SM90_ASM(...) __trap()
#endif
__device__ __forceinline__ void fence_smem_to_async() { JSS_SM90_ASM("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void bulk_store(void* g, const void* s, unsigned bytes) {
  JSS_SM90_ASM("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(g), "r"(smem_u32(s)), "r"(bytes)
               : "memory");
  JSS_SM90_ASM("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() { JSS_SM90_ASM("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { JSS_SM90_ASM("cp.async.bulk.wait_group 0;" ::: "memory"); }
#undef JSS_SM90_ASM

// A slot's 16-byte vector as VEC state values, and back.
template <class T>
__device__ __forceinline__ void rp_unpack(const float4& raw, float (&x)[16 / sizeof(T)]) {
  const Vec16<T> v = *reinterpret_cast<const Vec16<T>*>(&raw);
#pragma unroll
  for (int e = 0; e < Vec16<T>::N; ++e) x[e] = Elem<T>::up(v.v[e]);
}
template <class T>
__device__ __forceinline__ float4 rp_pack(const float (&x)[16 / sizeof(T)]) {
  Vec16<T> v;
#pragma unroll
  for (int e = 0; e < Vec16<T>::N; ++e) v.v[e] = Elem<T>::down(x[e]);
  return *reinterpret_cast<const float4*>(&v);
}

// 16-bit finisher: thread ftid re-walks the runs ftid + m * WIN (interleaved, independent
// chains) from carry o (the run's tile-local exclusive prefix), writing h (and the a-product
// when WITH_A) back over the slot's a (b) vectors it read.
template <class C, class T, int NV, bool REV, bool WITH_A>
__device__ __forceinline__ void rp_rewalk(float4* sa, float4* sb, const Pair<float>* lex, const Pair<float>& ex,
                                          int ftid, int64_t tbase, int64_t L) {
  using P = Pair<float>;
  constexpr int VEC = C::VEC, RPT = C::RUNS / C::WIN;
  P run[RPT];
#pragma unroll
  for (int m = 0; m < RPT; ++m) run[m] = combine(ex, lex[ftid + m * C::WIN]);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
#pragma unroll
    for (int m = 0; m < RPT; ++m) {
      const int v = (ftid + m * C::WIN) * NV + j;
      if (tbase + (int64_t)v * VEC < L) {
        const int sv = rp_swz<NV>(v);
        float xa[VEC], xb[VEC];
        rp_unpack<T>(sa[sv], xa);
        rp_unpack<T>(sb[sv], xb);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int src = REV ? VEC - 1 - e : e;
          run[m] = combine(run[m], P{xa[src], xb[src]});
          xa[src] = run[m].b;  // h over a
          if (WITH_A) xb[src] = run[m].a;
        }
        sa[sv] = rp_pack<T>(xa);
        if (WITH_A) sb[sv] = rp_pack<T>(xb);
      }
    }
  }
}

// NA aggregator warps; the direction is a template parameter (REV) because the scans index
// each vector's elements by it: a run-time flag cost selects on every element.
// BULK (fp32 only): without a_prod, the finishers hand each tile's h to one bulk copy from a
// staging region (above) instead of storing it vector by vector.
template <class T, int NV, int NSLOT, int NA, bool REV, bool BULK>
__global__ void __launch_bounds__(RowPipeCfg<T, NV, NSLOT, NA>::THREADS, 1) row_pipe_kernel(Dev d) {
  using C = RowPipeCfg<T, NV, NSLOT, NA>;
  using P = Pair<float>;
  static_assert(C::IN_PLACE || sizeof(T) == 2, "float slots are scanned in place, 16-bit ones re-walked");
  static_assert(!BULK || C::IN_PLACE, "the bulk copy's staging region fits beside the ring for fp32 only");
  constexpr int VEC = C::VEC, NVT = C::NVT, GT = PIPE_GROUP * 32, WIN = C::WIN;
  extern __shared__ float4 smem_rp[];  // [NSLOT][a, b][NVT], then (BULK) [NVT] of staged h
  __shared__ P s_tot[NSLOT];          // tile totals (aggregators -> finishers)
  __shared__ P s_aw[NA];              // aggregator warp totals
  __shared__ P s_lex[C::LEX][C::IN_PLACE ? 1 : C::RUNS];  // 16-bit: the runs' tile-local prefixes
  __shared__ P s_excl[2];             // the finishers' exclusive prefix, by tile parity
  __shared__ P s_win[WIN];            // the look-back window's pairs
  __shared__ uint32_t s_msk[2][2][PIPE_GROUP];  // [round parity][inclusive, empty][warp]
  __shared__ uint64_t bars[3 * NSLOT];
  __shared__ unsigned s_ids[NSLOT];
  uint64_t* full = bars;
  uint64_t* scanned = bars + NSLOT;
  uint64_t* empty = bars + 2 * NSLOT;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t L = d.L, nchains = d.nchains;
  const unsigned ntiles = (unsigned)(d.nchains * d.nchunks);
  const Status<float> st(d.status, d.nstatus);  // word of tile id: id

  if (tid == 0) {
    for (int s = 0; s < NSLOT; ++s) {
      mbar_init(full + s, 33);
      mbar_init(scanned + s, 1);
      mbar_init(empty + s, GT);
    }
  }
  __syncthreads();
  auto slot_a = [&](int s) { return smem_rp + (size_t)s * 2 * NVT; };
  auto slot_b = [&](int s) { return smem_rp + (size_t)s * 2 * NVT + NVT; };

  if (warp == C::PRODUCER) {  // ---- producer
    const T* A = static_cast<const T*>(d.a);
    const T* B = static_cast<const T*>(d.b);
    for (int i = 0;; ++i) {
      const int s = i % NSLOT;
      JSS_PIPE_CLOCK(t0);
      if (i >= NSLOT) {
        mbar_wait(empty + s, ((i / NSLOT) - 1) & 1);
        mbar_wait(scanned + s, ((i / NSLOT) - 1) & 1);  // returns at once; for racecheck
      }
      if (lane == 0) JSS_PIPE_STAT(7, clock64() - t0);
      unsigned id = 0;
      if (lane == 0) id = atomicAdd(d.counter, 1u);
      id = __shfl_sync(0xffffffffu, id, 0);
      if (lane == 0) s_ids[s] = id;  // >= ntiles: the end marker
      if (id < ntiles) {
        const int64_t chain = id % nchains, k = id / nchains;
        const T* ra = A + chain * L;
        const T* rb = B + chain * L;
        float4* da = slot_a(s);
        float4* db = slot_b(s);
#pragma unroll 8
        for (int v = lane; v < NVT; v += 32) {
          const int64_t p0 = k * C::TILE + (int64_t)v * VEC;
          if (p0 < L) {
            const int64_t q = REV ? L - p0 - VEC : p0;
            cp_async<16>(da + rp_swz<NV>(v), ra + q);
            cp_async<16>(db + rp_swz<NV>(v), rb + q);
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

  if (warp < NA) {  // ---- aggregators
    const int w = warp;
    const int v0 = (w * 32 + lane) * NV;  // the lane's run of NV vectors (row order)
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
      const int64_t chain = cur % nchains, k = cur / nchains, tbase = k * C::TILE;
      float4* sa = slot_a(s);
      float4* sb = slot_b(s);
      // pass 1: the lane's fold of its run, in logical order (the identity past the row)
      P run = identity<float>();
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        if (tbase + (int64_t)(v0 + j) * VEC < L) {
          float xa[VEC], xb[VEC];
          rp_unpack<T>(sa[rp_swz<NV>(v0 + j)], xa);
          rp_unpack<T>(sb[rp_swz<NV>(v0 + j)], xb);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const int src = REV ? VEC - 1 - e : e;
            run = combine(run, P{xa[src], xb[src]});
          }
        }
      }
      // the lanes' totals scanned over the warp (Kogge-Stone: lane >= o takes lane - o's
      // value as the EARLIER operand), the warps' totals folded in warp order
      P incl = run;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const P u = shfl_up(incl, o);
        if (lane >= o) incl = combine(u, incl);
      }
      P ex = shfl_up(incl, 1);
      if (lane == 0) ex = identity<float>();
      if (lane == 31) s_aw[w] = incl;
      // the finishers' accesses to this slot's last use (and to s_tot[s], s_lex[s]) came
      // before the producer's refill, so this returns at once; it states the order for racecheck
      if (i >= NSLOT) mbar_wait(empty + s, ((i / NSLOT) - 1) & 1);
      role_sync(1, NA * 32);
      P pre = identity<float>();
#pragma unroll
      for (int q = 0; q < NA; ++q)
        if (q < w) pre = combine(pre, s_aw[q]);
      if (tid == 0) {
        P tot = s_aw[0];
#pragma unroll
        for (int q = 1; q < NA; ++q) tot = combine(tot, s_aw[q]);
        s_tot[s] = tot;
        if (k == 0) st.publish(cur, ST_INC, combine(h0_pair<T>(d, chain), tot));
        else st.publish(cur, ST_AGG, tot);
      }
      run = combine(pre, ex);  // the run's tile-local exclusive prefix
      if constexpr (!C::IN_PLACE) {
        s_lex[s][w * 32 + lane] = run;
      } else {
        // pass 2: the tile-local inclusive prefix of every element written over its (a, b)
#pragma unroll
        for (int j = 0; j < NV; ++j) {
          if (tbase + (int64_t)(v0 + j) * VEC < L) {
            const int sv = rp_swz<NV>(v0 + j);
            const float4 va = sa[sv], vb = sb[sv];
            float xa[4] = {va.x, va.y, va.z, va.w}, xb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              const int src = REV ? VEC - 1 - e : e;
              run = combine(run, P{xa[src], xb[src]});
              xa[src] = run.a;
              xb[src] = run.b;
            }
            sa[sv] = make_float4(xa[0], xa[1], xa[2], xa[3]);
            sb[sv] = make_float4(xb[0], xb[1], xb[2], xb[3]);
          }
        }
      }
      role_sync(1, NA * 32);  // s_aw read and the slot (or s_lex[s]) written by every aggregator
      if (tid == 0) mbar_arrive(scanned + s);
      if (tid == 0) JSS_PIPE_STAT(10, clock64() - t1);
    }
    return;
  }

  // ---- finishers: look back, publish, apply the carry to the slot, store
  const int ftid = tid - C::FIN * 32, fw = ftid >> 5;
  constexpr int bar = 2;  // the finishers' named barrier
  T* H = static_cast<T*>(d.h);
  T* AP = static_cast<T*>(d.aprod);
  for (int i = 0;; ++i) {
    const int s = i % NSLOT, par = i & 1;
    JSS_PIPE_CLOCK(t0);
    mbar_wait(scanned + s, (i / NSLOT) & 1);
    role_sync(bar, GT);  // not needed by the protocol; lets racecheck see the order (section 10.2)
    JSS_PIPE_CLOCK(t1);
    if (ftid == 0) JSS_PIPE_STAT(3, t1 - t0);
    const unsigned cur = s_ids[s];
    if (cur >= ntiles) {
      if (BULK && ftid == 0) bulk_wait_all();  // the last tile's copy done before the block ends
      break;
    }
    const int64_t chain = cur % nchains, k = cur / nchains;
    auto rec = [&](int64_t c) { return (size_t)(c * nchains + chain); };
    // 1. the window: thread ftid reads the word of chunk k - 1 - ftid (chunk -1 is the
    //    virtual inclusive prefix (1, h0); chunks before it are never the nearest)
    const int64_t c = k - 1 - ftid;
    P wv = identity<float>();
    uint32_t wf = ST_INC;
    if (k > 0) {
      if (c >= 0) wf = st.load(rec(c), wv);
      else if (c == -1) wv = h0_pair<T>(d, chain);
    }
    // 2. the exclusive prefix: the nearest inclusive word, with no empty word nearer
    if (k == 0) {
      if (ftid == 0) s_excl[par] = h0_pair<T>(d, chain);
    } else {
      int near = -1;
      bool far = false;  // all WIN words aggregates: past the window
      for (int r = 0;; r ^= 1) {
        const unsigned inc = __ballot_sync(0xffffffffu, wf == ST_INC);
        const unsigned emp = __ballot_sync(0xffffffffu, wf == ST_INVALID);
        if (lane == 0) {
          s_msk[r][0][fw] = inc;
          s_msk[r][1][fw] = emp;
        }
        s_win[ftid] = wv;
        role_sync(bar, GT);
        int ni = -1, ne = -1;
#pragma unroll
        for (int q = PIPE_GROUP - 1; q >= 0; --q) {  // nearest = lowest index
          const unsigned mi = s_msk[r][0][q], me = s_msk[r][1][q];
          if (mi) ni = q * 32 + __ffs(mi) - 1;
          if (me) ne = q * 32 + __ffs(me) - 1;
        }
        if (ni >= 0 && (ne < 0 || ne > ni)) {
          near = ni;
          break;
        }
        if (ne < 0) {  // no empty word and no inclusive one
          far = true;
          break;
        }
        // an empty word nearer than any inclusive one: read the window again
        if (ftid == 0) JSS_PIPE_STAT(12, 1);
        if (c >= 0) wf = st.load(rec(c), wv);
      }
      if (far) {
        if (fw == 0) {
          if (lane == 0) JSS_PIPE_STAT(2, 1);
          const P e = lookback_warp<float>(st, k, rec, h0_pair<T>(d, chain));
          if (lane == 0) {
            s_excl[par] = e;
            st.publish(cur, ST_INC, combine(e, s_tot[s]));
          }
        }
      } else if (ftid == 0) {
        // the left fold from the nearest inclusive word, eight loads ahead of the combines
        JSS_PIPE_STAT(13, near);  // the variant bench prints its mean as "past the first words"
        P acc = s_win[near];
        int u = near - 1;
        for (; u >= 7; u -= 8) {
          P t[8];
#pragma unroll
          for (int q = 0; q < 8; ++q) t[q] = s_win[u - q];
#pragma unroll
          for (int q = 0; q < 8; ++q) acc = combine(acc, t[q]);
        }
        for (; u >= 0; --u) acc = combine(acc, s_win[u]);
        s_excl[par] = acc;
        st.publish(cur, ST_INC, combine(acc, s_tot[s]));
      }
    }
    if (BULK && ftid == 0) bulk_wait_read();  // the previous tile's copy has read the staging
    role_sync(bar, GT);
    JSS_PIPE_CLOCK(t2);
    if (ftid == 0) JSS_PIPE_STAT(4, t2 - t1);
    const P ex = s_excl[par];
    const int64_t tbase = k * C::TILE, row0 = chain * L;
    float4* sa = slot_a(s);
    float4* sb = slot_b(s);
    if (BULK && AP == nullptr) {
      // 3. apply into the staging region in plain order (row order; reversed for REV), then
      //    one bulk copy of the tile's nval vectors, left to drain
      float4* stg = smem_rp + C::ring() / 16;
      const int nval = (int)(L - tbase < C::TILE ? (L - tbase) / VEC : NVT);
#pragma unroll 4
      for (int v = ftid; v < nval; v += GT) {
        const float4 la = sa[rp_swz<NV>(v)], lb = sb[rp_swz<NV>(v)];
        stg[REV ? nval - 1 - v : v] = make_float4(s_fma(la.x, ex.b, lb.x), s_fma(la.y, ex.b, lb.y),
                                                  s_fma(la.z, ex.b, lb.z), s_fma(la.w, ex.b, lb.w));  // combine(ex, .).b
      }
      fence_smem_to_async();
      role_sync(bar, GT);
      if (ftid == 0)
        bulk_store(H + row0 + (REV ? L - tbase - (int64_t)nval * VEC : tbase), stg, (unsigned)nval * 16u);
    } else if constexpr (C::IN_PLACE) {
      // 3. apply: h = combine(excl, tile-local prefix), the slot read in row order (each
      //    element already at its physical place in the vector), 512 contiguous bytes per warp
#pragma unroll 4
      for (int v = ftid; v < NVT; v += GT) {
        const int64_t p0 = tbase + (int64_t)v * VEC;
        if (p0 >= L) break;  // v grows: every later vector is past the row too
        const float4 la = sa[rp_swz<NV>(v)], lb = sb[rp_swz<NV>(v)];
        const P y0 = combine(ex, P{la.x, lb.x}), y1 = combine(ex, P{la.y, lb.y});
        const P y2 = combine(ex, P{la.z, lb.z}), y3 = combine(ex, P{la.w, lb.w});
        const int64_t q = row0 + (REV ? L - p0 - VEC : p0);
        *reinterpret_cast<float4*>(H + q) = make_float4(y0.b, y1.b, y2.b, y3.b);
        if (AP) *reinterpret_cast<float4*>(AP + q) = make_float4(y0.a, y1.a, y2.a, y3.a);
      }
    } else {
      // 3. re-walk the runs from their carries, h (a-product) over the slot's a (b); then the
      //    tile stored in row order, 512 contiguous bytes per warp
      const P* lex = s_lex[s];
      if (AP) rp_rewalk<C, T, NV, REV, true>(sa, sb, lex, ex, ftid, tbase, L);
      else rp_rewalk<C, T, NV, REV, false>(sa, sb, lex, ex, ftid, tbase, L);
      role_sync(bar, GT);
#pragma unroll 4
      for (int v = ftid; v < NVT; v += GT) {
        const int64_t p0 = tbase + (int64_t)v * VEC;
        if (p0 >= L) break;
        const int64_t q = row0 + (REV ? L - p0 - VEC : p0);
        *reinterpret_cast<float4*>(H + q) = sa[rp_swz<NV>(v)];
        if (AP) *reinterpret_cast<float4*>(AP + q) = sb[rp_swz<NV>(v)];
      }
    }
    mbar_arrive(empty + s);
    if (ftid == 0) {
      JSS_PIPE_STAT(6, clock64() - t2);
      JSS_PIPE_STAT(0, 1);
    }
  }
}

// Host side. Scratch: the tile counter, then one 16-byte status word per tile (reset before
// every launch). A persistent grid: the blocks that fit at once, never more than tiles.
template <int TILE>
struct RowPipeGeom {
  int64_t nchains, nchunks, ntiles;
  explicit RowPipeGeom(const ScanProblem& p) {
    nchains = p.outer;
    nchunks = (p.L + TILE - 1) / TILE;
    ntiles = nchains * nchunks;
  }
  size_t total() const { return 256 + Status<float>::bytes((size_t)ntiles); }
};

// Whether one block may have the ring (+ staging) besides the kernel's static shared memory
// (both directions' kernels declare the same shared variables).
template <class T, int NV, int NSLOT, int NA, bool BULK = false>
cudaError_t row_pipe_fits_device(bool& fits) {
  static std::atomic<int> cache[64];
  return smem_fits_device(row_pipe_kernel<T, NV, NSLOT, NA, false, BULK>, RowPipeCfg<T, NV, NSLOT, NA>::smem(BULK),
                          cache, fits);
}

template <class T, int NV, int NSLOT, int NA, bool BULK = false>
cudaError_t row_pipe_launch(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  if constexpr (!std::is_same<T, float>::value && sizeof(T) != 2) {
    return cudaErrorInvalidValue;  // make_plan never asks for it
  } else {
    using C = RowPipeCfg<T, NV, NSLOT, NA>;
    const RowPipeGeom<C::TILE> g(p);
    if (g.ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
    auto kernel = p.reverse ? row_pipe_kernel<T, NV, NSLOT, NA, true, BULK> : row_pipe_kernel<T, NV, NSLOT, NA, false, BULK>;
    static std::atomic<int> resident[2][64];  // per direction's kernel (the same resources)
    int res = 0;
    cudaError_t err = resident_blocks(kernel, C::THREADS, C::smem(BULK), resident[p.reverse ? 1 : 0], res);
    if (err != cudaSuccess) return err;
    Dev d = dev_params(p);
    d.nchains = g.nchains;
    d.nchunks = g.nchunks;
    d.nct = 1;
    d.vec = true;
    char* base = static_cast<char*>(scratch);
    d.counter = reinterpret_cast<unsigned*>(base);
    d.status = base + 256;
    d.nstatus = (size_t)g.ntiles;
    err = cudaMemsetAsync(base, 0, 256 + Status<float>::reset_bytes((size_t)g.ntiles), stream);
    if (err != cudaSuccess) return err;
    const int64_t grid = g.ntiles < res ? g.ntiles : res;
    kernel<<<(unsigned)grid, C::THREADS, C::smem(BULK), stream>>>(d);
    return cudaGetLastError();
  }
}

}  // namespace jss
