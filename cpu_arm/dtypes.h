// Scalar element types and conversions shared by the kernels and the driver.
//
// bf16 and f16 are stored as raw 16-bit patterns and converted by hand (no
// compiler _Float16 / __bf16, whose availability differs between compilers
// and targets). float -> 16-bit rounds to nearest even; NaN stays NaN (made
// quiet), infinities and f16 subnormals are exact. The SIMD backends use the
// hardware conversions (F16C / FCVT), which give bit-identical results for
// non-NaN values; the C++ tests check that.
//
// Anonymous namespace: see simd.h (one private copy per ISA translation unit).
#pragma once

#include <cstdint>
#include <cstring>

namespace jax_selscan {
namespace {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };
struct c64_t { float re, im; };  // layout of std::complex<float>

inline uint32_t float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even (overflow -> inf)
  return uint16_t(u >> 16);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    float v = float(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

inline uint16_t float_to_f16(float x) {
  uint32_t u = float_bits(x);
  uint32_t sign = (u >> 16) & 0x8000u, ax = u & 0x7fffffffu;
  if (ax >= 0x7f800000u)  // inf or NaN (quiet, top payload bits kept)
    return uint16_t(sign | (ax > 0x7f800000u ? 0x7e00u | ((ax >> 13) & 0x3ffu) : 0x7c00u));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to inf (>= 65520)
  if (ax < 0x38800000u) {  // below 2^-14: an f16 subnormal or zero
    uint32_t e = ax >> 23;
    if (e < 102) return uint16_t(sign);  // below 2^-25: rounds to zero
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // value * 2^24 = mant >> shift
    uint32_t r = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ax - 0x38000000u;  // rebias the exponent from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

// ---- element traits: storage type -> lane type and lanes per element -----------
// The kernels and the driver work on "lanes": float (f32, bf16, f16, and the two
// halves of c64) or double. The recurrence state is always kept in lanes.
template <class T> struct ElemInfo;
template <> struct ElemInfo<float> {
  using Lane = float; static constexpr int kPer = 1;
  static void to_lanes(const float* s, int64_t n, float* d) { std::memcpy(d, s, size_t(n) * 4); }
  static void from_lanes(const float* s, int64_t n, float* d) { std::memcpy(d, s, size_t(n) * 4); }
};
template <> struct ElemInfo<double> {
  using Lane = double; static constexpr int kPer = 1;
  static void to_lanes(const double* s, int64_t n, double* d) { std::memcpy(d, s, size_t(n) * 8); }
  static void from_lanes(const double* s, int64_t n, double* d) { std::memcpy(d, s, size_t(n) * 8); }
};
template <> struct ElemInfo<c64_t> {
  using Lane = float; static constexpr int kPer = 2;
  static void to_lanes(const c64_t* s, int64_t n, float* d) { std::memcpy(d, s, size_t(n) * 8); }
  static void from_lanes(const float* s, int64_t n, c64_t* d) { std::memcpy(d, s, size_t(n) * 8); }
};
template <> struct ElemInfo<bf16_t> {
  using Lane = float; static constexpr int kPer = 1;
  static void to_lanes(const bf16_t* s, int64_t n, float* d) {
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i].bits);
  }
  static void from_lanes(const float* s, int64_t n, bf16_t* d) {
    for (int64_t i = 0; i < n; ++i) d[i].bits = float_to_bf16(s[i]);
  }
};
template <> struct ElemInfo<f16_t> {
  using Lane = float; static constexpr int kPer = 1;
  static void to_lanes(const f16_t* s, int64_t n, float* d) {
    for (int64_t i = 0; i < n; ++i) d[i] = f16_to_float(s[i].bits);
  }
  static void from_lanes(const float* s, int64_t n, f16_t* d) {
    for (int64_t i = 0; i < n; ++i) d[i].bits = float_to_f16(s[i]);
  }
};

}  // namespace
}  // namespace jax_selscan
