// A small SIMD layer of our own: just what the scan kernels need.
//
//   Vec<float>, Vec<double>      one register of float / double lanes
//   Vec<L>::kLanes                lane count, a constexpr
//   load / store / broadcast / add / mul / fma(a, b, c) = a*b + c
//   transpose(v)                  kLanes x kLanes block held in kLanes registers
//   row_sums(v)                   lane j = the sum of v[j]'s lanes (kLanes registers; pairwise
//                                 tree over adjacent lanes, the same bits on every backend)
//   dup_even / dup_odd / swap_pairs / neg_even   for interleaved complex numbers
//   load_bf16 / load_f16 / store_bf16 / store_f16  16-bit floats <-> Vec<float>
//                                 (stores round to nearest even, NaN stays NaN)
//   as_double / as_float          bit casts between the two vector types
//   kStreamLine / stream_line / stream_fence   a vector that is one 64-byte line stored
//                                 past the caches (AVX-512 only; elsewhere a plain store)
//
// The backend is chosen by the compiler flags of the translation unit that
// includes this header: AVX-512F, AVX2+FMA+F16C, NEON (aarch64), or a generic
// one on plain arrays (define JSS_SIMD_GENERIC to force it). The kernel source
// is compiled once per backend and picked at run time (dispatch.cc).
//
// Everything lives in an anonymous namespace: each of those translation units
// gets its own private copy, so the linker can never merge an AVX-512 copy of
// an inline function into code that runs on a CPU without AVX-512.
#pragma once

#include <cstdint>
#include <cstring>

#include "dtypes.h"

#if defined(JSS_SIMD_GENERIC)
#define JSS_SIMD_BACKEND_GENERIC 1
#elif defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define JSS_SIMD_BACKEND_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define JSS_SIMD_BACKEND_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define JSS_SIMD_BACKEND_NEON 1
#include <arm_neon.h>
#else
#define JSS_SIMD_BACKEND_GENERIC 1
#endif

// Fixed-trip-count loops over registers must be unrolled, or the compiler
// keeps the "registers" in a stack array and every dependency chain goes
// through store-to-load forwarding.
#if defined(__clang__)
#define JSS_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define JSS_UNROLL _Pragma("GCC unroll 32")
#else
#define JSS_UNROLL
#endif
#if defined(__GNUC__) || defined(__clang__)
#define JSS_INLINE inline __attribute__((always_inline))
#else
#define JSS_INLINE inline
#endif

