// linear_scan's device building blocks: the affine pair and its combine (explicit rounding,
// so that every call site gives the same bits), warp shuffles of pairs, the element types
// (storage T, state S) and their 16-byte vectors, the kernels' parameters, and cp.async.
// The algorithm and its invariants: scan_kernels.cuh.
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

// A vector of B bytes (16, or 8 / 4 for strided_pipe's narrow tiles) of T, and the word it is
// loaded and stored as.
template <class T, int B>
struct alignas(B) VecB {
  static_assert(B == 16 || B == 8 || B == 4, "16-, 8- or 4-byte vectors");
  static constexpr int N = B / sizeof(T);
  T v[N];
};
template <class T>
using Vec16 = VecB<T, 16>;
template <int B>
using VecWord = typename std::conditional<B == 16, uint4, typename std::conditional<B == 8, uint2, uint32_t>::type>::type;
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
  int64_t rows_per_warp = 1;  // row_walk: consecutive rows one warp walks
  void* status;              // look-back status words
  size_t nstatus;            // number of status records
  unsigned* counter;         // dynamic tile-id counter
  void* carry;               // three-pass: aggregates, then exclusive prefixes
  bool reverse;
  bool vec;                  // 16-byte loads/stores are legal
};

enum Carry { CARRY_LB_SERIAL = 0, CARRY_LB_WARP = 1, CARRY_ARRAY = 2, CARRY_REDUCE = 3 };


// ---------------------------------------------------------------------------------
// Asynchronous copies global -> shared (the walk and staged kernels).
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

}  // namespace jss
