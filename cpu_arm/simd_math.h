// Vector math over simd.h for the selective scan: exp2 on x <= 0, softplus,
// sigmoid / silu. Same backends and the same anonymous-namespace rule as
// simd.h (each ISA translation unit gets its own private copy).
//
//   exp2_nonpos(x)   2^x for x <= 0 (and -inf -> 0); max error <= 2 ULP against
//                    double exp2 over [-151, 0], subnormal results included
//                    (cpu_arm/tests/test_exp2_ulp.cc measures it per ISA).
//                    Range reduction: t = x + 1.5*2^23 rounds x to the integer
//                    k held in t's low mantissa bits; f = x - k in [-1/2, 1/2];
//                    2^f by a degree-6 polynomial (coefficients fitted for
//                    relative error 2e-9 on [-1/2, 1/2]); 2^k added to the
//                    exponent field as the integer k << 23. Lanes below -125
//                    (subnormal or zero results) take a second path that
//                    scales by 2^64 first and by 2^-64 last (one rounding).
//   softplus(x)      max(x, 0) + log1p(exp(-|x|)), log1p by 2 atanh(e / (2 + e)).
//   sigmoid(x)       no overflow for any x (exp of -|x| only).
#pragma once

#include <cmath>
#include <cstring>

#include "simd.h"

namespace jax_selscan {
namespace {
namespace simd {

// ---- the few extra per-backend operations ------------------------------------------
#if defined(JSS_SIMD_BACKEND_AVX512)
inline VF sub(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF div(VF a, VF b) { return {_mm512_div_ps(a.v, b.v)}; }
inline VF max(VF a, VF b) { return {_mm512_max_ps(a.v, b.v)}; }
inline VF abs(VF a) {
  return {_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7fffffff)))};
}
// p * 2^k where k is the integer in the low mantissa bits of t (k << 23 added to p's bits).
inline VF scale_bits(VF p, VF t) {
  return {_mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p.v),
                                               _mm512_slli_epi32(_mm512_castps_si512(t.v), 23)))};
}
inline bool any_lt(VF x, float c) { return _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(c), _CMP_LT_OQ) != 0; }
inline bool any_outside(VF x, float lo, float hi) {  // some lane < lo or > hi (NaN: no)
  return (_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(lo), _CMP_LT_OQ) |
          _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(hi), _CMP_GT_OQ)) != 0;
}
inline VF select_lt(VF x, float c, VF a, VF b) {  // x < c ? a : b
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(c), _CMP_LT_OQ), b.v, a.v)};
}
#elif defined(JSS_SIMD_BACKEND_AVX2)
inline VF sub(VF a, VF b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VF div(VF a, VF b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VF max(VF a, VF b) { return {_mm256_max_ps(a.v, b.v)}; }
inline VF abs(VF a) {
  return {_mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(a.v), _mm256_set1_epi32(0x7fffffff)))};
}
inline VF scale_bits(VF p, VF t) {
  return {_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p.v),
                                               _mm256_slli_epi32(_mm256_castps_si256(t.v), 23)))};
}
inline bool any_lt(VF x, float c) {
  return _mm256_movemask_ps(_mm256_cmp_ps(x.v, _mm256_set1_ps(c), _CMP_LT_OQ)) != 0;
}
inline bool any_outside(VF x, float lo, float hi) {
  return _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(x.v, _mm256_set1_ps(lo), _CMP_LT_OQ),
                                         _mm256_cmp_ps(x.v, _mm256_set1_ps(hi), _CMP_GT_OQ))) != 0;
}
inline VF select_lt(VF x, float c, VF a, VF b) {
  return {_mm256_blendv_ps(b.v, a.v, _mm256_cmp_ps(x.v, _mm256_set1_ps(c), _CMP_LT_OQ))};
}
#elif defined(JSS_SIMD_BACKEND_NEON)
inline VF sub(VF a, VF b) { return {vsubq_f32(a.v, b.v)}; }
inline VF div(VF a, VF b) { return {vdivq_f32(a.v, b.v)}; }
inline VF max(VF a, VF b) { return {vmaxq_f32(a.v, b.v)}; }
inline VF abs(VF a) { return {vabsq_f32(a.v)}; }
inline VF scale_bits(VF p, VF t) {
  return {vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p.v),
                                          vshlq_n_s32(vreinterpretq_s32_f32(t.v), 23)))};
}
inline bool any_lt(VF x, float c) { return vmaxvq_u32(vcltq_f32(x.v, vdupq_n_f32(c))) != 0; }
inline bool any_outside(VF x, float lo, float hi) {
  return vmaxvq_u32(vorrq_u32(vcltq_f32(x.v, vdupq_n_f32(lo)), vcgtq_f32(x.v, vdupq_n_f32(hi)))) != 0;
}
inline VF select_lt(VF x, float c, VF a, VF b) { return {vbslq_f32(vcltq_f32(x.v, vdupq_n_f32(c)), a.v, b.v)}; }
#else
inline VF sub(VF a, VF b) { VF r; for (int i = 0; i < VF::kLanes; ++i) r.v[i] = a.v[i] - b.v[i]; return r; }
inline VF div(VF a, VF b) { VF r; for (int i = 0; i < VF::kLanes; ++i) r.v[i] = a.v[i] / b.v[i]; return r; }
inline VF max(VF a, VF b) {
  VF r; for (int i = 0; i < VF::kLanes; ++i) r.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i]; return r;
}
inline VF abs(VF a) { VF r; for (int i = 0; i < VF::kLanes; ++i) r.v[i] = std::fabs(a.v[i]); return r; }
inline VF scale_bits(VF p, VF t) {
  VF r;
  for (int i = 0; i < VF::kLanes; ++i) {
    uint32_t pb = float_bits(p.v[i]), tb = float_bits(t.v[i]);
    r.v[i] = bits_float(pb + (tb << 23));
  }
  return r;
}
inline bool any_lt(VF x, float c) {
  bool any = false; for (int i = 0; i < VF::kLanes; ++i) any |= x.v[i] < c; return any;
}
inline bool any_outside(VF x, float lo, float hi) {
  bool any = false; for (int i = 0; i < VF::kLanes; ++i) any |= x.v[i] < lo || x.v[i] > hi; return any;
}
inline VF select_lt(VF x, float c, VF a, VF b) {
  VF r; for (int i = 0; i < VF::kLanes; ++i) r.v[i] = x.v[i] < c ? a.v[i] : b.v[i]; return r;
}
#endif

