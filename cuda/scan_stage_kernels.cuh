// The staged kernels: tiles landed in shared memory by cp.async (row_stage for contiguous
// rows, strided_stage for the strided layout, whose staged fold and walk the pipes share), and
// strided_stage's launcher.
#pragma once

#include "scan_block.cuh"
#include "scan_launch.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// row_stage ("auto" for few long contiguous rows; docs/PERFORMANCE_CUDA.md 9.4-9.6): the
// striped look-back tile of lookback_regs with its data landed in shared memory by cp.async
// instead of held in registers, so that several times more bytes can be in flight per SM. A lane reads back only the vectors it copied (no barrier for the data). Pass 1 scans
// the vectors for the warp prefixes; pass 2, after the look-back, re-reads them, applies the
// prefixes and stores: the same operations in the same order as the register tile, so the
// same bits. Contiguous rows with 16-byte vectors (d.vec) only.
template <class T, int NW, int ITEMS, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) tile_stage_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int THREADS = NW * 32, TILE = THREADS * ITEMS, VEC = 16 / sizeof(T), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "whole vectors");
  extern __shared__ __align__(16) unsigned char s_raw[];
  T* sa = reinterpret_cast<T*>(s_raw);
  T* sb = sa + TILE;
  __shared__ P s_warp[NW];
  __shared__ P s_excl;
  __shared__ unsigned s_id;
  const unsigned id = tile_id<CARRY_LB_WARP>(d, &s_id);
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t L = d.L, row0 = chain * L;
  const T* a = static_cast<const T*>(d.a) + row0;
  const T* b = static_cast<const T*>(d.b) + row0;
  const int64_t wbase = k * TILE + (int64_t)warp * 32 * ITEMS;
  const int sw = warp * 32 * ITEMS + lane * VEC;  // the lane's vector 0 in shared memory

  P pre_p = identity<S>();  // warp 0's early read of the 32 nearest status words
  uint32_t pre_f = ST_INVALID;
  if (warp == 0 && k > 0) {
    const int64_t c = k - 32 + lane;
    if (c >= 0) {
      Status<S> st(d.status, d.nstatus);
      pre_f = st.load((size_t)(c * d.nchains + chain), pre_p);
    } else {
      pre_f = ST_INC;
      pre_p = h0_pair<T>(d, chain);
    }
  }
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    const int64_t p0 = wbase + m * 32 * VEC + lane * VEC;
    if (p0 < L) {
      const int64_t q = d.reverse ? L - p0 - VEC : p0;
      cp_async<16>(sa + sw + m * 32 * VEC, a + q);
      cp_async<16>(sb + sw + m * 32 * VEC, b + q);
    }
  }
  cp_commit();
  cp_wait<0>();
  // vector m of this lane, in logical order, scanned serially (identity past the row's end)
  auto scanned = [&](int m, P (&x)[VEC]) {
    if (wbase + m * 32 * VEC + lane * VEC < L) {
      const Vec16<T> va = *reinterpret_cast<const Vec16<T>*>(sa + sw + m * 32 * VEC);
      const Vec16<T> vb = *reinterpret_cast<const Vec16<T>*>(sb + sw + m * 32 * VEC);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int src = d.reverse ? VEC - 1 - e : e;
        x[e] = {E::up(va.v[src]), E::up(vb.v[src])};
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) x[e] = identity<S>();
    }
#pragma unroll
    for (int e = 1; e < VEC; ++e) x[e] = combine(x[e - 1], x[e]);
  };
  P w[NV], pre[NV];
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    P x[VEC];
    scanned(m, x);
    w[m] = x[VEC - 1];
  }
  const P wt = striped_lane_scan<S, NV>(w, lane, pre);
  if (lane == 31) s_warp[warp] = wt;
  __syncthreads();
  const P wp = earlier_warps<S, NW>(s_warp, warp);
  const P excl = tile_lookback<T, CARRY_LB_WARP>(d, id, chain, k, block_total<S, NW>(s_warp), pre_p, pre_f, s_excl);
  const P tw = combine(excl, wp);
  T* h = static_cast<T*>(d.h) + row0;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + row0 : nullptr;
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    const int64_t p0 = wbase + m * 32 * VEC + lane * VEC;
    if (p0 >= L) continue;
    P x[VEC];
    scanned(m, x);
    const P pm = combine(tw, pre[m]);
    Vec16<T> vh, va;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int src = d.reverse ? VEC - 1 - e : e;
      const P y = combine(pm, x[src]);
      vh.v[e] = E::down(y.b);
      va.v[e] = E::down(y.a);
    }
    const int64_t q = d.reverse ? L - p0 - VEC : p0;
    store16(h + q, vh);
    if (ap) store16(ap + q, va);
  }
}


