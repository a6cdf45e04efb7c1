// The fused selective scan kernel (one source for every ISA of simd.h).
//
// Vectorised over channels: one task is `lanes` channels of one batch row (all
// in one B/C group), so every vector op works on `lanes` independent
// recurrences and the N states' dependency chains are independent of each
// other. Per time step t and state n:
//     dA = exp2(delta * A * log2 e)   (A pre-scaled once per task)
//     h  = dA * h + (delta * u) * B[t, n]       B broadcast (B shared by the group)
//     y += C[t, n] * h
// The state stays in registers (N = 16) or in a small L1 array (other N).
// Inputs are read `lanes` x `lanes` blocks at a time (one row per channel,
// transposed in registers) and converted from bf16/f16 on the fly; delta's
// bias and softplus and delta * u are computed once per block, the gate
// silu(z) and D * u once per output block.
//
// Bidirectional: the reverse pass runs first, computes dA once, keeps it in a
// per-task buffer (for the lowest SsTask::dA_blocks blocks: the ones it visits
// last, as many as fit the cache), its y (before D and the gate) and its blocks'
// prepared rows (delta after softplus, delta * u, u; SsTask::prep_blocks of them, all
// but at very long L). The forward pass then reads those dA instead of recomputing
// the exponentials (and recomputes the rest), reads the prepared rows instead of
// gathering them again, and writes out = (y_fwd + y_rev + 2 D u) * silu(z). The two
// directions' arithmetic is exactly that of two separate calls (same operations in
// the same order), so the fused result equals forward + reverse computed separately
// up to the final rounding of the sum.
//
// Few channels (at most lanes / 4 per task): the along-L path further down
// (time in the lanes). Fewer tasks than threads: a task is also run as pieces of
// its sequence (SsTask::split; run_piece here, the split branch of run_narrow).
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

// Per-task state and scratch (all inside SsTask::work).
struct Ctx {
  const SsParams* p;
  int64_t b, d0, N, L;
  int nch;
  int64_t row0;          // element offset of channel d0's row in u / delta / z / out
  int64_t bbase, cbase;  // element offset of (b, group, 0, 0) in B / C (variable)
  float *A2, *Bi, *Ci, *hs, *Bb, *Cb;  // [N][W]
  float *dl, *du, *ub, *yb, *tmp;      // [W][W]
  float *Dv, *biasv;                   // [W]
  float* yr;                           // [L][W]
  float* kp;                           // [kp_blocks][3][W][W] prepared dl, du, ub of the first
  int64_t kp_blocks;                   // blocks (bidirectional: kept by its first pass), or 0
  float* dA;                           // [dA_blocks * W][N][W] or null
  int64_t dA_blocks;                   // blocks of W steps from t = 0 kept in dA
  float* Ps;                           // [N][W] dA's running product (L split)
  float* ck;                           // checkpoints of this pass's direction (channel d0's
                                       // row + 1 + set offset; rows ckpt_row apart) or null
  float dmax;                          // delta <= dmax keeps delta * A2 >= -125 (-1: never)
};

inline void init_state(const Ctx& c) {
  const SsParams& p = *c.p;
  for (int64_t n = 0; n < c.N; ++n)
    for (int r = 0; r < W; ++r)
      c.hs[n * W + r] = (p.h0 != nullptr && r < c.nch)
                            ? ld1(p.h0, p.h0_t, ((c.b * p.dim + c.d0 + r) * c.N) + n)
                            : 0.0f;
}

inline void save_state(const Ctx& c, float* dst) {
  if (dst == nullptr) return;
  for (int r = 0; r < c.nch; ++r)
    for (int64_t n = 0; n < c.N; ++n)
      dst[(c.b * c.p->dim + c.d0 + r) * c.N + n] = c.hs[n * W + r];
}

// The block's rows in time order: delta (bias, softplus) in dl, delta * u in du, u in ub
// ([W][W] each; skipped with `rows_only`, when they were kept), and its B / C rows.
template <bool BVAR, bool CVAR>
JSS_INLINE void prepare(const Ctx& c, int64_t t0, int nt, float* dl, float* du, float* ub, bool rows_only) {
  const SsParams& p = *c.p;
  if (!rows_only) {
    gather_block(p.delta, p.delta_t, c.row0, c.L, c.nch, t0, nt, dl);
    gather_block(p.u, p.u_t, c.row0, c.L, c.nch, t0, nt, ub);
    const VF bias = simd::load(c.biasv);
    for (int tb = 0; tb < W; ++tb) {
      VF d = simd::load(dl + tb * W);
      if (p.delta_bias != nullptr) d = simd::add(d, bias);
      if (p.delta_softplus) d = simd::softplus(d);
      simd::store(dl + tb * W, d);
      simd::store(du + tb * W, simd::mul(d, simd::load(ub + tb * W)));
    }
  }
  auto rows = [&](const void* src, SsType ty, int64_t base, float* dst) {
    for (int64_t n = 0; n < c.N; ++n) {
      const int64_t off = base + n * c.L + t0;
      if (nt == W) {
        simd::store(dst + n * W, ldv(src, ty, off));
      } else {
        for (int tb = 0; tb < W; ++tb) dst[n * W + tb] = tb < nt ? ld1(src, ty, off + tb) : 0.0f;
      }
    }
  };
  if (BVAR) rows(p.B, p.B_t, c.bbase, c.Bb);
  if (CVAR) rows(p.C, p.C_t, c.cbase, c.Cb);
}

