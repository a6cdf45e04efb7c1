// CUDA kernels of linear_scan:  h[t] = a[t] * h[t-1] + b[t],  h[-1] = h0.
//
// Everything is a scan of affine pairs p = (a, b) under the NON-commutative combine
//     combine(earlier=(a1, b1), later=(a2, b2)) = (a2 * a1, a2 * b1 + b2).
// h0 enters as a virtual tile before the first one with the pair (1, h0), so that
// h[t] = (prefix through t).b and a_prod[t] = (prefix through t).a.
//
// Layouts. The array is (outer, L, inner), row-major.
//  * contiguous (inner == 1): a "chain" is one row; a tile is THREADS*ITEMS consecutive
//    elements of one row; chain = tile_id % nchains, chunk = tile_id / nchains.
//  * strided (inner > 1): a chain is (o, channel tile of CW channels); a tile is CW
//    channels x LC steps of the scanned axis; every channel has its own carry.
//  Tile ids are chunk-major, so the predecessor of tile id is id - nchains.
//
// Determinism. Every carry is defined as the LEFT FOLD
//     inc[k] = combine(inc[k-1], agg[k]),  inc[-1] = (1, h0),
// and the look-back reproduces exactly that fold: it finds the nearest predecessor j
// whose inclusive prefix is published, then folds the aggregates j+1..k-1 one by one,
// in order (a published inclusive prefix met on the way is, bit for bit, the value the
// fold would produce, so it may replace the running value). The combine uses explicit
// round-to-nearest intrinsics (no contraction that could differ between call sites),
// so the result does not depend on the timing of other blocks.
//
// Status words (look-back). For float state the flag and the pair fit one aligned
// 16-byte word {flag, 0, a, b}: published with one st.relaxed.gpu.v4 and read with one
// ld.relaxed.gpu.v4, the same single-transaction assumption CUB makes for its 16-byte
// status+value words. For double and complex64 state the pair is 16 bytes alone, so the
// protocol is split (see Status<S, false> below): the pair is written to a slot that is
// never overwritten (aggregate and inclusive have separate slots), then the flag is
// published with st.release.gpu; the reader loads the flag with ld.acquire.gpu and only
// then reads the slot that flag names (ld.cg, L2), so it never sees a torn or stale pair.
//
// Indexing is 64-bit everywhere an element offset is formed; tile ids are 32-bit (the
// host refuses more than 2^31 tiles).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "linear_scan.h"