inline VF neg(VF a) { return sub(broadcast(0.0f), a); }

// ---- exp2 on x <= 0 ------------------------------------------------------------------
JSS_INLINE VF exp2_poly(VF f) {
  VF p = broadcast(1.535336196e-04f);
  p = fma(p, f, broadcast(1.339887502e-03f));
  p = fma(p, f, broadcast(9.618436918e-03f));
  p = fma(p, f, broadcast(5.550332367e-02f));
  p = fma(p, f, broadcast(2.402264774e-01f));
  p = fma(p, f, broadcast(6.931471825e-01f));
  return fma(p, f, broadcast(1.0f));
}

// The same polynomial evaluated at g = -f, its odd coefficients negated. Each partial sum is
// the exact negation of exp2_poly's (round to nearest is symmetric), so the result has
// exp2_poly(f)'s bits. What it buys is the reduction: g = k - x fuses with the caller's
// x = delta * A2 into one FMLS on NEON, where f = x - k needs an FNEG and an FMLA (x86 has
// a fused form either way).
JSS_INLINE VF exp2_poly_neg(VF g) {
  VF p = broadcast(1.535336196e-04f);
  p = fma(p, g, broadcast(-1.339887502e-03f));
  p = fma(p, g, broadcast(9.618436918e-03f));
  p = fma(p, g, broadcast(-5.550332367e-02f));
  p = fma(p, g, broadcast(2.402264774e-01f));
  p = fma(p, g, broadcast(-6.931471825e-01f));
  return fma(p, g, broadcast(1.0f));
}

inline __attribute__((noinline)) VF exp2_tiny(VF x, VF fast) {
  const VF magic = broadcast(12582912.0f);  // 1.5 * 2^23
  const VF xc = max(x, broadcast(-151.0f));
  const VF t = add(xc, magic);
  const VF p = exp2_poly(sub(xc, sub(t, magic)));
  const VF slow = mul(scale_bits(mul(p, broadcast(18446744073709551616.0f)), t),
                      broadcast(5.42101086242752217e-20f));  // * 2^64 ... * 2^-64
  return select_lt(x, -125.0f, slow, fast);
}

JSS_INLINE VF exp2_nonpos(VF x) {
  const VF magic = broadcast(12582912.0f);
  const VF t = add(x, magic);
  const VF f = sub(x, sub(t, magic));
  const VF r = scale_bits(exp2_poly(f), t);
  if (__builtin_expect(any_lt(x, -125.0f), 0)) return exp2_tiny(x, r);
  return r;
}