// out block = (y [+ y_rev] + k D u) * silu(z), or y kept in yr (first pass of bidirectional).
inline void finish_block(const Ctx& c, int64_t t0, int nt, bool to_yr, bool add_yr, const float* ub) {
  const SsParams& p = *c.p;
  if (to_yr) {
    for (int tb = 0; tb < nt; ++tb) simd::store(c.yr + (t0 + tb) * W, simd::load(c.yb + tb * W));
    return;
  }
  if (p.z != nullptr) gather_block(p.z, p.z_t, c.row0, c.L, c.nch, t0, nt, c.tmp);
  const VF dv = simd::load(c.Dv);
  for (int tb = 0; tb < W; ++tb) {
    VF y = simd::load(c.yb + tb * W);
    if (add_yr && tb < nt) y = simd::add(y, simd::load(c.yr + (t0 + tb) * W));
    if (p.D != nullptr) y = simd::fma(dv, simd::load(ub + tb * W), y);
    if (p.z != nullptr) y = simd::mul(y, simd::silu(simd::load(c.tmp + tb * W)));
    simd::store(c.yb + tb * W, y);
  }
  scatter_block(p.out, p.out_t, c.row0, c.L, c.nch, t0, nt, c.yb);
}

// DA: 0 compute exp, 1 compute and keep in c.dA, 2 read c.dA. NS: N when it is a
// compile-time constant (state in registers), 0 for any N (state in c.hs).
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

// Where a pass's prepared rows (dl, du, ub) live: kOwn, the task's one-block scratch; kKeep,
// computed into c.kp's block (the first pass of bidirectional); kKept, read from there (the
// second pass: the same values without the gathers and the softplus). Blocks from
// c.kp_blocks on have no kept rows and use kOwn.
enum class Prep { kOwn, kKeep, kKept };

// Scan-order blocks [bi0, bi1) (-1: all). TRACK (L split, phase 1): also keep dA's
// running product in c.Ps and return after the first block at whose end it is
// <= kSsCarryDrop in every lane and state (the returned index; bi1 when that never happens).
template <int NS, bool BVAR, bool CVAR, int DA, bool TRACK = false>
int64_t pass(const Ctx& c, bool reverse, bool to_yr, bool add_yr, int64_t bi0 = 0, int64_t bi1 = -1,
             Prep prep = Prep::kOwn) {
  const int64_t N = NS > 0 ? NS : c.N;
  VF hreg[NS > 0 ? NS : 1];
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) hreg[n] = simd::load(c.hs + n * W);
  }
  const int64_t nblocks = (c.L + W - 1) / W;
  if (bi1 < 0) bi1 = nblocks;
  for (int64_t bi = bi0; bi < bi1; ++bi) {
    const int64_t blk = reverse ? nblocks - 1 - bi : bi;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(c.L - t0 < W ? c.L - t0 : W);
    if (c.ck != nullptr) {  // the state entering the block, for the backward (SsParams::ckpt)
      if constexpr (NS > 0) {
        JSS_UNROLL
        for (int n = 0; n < NS; ++n) simd::store(c.hs + n * W, hreg[n]);
      }
      for (int r = 0; r < c.nch; ++r) {
        float* dst = c.ck + r * c.p->ckpt_row + blk * N;
        for (int64_t n = 0; n < N; ++n) dst[n] = c.hs[n * W + r];
      }
    }
    auto prefetch = [&](int sub, int nsub) JSS_INLINE_LAMBDA {
      prefetch_burst(bi, t0, reverse, c.L, c.nch, [&](int64_t tp, int r0, int r1) JSS_INLINE_LAMBDA {
        const int64_t base = c.row0 + r0 * c.L;
        const SsParams& p = *c.p;
        prefetch_rows(p.delta, p.delta_t, base, c.L, r1 - r0, tp, false);
        prefetch_rows(p.u, p.u_t, base, c.L, r1 - r0, tp, false);
        if (!to_yr) {
          if (p.z != nullptr) prefetch_rows(p.z, p.z_t, base, c.L, r1 - r0, tp, false);
          prefetch_rows(p.out, p.out_t, base, c.L, r1 - r0, tp, true);
        }
      }, sub, nsub);
    };
    const bool kept_block = prep != Prep::kOwn && blk < c.kp_blocks;
    float* dl = kept_block ? c.kp + blk * 3 * W * W : c.dl;
    float* du = kept_block ? dl + W * W : c.du;
    float* ub = kept_block ? du + W * W : c.ub;
    prepare<BVAR, CVAR>(c, t0, nt, dl, du, ub, kept_block && prep == Prep::kKept);
    for (int k = 0; k < nt; ++k) {
      constexpr int kEvery = W / kSsFwdPrefetchSub;
      if (k % kEvery == 0) prefetch(k / kEvery, kSsFwdPrefetchSub);
      const int tb = reverse ? nt - 1 - k : k;
      const VF dlv = simd::load(dl + tb * W);
      const VF duv = simd::load(du + tb * W);
      VF y = simd::broadcast(0.0f);
      float* dAp = DA != 0 ? c.dA + (t0 + tb) * N * W : nullptr;
      // One range check per step instead of one per state: delta in [0, dmax]
      // puts every delta * A2[n] of this task in exp2's fast range [-125, 0].
      const bool fast = DA == 2 || !simd::any_outside(dlv, 0.0f, c.dmax);
      auto step = [&](auto fast_tag, int64_t n, VF h) JSS_INLINE_LAMBDA {
        VF a;
        if constexpr (DA == 2) {
          a = simd::load(dAp + n * W);
        } else {
          const VF x = simd::mul(dlv, simd::load(c.A2 + n * W));
          a = decltype(fast_tag)::value ? simd::exp2_inrange(x) : simd::exp2_any(x);
          if constexpr (DA == 1) simd::store(dAp + n * W, a);
        }
        if constexpr (TRACK) simd::store(c.Ps + n * W, simd::mul(a, simd::load(c.Ps + n * W)));
        const VF bb = BVAR ? simd::broadcast(c.Bb[n * W + tb]) : simd::load(c.Bi + n * W);
        const VF cc = CVAR ? simd::broadcast(c.Cb[n * W + tb]) : simd::load(c.Ci + n * W);
        h = simd::fma(a, h, simd::mul(duv, bb));
        y = simd::fma(cc, h, y);
        return h;
      };
      auto all_states = [&](auto fast_tag) JSS_INLINE_LAMBDA {
        if constexpr (NS > 0) {
          JSS_UNROLL
          for (int n = 0; n < NS; ++n) hreg[n] = step(fast_tag, n, hreg[n]);
        } else {
          for (int64_t n = 0; n < N; ++n)
            simd::store(c.hs + n * W, step(fast_tag, n, simd::load(c.hs + n * W)));
        }
      };
      if (fast) all_states(std::true_type());
      else all_states(std::false_type());
      simd::store(c.yb + tb * W, y);
    }
    finish_block(c, t0, nt, to_yr, add_yr, ub);
    if constexpr (TRACK) {
      bool zero = true;
      for (int64_t n = 0; n < N; ++n)
        zero = zero && !simd::any_outside(simd::load(c.Ps + n * W), 0.0f, kSsCarryDrop);
      if (zero) {
        bi1 = bi + 1;
        break;
      }
    }
  }
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) simd::store(c.hs + n * W, hreg[n]);
  }
  return bi1;
}

