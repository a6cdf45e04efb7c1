// A contiguous tile's block-level parts: its loads and stores (blocked and striped), the
// thread, warp and block scans over them, tile ids and the tile's look-back.
#pragma once

#include "scan_lookback.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// Contiguous layout: tile scan with ITEMS elements per thread in registers. Blocked (the
// default of tile_scan_kernel): thread j of a tile owns logical items [k*TILE + j*ITEMS,
// +ITEMS). Striped (TILE_STRIPED, what lookback_regs runs): see load_striped below. Logical
// index p maps to physical index p (forward) or L-1-p (reverse) inside the row.

// A thread's ITEMS in their storage type, in logical order.
template <class T, int ITEMS>
struct Raw {
  T a[ITEMS], b[ITEMS];
};

template <class T, int ITEMS>
__device__ __forceinline__ void load_raw(const Dev& d, const T* __restrict__ a, const T* __restrict__ b,
                                         int64_t base, Raw<T, ITEMS>& r) {
  using E = Elem<T>;
  using S = typename E::S;
  const T one = E::down(s_one<S>()), zero = E::down(s_zero<S>());  // the identity pair
  const int64_t L = d.L;
  constexpr int VEC = 16 / sizeof(T);
  if (ITEMS % VEC == 0 && d.vec) {
    constexpr int NV = ITEMS % VEC == 0 ? ITEMS / VEC : 1;
    if (!d.reverse) {
#pragma unroll
      for (int m = 0; m < NV; ++m) {
        const int64_t q = base + m * VEC;
        if (q < L) {
          Vec16<T> va = load16(a + q), vb = load16(b + q);
#pragma unroll
          for (int e = 0; e < VEC; ++e) r.a[m * VEC + e] = va.v[e], r.b[m * VEC + e] = vb.v[e];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) r.a[m * VEC + e] = one, r.b[m * VEC + e] = zero;
        }
      }
    } else {
      const int64_t q0 = L - base - ITEMS;  // physical start of this thread's items
#pragma unroll
      for (int m = 0; m < NV; ++m) {
        const int64_t q = q0 + m * VEC;
        const int i0 = ITEMS - 1 - m * VEC;
        if (q >= 0) {
          Vec16<T> va = load16(a + q), vb = load16(b + q);
#pragma unroll
          for (int e = 0; e < VEC; ++e) r.a[i0 - e] = va.v[e], r.b[i0 - e] = vb.v[e];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) r.a[i0 - e] = one, r.b[i0 - e] = zero;
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t p = base + i;
      if (p < L) {
        const int64_t q = d.reverse ? L - 1 - p : p;
        r.a[i] = a[q], r.b[i] = b[q];
      } else {
        r.a[i] = one, r.b[i] = zero;
      }
    }
  }
}

template <class T, int ITEMS>
__device__ __forceinline__ void unpack(const Raw<T, ITEMS>& r, Pair<typename Elem<T>::S> (&x)[ITEMS]) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) x[i] = {Elem<T>::up(r.a[i]), Elem<T>::up(r.b[i])};
}

template <class T, int ITEMS>
__device__ __forceinline__ void load_items(const Dev& d, const T* __restrict__ a, const T* __restrict__ b,
                                           int64_t base, Pair<typename Elem<T>::S> (&x)[ITEMS]) {
  Raw<T, ITEMS> r;
  load_raw<T, ITEMS>(d, a, b, base, r);
  unpack<T, ITEMS>(r, x);
}

template <class T, int ITEMS>
__device__ __forceinline__ void store_items(const Dev& d, T* __restrict__ h, T* __restrict__ ap, int64_t base,
                                            const Pair<typename Elem<T>::S> (&y)[ITEMS]) {
  using E = Elem<T>;
  const int64_t L = d.L;
  constexpr int VEC = 16 / sizeof(T);
  if (ITEMS % VEC == 0 && d.vec) {
    constexpr int NV = ITEMS % VEC == 0 ? ITEMS / VEC : 1;
    if (!d.reverse) {
#pragma unroll
      for (int m = 0; m < NV; ++m) {
        const int64_t q = base + m * VEC;
        if (q < L) {
          Vec16<T> vh, va;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            vh.v[e] = E::down(y[m * VEC + e].b);
            va.v[e] = E::down(y[m * VEC + e].a);
          }
          store16(h + q, vh);
          if (ap) store16(ap + q, va);
        }
      }
    } else {
      const int64_t q0 = L - base - ITEMS;
#pragma unroll
      for (int m = 0; m < NV; ++m) {
        const int64_t q = q0 + m * VEC;
        if (q >= 0) {
          Vec16<T> vh, va;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            vh.v[e] = E::down(y[ITEMS - 1 - (m * VEC + e)].b);
            va.v[e] = E::down(y[ITEMS - 1 - (m * VEC + e)].a);
          }
          store16(h + q, vh);
          if (ap) store16(ap + q, va);
        }
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int64_t p = base + i;
      if (p < L) {
        const int64_t q = d.reverse ? L - 1 - p : p;
        h[q] = E::down(y[i].b);
        if (ap) ap[q] = E::down(y[i].a);
      }
    }
  }
}