namespace jax_selscan {
namespace {
namespace simd {

template <class L>
struct Vec;

// ======================================================================= AVX-512
#if defined(JSS_SIMD_BACKEND_AVX512)
constexpr const char* kBackend = "avx512";

template <> struct Vec<float> { static constexpr int kLanes = 16; __m512 v; };
template <> struct Vec<double> { static constexpr int kLanes = 8; __m512d v; };
using VF = Vec<float>;
using VD = Vec<double>;

inline VF load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline VD load(const double* p) { return {_mm512_loadu_pd(p)}; }
inline void store(float* p, VF x) { _mm512_storeu_ps(p, x.v); }
inline void store(double* p, VD x) { _mm512_storeu_pd(p, x.v); }
// One whole 64-byte line written past the caches (p 64-byte aligned): no read for ownership.
#define JSS_HAVE_STREAM_LINE
constexpr bool kStreamLine = true;
inline void stream_line(float* p, VF x) { _mm512_stream_ps(p, x.v); }
inline void stream_fence() { _mm_sfence(); }
inline VF broadcast(float x) { return {_mm512_set1_ps(x)}; }
inline VD broadcast(double x) { return {_mm512_set1_pd(x)}; }
inline VF add(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VD add(VD a, VD b) { return {_mm512_add_pd(a.v, b.v)}; }
inline VF mul(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VD mul(VD a, VD b) { return {_mm512_mul_pd(a.v, b.v)}; }
inline VF fma(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VD fma(VD a, VD b, VD c) { return {_mm512_fmadd_pd(a.v, b.v, c.v)}; }
inline VD as_double(VF x) { return {_mm512_castps_pd(x.v)}; }
inline VF as_float(VD x) { return {_mm512_castpd_ps(x.v)}; }

inline VF dup_even(VF x) { return {_mm512_moveldup_ps(x.v)}; }
inline VF dup_odd(VF x) { return {_mm512_movehdup_ps(x.v)}; }
inline VF swap_pairs(VF x) { return {_mm512_permute_ps(x.v, 0xB1)}; }
inline VF neg_even(VF x) {
  const __m512i m = _mm512_set1_epi64(0x80000000LL);  // sign bit of each even lane
  return {_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x.v), m))};
}

inline VF load_bf16(const uint16_t* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}
inline void store_bf16(uint16_t* p, VF x) {
  __m512i u = _mm512_castps_si512(x.v);
  __m512i hi = _mm512_srli_epi32(u, 16);
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                           _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
  __mmask16 nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline VF load_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline void store_f16(uint16_t* p, VF x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// 16x16: unpack pairs of rows, then 4-row groups inside 128-bit lanes, then
// gather the 128-bit lanes of four groups.
JSS_INLINE void transpose(VF* r) {
  __m512 t[16], u[16];
  JSS_UNROLL
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  JSS_UNROLL
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  JSS_UNROLL
  for (int k = 0; k < 4; ++k) {
    __m512 v0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0x88);
    __m512 w0 = _mm512_shuffle_f32x4(u[k], u[4 + k], 0xDD);
    __m512 v1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0x88);
    __m512 w1 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], 0xDD);
    r[k].v = _mm512_shuffle_f32x4(v0, v1, 0x88);
    r[8 + k].v = _mm512_shuffle_f32x4(v0, v1, 0xDD);
    r[4 + k].v = _mm512_shuffle_f32x4(w0, w1, 0x88);
    r[12 + k].v = _mm512_shuffle_f32x4(w0, w1, 0xDD);
  }
}

// Four halving rounds, each summing adjacent lanes of two registers into one (two two-source
// permutes and an add per pair): 30 permutes against the transpose's 64 shuffles, all on the
// one shuffle port that 512-bit FMAs share. The same pairwise tree as transpose + adds.
#define JSS_HAVE_ROW_SUMS 1
JSS_INLINE VF row_sums(VF* r) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  __m512 v[16];
  JSS_UNROLL
  for (int i = 0; i < 16; ++i) v[i] = r[i].v;
  JSS_UNROLL
  for (int n = 16; n > 1; n /= 2) {
    JSS_UNROLL
    for (int i = 0; i < n / 2; ++i)
      v[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[2 * i], even, v[2 * i + 1]),
                           _mm512_permutex2var_ps(v[2 * i], odd, v[2 * i + 1]));
  }
  return {v[0]};
}
JSS_INLINE void transpose(VD* r) {
  __m512d t[8];
  JSS_UNROLL
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_pd(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm512_unpackhi_pd(r[2 * i].v, r[2 * i + 1].v);
  }
  JSS_UNROLL
  for (int k = 0; k < 2; ++k) {
    __m512d v0 = _mm512_shuffle_f64x2(t[k], t[2 + k], 0x88);
    __m512d w0 = _mm512_shuffle_f64x2(t[k], t[2 + k], 0xDD);
    __m512d v1 = _mm512_shuffle_f64x2(t[4 + k], t[6 + k], 0x88);
    __m512d w1 = _mm512_shuffle_f64x2(t[4 + k], t[6 + k], 0xDD);
    r[k].v = _mm512_shuffle_f64x2(v0, v1, 0x88);
    r[4 + k].v = _mm512_shuffle_f64x2(v0, v1, 0xDD);
    r[2 + k].v = _mm512_shuffle_f64x2(w0, w1, 0x88);
    r[6 + k].v = _mm512_shuffle_f64x2(w0, w1, 0xDD);
  }
}

