// The decoupled look-back's status words (the publish / read protocol and its fences) and
// the two predecessor walks: one thread (lookback_serial) and one warp (lookback_warp).
#pragma once

#include "scan_common.cuh"

namespace jss {

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

}  // namespace jss