namespace jss {

struct c64 {
  float x, y;
};

// ---------------------------------------------------------------------------------
// State arithmetic with explicit rounding.
__device__ __forceinline__ float s_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float s_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double s_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double s_fma(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ c64 s_mul(c64 a, c64 b) {
  return {__fmaf_rn(a.x, b.x, -__fmul_rn(a.y, b.y)), __fmaf_rn(a.x, b.y, __fmul_rn(a.y, b.x))};
}
__device__ __forceinline__ c64 s_fma(c64 a, c64 b, c64 c) {
  c64 m = s_mul(a, b);
  return {__fadd_rn(m.x, c.x), __fadd_rn(m.y, c.y)};
}

template <class S> __device__ __forceinline__ S s_one();
template <class S> __device__ __forceinline__ S s_zero();
template <> __device__ __forceinline__ float s_one<float>() { return 1.f; }
template <> __device__ __forceinline__ float s_zero<float>() { return 0.f; }
template <> __device__ __forceinline__ double s_one<double>() { return 1.0; }
template <> __device__ __forceinline__ double s_zero<double>() { return 0.0; }
template <> __device__ __forceinline__ c64 s_one<c64>() { return {1.f, 0.f}; }
template <> __device__ __forceinline__ c64 s_zero<c64>() { return {0.f, 0.f}; }

template <class S>
struct Pair {
  S a, b;
};

template <class S>
__device__ __forceinline__ Pair<S> identity() {
  return {s_one<S>(), s_zero<S>()};
}

// earlier first, later second: (a2*a1, a2*b1 + b2).
template <class S>
__device__ __forceinline__ Pair<S> combine(const Pair<S>& e, const Pair<S>& l) {
  return {s_mul(l.a, e.a), s_fma(l.a, e.b, l.b)};
}

// Warp shuffles of states and pairs.
__device__ __forceinline__ float shfl_up(float v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
__device__ __forceinline__ double shfl_up(double v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
__device__ __forceinline__ c64 shfl_up(c64 v, int d) { return {shfl_up(v.x, d), shfl_up(v.y, d)}; }
__device__ __forceinline__ float shfl_idx(float v, int l) { return __shfl_sync(0xffffffffu, v, l); }
__device__ __forceinline__ double shfl_idx(double v, int l) { return __shfl_sync(0xffffffffu, v, l); }
__device__ __forceinline__ c64 shfl_idx(c64 v, int l) { return {shfl_idx(v.x, l), shfl_idx(v.y, l)}; }
template <class S>
__device__ __forceinline__ Pair<S> shfl_up(const Pair<S>& p, int d) {
  return {shfl_up(p.a, d), shfl_up(p.b, d)};
}
template <class S>
__device__ __forceinline__ Pair<S> shfl_idx(const Pair<S>& p, int l) {
  return {shfl_idx(p.a, l), shfl_idx(p.b, l)};
}

// ---------------------------------------------------------------------------------
// Element types: storage T, state S.
template <class T> struct Elem;
template <> struct Elem<float> {
  using S = float;
  static __device__ __forceinline__ S up(float v) { return v; }
  static __device__ __forceinline__ float down(S v) { return v; }
};
template <> struct Elem<double> {
  using S = double;
  static __device__ __forceinline__ S up(double v) { return v; }
  static __device__ __forceinline__ double down(S v) { return v; }
};
template <> struct Elem<__nv_bfloat16> {
  using S = float;
  static __device__ __forceinline__ S up(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 down(S v) { return __float2bfloat16_rn(v); }
};
template <> struct Elem<__half> {
  using S = float;
  static __device__ __forceinline__ S up(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half down(S v) { return __float2half_rn(v); }
};
template <> struct Elem<c64> {
  using S = c64;
  static __device__ __forceinline__ S up(c64 v) { return v; }
  static __device__ __forceinline__ c64 down(S v) { return v; }
};

// 16-byte vector of T.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};
template <class T>
__device__ __forceinline__ Vec16<T> load16(const T* p) {
  uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  Vec16<T> r;
  *reinterpret_cast<uint4*>(&r) = u;
  return r;
}
template <class T>
__device__ __forceinline__ void store16(T* p, const Vec16<T>& r) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&r);
}

// ---------------------------------------------------------------------------------
// Tile status for the look-back.
enum : uint32_t { ST_INVALID = 0, ST_AGG = 1, ST_INC = 2 };

__host__ __device__ inline size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

template <class S, bool Packed = std::is_same<S, float>::value>
struct Status;

// float state: one 16-byte word {flag, 0, a, b}, published and read in one access.
template <class S>
struct Status<S, true> {
  uint4* w;
  __host__ __device__ Status(void* base, size_t) : w(static_cast<uint4*>(base)) {}
  static size_t bytes(size_t n) { return round_up(n * 16, 256); }
  static size_t reset_bytes(size_t n) { return bytes(n); }
  __device__ __forceinline__ void publish(size_t i, uint32_t flag, const Pair<float>& p) const {
    asm volatile("st.relaxed.gpu.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(w + i), "r"(flag),
                 "r"(0u), "r"(__float_as_uint(p.a)), "r"(__float_as_uint(p.b))
                 : "memory");
  }
  __device__ __forceinline__ uint32_t load(size_t i, Pair<float>& p) const {
    uint32_t f, pad, x, y;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(f), "=r"(pad), "=r"(x), "=r"(y)
                 : "l"(w + i)
                 : "memory");
    p.a = __uint_as_float(x);
    p.b = __uint_as_float(y);
    return f;
  }
};

__device__ __forceinline__ void st_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ double ldcg(const double* p) { return __ldcg(p); }
__device__ __forceinline__ c64 ldcg(const c64* p) {
  float2 v = __ldcg(reinterpret_cast<const float2*>(p));
  return {v.x, v.y};
}
__device__ __forceinline__ void stcg(double* p, double v) { __stcg(p, v); }
__device__ __forceinline__ void stcg(c64* p, c64 v) { __stcg(reinterpret_cast<float2*>(p), make_float2(v.x, v.y)); }

// double / complex64 state: the pair does not fit one word with the flag.
// Fence protocol:
//   writer: store the pair into agg[i] (flag ST_AGG) or inc[i] (flag ST_INC) -- two
//           distinct slots, each written once per launch -- then st.release.gpu flag[i].
//   reader: f = ld.acquire.gpu flag[i]; if f != 0 read the slot f names with ld.cg.
// The release orders the pair store before the flag; the acquire orders the flag load
// before the pair load; the slot a flag names is never rewritten, so no tearing.
template <class S>
struct Status<S, false> {
  uint32_t* flags;
  Pair<S>* agg;
  Pair<S>* inc;
  __host__ __device__ static size_t flag_bytes(size_t n) { return round_up(n * 4, 256); }
  __host__ __device__ static size_t bytes(size_t n) { return flag_bytes(n) + 2 * round_up(n * sizeof(Pair<S>), 256); }
  static size_t reset_bytes(size_t n) { return flag_bytes(n); }
  __host__ __device__ Status(void* base, size_t n) {
    char* c = static_cast<char*>(base);
    flags = reinterpret_cast<uint32_t*>(c);
    agg = reinterpret_cast<Pair<S>*>(c + flag_bytes(n));
    inc = reinterpret_cast<Pair<S>*>(c + flag_bytes(n) + round_up(n * sizeof(Pair<S>), 256));
  }
  __device__ __forceinline__ void publish(size_t i, uint32_t flag, const Pair<S>& p) const {
    Pair<S>* slot = (flag == ST_INC ? inc : agg) + i;
    stcg(&slot->a, p.a);
    stcg(&slot->b, p.b);
    st_release(flags + i, flag);
  }
  __device__ __forceinline__ uint32_t load(size_t i, Pair<S>& p) const {
    uint32_t f = ld_acquire(flags + i);
    if (f != ST_INVALID) {
      const Pair<S>* slot = (f == ST_INC ? inc : agg) + i;
      p.a = ldcg(&slot->a);
      p.b = ldcg(&slot->b);
    }
    return f;
  }
};

// ---------------------------------------------------------------------------------
// Kernel parameters.
struct Dev {
  const void* a;
  const void* b;
  const void* h0;
  void* h;
  void* aprod;
  int64_t L, inner;
  int64_t nchains, nchunks;  // tiles = nchains * nchunks
  int64_t nct;               // strided: channel tiles per outer index
  void* status;              // look-back status words
  size_t nstatus;            // number of status records
  unsigned* counter;         // dynamic tile-id counter
  void* carry;               // three-pass: aggregates, then exclusive prefixes
  bool reverse;
  bool vec;                  // 16-byte loads/stores are legal
};

enum Carry { CARRY_LB_SERIAL = 0, CARRY_LB_WARP = 1, CARRY_ARRAY = 2, CARRY_REDUCE = 3 };

// ---------------------------------------------------------------------------------
// Look-back, one thread (lookback_serial, and per channel in the strided layout).
// `rec(c)` = status record index of chunk c of this chain. Returns inc[k-1].
template <class S, class St, class Rec>
__device__ Pair<S> lookback_serial(const St& st, int64_t k, const Rec& rec, const Pair<S>& h0p) {
  using P = Pair<S>;
  P p;
  int64_t c = k - 1;
  for (; c >= 0; --c) {  // backwards to the nearest published inclusive prefix
    uint32_t f;
    while ((f = st.load(rec(c), p)) == ST_INVALID) {
    }
    if (f == ST_INC) break;
  }
  P acc = (c < 0) ? h0p : p;
  for (int64_t m = c + 1; m <= k - 1; ++m) {  // then forwards, folding in order
    uint32_t f = st.load(rec(m), p);          // already seen valid: flags only grow
    acc = (f == ST_INC) ? p : combine(acc, p);
  }
  return acc;
}

// acc = p[s] o p[s+1] o ... o p[31] (lane l holds p[l]), strictly left to right. Fully
// unrolled with a predicate so that the 31 shuffles do not wait on the combine chain.
template <class S>
__device__ __forceinline__ Pair<S> fold_window(const Pair<S>& p, int s) {
  Pair<S> acc = shfl_idx(p, s);
#pragma unroll
  for (int l = 1; l < 32; ++l) {
    const Pair<S> q = shfl_idx(p, l);
    if (l > s) acc = combine(acc, q);
  }
  return acc;
}

// Look-back by a whole warp: 32 predecessors inspected at once. All 32 lanes call it and
// all get the result. Lane l of a window inspects chunk hi - 31 + l (lane 31 is nearest).
template <class S, class St, class Rec>
__device__ Pair<S> lookback_warp(const St& st, int64_t k, const Rec& rec, const Pair<S>& h0p) {
  using P = Pair<S>;
  const int lane = threadIdx.x & 31;
  P acc = h0p;
  int64_t hi = k - 1;
  while (true) {  // phase 1: backwards, window by window, to an inclusive prefix
    const int64_t c = hi - 31 + lane;
    P p = h0p;  // lanes before the chain's start hold the virtual tile (1, h0)
    uint32_t f = ST_INC;
    while (true) {  // spin, the whole warp together, until no lane sees an empty word
      if (c >= 0) f = st.load(rec(c), p);
      if (!__any_sync(0xffffffffu, f == ST_INVALID)) break;
    }
    unsigned mask = __ballot_sync(0xffffffffu, f == ST_INC);
    if (mask) {
      acc = fold_window(p, 31 - __clz(mask));
      break;
    }
    hi -= 32;
  }
  // phase 2: forwards through the windows skipped in phase 1, folding in order
  for (int64_t lo = hi + 1; lo <= k - 1; lo += 32) {
    const int64_t c = lo + lane;
    const bool valid = c <= k - 1;
    P p = identity<S>();
    uint32_t f = ST_AGG;
    if (valid) f = st.load(rec(c), p);
    unsigned mask = __ballot_sync(0xffffffffu, valid && f == ST_INC);
    int first = 0;
    if (mask) {
      const int s = 31 - __clz(mask);
      acc = shfl_idx(p, s);
      first = s + 1;
    }
    const int n = (int)((k - lo) < 32 ? (k - lo) : 32);
    for (int l = first; l < n; ++l) acc = combine(acc, shfl_idx(p, l));
  }
  return acc;
}

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

// Tile option (OPT bit): TILE_STRIPED, the striped register layout above.
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

// ---------------------------------------------------------------------------------
// Blelloch (work-efficient) tile scan: up-sweep and down-sweep in shared memory, two
// elements per thread, carries from the three-pass arrays.
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) blelloch_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int N = 2 * THREADS;
  __shared__ P s[N];
  const unsigned id = blockIdx.x;
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int tid = threadIdx.x;
  const int64_t row0 = chain * d.L, L = d.L;
  const T* a = static_cast<const T*>(d.a) + row0;
  const T* b = static_cast<const T*>(d.b) + row0;
  P x[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // coalesced: element tid and tid + THREADS of the tile
    const int64_t p = k * N + tid + r * THREADS;
    if (p < L) {
      const int64_t q = d.reverse ? L - 1 - p : p;
      x[r] = {E::up(a[q]), E::up(b[q])};
    } else {
      x[r] = identity<S>();
    }
    s[tid + r * THREADS] = x[r];
  }
  int off = 1;
#pragma unroll
  for (int n = N >> 1; n > 0; n >>= 1) {  // up-sweep: s[bi] = s[ai] (earlier) o s[bi]
    __syncthreads();
    if (tid < n) {
      const int ai = off * (2 * tid + 1) - 1, bi = off * (2 * tid + 2) - 1;
      s[bi] = combine(s[ai], s[bi]);
    }
    off <<= 1;
  }
  if (tid == 0) s[N - 1] = identity<S>();
#pragma unroll
  for (int n = 1; n < N; n <<= 1) {  // down-sweep: left gets the prefix, right prefix o left sum
    off >>= 1;
    __syncthreads();
    if (tid < n) {
      const int ai = off * (2 * tid + 1) - 1, bi = off * (2 * tid + 2) - 1;
      const P t = s[ai];
      s[ai] = s[bi];
      s[bi] = combine(s[bi], t);
    }
  }
  __syncthreads();
  const P excl = static_cast<const P*>(d.carry)[id];
  T* h = static_cast<T*>(d.h) + row0;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + row0 : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t p = k * N + tid + r * THREADS;
    if (p < L) {
      const int64_t q = d.reverse ? L - 1 - p : p;
      const P y = combine(excl, combine(s[tid + r * THREADS], x[r]));
      h[q] = E::down(y.b);
      if (ap) ap[q] = E::down(y.a);
    }
  }
}