// ---------------------------------------------------------------------------------
// Strided layout, staged tiles ("strided_stage", chosen by "auto" only). A tile is
// CW = 32*V channels (V = 16 / sizeof(T): one 16-byte vector per lane) x LC = NW*SPW steps
// of the scanned axis; warp w walks steps [w*SPW, +SPW) of the tile, lane l owns channels
// [l*V, +V). The tile is staged ONCE in shared memory with cp.async (DRAM is read once)
// and walked twice from there: first for the per-warp aggregates, then, once the tile's
// exclusive prefix is known, again to write h (and a_prod).
//
// Tiles are chunk-major (id = k * nchains + chain, chain = o * nct + ct), handed out by an
// atomic counter in the order blocks ask, so every predecessor of a tile was handed out
// earlier (no deadlock). NBUF = 2: a block keeps two tiles, the next one's loads issued
// before the current one's look-back (persistent grid of resident blocks; the current
// tile always has the smaller id, so the smallest unfinished tile can always finish).
//
// Carry across tiles, per channel, canonical: inc(k) = combine(inc(k-1), agg(k)),
// inc(-1) = (1, h0). Status: ONE flag per tile (the look-back polls 32 predecessors per
// load, one word each) and two value slots per tile and channel, each written once:
// agg (flag ST_AGG) and inc (flag ST_INC). Writer: every thread stores its channels'
// values (st.cg); a barrier; thread 0 stores the flag with st.release.gpu (a release is
// cumulative: it orders every write the barrier made visible to thread 0, the pattern of
// CUTLASS's inter-CTA barrier). Reader: warp 0 polls the window of flags with ld.acquire.gpu until no
// flag between its nearest inclusive one and the tile is empty; a barrier; the channel
// threads read inc(j) and fold agg(j+1) .. agg(k-1) strictly left to right (ld.cg).
// That is bit for bit the left fold, whatever the timing.
template <class T>
struct StageCfg {
  static constexpr int V = 16 / sizeof(T);  // channels per lane
  static constexpr int CW = 32 * V;         // channels per tile
};

__device__ __forceinline__ void stcg_pair(Pair<float>* p, const Pair<float>& v) {
  __stcg(reinterpret_cast<float2*>(p), make_float2(v.a, v.b));
}
__device__ __forceinline__ Pair<float> ldcg_pair(const Pair<float>* p) {
  const float2 v = __ldcg(reinterpret_cast<const float2*>(p));
  return {v.x, v.y};
}
template <class S>
__device__ __forceinline__ void stcg_pair(Pair<S>* p, const Pair<S>& v) {
  stcg(&p->a, v.a);
  stcg(&p->b, v.b);
}
template <class S>
__device__ __forceinline__ Pair<S> ldcg_pair(const Pair<S>* p) {
  return {ldcg(&p->a), ldcg(&p->b)};
}

// One warp's steps of a staged strided tile, shared by strided_stage and strided_pipe. The
// staged layout: per step, the 32 lanes' VB-byte vectors of a, then those of b (64 words of
// VB bytes; VB = 16, or 8 for strided_pipe's narrow tiles); a lane reads only its own vectors.
// staged_fold: the fold of the first n <= SPW steps, per channel of the lane, into x (from
// the identity).
template <class T, int SPW, int UNR = SPW, int VB = 16>
__device__ __forceinline__ void staged_fold(const VecWord<VB>* st, int n, int lane,
                                            Pair<typename Elem<T>::S> (&x)[VecB<T, VB>::N]) {
  using E = Elem<T>;
  using S = typename E::S;
  using U = VecWord<VB>;
#pragma unroll
  for (int e = 0; e < VecB<T, VB>::N; ++e) x[e] = identity<S>();
#pragma unroll UNR
  for (int i = 0; i < SPW; ++i) {
    if (i < n) {
      VecB<T, VB> va, vb;
      *reinterpret_cast<U*>(&va) = st[i * 64 + lane];
      *reinterpret_cast<U*>(&vb) = st[i * 64 + 32 + lane];
#pragma unroll
      for (int e = 0; e < VecB<T, VB>::N; ++e) x[e] = combine(x[e], Pair<S>{E::up(va.v[e]), E::up(vb.v[e])});
    }
  }
}