// ========================================================================= AVX2
#elif defined(JSS_SIMD_BACKEND_AVX2)
constexpr const char* kBackend = "avx2";

template <> struct Vec<float> { static constexpr int kLanes = 8; __m256 v; };
template <> struct Vec<double> { static constexpr int kLanes = 4; __m256d v; };
using VF = Vec<float>;
using VD = Vec<double>;

inline VF load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline VD load(const double* p) { return {_mm256_loadu_pd(p)}; }
inline void store(float* p, VF x) { _mm256_storeu_ps(p, x.v); }
inline void store(double* p, VD x) { _mm256_storeu_pd(p, x.v); }
inline VF broadcast(float x) { return {_mm256_set1_ps(x)}; }
inline VD broadcast(double x) { return {_mm256_set1_pd(x)}; }
inline VF add(VF a, VF b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VD add(VD a, VD b) { return {_mm256_add_pd(a.v, b.v)}; }
inline VF mul(VF a, VF b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VD mul(VD a, VD b) { return {_mm256_mul_pd(a.v, b.v)}; }
inline VF fma(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline VD fma(VD a, VD b, VD c) { return {_mm256_fmadd_pd(a.v, b.v, c.v)}; }
inline VD as_double(VF x) { return {_mm256_castps_pd(x.v)}; }
inline VF as_float(VD x) { return {_mm256_castpd_ps(x.v)}; }

inline VF dup_even(VF x) { return {_mm256_moveldup_ps(x.v)}; }
inline VF dup_odd(VF x) { return {_mm256_movehdup_ps(x.v)}; }
inline VF swap_pairs(VF x) { return {_mm256_permute_ps(x.v, 0xB1)}; }
inline VF neg_even(VF x) {
  const __m256i m = _mm256_set1_epi64x(0x80000000LL);
  return {_mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(x.v), m))};
}

inline VF load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}
inline void store_bf16(uint16_t* p, VF x) {
  __m256i u = _mm256_castps_si256(x.v);
  __m256i hi = _mm256_srli_epi32(u, 16);
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                           _mm256_and_si256(hi, _mm256_set1_epi32(1)))), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // packus works inside 128-bit lanes: gather the two useful quarters.
  __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline VF load_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline void store_f16(uint16_t* p, VF x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

JSS_INLINE void transpose(VF* r) {
  __m256 t[8], u[8];
  JSS_UNROLL
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  JSS_UNROLL
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  JSS_UNROLL
  for (int k = 0; k < 4; ++k) {
    r[k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x20);
    r[4 + k].v = _mm256_permute2f128_ps(u[k], u[4 + k], 0x31);
  }
}
JSS_INLINE void transpose(VD* r) {
  __m256d t0 = _mm256_unpacklo_pd(r[0].v, r[1].v), t1 = _mm256_unpackhi_pd(r[0].v, r[1].v);
  __m256d t2 = _mm256_unpacklo_pd(r[2].v, r[3].v), t3 = _mm256_unpackhi_pd(r[2].v, r[3].v);
  r[0].v = _mm256_permute2f128_pd(t0, t2, 0x20);
  r[1].v = _mm256_permute2f128_pd(t1, t3, 0x20);
  r[2].v = _mm256_permute2f128_pd(t0, t2, 0x31);
  r[3].v = _mm256_permute2f128_pd(t1, t3, 0x31);
}

// ========================================================================= NEON
#elif defined(JSS_SIMD_BACKEND_NEON)
constexpr const char* kBackend = "neon";

template <> struct Vec<float> { static constexpr int kLanes = 4; float32x4_t v; };
template <> struct Vec<double> { static constexpr int kLanes = 2; float64x2_t v; };
using VF = Vec<float>;
using VD = Vec<double>;

inline VF load(const float* p) { return {vld1q_f32(p)}; }
inline VD load(const double* p) { return {vld1q_f64(p)}; }
inline void store(float* p, VF x) { vst1q_f32(p, x.v); }
inline void store(double* p, VD x) { vst1q_f64(p, x.v); }
inline VF broadcast(float x) { return {vdupq_n_f32(x)}; }
inline VD broadcast(double x) { return {vdupq_n_f64(x)}; }
inline VF add(VF a, VF b) { return {vaddq_f32(a.v, b.v)}; }
inline VD add(VD a, VD b) { return {vaddq_f64(a.v, b.v)}; }
inline VF mul(VF a, VF b) { return {vmulq_f32(a.v, b.v)}; }
inline VD mul(VD a, VD b) { return {vmulq_f64(a.v, b.v)}; }
inline VF fma(VF a, VF b, VF c) { return {vfmaq_f32(c.v, a.v, b.v)}; }
inline VD fma(VD a, VD b, VD c) { return {vfmaq_f64(c.v, a.v, b.v)}; }
inline VD as_double(VF x) { return {vreinterpretq_f64_f32(x.v)}; }
inline VF as_float(VD x) { return {vreinterpretq_f32_f64(x.v)}; }

inline VF dup_even(VF x) { return {vtrn1q_f32(x.v, x.v)}; }
inline VF dup_odd(VF x) { return {vtrn2q_f32(x.v, x.v)}; }
inline VF swap_pairs(VF x) { return {vrev64q_f32(x.v)}; }
inline VF neg_even(VF x) {
  const uint32x4_t m = vreinterpretq_u32_u64(vdupq_n_u64(0x80000000ULL));
  return {vreinterpretq_f32_u32(veorq_u32(vreinterpretq_u32_f32(x.v), m))};
}

inline VF load_bf16(const uint16_t* p) {
  return {vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))};
}
inline void store_bf16(uint16_t* p, VF x) {
  uint32x4_t u = vreinterpretq_u32_f32(x.v);
  uint32x4_t hi = vshrq_n_u32(u, 16);
  uint32x4_t r = vshrq_n_u32(
      vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(hi, vdupq_n_u32(1)))), 16);
  uint32x4_t is_num = vceqq_f32(x.v, x.v);  // false for NaN
  r = vbslq_u32(is_num, r, vorrq_u32(hi, vdupq_n_u32(0x40)));
  vst1_u16(p, vmovn_u32(r));
}
// FCVT rounds with FPCR's mode, round-to-nearest-even unless someone changed it.
inline VF load_f16(const uint16_t* p) {
  return {vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)))};
}
inline void store_f16(uint16_t* p, VF x) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x.v))); }