// Hillis-Steele / Kogge-Stone tile scan held in registers: one element per thread,
// log2(32) shuffle steps in the warp, then log2(NW) steps over the warp totals (double-
// buffered in shared memory), carries from the three-pass arrays.
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) hillis_steele_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NW = THREADS / 32;
  __shared__ P s_tot[2][NW];
  const unsigned id = blockIdx.x;
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row0 = chain * d.L, L = d.L;
  const int64_t p = k * THREADS + tid;
  const int64_t q = d.reverse ? L - 1 - p : p;
  P x = identity<S>();
  if (p < L) x = {E::up(static_cast<const T*>(d.a)[row0 + q]), E::up(static_cast<const T*>(d.b)[row0 + q])};
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    P u = shfl_up(x, o);
    if (lane >= o) x = combine(u, x);
  }
  if (lane == 31) s_tot[0][warp] = x;
  __syncthreads();
  int cur = 0;
#pragma unroll
  for (int o = 1; o < NW; o <<= 1) {  // Kogge-Stone over the warp totals
    if (tid < NW) s_tot[cur ^ 1][tid] = tid >= o ? combine(s_tot[cur][tid - o], s_tot[cur][tid]) : s_tot[cur][tid];
    __syncthreads();
    cur ^= 1;
  }
  P y = x;
  if (warp > 0) y = combine(s_tot[cur][warp - 1], x);
  y = combine(static_cast<const P*>(d.carry)[id], y);
  if (p < L) {
    static_cast<T*>(d.h)[row0 + q] = E::down(y.b);
    if (d.aprod) static_cast<T*>(d.aprod)[row0 + q] = E::down(y.a);
  }
}