// staged_walk: the same steps again from the prefix c (per channel), storing h at ph (and the
// running product at pp unless null), the pointers moving by `step` elements per step. In
// both, UNR is how many steps are unrolled at a time (by default all).
template <class T, int SPW, int UNR = SPW, int VB = 16>
__device__ __forceinline__ void staged_walk(const VecWord<VB>* st, int n, int lane, int64_t step,
                                            Pair<typename Elem<T>::S> (&c)[VecB<T, VB>::N], T* ph, T* pp) {
  using E = Elem<T>;
  using U = VecWord<VB>;
  constexpr int V = VecB<T, VB>::N;
  if (pp) {
#pragma unroll UNR
    for (int i = 0; i < SPW; ++i) {
      if (i < n) {
        VecB<T, VB> va, vb, vh, vp;
        *reinterpret_cast<U*>(&va) = st[i * 64 + lane];
        *reinterpret_cast<U*>(&vb) = st[i * 64 + 32 + lane];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          c[e] = combine(c[e], {E::up(va.v[e]), E::up(vb.v[e])});
          vh.v[e] = E::down(c[e].b);
          vp.v[e] = E::down(c[e].a);
        }
        *reinterpret_cast<U*>(ph) = *reinterpret_cast<const U*>(&vh);
        *reinterpret_cast<U*>(pp) = *reinterpret_cast<const U*>(&vp);
      }
      ph += step;
      pp += step;
    }
    return;
  }
  // h only: the running product is not needed (the same b bits: fma(a, b1, b2)). The shared
  // loads go two steps ahead of their stores (one after the other, each step's loads would
  // wait behind the last step's store).
  constexpr int BJ = SPW % 2 == 0 ? 2 : 1;
  constexpr int UB = UNR / BJ > 0 ? UNR / BJ : 1;
#pragma unroll UB
  for (int i0 = 0; i0 < SPW; i0 += BJ) {
    VecB<T, VB> va[BJ], vb[BJ];
#pragma unroll
    for (int u = 0; u < BJ; ++u) {
      if (i0 + u < n) {
        *reinterpret_cast<U*>(&va[u]) = st[(i0 + u) * 64 + lane];
        *reinterpret_cast<U*>(&vb[u]) = st[(i0 + u) * 64 + 32 + lane];
      }
    }
#pragma unroll
    for (int u = 0; u < BJ; ++u) {
      if (i0 + u < n) {
        VecB<T, VB> vh;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          c[e].b = s_fma(E::up(va[u].v[e]), c[e].b, E::up(vb[u].v[e]));
          vh.v[e] = E::down(c[e].b);
        }
        *reinterpret_cast<U*>(ph) = *reinterpret_cast<const U*>(&vh);
      }
      ph += step;
    }
  }
}