template <class T>
__device__ __forceinline__ Pair<typename Elem<T>::S> h0_pair(const Dev& d, int64_t idx) {
  using S = typename Elem<T>::S;
  return {s_one<S>(), Elem<T>::up(static_cast<const T*>(d.h0)[idx])};
}

// Striped register tile (tile option TILE_STRIPED): the ITEMS of thread (warp w, lane l)
// are NV = ITEMS / VEC vectors; vector m holds the tile positions
//     w * 32 * ITEMS + m * 32 * VEC + l * VEC + [0, VEC),
// so every warp load / store instruction moves 32 consecutive 16-byte vectors (512
// contiguous bytes) instead of 32 vectors 16 * NV bytes apart (the blocked layout, whose
// half-used sectors doubled the L2 requests per DRAM byte: docs/PERFORMANCE_CUDA.md 9.1).
// wbase: the tile position of the warp's first element; logical index p maps to physical p
// (forward) or L-1-p (reverse).
template <class T, int ITEMS>
__device__ __forceinline__ void load_striped(const Dev& d, const T* __restrict__ a, const T* __restrict__ b,
                                             int64_t wbase, int lane, Raw<T, ITEMS>& r) {
  using E = Elem<T>;
  using S = typename E::S;
  constexpr int VEC = 16 / sizeof(T), NV = ITEMS / VEC;
  static_assert(ITEMS % VEC == 0, "striped tiles hold whole vectors");
  const T one = E::down(s_one<S>()), zero = E::down(s_zero<S>());
  const int64_t L = d.L;
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    const int64_t p0 = wbase + m * 32 * VEC + lane * VEC;  // logical start of the vector
    if (d.vec) {  // L % VEC == 0: a vector is wholly inside or wholly past the row
      if (p0 < L) {
        const int64_t q = d.reverse ? L - p0 - VEC : p0;
        Vec16<T> va = load16(a + q), vb = load16(b + q);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int src = d.reverse ? VEC - 1 - e : e;
          r.a[m * VEC + e] = va.v[src], r.b[m * VEC + e] = vb.v[src];
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r.a[m * VEC + e] = one, r.b[m * VEC + e] = zero;
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t p = p0 + e;
        if (p < L) {
          const int64_t q = d.reverse ? L - 1 - p : p;
          r.a[m * VEC + e] = a[q], r.b[m * VEC + e] = b[q];
        } else {
          r.a[m * VEC + e] = one, r.b[m * VEC + e] = zero;
        }
      }
    }
  }
}

template <class T, int ITEMS>
__device__ __forceinline__ void store_striped(const Dev& d, T* __restrict__ h, T* __restrict__ ap, int64_t wbase,
                                              int lane, const Pair<typename Elem<T>::S> (&y)[ITEMS]) {
  using E = Elem<T>;
  constexpr int VEC = 16 / sizeof(T), NV = ITEMS / VEC;
  const int64_t L = d.L;
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    const int64_t p0 = wbase + m * 32 * VEC + lane * VEC;
    if (d.vec) {
      if (p0 < L) {
        const int64_t q = d.reverse ? L - p0 - VEC : p0;
        Vec16<T> vh, va;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int src = d.reverse ? VEC - 1 - e : e;
          vh.v[e] = E::down(y[m * VEC + src].b);
          va.v[e] = E::down(y[m * VEC + src].a);
        }
        store16(h + q, vh);
        if (ap) store16(ap + q, va);
      }
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t p = p0 + e;
        if (p < L) {
          const int64_t q = d.reverse ? L - 1 - p : p;
          h[q] = E::down(y[m * VEC + e].b);
          if (ap) ap[q] = E::down(y[m * VEC + e].a);
        }
      }
    }
  }
}

// The lane part of a striped warp scan: w[m] = this lane's total of its vector m on entry;
// a Kogge-Stone scan per vector index m over the lanes (NV independent scans, interleaved),
// then the vectors' warp totals folded in m order. pre[m] = (fold of segments 0..m-1) o
// (lane-exclusive value of segment m); returns the warp total (in every lane).
template <class S, int NV>
__device__ __forceinline__ Pair<S> striped_lane_scan(Pair<S> (&w)[NV], int lane, Pair<S> (&pre)[NV]) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
    for (int m = 0; m < NV; ++m) {
      const Pair<S> u = shfl_up(w[m], o);
      if (lane >= o) w[m] = combine(u, w[m]);
    }
  }
  Pair<S> run = identity<S>();
#pragma unroll
  for (int m = 0; m < NV; ++m) {
    Pair<S> ex = shfl_up(w[m], 1);
    if (lane == 0) ex = identity<S>();
    pre[m] = m == 0 ? ex : combine(run, ex);
    const Pair<S> tot = shfl_idx(w[m], 31);
    run = m == 0 ? tot : combine(run, tot);
  }
  return run;
}