// One direction of one piece of an L-split task (see SsTask).
template <int NS, bool BVAR, bool CVAR>
void run_piece(const Ctx& c, const SsTask& t) {
  const SsParams& p = *c.p;
  const bool reverse = t.reverse != 0;
  const bool to_yr = t.yr_mode == 1, add_yr = t.yr_mode == 2;
  const int64_t units = (c.L + W - 1) / W;
  const int64_t u0 = t.piece * units / t.pieces, u1 = (t.piece + 1) * units / t.pieces;
  const int64_t N = c.N;
  if (t.phase == 1) {
    if (t.piece == 0) {
      init_state(c);
      pass<NS, BVAR, CVAR, 0>(c, reverse, to_yr, add_yr, u0, u1);
      *t.window = u0;
      for (int64_t i = 0; i < N * W; ++i) c.Ps[i] = 0.0f;
    } else {
      for (int64_t n = 0; n < N; ++n)
        for (int r = 0; r < W; ++r) {
          c.hs[n * W + r] = 0.0f;
          c.Ps[n * W + r] = r < c.nch ? 1.0f : 0.0f;  // idle lanes: already "underflowed"
        }
      const int64_t w = pass<NS, BVAR, CVAR, 0, true>(c, reverse, to_yr, add_yr, u0, u1);
      if (w < u1) {
        pass<NS, BVAR, CVAR, 0>(c, reverse, to_yr, add_yr, w, u1);
        for (int64_t i = 0; i < N * W; ++i) c.Ps[i] = 0.0f;  // the dropped term
      }
      *t.window = w;
    }
    for (int r = 0; r < c.nch; ++r)
      for (int64_t n = 0; n < N; ++n) {
        t.hend[r * N + n] = c.hs[n * W + r];
        t.ptot[r * N + n] = c.Ps[n * W + r];
      }
    (void)p;
  } else {
    for (int64_t n = 0; n < N; ++n)
      for (int r = 0; r < W; ++r) c.hs[n * W + r] = r < c.nch ? t.hin[r * N + n] : 0.0f;
    pass<NS, BVAR, CVAR, 0>(c, reverse, to_yr, add_yr, u0, *t.window);
  }
}

template <int NS, bool BVAR, bool CVAR>
void run_task(const Ctx& c, const SsTask& t) {
  const SsParams& p = *c.p;
  if (t.split) {
    run_piece<NS, BVAR, CVAR>(c, t);
    return;
  }
  // Checkpoints (SsParams::ckpt): the driver checked ckpt_row; sets as ss_ckpt_row.
  Ctx& cm = const_cast<Ctx&>(c);
  float* row = p.ckpt != nullptr ? p.ckpt + (c.b * p.dim + c.d0) * p.ckpt_row : nullptr;
  const int64_t set = ((c.L + W - 1) / W) * c.N;
  cm.ck = row != nullptr ? row + 1 : nullptr;
  switch (p.direction) {
    case SsDirection::kForward:
      pass<NS, BVAR, CVAR, 0>(c, false, false, false);
      save_state(c, p.last_fwd);
      break;
    case SsDirection::kReverse:
      pass<NS, BVAR, CVAR, 0>(c, true, false, false);
      save_state(c, p.last_rev);
      break;
    case SsDirection::kBidirectional: {
      // dA of blocks [0, kb) is kept: the reverse pass's last kb blocks in its scan order,
      // the forward pass's first kb. Kept or recomputed, the values are the same.
      const int64_t nb = (c.L + W - 1) / W;
      const int64_t kb = c.dA == nullptr ? 0 : c.dA_blocks < nb ? c.dA_blocks : nb;
      // The prepared rows of the first c.kp_blocks blocks are kept too (Prep::kKeep), and
      // the forward pass reads them (Prep::kKept).
      if (kb < nb) pass<NS, BVAR, CVAR, 0>(c, true, true, false, 0, nb - kb, Prep::kKeep);
      if (kb > 0) pass<NS, BVAR, CVAR, 1>(c, true, true, false, nb - kb, nb, Prep::kKeep);
      save_state(c, p.last_rev);
      init_state(c);
      if (row != nullptr) cm.ck = row + 1 + set;
      if (kb > 0) pass<NS, BVAR, CVAR, 2>(c, false, false, true, 0, kb, Prep::kKept);
      if (kb < nb) pass<NS, BVAR, CVAR, 0>(c, false, false, true, kb, nb, Prep::kKept);
      save_state(c, p.last_fwd);
      break;
    }
  }
  cm.ck = nullptr;
  if (row != nullptr)
    for (int r = 0; r < c.nch; ++r) row[r * p.ckpt_row] = static_cast<float>(W);
}


