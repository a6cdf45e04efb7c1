// The register-tile kernels: tile_scan_kernel (contiguous rows; lookback_serial,
// lookback_warp, lookback_regs, and the tile passes of three_pass) and strided_kernel (the
// strided layout's look-back tile).
#pragma once

#include "scan_block.cuh"

namespace jss {

// Tile option (OPT bit): TILE_STRIPED, the striped register layout (scan_block.cuh).
enum : int { TILE_STRIPED = 1 };

template <class T, int THREADS, int ITEMS, int CARRY, int MINB = 1, int OPT = 0>
__global__ void __launch_bounds__(THREADS, MINB) tile_scan_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NW = THREADS / 32;
  constexpr int TILE = THREADS * ITEMS;
  __shared__ P s_warp[NW];
  __shared__ P s_excl;
  __shared__ unsigned s_id;

  const unsigned id = tile_id<CARRY>(d, &s_id);
  const int64_t chain = id % d.nchains;  // the row
  const int64_t k = id / d.nchains;      // tile within the row
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row0 = chain * d.L;
  const T* a = static_cast<const T*>(d.a) + row0;
  const T* b = static_cast<const T*>(d.b) + row0;
  const int64_t base = k * TILE + (int64_t)tid * ITEMS;

  // Warp look-back: read the 32 nearest predecessors' status words now, together with the
  // tile's data, so that when an inclusive prefix is already there (the usual case when
  // many rows are in flight) the look-back costs no extra round trip.
  P pre_p = identity<S>();
  uint32_t pre_f = ST_INVALID;
  if (CARRY == CARRY_LB_WARP && warp == 0 && k > 0) {
    const int64_t c = k - 32 + lane;
    if (c >= 0) {
      Status<S> st(d.status, d.nstatus);
      pre_f = st.load((size_t)(c * d.nchains + chain), pre_p);
    } else {
      pre_f = ST_INC;
      pre_p = h0_pair<T>(d, chain);
    }
  }

  constexpr bool STRIPED = (OPT & TILE_STRIPED) != 0;
  constexpr int VEC = 16 / sizeof(T), NV = STRIPED ? ITEMS / VEC : 1;
  const int64_t wbase = k * TILE + (int64_t)warp * 32 * ITEMS;  // striped: the warp's first position
  P x[ITEMS];
  P ex, w;
  P spre[NV];  // striped: the prefix of each vector index within the warp
  if constexpr (STRIPED) {
    Raw<T, ITEMS> r;
    load_striped<T, ITEMS>(d, a, b, wbase, lane, r);
    unpack<T, ITEMS>(r, x);
    w = striped_warp_scan<S, ITEMS, VEC>(x, lane, spre);  // the warp total, in every lane
  } else {
    load_items<T, ITEMS>(d, a, b, base, x);
    // 1-2. serial inclusive scan in registers, then over the warp's thread aggregates
    w = thread_warp_scan<S, ITEMS>(x, lane, ex);
  }
  if (lane == 31) s_warp[warp] = w;
  __syncthreads();
  // 3. block: the warp's prefix is the fold of the earlier warps' totals
  const P wp = earlier_warps<S, NW>(s_warp, warp);

  // 4. tile carry
  if (CARRY == CARRY_REDUCE) {
    if (tid == 0) static_cast<P*>(d.carry)[id] = block_total<S, NW>(s_warp);
    return;
  }
  P excl;
  if (CARRY == CARRY_ARRAY) {
    excl = static_cast<const P*>(d.carry)[id];
  } else {
    excl = tile_lookback<T, CARRY>(d, id, chain, k, block_total<S, NW>(s_warp), pre_p, pre_f, s_excl);
  }

  // 5. apply the prefixes
  T* hrow = static_cast<T*>(d.h) + row0;
  T* aprow = d.aprod ? static_cast<T*>(d.aprod) + row0 : nullptr;
  if constexpr (STRIPED) {
    const P tw = combine(excl, wp);
#pragma unroll
    for (int m = 0; m < NV; ++m) {
      const P pm = combine(tw, spre[m]);
#pragma unroll
      for (int e = 0; e < ITEMS / NV; ++e) x[m * (ITEMS / NV) + e] = combine(pm, x[m * (ITEMS / NV) + e]);
    }
    store_striped<T, ITEMS>(d, hrow, aprow, wbase, lane, x);
  } else {
    const P pre = combine(combine(excl, wp), ex);
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) x[i] = combine(pre, x[i]);
    store_items<T, ITEMS>(d, hrow, aprow, base, x);
  }
}