JSS_INLINE void transpose(VF* r) {
  float32x4_t t0 = vtrn1q_f32(r[0].v, r[1].v), t1 = vtrn2q_f32(r[0].v, r[1].v);
  float32x4_t t2 = vtrn1q_f32(r[2].v, r[3].v), t3 = vtrn2q_f32(r[2].v, r[3].v);
  auto d = [](float32x4_t x) { return vreinterpretq_f64_f32(x); };
  auto f = [](float64x2_t x) { return vreinterpretq_f32_f64(x); };
  r[0].v = f(vtrn1q_f64(d(t0), d(t2)));
  r[1].v = f(vtrn1q_f64(d(t1), d(t3)));
  r[2].v = f(vtrn2q_f64(d(t0), d(t2)));
  r[3].v = f(vtrn2q_f64(d(t1), d(t3)));
}
JSS_INLINE void transpose(VD* r) {
  float64x2_t t0 = vtrn1q_f64(r[0].v, r[1].v), t1 = vtrn2q_f64(r[0].v, r[1].v);
  r[0].v = t0;
  r[1].v = t1;
}

// ====================================================================== generic
#else
// Plain arrays of 4 floats / 2 doubles: compilers turn these loops into
// whatever vector instructions the baseline target has (SSE2 on x86-64).
constexpr const char* kBackend = "generic";

