// The selective scan's row and lane building blocks, shared by the forward's channel tiles
// (selective_scan.h), its along-L path (selective_scan_narrow.h) and the backward
// (selective_scan_bwd*.h): lane moves, loads and stores of any input dtype, the block
// gathers / scatters (transposes), the prefetch bursts, and the L split's carry cut-off.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "selective_scan_api.h"
#include "simd_math.h"

#if defined(__GNUC__) || defined(__clang__)
#define JSS_INLINE_LAMBDA __attribute__((always_inline))
#else
#define JSS_INLINE_LAMBDA
#endif

namespace jax_selscan {
namespace {
namespace ss {

using simd::VF;
constexpr int W = VF::kLanes;

// Lane moves for the along-L carries (fill: a broadcast value).
//   up<K>(x, f)[r]   = r >= K ? x[r - K] : f        down<K>(x, f)[r] = r + K < W ? x[r + K] : f
//   last(x), first(x): that lane broadcast
#if defined(JSS_SIMD_BACKEND_AVX512)
template <int K> JSS_INLINE VF up(VF x, VF f) {
  return {_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(x.v), _mm512_castps_si512(f.v), 16 - K))};
}
template <int K> JSS_INLINE VF down(VF x, VF f) {
  return {_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(f.v), _mm512_castps_si512(x.v), K))};
}
JSS_INLINE VF last(VF x) { return {_mm512_permutexvar_ps(_mm512_set1_epi32(15), x.v)}; }
JSS_INLINE VF first(VF x) { return {_mm512_broadcastss_ps(_mm512_castps512_ps128(x.v))}; }
#elif defined(JSS_SIMD_BACKEND_AVX2)
template <int K> JSS_INLINE VF up(VF x, VF f) {
  const __m256i idx = _mm256_setr_epi32(0 - K < 0 ? 0 : 0 - K, 1 - K < 0 ? 0 : 1 - K, 2 - K < 0 ? 0 : 2 - K,
                                        3 - K < 0 ? 0 : 3 - K, 4 - K, 5 - K, 6 - K, 7 - K);
  return {_mm256_blend_ps(_mm256_permutevar8x32_ps(x.v, idx), f.v, (1 << K) - 1)};
}
template <int K> JSS_INLINE VF down(VF x, VF f) {
  const __m256i idx = _mm256_setr_epi32(0 + K, 1 + K, 2 + K, 3 + K, 4 + K > 7 ? 7 : 4 + K,
                                        5 + K > 7 ? 7 : 5 + K, 6 + K > 7 ? 7 : 6 + K, 7);
  return {_mm256_blend_ps(_mm256_permutevar8x32_ps(x.v, idx), f.v, ((1 << K) - 1) << (8 - K))};
}
JSS_INLINE VF last(VF x) { return {_mm256_permutevar8x32_ps(x.v, _mm256_set1_epi32(7))}; }
JSS_INLINE VF first(VF x) { return {_mm256_permutevar8x32_ps(x.v, _mm256_set1_epi32(0))}; }
#elif defined(JSS_SIMD_BACKEND_NEON)
template <int K> JSS_INLINE VF up(VF x, VF f) { return {vextq_f32(f.v, x.v, 4 - K)}; }
template <int K> JSS_INLINE VF down(VF x, VF f) { return {vextq_f32(x.v, f.v, K)}; }
JSS_INLINE VF last(VF x) { return {vdupq_laneq_f32(x.v, 3)}; }
JSS_INLINE VF first(VF x) { return {vdupq_laneq_f32(x.v, 0)}; }
#else
template <int K> JSS_INLINE VF up(VF x, VF f) {
  VF r;
  for (int i = 0; i < W; ++i) r.v[i] = i >= K ? x.v[i - K] : f.v[i];
  return r;
}
template <int K> JSS_INLINE VF down(VF x, VF f) {
  VF r;
  for (int i = 0; i < W; ++i) r.v[i] = i + K < W ? x.v[i + K] : f.v[i];
  return r;
}
JSS_INLINE VF last(VF x) { return simd::broadcast(x.v[W - 1]); }
JSS_INLINE VF first(VF x) { return simd::broadcast(x.v[0]); }
#endif