template <class T, int NW, int SPW, int NBUF>
__global__ void __launch_bounds__(NW * 32) strided_stage_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int V = StageCfg<T>::V;
  constexpr int CW = StageCfg<T>::CW;
  constexpr int THREADS = NW * 32;
  constexpr int LC = NW * SPW;
  constexpr int PER = (CW + THREADS - 1) / THREADS;  // channels per thread in the carry phase
  extern __shared__ uint4 s_tile[];                  // [NBUF][NW][SPW][2][32] 16-byte slots
  __shared__ P s_agg[NW][CW];
  __shared__ P s_excl[CW];
  __shared__ unsigned s_id[2];
  __shared__ long long s_j;

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int64_t L = d.L, inner = d.inner, nchains = d.nchains;
  const unsigned ntiles = (unsigned)(d.nchains * d.nchunks);
  const int64_t step = d.reverse ? -inner : inner;
  uint32_t* flags = static_cast<uint32_t*>(d.status);
  P* agg_v = static_cast<P*>(d.carry);
  P* inc_v = agg_v + (size_t)ntiles * CW;
  const T* A = static_cast<const T*>(d.a);
  const T* B = static_cast<const T*>(d.b);
  T* H = static_cast<T*>(d.h);
  T* AP = static_cast<T*>(d.aprod);

  struct Where {
    int64_t off;  // element offset of this thread's first step (valid if n > 0)
    int n;        // steps of this thread's slice inside [0, L)
    bool active;  // the lane's channels exist
  };
  auto where = [&](unsigned id) {
    const int64_t chain = id % nchains, k = id / nchains;
    const int64_t o = chain / d.nct, ct = chain % d.nct;
    const int64_t c0 = ct * CW + (int64_t)lane * V;
    const int64_t p0 = k * LC + (int64_t)w * SPW;
    Where r;
    const int64_t rem = L - p0;
    r.n = rem <= 0 ? 0 : (rem < SPW ? (int)rem : SPW);
    r.active = c0 < inner;
    const int64_t q0 = d.reverse ? L - 1 - p0 : p0;
    r.off = r.n > 0 ? (o * L + q0) * inner + c0 : 0;
    return r;
  };
  auto issue = [&](unsigned id, int buf) {
    if (id < ntiles) {
      const Where r = where(id);
      if (r.active) {
        uint4* st = s_tile + (size_t)((buf * NW + w) * SPW) * 64;
        const T* pa = A + r.off;
        const T* pb = B + r.off;
#pragma unroll
        for (int i = 0; i < SPW; ++i) {
          if (i < r.n) {
            cp_async<16>(st + i * 64 + lane, pa);
            cp_async<16>(st + i * 64 + 32 + lane, pb);
          }
          pa += step;
          pb += step;
        }
      }
    }
    cp_commit();
  };

  if (tid == 0) s_id[0] = atomicAdd(d.counter, 1u);
  __syncthreads();
  unsigned cur = s_id[0];
  if (cur >= ntiles) return;
  issue(cur, 0);
  int buf = 0, par = 0;
  while (true) {
    unsigned nxt = ntiles;
    if (NBUF == 2) {  // hand out and start loading the next tile before this one's look-back
      if (tid == 0) s_id[par ^ 1] = atomicAdd(d.counter, 1u);
      __syncthreads();
      nxt = s_id[par ^ 1];
      issue(nxt, buf ^ 1);
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    const int64_t chain = cur % nchains, k = cur / nchains;
    const int64_t o = chain / d.nct, ct = chain % d.nct;
    const Where r = where(cur);
    const uint4* st = s_tile + (size_t)((buf * NW + w) * SPW) * 64;

    // 1. first walk: the warp's aggregate of its SPW steps, per channel
    P x[V];
    staged_fold<T, SPW>(st, r.active ? r.n : 0, lane, x);
#pragma unroll
    for (int e = 0; e < V; ++e) s_agg[w][lane * V + e] = x[e];
    __syncthreads();

    // 2. the tile's aggregate per channel (warps folded in order), publish, look back
    P t[PER], h0p[PER];
#pragma unroll
    for (int m = 0; m < PER; ++m) {
      const int ch = tid + m * THREADS;
      if (ch < CW) {
        P acc = s_agg[0][ch];
#pragma unroll
        for (int q = 1; q < NW; ++q) acc = combine(acc, s_agg[q][ch]);
        t[m] = acc;
        const int64_t c = ct * CW + ch;
        h0p[m] = c < inner ? h0_pair<T>(d, o * inner + c) : identity<S>();
        if (k > 0) stcg_pair(agg_v + (size_t)cur * CW + ch, acc);
      }
    }
    int64_t j = -1;
    if (k > 0) {
      __syncthreads();  // the agg values of every thread, then one release by lane 0 below
      if (w == 0) {
        if (lane == 0) st_release(flags + cur, ST_AGG);
        int64_t hi = k - 1;
        while (true) {
          const int64_t c = hi - 31 + lane;
          uint32_t f = ST_INC;  // chunks before the first: the virtual inclusive (1, h0)
          while (true) {
            if (c >= 0) f = ld_acquire(flags + c * nchains + chain);
            if (!__any_sync(0xffffffffu, f == ST_INVALID)) break;
          }
          const unsigned mask = __ballot_sync(0xffffffffu, f == ST_INC);
          if (mask) {
            j = hi - 31 + (31 - __clz(mask));
            break;
          }
          hi -= 32;
        }
        if (lane == 0) s_j = j;
      }
      __syncthreads();
      j = s_j;
    }
#pragma unroll
    for (int m = 0; m < PER; ++m) {
      const int ch = tid + m * THREADS;
      if (ch < CW) {
        P acc = j < 0 ? h0p[m] : ldcg_pair(inc_v + (size_t)(j * nchains + chain) * CW + ch);
        const P* g = agg_v + (size_t)chain * CW + ch;  // agg of chunk c at g[c * nchains * CW]
        const size_t gs = (size_t)nchains * CW;
        int64_t c = j + 1;
        for (; c + 4 <= k; c += 4) {  // four independent L2 loads, then the ordered fold
          const P g0 = ldcg_pair(g + c * gs), g1 = ldcg_pair(g + (c + 1) * gs);
          const P g2 = ldcg_pair(g + (c + 2) * gs), g3 = ldcg_pair(g + (c + 3) * gs);
          acc = combine(combine(combine(combine(acc, g0), g1), g2), g3);
        }
        for (; c < k; ++c) acc = combine(acc, ldcg_pair(g + c * gs));
        s_excl[ch] = acc;
        stcg_pair(inc_v + (size_t)cur * CW + ch, combine(acc, t[m]));
      }
    }
    __syncthreads();
    if (tid == 0) st_release(flags + cur, ST_INC);

    // 3. second walk from shared memory: prefix = excl o (earlier warps), then the steps
    if (r.active) {
      P c[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const int ch = lane * V + e;
        P acc = s_excl[ch];
#pragma unroll
        for (int q = 0; q < NW; ++q)
          if (q < w) acc = combine(acc, s_agg[q][ch]);
        c[e] = acc;
      }
      staged_walk<T, SPW>(st, r.n, lane, step, c, H + r.off, AP ? AP + r.off : nullptr);
    }
    if (NBUF == 1) {  // non-persistent grid: one tile per block
      return;
    }
    if (nxt >= ntiles) break;
    // the next iteration's first barrier orders this walk's reads of s_agg / s_excl before
    // they are overwritten, and this buffer's reads before the loads into it
    cur = nxt;
    buf ^= 1;
    par ^= 1;
  }
  cp_wait<0>();
}