// ---------------------------------------------------------------------------------
// Three-pass middle pass: per sequence (a chain, or a channel of a chain), replace the
// tile aggregates agg[chunk] (at index (chunk * nchains) * cw + seq_in) by the exclusive
// prefixes inc[chunk-1], folding strictly left to right from (1, h0).
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) carry_scan_kernel(Dev d, int cw) {
  using S = typename Elem<T>::S;
  using P = Pair<S>;
  __shared__ P s_seg[THREADS];
  const int64_t seq = blockIdx.x;  // = chain * cw + ch
  const int64_t chain = seq / cw, ch = seq % cw;
  const int64_t o = chain / d.nct, ct = chain % d.nct;
  const int64_t c = ct * cw + ch;
  P h0p = identity<S>();
  if (c < d.inner) h0p = h0_pair<T>(d, o * d.inner + c);
  P* agg = static_cast<P*>(d.carry);
  const int64_t n = d.nchunks, stride = d.nchains * cw;
  const int64_t seg = (n + THREADS - 1) / THREADS;
  const int64_t lo = threadIdx.x * seg, hi = lo + seg < n ? lo + seg : n;
  P t = identity<S>();
  for (int64_t m = lo; m < hi; ++m) t = combine(t, agg[m * stride + seq]);
  s_seg[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    P acc = h0p;
    for (int i = 0; i < THREADS; ++i) {
      const P s = s_seg[i];
      s_seg[i] = acc;
      acc = combine(acc, s);
    }
  }
  __syncthreads();
  // Re-fold the segment from its carry-in: identical association to a serial left fold
  // only segment by segment, which is deterministic (fixed THREADS and n).
  P acc = s_seg[threadIdx.x];
  for (int64_t m = lo; m < hi; ++m) {
    const P g = agg[m * stride + seq];
    agg[m * stride + seq] = acc;
    acc = combine(acc, g);
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

// ---------------------------------------------------------------------------------
// Walk kernels (chosen by "auto" only): one warp owns a whole sequence and walks it from
// start to end with the carry in registers. No inter-block communication at all, so the
// result is trivially deterministic. Loads go through a per-warp ring of STAGES shared-
// memory stages filled with cp.async, so that STAGES-1 stages of loads are always in
// flight while the warp scans the oldest one. Each lane copies and later reads only its
// own 16/8/4-byte slots, so no barrier is needed: cp.async.wait_group makes a lane's own
// copies visible to that lane. One warp per block (dynamic shared memory), so that the
// warps spread evenly over the multiprocessors.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
template <int N>
__device__ __forceinline__ void cp_async(void* s, const void* g) {
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(s)), "l"(g) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_u32(s)), "l"(g), "n"(N) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

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

// One sub-chunk of a row: lane l holds logical items [l*VEC, +VEC) in x. Serial scan in
// the lane, Kogge-Stone over the lanes, then y = (carry o lane-exclusive) o x; the carry
// moves on by the sub-chunk total (lane 31's inclusive value).
template <class S, int VEC>
__device__ __forceinline__ void warp_sub_scan(Pair<S> (&x)[VEC], Pair<S>& carry, int lane) {
  using P = Pair<S>;
  P ex;
  const P w = thread_warp_scan<S, VEC>(x, lane, ex);
  const P pre = combine(carry, ex);
#pragma unroll
  for (int e = 0; e < VEC; ++e) x[e] = combine(pre, x[e]);
  carry = combine(carry, shfl_idx(w, 31));
}

// Contiguous layout, one warp per row. Sub-chunk j of a row covers logical items
// [j*SUB, (j+1)*SUB), SUB = 32*VEC; lane l holds [j*SUB + l*VEC, +VEC) (one 16-byte
// vector of a and one of b, physical start p (forward) or L-p-VEC (reverse, items in
// reversed order)). Stage j % STAGES of the warp's ring holds sub-chunk j.
template <class T, int STAGES>
__global__ void __launch_bounds__(32) row_walk_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int VEC = 16 / sizeof(T);
  constexpr int SUB = 32 * VEC;
  extern __shared__ uint4 s_ring[];  // [STAGES][2][32]
  const int lane = threadIdx.x;
  const int64_t r = blockIdx.x;
  const int64_t L = d.L;
  const T* a = static_cast<const T*>(d.a) + r * L;
  const T* b = static_cast<const T*>(d.b) + r * L;
  T* h = static_cast<T*>(d.h) + r * L;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + r * L : nullptr;
  P carry = h0_pair<T>(d, r);
  const int64_t nsub = (L + SUB - 1) / SUB;
  if (d.vec) {
    auto issue = [&](int64_t j) {
      const int64_t p = j * SUB + (int64_t)lane * VEC;
      if (j < nsub && p < L) {
        const int64_t q = d.reverse ? L - p - VEC : p;
        uint4* st = s_ring + (j % STAGES) * 64;
        cp_async<16>(st + lane, a + q);
        cp_async<16>(st + 32 + lane, b + q);
      }
      cp_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int64_t j = 0; j < nsub; ++j) {
      cp_wait<STAGES - 2>();
      const uint4* st = s_ring + (j % STAGES) * 64;
      const int64_t p = j * SUB + (int64_t)lane * VEC;
      const bool valid = p < L;
      P x[VEC];
      Vec16<T> va, vb;
      if (valid) {
        *reinterpret_cast<uint4*>(&va) = st[lane];
        *reinterpret_cast<uint4*>(&vb) = st[32 + lane];
      }
      issue(j + STAGES - 1);  // into the stage read in the previous iteration
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int i = d.reverse ? VEC - 1 - e : e;
        x[i] = valid ? P{E::up(va.v[e]), E::up(vb.v[e])} : identity<S>();
      }
      warp_sub_scan<S, VEC>(x, carry, lane);
      if (valid) {
        const int64_t q = d.reverse ? L - p - VEC : p;
        Vec16<T> vh, vp;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int i = d.reverse ? VEC - 1 - e : e;
          vh.v[e] = E::down(x[i].b);
          vp.v[e] = E::down(x[i].a);
        }
        store16(h + q, vh);
        if (ap) store16(ap + q, vp);
      }
    }
    cp_wait<0>();
  } else {  // unaligned or L not a multiple of VEC: scalar loads, same item mapping
    for (int64_t j = 0; j < nsub; ++j) {
      const int64_t p = j * SUB + (int64_t)lane * VEC;
      P x[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t pe = p + e;
        const int64_t q = d.reverse ? L - 1 - pe : pe;
        x[e] = pe < L ? P{E::up(a[q]), E::up(b[q])} : identity<S>();
      }
      warp_sub_scan<S, VEC>(x, carry, lane);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t pe = p + e;
        if (pe < L) {
          const int64_t q = d.reverse ? L - 1 - pe : pe;
          h[q] = E::down(x[e].b);
          if (ap) ap[q] = E::down(x[e].a);
        }
      }
    }
  }
}