// One Kogge-Stone level of the affine scan over lanes (P, H): the lane K
// before in scan order is composed first.
template <int K, bool REV> JSS_INLINE void scan_level(VF& P, VF& H) {
  if constexpr (K < W) {
    const VF one = simd::broadcast(1.0f), zero = simd::broadcast(0.0f);
    const VF Ps = REV ? down<K>(P, one) : up<K>(P, one);
    const VF Hs = REV ? down<K>(H, zero) : up<K>(H, zero);
    H = simd::fma(P, Hs, H);
    P = simd::mul(P, Ps);
  }
}

JSS_INLINE float ld1(const void* p, SsType t, int64_t i) {
  switch (t) {
    case SsType::kF32: return static_cast<const float*>(p)[i];
    case SsType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return f16_to_float(static_cast<const uint16_t*>(p)[i]);
  }
}
JSS_INLINE VF ldv(const void* p, SsType t, int64_t i) {
  switch (t) {
    case SsType::kF32: return simd::load(static_cast<const float*>(p) + i);
    case SsType::kBF16: return simd::load_bf16(static_cast<const uint16_t*>(p) + i);
    default: return simd::load_f16(static_cast<const uint16_t*>(p) + i);
  }
}
JSS_INLINE void st1(void* p, SsType t, int64_t i, float x) {
  switch (t) {
    case SsType::kF32: static_cast<float*>(p)[i] = x; break;
    case SsType::kBF16: static_cast<uint16_t*>(p)[i] = float_to_bf16(x); break;
    default: static_cast<uint16_t*>(p)[i] = float_to_f16(x); break;
  }
}
JSS_INLINE void stv(void* p, SsType t, int64_t i, VF x) {
  switch (t) {
    case SsType::kF32: simd::store(static_cast<float*>(p) + i, x); break;
    case SsType::kBF16: simd::store_bf16(static_cast<uint16_t*>(p) + i, x); break;
    default: simd::store_f16(static_cast<uint16_t*>(p) + i, x); break;
  }
}

// r[i] = p[base + i * stride .. + W) for the W rows of a tile (one type switch per tile).
JSS_INLINE void load_rows(const void* p, SsType t, int64_t base, int64_t stride, VF* r) {
  switch (t) {
    case SsType::kF32: {
      const float* q = static_cast<const float*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) r[i] = simd::load(q);
      break;
    }
    case SsType::kBF16: {
      const uint16_t* q = static_cast<const uint16_t*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) r[i] = simd::load_bf16(q);
      break;
    }
    default: {
      const uint16_t* q = static_cast<const uint16_t*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) r[i] = simd::load_f16(q);
      break;
    }
  }
}
JSS_INLINE void store_rows(void* p, SsType t, int64_t base, int64_t stride, const VF* r) {
  switch (t) {
    case SsType::kF32: {
      float* q = static_cast<float*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) simd::store(q, r[i]);
      break;
    }
    case SsType::kBF16: {
      uint16_t* q = static_cast<uint16_t*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) simd::store_bf16(q, r[i]);
      break;
    }
    default: {
      uint16_t* q = static_cast<uint16_t*>(p) + base;
      JSS_UNROLL
      for (int i = 0; i < W; ++i, q += stride) simd::store_f16(q, r[i]);
      break;
    }
  }
}

// buf[tb * W + r] = p[base + r * stride + t0 + tb] for r < nch, tb < nt; 0 elsewhere.
inline void gather_block(const void* p, SsType ty, int64_t base, int64_t stride, int nch,
                         int64_t t0, int nt, float* buf) {
  if (nch == W && nt == W) {
    VF r[W];
    JSS_UNROLL
    for (int i = 0; i < W; ++i) r[i] = ldv(p, ty, base + i * stride + t0);
    simd::transpose(r);
    JSS_UNROLL
    for (int i = 0; i < W; ++i) simd::store(buf + i * W, r[i]);
    return;
  }
  for (int tb = 0; tb < W; ++tb)
    for (int r = 0; r < W; ++r)
      buf[tb * W + r] = (tb < nt && r < nch) ? ld1(p, ty, base + r * stride + t0 + tb) : 0.0f;
}