// ---- the along-L path: few channels, time in the lanes --------------------------------
//
// A task with few channels would leave most lanes idle, so each of its channels
// runs with the time axis in the lanes. L is cut into chunks of W * S steps (S a
// multiple of W, ss_seg_len); in a chunk lane r owns the segment of S steps
// starting at r * S. Per chunk:
//   1. local pass, all W segments at once from a zero state (W x W tiles read as
//      rows of W steps of each segment and transposed in registers): for each
//      state n, h = dA h + delta u B, P = dA P (P: dA's product over the segment
//      so far), y += C h, and Q[n] = C P is kept (chunk buffer, L1);
//   2. carries, W scalar steps per state: the state entering segment r is
//      cin[r] = h_end[r-1] + P_end[r-1] * cin[r-1], from the chunk's entering state;
//   3. finish: y += sum_n Q[n] * cin[n] (the missing part of each segment's
//      states, C * prod(dA) * carry, from the kept Q: no exponential is
//      recomputed), transposed back to time order, + D u, * silu(z), stored.
// Inputs are read once and the output written once; only the chunk lives in
// scratch. Numerics: the carry term multiplies the entering state by products of
// dA (each <= 1 for A <= 0, delta >= 0), so nothing grows; the result differs from
// the sequential loop by float rounding only. The last L mod (W S) steps (the
// partial chunk) run in scalar code, last in scan order (after the chunks forward,
// i.e. at the sequence start in reverse).
struct Seg {
  const SsParams* p;
  int64_t N, L, S, CH, nchunks, tail;
  int64_t row, bb, cb;   // offsets of the channel's rows in u / delta / z / out, B, C
  float bias, dk, dmax;  // delta bias, k * D, delta range of the fast exp2
  int yr_mode;           // 0 none, 1 write yr (reverse half), 2 add yr (forward half)
  float* yr;             // [L] natural order (bidirectional)
  float *A2, *Bc, *Cc;   // [N]
  float *hs, *Ps, *cin, *hb;  // [N][W] (hb: the running state, all lanes equal)
  float *y, *Q;          // [S][W] (row j * W + tb of tile j), [N][S][W]
  float *dlT, *duT, *dun, *yt, *bT, *cT;  // [W][W]
};