// Strided layout, one warp per group of CWW = 32*NCH consecutive channels (NCH = 2 for
// 16-bit types, else 1: 4 or 8 bytes per lane, 128 or 256 bytes per warp and step),
// walking the whole scanned axis. Warp g: o = g / nct, channel group cg = g % nct; lane l
// owns channels c0 = cg*CWW + l*NCH .. +NCH. Ring stage s holds K consecutive steps.
template <class T>
struct WalkCfg {
  static constexpr int NCH = sizeof(T) >= 4 ? 1 : 4 / sizeof(T);
  static constexpr int VB = NCH * sizeof(T);
  static constexpr int CWW = 32 * NCH;
};
template <class T, int STAGES, int K>
__global__ void __launch_bounds__(32) strided_walk_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NCH = WalkCfg<T>::NCH;
  constexpr int VB = WalkCfg<T>::VB;
  constexpr int CWW = WalkCfg<T>::CWW;
  struct alignas(VB) Raw {
    T v[NCH];
  };
  extern __shared__ uint4 s_ring_raw[];
  Raw* ring = reinterpret_cast<Raw*>(s_ring_raw);  // [STAGES][K][2][32]
  const int lane = threadIdx.x;
  const int64_t g = blockIdx.x;
  const int64_t o = g / d.nct, cg = g % d.nct;
  const int64_t L = d.L, inner = d.inner;
  const int64_t c0 = cg * CWW + (int64_t)lane * NCH;
  const T* a = static_cast<const T*>(d.a) + o * L * inner + c0;
  const T* b = static_cast<const T*>(d.b) + o * L * inner + c0;
  T* h = static_cast<T*>(d.h) + o * L * inner + c0;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + o * L * inner + c0 : nullptr;
  P carry[NCH];