// 2^x for any x (the kernel's exp(delta A) when A or delta has the unusual sign):
// the fast path for lanes in [-125, 0], otherwise exp2_nonpos on the lanes < 0
// and (2^(x/2 - 64) * 2^64)^2 on the lanes > 0 (<= 4 ULP, inf above 128).
inline __attribute__((noinline)) VF exp2_general_slow(VF x) {
  const VF neg_part = exp2_nonpos(select_lt(x, 0.0f, x, broadcast(0.0f)));
  VF xp = max(x, broadcast(0.0f));
  xp = select_lt(xp, 128.0f, xp, broadcast(128.0f));
  VF half = mul(exp2_nonpos(sub(mul(xp, broadcast(0.5f)), broadcast(64.0f))),
                broadcast(18446744073709551616.0f));
  const VF pos_part = mul(half, half);
  return select_lt(x, 0.0f, neg_part, pos_part);
}

// 2^x when the caller knows x is in [-125, 0] (no range check).
JSS_INLINE VF exp2_inrange(VF x) {
  const VF magic = broadcast(12582912.0f);
  const VF t = add(x, magic);
  return scale_bits(exp2_poly_neg(sub(sub(t, magic), x)), t);
}

JSS_INLINE VF exp2_any(VF x) {
  if (__builtin_expect(any_outside(x, -125.0f, 0.0f), 0)) return exp2_general_slow(x);
  const VF magic = broadcast(12582912.0f);
  const VF t = add(x, magic);
  return scale_bits(exp2_poly_neg(sub(sub(t, magic), x)), t);
}

// ---- softplus, sigmoid, silu ---------------------------------------------------------
constexpr float kLog2e = 1.44269504088896341f;

JSS_INLINE VF log1p_unit(VF e) {  // log(1 + e) for e in [0, 1]
  const VF s = div(e, add(broadcast(2.0f), e));  // in [0, 1/3]
  const VF s2 = mul(s, s);
  VF q = broadcast(1.0f / 15.0f);
  q = fma(q, s2, broadcast(1.0f / 13.0f));
  q = fma(q, s2, broadcast(1.0f / 11.0f));
  q = fma(q, s2, broadcast(1.0f / 9.0f));
  q = fma(q, s2, broadcast(1.0f / 7.0f));
  q = fma(q, s2, broadcast(1.0f / 5.0f));
  q = fma(q, s2, broadcast(1.0f / 3.0f));
  const VF s2x = add(s, s);
  return fma(mul(s2x, s2), q, s2x);
}

// exp(x) for x <= 0 with the product x * log2 e carried to about 2^-48 relative
// (log2 e split in two floats, the product's rounding error recovered by fma),
// so large |x| keeps a few-ULP result. Used by softplus / sigmoid, once per
// (channel, t); the per-state exp(delta A) uses exp2 on A * log2 e directly.
JSS_INLINE VF exp_nonpos(VF x) {
  const VF l_hi = broadcast(1.44269502162933349609375f), l_lo = broadcast(1.925963033500e-08f);
  const VF p = mul(x, l_hi);
  if (__builtin_expect(any_lt(p, -125.0f), 0)) return exp2_nonpos(p);
  const VF r = fma(x, l_lo, fma(x, l_hi, neg(p)));  // x * log2 e - p
  const VF magic = broadcast(12582912.0f);
  const VF t = add(p, magic);
  const VF f = add(sub(p, sub(t, magic)), r);
  return scale_bits(exp2_poly(f), t);
}

JSS_INLINE VF softplus(VF x) {
  const VF e = exp_nonpos(neg(abs(x)));
  return add(max(x, broadcast(0.0f)), log1p_unit(e));
}

JSS_INLINE VF sigmoid(VF x) {
  const VF e = exp_nonpos(neg(abs(x)));  // exp(-|x|)
  const VF r = div(broadcast(1.0f), add(broadcast(1.0f), e));  // sigmoid(|x|)
  return select_lt(x, 0.0f, mul(e, r), r);                     // sigmoid(-|x|) = e / (1 + e)
}

JSS_INLINE VF silu(VF x) { return mul(x, sigmoid(x)); }

// softplus(x), and sigmoid(x) (its derivative) in *sg, sharing exp(-|x|): the same bits as
// softplus(x) and sigmoid(x).
JSS_INLINE VF softplus_sigmoid(VF x, VF* sg) {
  const VF e = exp_nonpos(neg(abs(x)));
  const VF r = div(broadcast(1.0f), add(broadcast(1.0f), e));
  *sg = select_lt(x, 0.0f, mul(e, r), r);
  return add(max(x, broadcast(0.0f)), log1p_unit(e));
}

}  // namespace simd
}  // namespace
}  // namespace jax_selscan