inline float softplus1(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// Local pass of one tile (j) of the chunk at memory offset ct0; FAST: every
// delta * A2 of the tile is in exp2's fast range.
template <bool FAST, bool BVAR, bool CVAR, bool REV>
inline void seg_tile_states(const Seg& g, int64_t ct0, int64_t j) {
  const SsParams& p = *g.p;
  for (int64_t n = 0; n < g.N; ++n) {
    {
      VF r[W];
      if constexpr (BVAR) {
        load_rows(p.B, p.B_t, g.bb + n * g.L + ct0 + j * W, g.S, r);
        JSS_UNROLL
        for (int i = 0; i < W; ++i) r[i] = simd::mul(simd::load(g.dun + i * W), r[i]);
        simd::transpose(r);
        JSS_UNROLL
        for (int i = 0; i < W; ++i) simd::store(g.bT + i * W, r[i]);
      }
      if constexpr (CVAR) {
        load_rows(p.C, p.C_t, g.cb + n * g.L + ct0 + j * W, g.S, r);
        simd::transpose(r);
        JSS_UNROLL
        for (int i = 0; i < W; ++i) simd::store(g.cT + i * W, r[i]);
      }
    }
    const VF a2 = simd::broadcast(g.A2[n]);
    const VF bn = simd::broadcast(g.Bc[n]), cn = simd::broadcast(g.Cc[n]);
    VF h = simd::load(g.hs + n * W), P = simd::load(g.Ps + n * W);
    float* q = g.Q + (n * g.S + j * W) * W;
    const float* dlT = g.dlT;
    const float* bT = BVAR ? g.bT : g.duT;
    const float* cT = g.cT;
    float* yt = g.yt;
    const bool first = n == 0;
    JSS_UNROLL
    for (int k = 0; k < W; ++k) {
      const int tb = REV ? W - 1 - k : k;
      const VF x = simd::mul(simd::load(dlT + tb * W), a2);
      const VF a = FAST ? simd::exp2_inrange(x) : simd::exp2_any(x);
      const VF bt = BVAR ? simd::load(bT + tb * W) : simd::mul(simd::load(bT + tb * W), bn);
      const VF ct = CVAR ? simd::load(cT + tb * W) : cn;
      h = simd::fma(a, h, bt);
      P = simd::mul(a, P);
      const VF yv = first ? simd::mul(ct, h) : simd::fma(ct, h, simd::load(yt + tb * W));
      simd::store(yt + tb * W, yv);
      simd::store(q + tb * W, simd::mul(ct, P));
    }
    simd::store(g.hs + n * W, h);
    simd::store(g.Ps + n * W, P);
  }
}

template <bool FAST, bool REV>
JSS_INLINE void seg_tile_states_any(const Seg& g, int64_t ct0, int64_t j) {
  const SsParams& p = *g.p;
  if (p.b_var && p.c_var) seg_tile_states<FAST, true, true, REV>(g, ct0, j);
  else if (p.b_var) seg_tile_states<FAST, true, false, REV>(g, ct0, j);
  else if (p.c_var) seg_tile_states<FAST, false, true, REV>(g, ct0, j);
  else seg_tile_states<FAST, false, false, REV>(g, ct0, j);
}

// Step 1 for the chunk at memory offset ct0.
inline void seg_chunk_local(const Seg& g, int64_t ct0, bool reverse) {
  const SsParams& p = *g.p;
  for (int64_t n = 0; n < g.N; ++n) {
    simd::store(g.hs + n * W, simd::broadcast(0.0f));
    simd::store(g.Ps + n * W, simd::broadcast(1.0f));
  }
  const int64_t ntiles = g.S / W;
  for (int64_t jj = 0; jj < ntiles; ++jj) {
    const int64_t j = reverse ? ntiles - 1 - jj : jj;
    const int64_t base = g.row + ct0 + j * W;
    VF dl[W], du[W];
    load_rows(p.delta, p.delta_t, base, g.S, dl);
    load_rows(p.u, p.u_t, base, g.S, du);
    if (p.delta_bias != nullptr) {
      const VF bias = simd::broadcast(g.bias);
      JSS_UNROLL
      for (int i = 0; i < W; ++i) dl[i] = simd::add(dl[i], bias);
    }
    if (p.delta_softplus) {
      for (int i = 0; i < W; ++i) dl[i] = simd::softplus(dl[i]);
    }
    VF nlo = simd::neg(dl[0]), hi = dl[0];  // -min, max over the tile
    JSS_UNROLL
    for (int i = 0; i < W; ++i) {
      nlo = simd::max(nlo, simd::neg(dl[i]));
      hi = simd::max(hi, dl[i]);
      du[i] = simd::mul(dl[i], du[i]);
    }
    const bool fast =
        !simd::any_outside(simd::neg(nlo), 0.0f, g.dmax) && !simd::any_outside(hi, 0.0f, g.dmax);
    simd::transpose(dl);
    JSS_UNROLL
    for (int i = 0; i < W; ++i) {
      simd::store(g.dlT + i * W, dl[i]);
      simd::store(g.yt + i * W, simd::broadcast(0.0f));
    }
    if (p.b_var) {
      JSS_UNROLL
      for (int i = 0; i < W; ++i) simd::store(g.dun + i * W, du[i]);
    } else {
      simd::transpose(du);
      JSS_UNROLL
      for (int i = 0; i < W; ++i) simd::store(g.duT + i * W, du[i]);
    }
    if (fast) reverse ? seg_tile_states_any<true, true>(g, ct0, j) : seg_tile_states_any<true, false>(g, ct0, j);
    else reverse ? seg_tile_states_any<false, true>(g, ct0, j) : seg_tile_states_any<false, false>(g, ct0, j);
    for (int i = 0; i < W; ++i) simd::store(g.y + (j * W + i) * W, simd::load(g.yt + i * W));
  }
}

// Step 2: the state entering each segment, cin[n] = h_end + P_end * (state entering
// the segment before), as an affine scan over the lanes (log2 W levels in
// registers); hb[n] (the chunk's entering state, all lanes) becomes its end state;
// pcum (if not null) *= dA's product over the chunk.
template <bool REV>
inline void seg_chunk_carries(const Seg& g, float* pcum) {
  for (int64_t n = 0; n < g.N; ++n) {
    VF P = simd::load(g.Ps + n * W), H = simd::load(g.hs + n * W);
    scan_level<1, REV>(P, H);
    scan_level<2, REV>(P, H);
    scan_level<4, REV>(P, H);
    scan_level<8, REV>(P, H);
    const VF hin = simd::load(g.hb + n * W);
    const VF X = simd::fma(P, hin, H);  // state leaving each segment
    simd::store(g.cin + n * W, REV ? down<1>(X, hin) : up<1>(X, hin));
    simd::store(g.hb + n * W, REV ? first(X) : last(X));
    if (pcum != nullptr) {
      float tmp[W];
      simd::store(tmp, P);
      pcum[n] *= REV ? tmp[0] : tmp[W - 1];
    }
  }
}

// out (or yr) rows t0 + i * S (i < W) from the float rows y (time order).
JSS_INLINE void seg_out_rows(const Seg& g, int64_t t0, VF* y) {
  const SsParams& p = *g.p;
  if (g.yr_mode == 1) {
    JSS_UNROLL
    for (int i = 0; i < W; ++i) simd::store(g.yr + t0 + i * g.S, y[i]);
    return;
  }
  if (g.yr_mode == 2) {
    JSS_UNROLL
    for (int i = 0; i < W; ++i) y[i] = simd::add(y[i], simd::load(g.yr + t0 + i * g.S));
  }
  VF x[W];
  if (p.D != nullptr) {
    load_rows(p.u, p.u_t, g.row + t0, g.S, x);
    const VF dk = simd::broadcast(g.dk);
    JSS_UNROLL
    for (int i = 0; i < W; ++i) y[i] = simd::fma(dk, x[i], y[i]);
  }
  if (p.z != nullptr) {
    load_rows(p.z, p.z_t, g.row + t0, g.S, x);
    for (int i = 0; i < W; ++i) y[i] = simd::mul(y[i], simd::silu(x[i]));
  }
  store_rows(p.out, p.out_t, g.row + t0, g.S, y);
}

// Step 3.
inline void seg_chunk_finish(const Seg& g, int64_t ct0) {
  const int64_t ntiles = g.S / W;
  for (int64_t j = 0; j < ntiles; ++j) {
    VF yv[W];
    JSS_UNROLL
    for (int tb = 0; tb < W; ++tb) yv[tb] = simd::load(g.y + (j * W + tb) * W);
    for (int64_t n = 0; n < g.N; ++n) {
      const VF cn = simd::load(g.cin + n * W);
      const float* q = g.Q + (n * g.S + j * W) * W;
      JSS_UNROLL
      for (int tb = 0; tb < W; ++tb) yv[tb] = simd::fma(simd::load(q + tb * W), cn, yv[tb]);
    }
    simd::transpose(yv);
    seg_out_rows(g, ct0 + j * W, yv);
  }
}

// The partial chunk: scalar steps over memory range [t_begin, t_end) in scan order.
inline void seg_tail(const Seg& g, int64_t t_begin, int64_t t_end, bool reverse, float* h, float* pcum) {
  const SsParams& p = *g.p;
  for (int64_t k = 0; k < t_end - t_begin; ++k) {
    const int64_t t = reverse ? t_end - 1 - k : t_begin + k;
    float dl = ld1(p.delta, p.delta_t, g.row + t) + g.bias;
    if (p.delta_softplus) dl = softplus1(dl);
    const float du = dl * ld1(p.u, p.u_t, g.row + t);
    float y = 0.0f;
    for (int64_t n = 0; n < g.N; ++n) {
      const float b = p.b_var ? ld1(p.B, p.B_t, g.bb + n * g.L + t) : g.Bc[n];
      const float c = p.c_var ? ld1(p.C, p.C_t, g.cb + n * g.L + t) : g.Cc[n];
      const float a = std::exp2(dl * g.A2[n]);
      h[n] = a * h[n] + du * b;
      if (pcum != nullptr) pcum[n] *= a;
      y += c * h[n];
    }
    if (g.yr_mode == 1) {
      g.yr[t] = y;
      continue;
    }
    if (g.yr_mode == 2) y += g.yr[t];
    y += g.dk * ld1(p.u, p.u_t, g.row + t);
    if (p.z != nullptr) {
      const float z = ld1(p.z, p.z_t, g.row + t);
      y *= z / (1.0f + std::exp(-z));
    }
    st1(p.out, p.out_t, g.row + t, y);
  }
}

// dstate == 1: no transposes. Each vector of W consecutive steps is scanned in
// registers (Kogge-Stone over the lanes on the affine pairs (dA, delta u B), log2 W
// levels of lane shifts), then combined with the state entering it (one fma) and the
// state leaving it broadcast from the last lane (first in reverse): ~37 vector ops
// per W steps against ~57 for the transposed chunk with one state.
template <bool REV, bool TRACK, bool F32>
inline void seg_chunk_n1(const Seg& g, int64_t ct0) {
  const SsParams& p = *g.p;
  const VF a2 = simd::broadcast(g.A2[0]), bias = simd::broadcast(g.bias);
  const VF bc = simd::broadcast(g.Bc[0]), cc = simd::broadcast(g.Cc[0]), dk = simd::broadcast(g.dk);
  VF hb = simd::load(g.hb);
  VF pacc = simd::broadcast(1.0f);
  // F32: every array this loop touches is float32 (no per-load type switch).
  auto ld = [&](const void* q, SsType ty, int64_t i) JSS_INLINE_LAMBDA {
    return F32 ? simd::load(static_cast<const float*>(q) + i) : ldv(q, ty, i);
  };
  for (int v = 0; v < W; ++v) {
    const int64_t t = ct0 + (REV ? W - 1 - v : v) * W;
    const int64_t off = g.row + t;
    VF dl = ld(p.delta, p.delta_t, off);
    if (p.delta_bias != nullptr) dl = simd::add(dl, bias);
    if (p.delta_softplus) dl = simd::softplus(dl);
    const VF uv = ld(p.u, p.u_t, off);
    const VF x = simd::mul(dl, a2);
    VF P = simd::any_outside(dl, 0.0f, g.dmax) ? simd::exp2_any(x) : simd::exp2_inrange(x);
    VF H = simd::mul(simd::mul(dl, uv), p.b_var ? ld(p.B, p.B_t, g.bb + t) : bc);
    scan_level<1, REV>(P, H);
    scan_level<2, REV>(P, H);
    scan_level<4, REV>(P, H);
    scan_level<8, REV>(P, H);
    const VF h = simd::fma(P, hb, H);
    hb = REV ? first(h) : last(h);
    if constexpr (TRACK) pacc = simd::mul(pacc, REV ? first(P) : last(P));
    VF y = simd::mul(h, p.c_var ? ld(p.C, p.C_t, g.cb + t) : cc);
    if (g.yr_mode == 1) {
      simd::store(g.yr + t, y);
      continue;
    }
    if (g.yr_mode == 2) y = simd::add(y, simd::load(g.yr + t));
    if (p.D != nullptr) y = simd::fma(dk, uv, y);
    if (p.z != nullptr) y = simd::mul(y, simd::silu(ld(p.z, p.z_t, off)));
    if (F32) simd::store(static_cast<float*>(p.out) + off, y);
    else stv(p.out, p.out_t, off, y);
  }
  simd::store(g.hb, hb);
  if constexpr (TRACK) simd::store(g.Ps, pacc);
}

template <bool REV, bool TRACK>
inline void seg_chunk_n1_any(const Seg& g, int64_t ct0) {
  const SsParams& p = *g.p;
  const bool f32 = p.u_t == SsType::kF32 && p.delta_t == SsType::kF32 && p.out_t == SsType::kF32 &&
                   (!p.b_var || p.B_t == SsType::kF32) && (!p.c_var || p.C_t == SsType::kF32) &&
                   (p.z == nullptr || p.z_t == SsType::kF32);
  if (f32) seg_chunk_n1<REV, TRACK, true>(g, ct0);
  else seg_chunk_n1<REV, TRACK, false>(g, ct0);
}

// Units [u0, u1) in scan order (chunks, then the tail) from state h[N] (left at
// the end state). With pcum (dA's running product, [N]) the return value is the
// unit after which every pcum[n] was 0 (tracking stops there), else -1.
inline int64_t seg_units(const Seg& g, bool reverse, int64_t u0, int64_t u1, float* h, float* pcum) {
  int64_t closed = -1;
  for (int64_t n = 0; n < g.N; ++n) simd::store(g.hb + n * W, simd::broadcast(h[n]));
  for (int64_t u = u0; u < u1; ++u) {
    if (u < g.nchunks) {
      const int64_t ct0 = reverse ? g.L - (u + 1) * g.CH : u * g.CH;
      if (g.N == 1) {
        if (pcum != nullptr) {
          reverse ? seg_chunk_n1_any<true, true>(g, ct0) : seg_chunk_n1_any<false, true>(g, ct0);
          pcum[0] *= g.Ps[0];
        } else {
          reverse ? seg_chunk_n1_any<true, false>(g, ct0) : seg_chunk_n1_any<false, false>(g, ct0);
        }
      } else {
        seg_chunk_local(g, ct0, reverse);
        if (reverse) seg_chunk_carries<true>(g, pcum);
        else seg_chunk_carries<false>(g, pcum);
        seg_chunk_finish(g, ct0);
      }
      if (u + 1 == u1 || u + 1 == g.nchunks)
        for (int64_t n = 0; n < g.N; ++n) h[n] = g.hb[n * W];
    } else if (reverse) {
      seg_tail(g, 0, g.tail, true, h, pcum);
    } else {
      seg_tail(g, g.L - g.tail, g.L, false, h, pcum);
    }
    if (pcum != nullptr) {
      bool zero = true;
      for (int64_t n = 0; n < g.N; ++n) zero = zero && std::fabs(pcum[n]) <= kSsCarryDrop;
      if (zero) {
        closed = u + 1;
        for (int64_t n = 0; n < g.N; ++n) pcum[n] = 0.0f;  // the dropped term
        pcum = nullptr;
      }
    }
  }
  return closed;
}

inline void seg_setup(Seg& g, const SsParams& p, const SsTask& t, int64_t d, float* w) {
  auto take = [&](int64_t n) { float* r = w; w += (n + 15) / 16 * 16; return r; };
  g.p = &p;
  g.N = p.dstate;
  g.L = p.length;
  g.S = ss_seg_len(W, g.N);
  g.CH = g.S * W;
  g.nchunks = g.L / g.CH;
  g.tail = g.L - g.nchunks * g.CH;
  g.A2 = take(g.N); g.Bc = take(g.N); g.Cc = take(g.N);
  g.hs = take(g.N * W); g.Ps = take(g.N * W); g.cin = take(g.N * W); g.hb = take(g.N * W);
  g.y = take(g.CH); g.Q = take(g.N * g.CH);
  g.dlT = take(W * W); g.duT = take(W * W); g.dun = take(W * W); g.yt = take(W * W);
  g.bT = take(W * W); g.cT = take(W * W);
  const bool bidi = p.direction == SsDirection::kBidirectional;
  g.yr = t.split ? t.yr : bidi ? take(g.L) : nullptr;  // (ss_work_floats' `yr`)
  g.row = (t.b * p.dim + d) * p.length;
  g.bb = (t.b * p.b_groups + d / (p.dim / p.b_groups)) * p.dstate * p.length;
  g.cb = (t.b * p.c_groups + d / (p.dim / p.c_groups)) * p.dstate * p.length;
  g.bias = p.delta_bias != nullptr ? ld1(p.delta_bias, p.delta_bias_t, d) : 0.0f;
  g.dk = p.D != nullptr ? (bidi ? 2.0f : 1.0f) * ld1(p.D, p.D_t, d) : 0.0f;
  float a_min = 0.0f, a_max = -1.0f;
  for (int64_t n = 0; n < g.N; ++n) {
    g.A2[n] = ld1(p.A, p.A_t, d * g.N + n) * simd::kLog2e;
    g.Bc[n] = p.b_var ? 0.0f : ld1(p.B, p.B_t, d * g.N + n);
    g.Cc[n] = p.c_var ? 0.0f : ld1(p.C, p.C_t, d * g.N + n);
    a_min = g.A2[n] < a_min ? g.A2[n] : a_min;
    a_max = g.A2[n] > a_max ? g.A2[n] : a_max;
  }
  g.dmax = !(a_max <= 0.0f) ? -1.0f : a_min < 0.0f ? -125.0f / a_min : 3.0e38f;
}

inline void run_narrow(const SsParams& p, const SsTask& t) {
  Seg g;
  const int64_t N = p.dstate;
  float* w = t.work;
  float* h = w;            // [N]
  float* pcum = w + N;     // [N]
  float* h0 = w + 2 * N;   // [N]
  float* rest = w + (3 * N + 15) / 16 * 16;
  if (t.split) {
    // One direction, one piece, each channel in turn (the window: the largest of them).
    const bool reverse = t.reverse != 0;
    int64_t window = 0;
    for (int64_t r = 0; r < t.nch; ++r) {
      const int64_t d = t.d0 + r;
      seg_setup(g, p, t, d, rest);
      if (t.yr != nullptr) g.yr = t.yr + r * g.L;
      g.yr_mode = t.yr_mode;
      const int64_t units = g.nchunks + (g.tail != 0 ? 1 : 0);
      const int64_t u0 = t.piece * units / t.pieces, u1 = (t.piece + 1) * units / t.pieces;
      if (t.phase == 1) {
        for (int64_t n = 0; n < N; ++n) {
          h[n] = (t.piece == 0 && p.h0 != nullptr) ? ld1(p.h0, p.h0_t, (t.b * p.dim + d) * N + n) : 0.0f;
          pcum[n] = 1.0f;
        }
        const int64_t closed = seg_units(g, reverse, u0, u1, h, t.piece == 0 ? nullptr : pcum);
        for (int64_t n = 0; n < N; ++n) {
          t.hend[r * N + n] = h[n];
          t.ptot[r * N + n] = t.piece == 0 ? 0.0f : pcum[n];
        }
        const int64_t w = t.piece == 0 ? u0 : closed >= 0 ? closed : u1;
        window = r == 0 || w > window ? w : window;
      } else {
        for (int64_t n = 0; n < N; ++n) h[n] = t.hin[r * N + n];
        seg_units(g, reverse, u0, *t.window, h, nullptr);
      }
    }
    if (t.phase == 1) *t.window = window;
    return;
  }
  for (int64_t r = 0; r < t.nch; ++r) {
    const int64_t d = t.d0 + r;
    seg_setup(g, p, t, d, rest);
    const int64_t units = g.nchunks + (g.tail != 0 ? 1 : 0);
    const int64_t o = (t.b * p.dim + d) * N;
    for (int64_t n = 0; n < N; ++n) h0[n] = p.h0 != nullptr ? ld1(p.h0, p.h0_t, o + n) : 0.0f;
    const bool bidi = p.direction == SsDirection::kBidirectional;
    if (p.direction != SsDirection::kForward) {
      for (int64_t n = 0; n < N; ++n) h[n] = h0[n];
      g.yr_mode = bidi ? 1 : 0;
      seg_units(g, true, 0, units, h, nullptr);
      if (p.last_rev != nullptr)
        for (int64_t n = 0; n < N; ++n) p.last_rev[o + n] = h[n];
    }
    if (p.direction != SsDirection::kReverse) {
      for (int64_t n = 0; n < N; ++n) h[n] = h0[n];
      g.yr_mode = bidi ? 2 : 0;
      seg_units(g, false, 0, units, h, nullptr);
      if (p.last_fwd != nullptr)
        for (int64_t n = 0; n < N; ++n) p.last_fwd[o + n] = h[n];
    }
  }
}

inline void run(const SsParams& p, const SsTask& t) {
  if (ss_use_narrow(W, t.nch, p.length)) {
    run_narrow(p, t);
    return;
  }
  Ctx c;
  c.p = &p;
  c.b = t.b;
  c.d0 = t.d0;
  c.nch = static_cast<int>(t.nch);
  c.N = p.dstate;
  c.L = p.length;
  c.row0 = (t.b * p.dim + t.d0) * p.length;
  c.bbase = (t.b * p.b_groups + t.d0 / (p.dim / p.b_groups)) * p.dstate * p.length;
  c.cbase = (t.b * p.c_groups + t.d0 / (p.dim / p.c_groups)) * p.dstate * p.length;
  float* w = t.work;
  auto take = [&](int64_t n) { float* r = w; w += (n + 15) / 16 * 16; return r; };
  c.A2 = take(c.N * W); c.Bi = take(c.N * W); c.Ci = take(c.N * W); c.hs = take(c.N * W);
  c.Bb = take(c.N * W); c.Cb = take(c.N * W);
  c.dl = take(W * W); c.du = take(W * W); c.ub = take(W * W); c.yb = take(W * W);
  c.tmp = take(W * W);
  c.Dv = take(W); c.biasv = take(W);
  c.yr = t.split ? t.yr : p.direction == SsDirection::kBidirectional ? take(c.L * W) : nullptr;
  c.kp_blocks = !t.split && p.direction == SsDirection::kBidirectional ? t.prep_blocks : 0;
  c.kp = c.kp_blocks > 0 ? take(c.kp_blocks * 3 * W * W) : nullptr;
  c.dA = t.split ? nullptr : t.dA;
  c.dA_blocks = c.dA != nullptr ? t.dA_blocks : 0;
  c.Ps = take(c.N * W);
  c.ck = nullptr;

  const float k = p.direction == SsDirection::kBidirectional ? 2.0f : 1.0f;
  for (int r = 0; r < W; ++r) {
    const bool in = r < c.nch;
    const int64_t d = t.d0 + r;
    c.Dv[r] = (in && p.D != nullptr) ? k * ld1(p.D, p.D_t, d) : 0.0f;
    c.biasv[r] = (in && p.delta_bias != nullptr) ? ld1(p.delta_bias, p.delta_bias_t, d) : 0.0f;
    for (int64_t n = 0; n < c.N; ++n) {
      c.A2[n * W + r] = in ? ld1(p.A, p.A_t, d * c.N + n) * simd::kLog2e : 0.0f;
      c.Bi[n * W + r] = (in && !p.b_var) ? ld1(p.B, p.B_t, d * c.N + n) : 0.0f;
      c.Ci[n * W + r] = (in && !p.c_var) ? ld1(p.C, p.C_t, d * c.N + n) : 0.0f;
    }
  }
  float a_min = 0.0f, a_max = -1.0f;
  for (int64_t i = 0; i < c.N * W; ++i) {
    a_min = c.A2[i] < a_min ? c.A2[i] : a_min;
    a_max = c.A2[i] > a_max ? c.A2[i] : a_max;
  }
  c.dmax = !(a_max <= 0.0f) ? -1.0f : a_min < 0.0f ? -125.0f / a_min : 3.0e38f;
  init_state(c);
  const bool n16 = c.N == 16;
  if (p.b_var && p.c_var) n16 ? run_task<16, true, true>(c, t) : run_task<0, true, true>(c, t);
  else if (p.b_var) n16 ? run_task<16, true, false>(c, t) : run_task<0, true, false>(c, t);
  else if (p.c_var) n16 ? run_task<16, false, true>(c, t) : run_task<0, false, true>(c, t);
  else n16 ? run_task<16, false, false>(c, t) : run_task<0, false, false>(c, t);
}

}  // namespace ss
}  // namespace
}  // namespace jax_selscan