#pragma unroll
  for (int e = 0; e < NCH; ++e)
    carry[e] = c0 + e < inner ? h0_pair<T>(d, o * inner + c0 + e) : identity<S>();
  if (d.vec) {  // inner % NCH == 0 and aligned: whole vectors
    const bool active = c0 < inner;
    const int64_t ngrp = (L + K - 1) / K;
    auto issue = [&](int64_t j) {
      if (active && j < ngrp) {
        Raw* st = ring + (j % STAGES) * (K * 64);
#pragma unroll
        for (int kk = 0; kk < K; ++kk) {
          const int64_t p = j * K + kk;
          if (p < L) {
            const int64_t q = d.reverse ? L - 1 - p : p;
            cp_async<VB>(st + kk * 64 + lane, a + q * inner);
            cp_async<VB>(st + kk * 64 + 32 + lane, b + q * inner);
          }
        }
      }
      cp_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int64_t j = 0; j < ngrp; ++j) {
      cp_wait<STAGES - 2>();
      const Raw* st = ring + (j % STAGES) * (K * 64);
      Raw ra[K], rb[K];
#pragma unroll
      for (int kk = 0; kk < K; ++kk) {
        ra[kk] = st[kk * 64 + lane];
        rb[kk] = st[kk * 64 + 32 + lane];
      }
      issue(j + STAGES - 1);
      if (active) {
#pragma unroll
        for (int kk = 0; kk < K; ++kk) {
          const int64_t p = j * K + kk;
          if (p < L) {
            const int64_t q = d.reverse ? L - 1 - p : p;
            Raw rh, rp;
#pragma unroll
            for (int e = 0; e < NCH; ++e) {
              carry[e] = combine(carry[e], P{E::up(ra[kk].v[e]), E::up(rb[kk].v[e])});
              rh.v[e] = E::down(carry[e].b);
              rp.v[e] = E::down(carry[e].a);
            }
            *reinterpret_cast<Raw*>(h + q * inner) = rh;
            if (ap) *reinterpret_cast<Raw*>(ap + q * inner) = rp;
          }
        }
      }
    }
    cp_wait<0>();
  } else {
    for (int64_t p = 0; p < L; ++p) {
      const int64_t q = d.reverse ? L - 1 - p : p;
#pragma unroll
      for (int e = 0; e < NCH; ++e) {
        if (c0 + e < inner) {
          const int64_t off = q * inner + e;
          carry[e] = combine(carry[e], P{E::up(a[off]), E::up(b[off])});
          h[off] = E::down(carry[e].b);
          if (ap) ap[off] = E::down(carry[e].a);
        }
      }
    }
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
// staged layout: per step, the 32 lanes' 16-byte vectors of a, then those of b (64 uint4); a
// lane reads only its own vectors. staged_fold: the fold of the first n <= SPW steps, per
// channel of the lane, into x (from the identity).
template <class T, int SPW, int UNR = SPW>
__device__ __forceinline__ void staged_fold(const uint4* st, int n, int lane,
                                            Pair<typename Elem<T>::S> (&x)[Vec16<T>::N]) {
  using E = Elem<T>;
  using S = typename E::S;
#pragma unroll
  for (int e = 0; e < Vec16<T>::N; ++e) x[e] = identity<S>();
#pragma unroll UNR
  for (int i = 0; i < SPW; ++i) {
    if (i < n) {
      Vec16<T> va, vb;
      *reinterpret_cast<uint4*>(&va) = st[i * 64 + lane];
      *reinterpret_cast<uint4*>(&vb) = st[i * 64 + 32 + lane];
#pragma unroll
      for (int e = 0; e < Vec16<T>::N; ++e) x[e] = combine(x[e], Pair<S>{E::up(va.v[e]), E::up(vb.v[e])});
    }
  }
}

// staged_walk: the same steps again from the prefix c (per channel), storing h at ph (and the
// running product at pp unless null), the pointers moving by `step` elements per step. In
// both, UNR is how many steps are unrolled at a time (by default all).
template <class T, int SPW, int UNR = SPW>
__device__ __forceinline__ void staged_walk(const uint4* st, int n, int lane, int64_t step,
                                            Pair<typename Elem<T>::S> (&c)[Vec16<T>::N], T* ph, T* pp) {
  using E = Elem<T>;
  constexpr int V = Vec16<T>::N;
  if (pp) {
#pragma unroll UNR
    for (int i = 0; i < SPW; ++i) {
      if (i < n) {
        Vec16<T> va, vb, vh, vp;
        *reinterpret_cast<uint4*>(&va) = st[i * 64 + lane];
        *reinterpret_cast<uint4*>(&vb) = st[i * 64 + 32 + lane];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          c[e] = combine(c[e], {E::up(va.v[e]), E::up(vb.v[e])});
          vh.v[e] = E::down(c[e].b);
          vp.v[e] = E::down(c[e].a);
        }
        store16(ph, vh);
        store16(pp, vp);
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
    Vec16<T> va[BJ], vb[BJ];
#pragma unroll
    for (int u = 0; u < BJ; ++u) {
      if (i0 + u < n) {
        *reinterpret_cast<uint4*>(&va[u]) = st[(i0 + u) * 64 + lane];
        *reinterpret_cast<uint4*>(&vb[u]) = st[(i0 + u) * 64 + 32 + lane];
      }
    }
#pragma unroll
    for (int u = 0; u < BJ; ++u) {
      if (i0 + u < n) {
        Vec16<T> vh;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          c[e].b = s_fma(E::up(va[u].v[e]), c[e].b, E::up(vb[u].v[e]));
          vh.v[e] = E::down(c[e].b);
        }
        store16(ph, vh);
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

// The problem's pointers, sizes and direction as kernel parameters (each launcher fills in
// its tiling, its scratch and the vector flag).
inline Dev dev_params(const ScanProblem& p) {
  Dev d{};
  d.a = p.a;
  d.b = p.b;
  d.h0 = p.h0;
  d.h = p.h;
  d.aprod = p.aprod;
  d.L = p.L;
  d.inner = p.inner;
  d.reverse = p.reverse;
  return d;
}

// The low address bits of the four arrays together (16-byte vectors need (bits & 15) == 0).
inline uintptr_t align_bits(const ScanProblem& p) {
  return reinterpret_cast<uintptr_t>(p.a) | reinterpret_cast<uintptr_t>(p.b) |
         reinterpret_cast<uintptr_t>(p.h) | reinterpret_cast<uintptr_t>(p.aprod);
}

// Blocks of `kernel` that fit on the current device at once (occupancy x SMs, at least 1),
// asked once per device and remembered in `cache` (one slot per device, 0: not asked yet).
template <class K>
cudaError_t resident_blocks(K kernel, int threads, size_t smem, std::atomic<int> (&cache)[64], int& out) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  out = cache[dev & 63].load(std::memory_order_relaxed);
  if (out > 0) return cudaSuccess;
  int per_sm = 0, sms = 0;
  // The opt-in is needed once static + dynamic shared memory pass the default 48 KB (the
  // static part counts: bf16 strided_stage at 8 warps x 4 steps has 32 KB dynamic + 18 KB
  // static and failed to launch, "invalid argument", when only the dynamic part was checked).
  cudaFuncAttributes fa{};
  err = cudaFuncGetAttributes(&fa, kernel);
  if (err == cudaSuccess && smem + fa.sharedSizeBytes > 48 * 1024)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  out = per_sm * sms > 0 ? per_sm * sms : 1;
  cache[dev & 63].store(out, std::memory_order_relaxed);
  return cudaSuccess;
}

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
#include "strided_pipe.cuh"
#include "row_pipe.cuh"
namespace jss {

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
};

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
  if (pl.algo == kStridedStage && !stage_legal<T>(p)) pl.algo = kLookbackRegs;
  if (pl.algo == kStridedPipe && !pipe_legal<T>(p)) pl.algo = stage_legal<T>(p) ? kStridedStage : kLookbackRegs;
  if (pl.algo == kStridedPipe) {
    const PipeGeom<T, PipeTune<T>::SPW> g(p);
    pl.nct = g.nct;
    pl.nchains = g.nchains;
    pl.nchunks = g.nchunks;
    pl.total_bytes = g.total();
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
cudaError_t device_algorithm(int planned, int& algo) {
  algo = planned;
  bool fits = true;
  cudaError_t err = cudaSuccess;
  if (planned == kStridedPipe) {
    using TU = PipeTune<T>;
    err = pipe_fits_device<T, TU::SPW, TU::NSLOT, TU::UF, TU::UW>(fits);
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
  return device_algorithm<T>(make_plan<T>(p).algo, algo);
}

template <class T>
cudaError_t launch_t(const ScanProblem& p, void* scratch, cudaStream_t stream) {
  using C = Config<T>;
  if (p.outer == 0 || p.L == 0 || p.inner == 0) return cudaSuccess;
  const Plan pl = make_plan<T>(p);
  const int64_t ntiles = pl.nchains * pl.nchunks;
  if (ntiles >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  if (pl.algo == kStridedStage) {
    using TU = StageTune<T>;
    return stage_launch<T, TU::NW, TU::SPW, TU::NBUF>(p, scratch, stream);
  }
  if (pl.algo == kStridedPipe || pl.algo == kRowPipe) {
    int algo = pl.algo;
    const cudaError_t err = device_algorithm<T>(pl.algo, algo);
    if (err != cudaSuccess) return err;
    if (algo == kStridedPipe) {
      using TU = PipeTune<T>;
      return pipe_launch<T, TU::SPW, TU::NSLOT, TU::UF, TU::UW>(p, scratch, stream);
    }
    if constexpr (std::is_same<T, float>::value || sizeof(T) == 2) {
      if (algo == kRowPipe) {
        using TU = RowPipeTune<T>;
        return row_pipe_launch<T, TU::NV, TU::NSLOT, TU::NA, TU::BULK>(p, scratch, stream);
      }
      static_assert(RowStageTune<T>::TILE == RowPipeTune<T>::TILE, "the fallback uses row_pipe's status words");
    }
    // A GPU with less shared memory per block than the ring needs (an A100 has 163 KB; not run
    // on such a GPU here). strided_pipe -> lookback_regs: its status words fit the scratch
    // planned for the pipe (one 16-byte word per channel and 64-step chunk, over at most as
    // many channels: 128-channel tiles instead of 256 for 16-bit types), and the scratch XLA
    // gives is in any case the larger of the aligned plan and the unaligned one, which is
    // lookback_regs' (ffi_module.cc). row_pipe (192 KB; fp32 224 KB with the staging region of
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
      row_walk_kernel<T, C::ROW_STAGES><<<(unsigned)pl.nchains, 32, C::row_smem(), stream>>>(d);
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