// Whether float32 rows of `stride` elements from element `base` of p take a whole number of
// 64-byte lines per block of W steps, every block on a line (for simd::stream_line).
inline bool lines_streamable(const void* p, SsType ty, int64_t base, int64_t stride) {
  return simd::kStreamLine && p != nullptr && ty == SsType::kF32 && stride % W == 0 &&
         reinterpret_cast<uintptr_t>(static_cast<const float*>(p) + base) % 64 == 0;
}

// The inverse: p[base + r * stride + t0 + tb] = buf[tb * W + r] for r < nch, tb < nt.
// `stream` (only where lines_streamable): whole blocks stored past the caches.
inline void scatter_block(void* p, SsType ty, int64_t base, int64_t stride, int nch, int64_t t0,
                          int nt, const float* buf, bool stream = false) {
  if (nch == W && nt == W) {
    VF r[W];
    JSS_UNROLL
    for (int i = 0; i < W; ++i) r[i] = simd::load(buf + i * W);
    simd::transpose(r);
    if (stream) {
      JSS_UNROLL
      for (int i = 0; i < W; ++i) simd::stream_line(static_cast<float*>(p) + base + i * stride + t0, r[i]);
      return;
    }
    JSS_UNROLL
    for (int i = 0; i < W; ++i) stv(p, ty, base + i * stride + t0, r[i]);
    return;
  }
  for (int tb = 0; tb < nt; ++tb)
    for (int r = 0; r < nch; ++r) st1(p, ty, base + r * stride + t0 + tb, buf[tb * W + r]);
}

// The prefetch's distance (steps), burst (blocks of W steps per row at once) and locality (3:
// into L1, as __builtin_prefetch's third argument), compile-time knobs for experiments
// (PERFORMANCE_CPU, sessions 32 and 33).
#ifndef JSS_PF_STEPS
#define JSS_PF_STEPS 128
#endif
#ifndef JSS_PF_GROUP
#define JSS_PF_GROUP 8
#endif
#ifndef JSS_PF_LOC
#define JSS_PF_LOC 3
#endif
#ifndef JSS_PF_SPREAD
#define JSS_PF_SPREAD 1
#endif
#ifndef JSS_PF_FWD_SUB
#define JSS_PF_FWD_SUB 4
#endif
#ifndef JSS_PF_BWD_SUB
#define JSS_PF_BWD_SUB 16
#endif

// Prefetch of the rows' elements at time t (the line holding them) for r < nch. The blocks'
// reads go down nch rows at once, which the hardware prefetchers follow only for some
// relative alignments of u, delta, z and out (notes PERFORMANCE_CPU, session 25).
JSS_INLINE void prefetch_rows(const void* p, SsType ty, int64_t base, int64_t stride, int nch,
                              int64_t t, bool write) {
  const int64_t esize = ty == SsType::kF32 ? 4 : 2;
  const char* q = static_cast<const char*>(p) + (base + t) * esize;
  for (int r = 0; r < nch; ++r, q += stride * esize) {
    if (write) __builtin_prefetch(q, 1, JSS_PF_LOC);
    else __builtin_prefetch(q, 0, JSS_PF_LOC);
  }
}