template <> struct Vec<float> { static constexpr int kLanes = 4; float v[4]; };
template <> struct Vec<double> { static constexpr int kLanes = 2; double v[2]; };
using VF = Vec<float>;
using VD = Vec<double>;

#define JSS_GENERIC_LANEWISE(V, L)                                                     \
  inline V load(const L* p) { V r; for (int i = 0; i < V::kLanes; ++i) r.v[i] = p[i]; return r; } \
  inline void store(L* p, V x) { for (int i = 0; i < V::kLanes; ++i) p[i] = x.v[i]; }           \
  inline V broadcast(L x) { V r; for (int i = 0; i < V::kLanes; ++i) r.v[i] = x; return r; }    \
  inline V add(V a, V b) { V r; for (int i = 0; i < V::kLanes; ++i) r.v[i] = a.v[i] + b.v[i]; return r; } \
  inline V mul(V a, V b) { V r; for (int i = 0; i < V::kLanes; ++i) r.v[i] = a.v[i] * b.v[i]; return r; } \
  inline V fma(V a, V b, V c) { V r; for (int i = 0; i < V::kLanes; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i]; return r; } \
  JSS_INLINE void transpose(V* r) {                                                        \
    for (int i = 0; i < V::kLanes; ++i)                                                \
      for (int j = i + 1; j < V::kLanes; ++j) {                                        \
        L t = r[i].v[j]; r[i].v[j] = r[j].v[i]; r[j].v[i] = t;                         \
      }                                                                                \
  }
JSS_GENERIC_LANEWISE(VF, float)
JSS_GENERIC_LANEWISE(VD, double)
#undef JSS_GENERIC_LANEWISE

inline VD as_double(VF x) { VD r; std::memcpy(r.v, x.v, sizeof r.v); return r; }
inline VF as_float(VD x) { VF r; std::memcpy(r.v, x.v, sizeof r.v); return r; }
inline VF dup_even(VF x) { return {{x.v[0], x.v[0], x.v[2], x.v[2]}}; }
inline VF dup_odd(VF x) { return {{x.v[1], x.v[1], x.v[3], x.v[3]}}; }
inline VF swap_pairs(VF x) { return {{x.v[1], x.v[0], x.v[3], x.v[2]}}; }
inline VF neg_even(VF x) { return {{-x.v[0], x.v[1], -x.v[2], x.v[3]}}; }
inline VF load_bf16(const uint16_t* p) {
  VF r; for (int i = 0; i < 4; ++i) r.v[i] = bf16_to_float(p[i]); return r;
}
inline void store_bf16(uint16_t* p, VF x) { for (int i = 0; i < 4; ++i) p[i] = float_to_bf16(x.v[i]); }
inline VF load_f16(const uint16_t* p) {
  VF r; for (int i = 0; i < 4; ++i) r.v[i] = f16_to_float(p[i]); return r;
}
inline void store_f16(uint16_t* p, VF x) { for (int i = 0; i < 4; ++i) p[i] = float_to_f16(x.v[i]); }
#endif

#ifndef JSS_HAVE_STREAM_LINE
// A vector is less than a cache line here: plain stores (streaming half lines would leave
// partial lines in the write-combining buffers).
constexpr bool kStreamLine = false;
inline void stream_line(float* p, VF x) { store(p, x); }
inline void stream_fence() {}
#endif
#undef JSS_HAVE_STREAM_LINE

#ifndef JSS_HAVE_ROW_SUMS
JSS_INLINE VF row_sums(VF* r) {
  transpose(r);
  JSS_UNROLL
  for (int s = 1; s < VF::kLanes; s *= 2) {
    JSS_UNROLL
    for (int i = 0; i + s < VF::kLanes; i += 2 * s) r[i] = add(r[i], r[i + s]);
  }
  return r[0];
}
#endif
#undef JSS_HAVE_ROW_SUMS

}  // namespace simd
}  // namespace
}  // namespace jax_selscan