// ---------------------------------------------------------------------------------
// strided_stage's host side.
// strided_stage host side, for any geometry (the variant bench launches several; the
// package uses StageTune<T>).
template <class T>
struct StageTune {  // docs/PERFORMANCE_CUDA.md section 5: 8 warps x 8 steps, one tile per
  // block (64 KB staged: 3 blocks/SM for 4-byte types, 2 for 16-bit types) measured best
  // or within 5% of the best at every large strided shape; the persistent two-tile
  // variants (NBUF = 2) measured slower everywhere
  static constexpr int NW = 8, SPW = 8, NBUF = 1;
};

template <class T, int NW, int SPW>
struct StageGeom {
  using S = typename Elem<T>::S;
  static constexpr int CW = StageCfg<T>::CW;
  static constexpr int LC = NW * SPW;
  int64_t nct, nchains, nchunks, ntiles;
  size_t flag_bytes, value_bytes;
  explicit StageGeom(const ScanProblem& p) {
    nct = (p.inner + CW - 1) / CW;
    nchains = p.outer * nct;
    nchunks = (p.L + LC - 1) / LC;
    ntiles = nchains * nchunks;
    flag_bytes = round_up((size_t)ntiles * 4, 256);
    value_bytes = round_up((size_t)ntiles * CW * sizeof(Pair<S>), 256);
  }
  size_t total() const { return 256 + flag_bytes + 2 * value_bytes; }
};

// 16-byte vectors along the channels are legal (else the plan falls back to lookback_regs)
template <class T>
bool stage_legal(const ScanProblem& p) {
  return p.inner > 1 && (align_bits(p) & 15) == 0 && p.inner % StageCfg<T>::V == 0;
}

template <class T, int NW, int SPW, int NBUF>
cudaError_t stage_launch(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  const StageGeom<T, NW, SPW> g(p);
  if (g.ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  auto kernel = strided_stage_kernel<T, NW, SPW, NBUF>;
  const size_t smem = size_t(NBUF) * NW * SPW * 1024;
  static std::atomic<int> resident[64];
  int per_sm = 0;  // resident blocks on the device (the persistent NBUF > 1 grid)
  cudaError_t err = resident_blocks(kernel, NW * 32, smem, resident, per_sm);
  if (err != cudaSuccess) return err;
  Dev d = dev_params(p);
  d.nchains = g.nchains;
  d.nchunks = g.nchunks;
  d.nct = g.nct;
  d.vec = true;
  char* base = static_cast<char*>(scratch);
  d.counter = reinterpret_cast<unsigned*>(base);
  d.status = base + 256;
  d.nstatus = (size_t)g.ntiles;
  d.carry = base + 256 + g.flag_bytes;
  err = cudaMemsetAsync(base, 0, 256 + g.flag_bytes, stream);
  if (err != cudaSuccess) return err;
  const int64_t grid = NBUF == 1 ? g.ntiles : (g.ntiles < per_sm ? g.ntiles : per_sm);
  kernel<<<(unsigned)grid, NW * 32, smem, stream>>>(d);
  return cudaGetLastError();
}

}  // namespace jss