// L split: a piece's phase 1 stops tracking dA's running product P (and phase 3's
// rerun stops) once P <= 2^-30 in every lane and state: the entering state's
// contribution P * h_in to every later state is then dropped. That is below float32
// resolution of h_in (2^-24): the error is at most 2^-30 |h_in| in the states, i.e.
// at most 2^-30 |C| |h_in| in y. (Waiting for P to reach 0 does not work: with
// dA > 1/2 the product sticks at the smallest subnormal, 2^-149 * dA rounding back.)
constexpr float kSsCarryDrop = 9.3132257e-10f;  // 2^-30
// pass() prefetches the rows' lines in bursts: at every kSsPrefetchGroup-th block, the lines
// of the kSsPrefetchGroup blocks that start kSsPrefetchSteps ahead in scan order, 8 consecutive
// lines of each row at once. One line of each row per block (two blocks ahead, until session
// 33) ran 1.4-1.7x slower whenever the rows' stride was a multiple of 128 bytes or so (L 1024,
// 1152, 1536, 2048, ...: most Mamba lengths); the bursts ran 0.29-0.33 ns per (t, d, n) at
// every L measured. (The fused bidirectional call's passes, which stream fewer arrays from
// memory, lost 2-5% to bursts up to L 4096 and gained 20% at 8192: bursts everywhere;
// PERFORMANCE_CPU, session 33.)
constexpr int64_t kSsPrefetchSteps = JSS_PF_STEPS;
constexpr int64_t kSsPrefetchGroup = JSS_PF_GROUP;
// Slices of a block's share of a burst (prefetch_burst's nsub): issued at that many evenly
// spaced steps of the forward's pass() and of the backward's walk (each divides W; clamped to W).
constexpr int kSsFwdPrefetchSub = JSS_PF_FWD_SUB < W ? JSS_PF_FWD_SUB : W;
constexpr int kSsBwdPrefetchSub = JSS_PF_BWD_SUB < W ? JSS_PF_BWD_SUB : W;

// The burst due at scan-order block bi (first step t0; `down`: travelling towards t = 0):
// rows(tp, r0, r1) prefetches rows [r0, r1) of the nch rows at step tp, for the first step tp of
// each of the kSsPrefetchGroup blocks from kSsPrefetchSteps ahead. With JSS_PF_SPREAD the
// burst due at a group's first block is cut into kSsPrefetchGroup * nsub slices of its
// (row, block) items, a row's lines kept together, and block k of the group issues slices
// k * nsub .. k * nsub + nsub - 1 (one per call, `sub`): issued all at once (up to 896
// prefetches in the backward's walk) or a block's share at once (112), the bursts stalled on
// full line-fill buffers (PERFORMANCE_CPU, sessions 34 and 35). Shared by the forward's pass()
// and the backward's walk. (Always inlined, with JSS_INLINE_LAMBDA on `rows`: GCC 12 took a
// function that only prefetches for one without side effects and dropped its calls.)
template <class Rows>
JSS_INLINE void prefetch_burst(int64_t bi, int64_t t0, bool down, int64_t L, int nch, Rows&& rows, int sub = 0,
                               int nsub = 1) {
#if JSS_PF_SPREAD
  const int64_t k = bi % kSsPrefetchGroup;
  const int64_t tg = down ? t0 + k * W : t0 - k * W;  // the group's first block's t0
  const int64_t slices = kSsPrefetchGroup * nsub, slice = k * nsub + sub, items = nch * kSsPrefetchGroup;
  const int64_t i0 = slice * items / slices, i1 = (slice + 1) * items / slices;
  for (int64_t i = i0; i < i1; ++i) {
    const int r = static_cast<int>(i / kSsPrefetchGroup);
    const int64_t ahead = kSsPrefetchSteps + (i % kSsPrefetchGroup) * W, tp = down ? tg - ahead : tg + ahead;
    if (tp >= 0 && tp < L) rows(tp, r, r + 1);
  }
#else
  if (bi % kSsPrefetchGroup != 0 || sub != 0) return;
  for (int64_t g = 0; g < kSsPrefetchGroup; ++g) {
    const int64_t ahead = kSsPrefetchSteps + g * W, tp = down ? t0 - ahead : t0 + ahead;
    if (tp < 0 || tp >= L) break;
    rows(tp, 0, nch);
  }
#endif
}


// Scalar softplus (the along-L paths' partial chunks).
inline float softplus1(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

}  // namespace ss
}  // namespace
}  // namespace jax_selscan