// The scan of a striped warp tile: each vector serially in the thread, then the lane part.
template <class S, int ITEMS, int VEC>
__device__ __forceinline__ Pair<S> striped_warp_scan(Pair<S> (&x)[ITEMS], int lane, Pair<S> (&pre)[ITEMS / VEC]) {
  constexpr int NV = ITEMS / VEC;
  Pair<S> w[NV];
#pragma unroll
  for (int m = 0; m < NV; ++m) {
#pragma unroll
    for (int e = 1; e < VEC; ++e) x[m * VEC + e] = combine(x[m * VEC + e - 1], x[m * VEC + e]);
    w[m] = x[m * VEC + VEC - 1];
  }
  return striped_lane_scan<S, NV>(w, lane, pre);
}

// Serial inclusive scan of a thread's ITEMS, then a Kogge-Stone scan of the thread totals
// across the warp (lane >= o takes the lane o below as the EARLIER operand). Returns the
// lane's warp-inclusive total; ex = its warp-exclusive prefix (identity in lane 0).
template <class S, int ITEMS>
__device__ __forceinline__ Pair<S> thread_warp_scan(Pair<S> (&x)[ITEMS], int lane, Pair<S>& ex) {
#pragma unroll
  for (int i = 1; i < ITEMS; ++i) x[i] = combine(x[i - 1], x[i]);
  Pair<S> w = x[ITEMS - 1];
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    Pair<S> u = shfl_up(w, o);
    if (lane >= o) w = combine(u, w);
  }
  ex = shfl_up(w, 1);
  if (lane == 0) ex = identity<S>();
  return w;
}

// The fold of the totals of the warps before `warp`, in warp order (identity for warp 0).
template <class S, int NW>
__device__ __forceinline__ Pair<S> earlier_warps(const Pair<S> (&s_warp)[NW], int warp) {
  Pair<S> wp = identity<S>();
#pragma unroll
  for (int q = 0; q < NW; ++q)
    if (q < warp) wp = combine(wp, s_warp[q]);
  return wp;
}

// The tile id: dynamic (in the order blocks start, so that every predecessor of a tile
// has started and will finish: no deadlock) for the look-back, blockIdx.x otherwise.
template <int CARRY>
__device__ __forceinline__ unsigned tile_id(const Dev& d, unsigned* s_id) {
  if (CARRY == CARRY_LB_SERIAL || CARRY == CARRY_LB_WARP) {
    if (threadIdx.x == 0) *s_id = atomicAdd(d.counter, 1u);
    __syncthreads();
    return *s_id;
  }
  return blockIdx.x;
}

// The tile total: the fold of the warp totals in warp order.
template <class S, int NW>
__device__ __forceinline__ Pair<S> block_total(const Pair<S> (&s_warp)[NW]) {
  Pair<S> t = s_warp[0];
#pragma unroll
  for (int q = 1; q < NW; ++q) t = combine(t, s_warp[q]);
  return t;
}

// The exclusive prefix of tile `id` (chunk k of `chain`, total t) by look-back: warp 0
// publishes t as the tile's aggregate, looks back and publishes the inclusive prefix; every
// thread gets the prefix. pre_p / pre_f: warp 0's early read of the 32 nearest words
// (CARRY_LB_WARP).
template <class T, int CARRY>
__device__ Pair<typename Elem<T>::S> tile_lookback(const Dev& d, unsigned id, int64_t chain, int64_t k,
                                                   const Pair<typename Elem<T>::S>& t,
                                                   const Pair<typename Elem<T>::S>& pre_p, uint32_t pre_f,
                                                   Pair<typename Elem<T>::S>& s_excl) {
  using S = typename Elem<T>::S;
  using P = Pair<S>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp == 0) {
    Status<S> st(d.status, d.nstatus);
    const P h0p = h0_pair<T>(d, chain);
    P e = h0p;
    if (k > 0) {
      if (lane == 0) st.publish(id, ST_AGG, t);
      auto rec = [&](int64_t c) { return (size_t)(c * d.nchains + chain); };
      if (CARRY == CARRY_LB_WARP) {
        const unsigned inc = __ballot_sync(0xffffffffu, pre_f == ST_INC);
        const int s = inc ? 31 - __clz(inc) : 32;
        const bool usable = inc && !__any_sync(0xffffffffu, lane > s && pre_f == ST_INVALID);
        e = usable ? fold_window(pre_p, s) : lookback_warp<S>(st, k, rec, h0p);
      } else if (lane == 0) {
        e = lookback_serial<S>(st, k, rec, h0p);
      }
    }
    if (lane == 0) {
      st.publish(id, ST_INC, combine(e, t));
      s_excl = e;
    }
  }
  __syncthreads();
  return s_excl;
}

}  // namespace jss