// ---------------------------------------------------------------------------------
// Strided layout (inner > 1): a block owns CW = 32*VEC channels x LC = 8*TPT steps.
// Lane l holds channels [l*VEC, +VEC) of the tile (16-byte vectors along the channels),
// warp w holds steps [w*TPT, +TPT) of the chunk; a look-back per channel.
template <class T>
struct VecN {  // the strided layout's per-thread channel vector: 4 channels, 2 for 8-byte types
  static constexpr int N = sizeof(T) == 8 ? 2 : 4;
  T v[N];
};
template <class T>
__device__ __forceinline__ VecN<T> loadN(const T* p) {
  VecN<T> r;
  if constexpr (sizeof(VecN<T>) == 16) {
    *reinterpret_cast<uint4*>(&r) = __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    *reinterpret_cast<uint2*>(&r) = __ldg(reinterpret_cast<const uint2*>(p));
  }
  return r;
}
template <class T>
__device__ __forceinline__ void storeN(T* p, const VecN<T>& r) {
  if constexpr (sizeof(VecN<T>) == 16) {
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
  } else {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(&r);
  }
}

template <class T, int TPT, int CARRY, int MINB = 2>
__global__ void __launch_bounds__(256, MINB) strided_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int VEC = VecN<T>::N;
  constexpr int CW = 32 * VEC;
  constexpr int NW = 8;
  constexpr int LC = NW * TPT;
  __shared__ P s_agg[NW][CW];
  __shared__ P s_excl[CW];
  __shared__ unsigned s_id;

  const unsigned id = tile_id<CARRY>(d, &s_id);
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int64_t o = chain / d.nct, ct = chain % d.nct;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int64_t L = d.L, inner = d.inner;
  const int64_t c0 = ct * CW + lane * VEC;  // first channel of this thread
  const T* a = static_cast<const T*>(d.a);
  const T* b = static_cast<const T*>(d.b);

  P x[TPT][VEC];
#pragma unroll
  for (int i = 0; i < TPT; ++i) {
    const int64_t p = k * LC + w * TPT + i;
    const int64_t q = d.reverse ? L - 1 - p : p;
    const int64_t off = (o * L + q) * inner + c0;
    if (d.vec) {
      if (p < L && c0 < inner) {
        VecN<T> va = loadN(a + off), vb = loadN(b + off);
#pragma unroll
        for (int e = 0; e < VEC; ++e) x[i][e] = {E::up(va.v[e]), E::up(vb.v[e])};
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) x[i][e] = identity<S>();
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (p < L && c0 + e < inner)
          x[i][e] = {E::up(a[off + e]), E::up(b[off + e])};
        else
          x[i][e] = identity<S>();
      }
    }
  }
  // serial scan along the steps, per channel
#pragma unroll
  for (int i = 1; i < TPT; ++i)
#pragma unroll
    for (int e = 0; e < VEC; ++e) x[i][e] = combine(x[i - 1][e], x[i][e]);
#pragma unroll
  for (int e = 0; e < VEC; ++e) s_agg[w][lane * VEC + e] = x[TPT - 1][e];
  __syncthreads();

  // tile carry per channel (threads tid < CW own channel tid)
  if (tid < CW) {
    P t = s_agg[0][tid];
#pragma unroll
    for (int q = 1; q < NW; ++q) t = combine(t, s_agg[q][tid]);
    const size_t rec_id = (size_t)id * CW + tid;
    if (CARRY == CARRY_REDUCE) {
      static_cast<P*>(d.carry)[rec_id] = t;
    } else if (CARRY == CARRY_ARRAY) {
      s_excl[tid] = static_cast<const P*>(d.carry)[rec_id];
    } else {
      const int64_t c = ct * CW + tid;
      P h0p = identity<S>();
      if (c < inner) h0p = h0_pair<T>(d, o * inner + c);
      Status<S> st(d.status, d.nstatus);
      P e = h0p;
      if (k > 0) {
        st.publish(rec_id, ST_AGG, t);
        auto rec = [&](int64_t cc) { return (size_t)(cc * d.nchains + chain) * CW + tid; };
        e = lookback_serial<S>(st, k, rec, h0p);
      }
      st.publish(rec_id, ST_INC, combine(e, t));
      s_excl[tid] = e;
    }
  }
  if (CARRY == CARRY_REDUCE) return;
  __syncthreads();

  P pre[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int ch = lane * VEC + e;
    P wp = s_excl[ch];
#pragma unroll
    for (int q = 0; q < NW; ++q)
      if (q < w) wp = combine(wp, s_agg[q][ch]);
    pre[e] = wp;
  }
  T* h = static_cast<T*>(d.h);
  T* ap = static_cast<T*>(d.aprod);
#pragma unroll
  for (int i = 0; i < TPT; ++i) {
    const int64_t p = k * LC + w * TPT + i;
    if (p >= L) continue;
    const int64_t q = d.reverse ? L - 1 - p : p;
    const int64_t off = (o * L + q) * inner + c0;
    P y[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) y[e] = combine(pre[e], x[i][e]);
    if (d.vec) {
      if (c0 < inner) {
        VecN<T> vh, va;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          vh.v[e] = E::down(y[e].b);
          va.v[e] = E::down(y[e].a);
        }
        storeN(h + off, vh);
        if (ap) storeN(ap + off, va);
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (c0 + e < inner) {
          h[off + e] = E::down(y[e].b);
          if (ap) ap[off + e] = E::down(y[e].a);
        }
      }
    }
  }
}

}  // namespace jss
