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
// per-task buffer (length * N * lanes floats) and keeps its y (before D and
// the gate) in another; the forward pass then reads dA instead of
// recomputing the exponentials, and writes out = (y_fwd + y_rev + 2 D u) *
// silu(z). The two directions' arithmetic is exactly that of two separate
// calls (same operations in the same order), so the fused result equals
// forward + reverse computed separately up to the final rounding of the sum.
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

// The inverse: p[base + r * stride + t0 + tb] = buf[tb * W + r] for r < nch, tb < nt.
inline void scatter_block(void* p, SsType ty, int64_t base, int64_t stride, int nch, int64_t t0,
                          int nt, const float* buf) {
  if (nch == W && nt == W) {
    VF r[W];
    JSS_UNROLL
    for (int i = 0; i < W; ++i) r[i] = simd::load(buf + i * W);
    simd::transpose(r);
    JSS_UNROLL
    for (int i = 0; i < W; ++i) stv(p, ty, base + i * stride + t0, r[i]);
    return;
  }
  for (int tb = 0; tb < nt; ++tb)
    for (int r = 0; r < nch; ++r) st1(p, ty, base + r * stride + t0 + tb, buf[tb * W + r]);
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
  float* dA;                           // [L][N][W] or null
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

// delta (bias, softplus), delta * u, u, and the block's B / C rows.
template <bool BVAR, bool CVAR>
JSS_INLINE void prepare(const Ctx& c, int64_t t0, int nt) {
  const SsParams& p = *c.p;
  gather_block(p.delta, p.delta_t, c.row0, c.L, c.nch, t0, nt, c.dl);
  gather_block(p.u, p.u_t, c.row0, c.L, c.nch, t0, nt, c.ub);
  const VF bias = simd::load(c.biasv);
  for (int tb = 0; tb < W; ++tb) {
    VF d = simd::load(c.dl + tb * W);
    if (p.delta_bias != nullptr) d = simd::add(d, bias);
    if (p.delta_softplus) d = simd::softplus(d);
    simd::store(c.dl + tb * W, d);
    simd::store(c.du + tb * W, simd::mul(d, simd::load(c.ub + tb * W)));
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
inline void finish_block(const Ctx& c, int64_t t0, int nt, bool to_yr, bool add_yr) {
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
    if (p.D != nullptr) y = simd::fma(dv, simd::load(c.ub + tb * W), y);
    if (p.z != nullptr) y = simd::mul(y, simd::silu(simd::load(c.tmp + tb * W)));
    simd::store(c.yb + tb * W, y);
  }
  scatter_block(p.out, p.out_t, c.row0, c.L, c.nch, t0, nt, c.yb);
}

// DA: 0 compute exp, 1 compute and keep in c.dA, 2 read c.dA. NS: N when it is a
// compile-time constant (state in registers), 0 for any N (state in c.hs).
template <int NS, bool BVAR, bool CVAR, int DA>
void pass(const Ctx& c, bool reverse, bool to_yr, bool add_yr) {
  const int64_t N = NS > 0 ? NS : c.N;
  VF hreg[NS > 0 ? NS : 1];
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) hreg[n] = simd::load(c.hs + n * W);
  }
  const int64_t nblocks = (c.L + W - 1) / W;
  for (int64_t bi = 0; bi < nblocks; ++bi) {
    const int64_t blk = reverse ? nblocks - 1 - bi : bi;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(c.L - t0 < W ? c.L - t0 : W);
    prepare<BVAR, CVAR>(c, t0, nt);
    for (int k = 0; k < nt; ++k) {
      const int tb = reverse ? nt - 1 - k : k;
      const VF dlv = simd::load(c.dl + tb * W);
      const VF duv = simd::load(c.du + tb * W);
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
    finish_block(c, t0, nt, to_yr, add_yr);
  }
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) simd::store(c.hs + n * W, hreg[n]);
  }
}

template <int NS, bool BVAR, bool CVAR>
void run_task(const Ctx& c) {
  const SsParams& p = *c.p;
  switch (p.direction) {
    case SsDirection::kForward:
      pass<NS, BVAR, CVAR, 0>(c, false, false, false);
      save_state(c, p.last_fwd);
      break;
    case SsDirection::kReverse:
      pass<NS, BVAR, CVAR, 0>(c, true, false, false);
      save_state(c, p.last_rev);
      break;
    case SsDirection::kBidirectional:
      if (c.dA != nullptr) pass<NS, BVAR, CVAR, 1>(c, true, true, false);
      else pass<NS, BVAR, CVAR, 0>(c, true, true, false);
      save_state(c, p.last_rev);
      init_state(c);
      if (c.dA != nullptr) pass<NS, BVAR, CVAR, 2>(c, false, false, true);
      else pass<NS, BVAR, CVAR, 0>(c, false, false, true);
      save_state(c, p.last_fwd);
      break;
  }
}


// ---- narrow tasks: one channel, vectorised along L ------------------------------------
//
// A task with few channels would leave most lanes idle. Instead each of its channels
// is cut into W segments of S = L / W steps, one per lane (the rows of a block are
// then segments, W x W blocks transposed as for channels). Pass 1 runs every
// segment from a zero state (the first segment in scan order from h0) and keeps
// y, its final state and sum(delta); the true state entering each segment follows
// by a W-step scalar carry (P = exp(A * sum delta) over a segment); pass 2 runs the
// homogeneous recurrence h = dA h from those carries and adds C h to y. The last
// L - W S steps run in scalar code (after the segments forward, before them in
// reverse). Costs two exponentials per step, on W lanes instead of one.
struct Seg {
  const SsParams* p;
  int64_t N, L, S, M;  // M = W * S steps in segments
  int64_t row;         // element offset of the channel's row in u / delta / z / out
  int64_t bb, cb;      // offsets of the channel's (group's) B / C rows (variable)
  int64_t d;
  float bias;
  float *A2, *Bc, *Cc;   // [N] (A * log2 e, invariant B / C)
  float *hs, *dsum;      // [N][W], [W]
  float *dl, *du, *Bb, *Cb, *yb, *tmp;  // [W][W] (Bb, Cb: [N][W][W])
  float* y;              // [L] accumulated y (no D, no gate)
  float* dls;            // [M] delta after bias / softplus, in block-transposed order
};

inline float softplus1(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// One direction's segment passes (pass 1 when !homog, else pass 2).
inline void seg_pass(const Seg& g, bool reverse, bool homog) {
  const SsParams& p = *g.p;
  const int64_t nblocks = (g.S + W - 1) / W;
  for (int64_t bi = 0; bi < nblocks; ++bi) {
    const int64_t blk = reverse ? nblocks - 1 - bi : bi;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(g.S - t0 < W ? g.S - t0 : W);
    float* dlb = g.dls + blk * W * W;
    if (!homog) {
      gather_block(p.delta, p.delta_t, g.row, g.S, W, t0, nt, g.dl);
      gather_block(p.u, p.u_t, g.row, g.S, W, t0, nt, g.tmp);
      for (int tb = 0; tb < W; ++tb) {
        VF d = simd::add(simd::load(g.dl + tb * W), simd::broadcast(g.bias));
        if (p.delta_softplus) d = simd::softplus(d);
        if (tb >= nt) d = simd::broadcast(0.0f);
        simd::store(dlb + tb * W, d);
        simd::store(g.du + tb * W, simd::mul(d, simd::load(g.tmp + tb * W)));
        simd::store(g.dsum, simd::add(simd::load(g.dsum), d));
      }
      if (p.b_var)
        for (int64_t n = 0; n < g.N; ++n)
          gather_block(p.B, p.B_t, g.bb + n * g.L, g.S, W, t0, nt, g.Bb + n * W * W);
    }
    if (p.c_var)
      for (int64_t n = 0; n < g.N; ++n)
        gather_block(p.C, p.C_t, g.cb + n * g.L, g.S, W, t0, nt, g.Cb + n * W * W);
    for (int k = 0; k < nt; ++k) {
      const int tb = reverse ? nt - 1 - k : k;
      const VF dlv = simd::load(dlb + tb * W);
      const VF duv = homog ? simd::broadcast(0.0f) : simd::load(g.du + tb * W);
      VF y = simd::broadcast(0.0f);
      for (int64_t n = 0; n < g.N; ++n) {
        const VF a = simd::exp2_any(simd::mul(dlv, simd::broadcast(g.A2[n])));
        VF h = simd::load(g.hs + n * W);
        if (homog) {
          h = simd::mul(a, h);
        } else {
          const VF b = p.b_var ? simd::load(g.Bb + (n * W + tb) * W) : simd::broadcast(g.Bc[n]);
          h = simd::fma(a, h, simd::mul(duv, b));
        }
        simd::store(g.hs + n * W, h);
        const VF c = p.c_var ? simd::load(g.Cb + (n * W + tb) * W) : simd::broadcast(g.Cc[n]);
        y = simd::fma(c, h, y);
      }
      simd::store(g.yb + tb * W, y);
    }
    // y (rows = segments, stride S) += this block.
    gather_block(g.y, SsType::kF32, 0, g.S, W, t0, nt, g.tmp);
    for (int tb = 0; tb < W; ++tb)
      simd::store(g.tmp + tb * W, simd::add(simd::load(g.tmp + tb * W), simd::load(g.yb + tb * W)));
    scatter_block(g.y, SsType::kF32, 0, g.S, W, t0, nt, g.tmp);
  }
}

// Scalar steps [t_begin, t_end) of one direction from state h[N] (float).
inline void seg_scalar(const Seg& g, int64_t t_begin, int64_t t_end, bool reverse, float* h) {
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
      h[n] = std::exp2(dl * g.A2[n]) * h[n] + du * b;
      y += c * h[n];
    }
    g.y[t] += y;
  }
}

// One direction for one channel; leaves the last state in h[N].
inline void seg_direction(const Seg& g, bool reverse, const float* h0, float* h) {
  for (int64_t n = 0; n < g.N; ++n) h[n] = h0 != nullptr ? h0[n] : 0.0f;
  if (reverse) seg_scalar(g, g.M, g.L, true, h);  // the tail first
  const int first = reverse ? W - 1 : 0;
  for (int64_t n = 0; n < g.N; ++n)
    for (int r = 0; r < W; ++r) g.hs[n * W + r] = r == first ? h[n] : 0.0f;
  for (int r = 0; r < W; ++r) g.dsum[r] = 0.0f;
  seg_pass(g, reverse, false);
  // Carries: the true state entering each segment, in scan order.
  for (int64_t n = 0; n < g.N; ++n) {
    float carry = 0.0f;
    for (int k = 0; k < W; ++k) {
      const int r = reverse ? W - 1 - k : k;
      const float local_end = g.hs[n * W + r];
      g.hs[n * W + r] = carry;  // pass 2 starts segment r from its missing part
      carry = local_end + std::exp2(g.A2[n] * g.dsum[r]) * carry;
    }
    h[n] = carry;
  }
  seg_pass(g, reverse, true);
  if (!reverse) seg_scalar(g, g.M, g.L, false, h);  // the tail last
}

inline void run_narrow(const SsParams& p, const SsTask& t) {
  float* w = t.work;
  auto take = [&](int64_t n) { float* r = w; w += (n + 15) / 16 * 16; return r; };
  Seg g;
  g.p = &p;
  g.N = p.dstate;
  g.L = p.length;
  // Segment length S = 16 (mod 32): segments a power of two apart would all map to
  // the same L1 sets (every block reads W rows, S apart, of u, delta, B, C and y).
  g.S = (p.length / W - 16) / 32 * 32 + 16;
  g.M = g.S * W;
  g.A2 = take(g.N); g.Bc = take(g.N); g.Cc = take(g.N);
  g.hs = take(g.N * W); g.dsum = take(W);
  g.dl = take(W * W); g.du = take(W * W); g.yb = take(W * W); g.tmp = take(W * W);
  g.Bb = take(g.N * W * W); g.Cb = take(g.N * W * W);
  float* hf = take(g.N);
  float* hr = take(g.N);
  float* h0 = take(g.N);
  g.y = take(g.L);
  g.dls = take(((g.S + W - 1) / W) * W * W);
  const bool bidi = p.direction == SsDirection::kBidirectional;
  for (int64_t r = 0; r < t.nch; ++r) {
    const int64_t d = t.d0 + r;
    g.d = d;
    g.row = (t.b * p.dim + d) * p.length;
    g.bb = (t.b * p.b_groups + d / (p.dim / p.b_groups)) * p.dstate * p.length;
    g.cb = (t.b * p.c_groups + d / (p.dim / p.c_groups)) * p.dstate * p.length;
    g.bias = p.delta_bias != nullptr ? ld1(p.delta_bias, p.delta_bias_t, d) : 0.0f;
    for (int64_t n = 0; n < g.N; ++n) {
      g.A2[n] = ld1(p.A, p.A_t, d * g.N + n) * simd::kLog2e;
      g.Bc[n] = p.b_var ? 0.0f : ld1(p.B, p.B_t, d * g.N + n);
      g.Cc[n] = p.c_var ? 0.0f : ld1(p.C, p.C_t, d * g.N + n);
      h0[n] = p.h0 != nullptr ? ld1(p.h0, p.h0_t, (t.b * p.dim + d) * g.N + n) : 0.0f;
    }
    for (int64_t i = 0; i < g.L; ++i) g.y[i] = 0.0f;
    if (p.direction != SsDirection::kReverse) seg_direction(g, false, h0, hf);
    if (p.direction != SsDirection::kForward) seg_direction(g, true, h0, hr);
    for (int64_t n = 0; n < g.N; ++n) {
      const int64_t o = (t.b * p.dim + d) * g.N + n;
      if (p.last_fwd != nullptr && p.direction != SsDirection::kReverse) p.last_fwd[o] = hf[n];
      if (p.last_rev != nullptr && p.direction != SsDirection::kForward) p.last_rev[o] = hr[n];
    }
    // out = (y + k D u) * silu(z), along L.
    const float dk = p.D != nullptr ? (bidi ? 2.0f : 1.0f) * ld1(p.D, p.D_t, d) : 0.0f;
    int64_t i = 0;
    for (; i + W <= g.L; i += W) {
      VF y = simd::fma(simd::broadcast(dk), ldv(p.u, p.u_t, g.row + i), simd::load(g.y + i));
      if (p.z != nullptr) y = simd::mul(y, simd::silu(ldv(p.z, p.z_t, g.row + i)));
      stv(p.out, p.out_t, g.row + i, y);
    }
    for (; i < g.L; ++i) {
      float y = g.y[i] + dk * ld1(p.u, p.u_t, g.row + i);
      if (p.z != nullptr) {
        const float z = ld1(p.z, p.z_t, g.row + i);
        y *= z / (1.0f + std::exp(-z));
      }
      st1(p.out, p.out_t, g.row + i, y);
    }
  }
}

// Narrow path when a task fills at most a quarter of the lanes and each lane gets
// at least 4 blocks of steps.
inline bool use_narrow(const SsParams& p, int64_t nch) {
  return nch * 4 <= W && p.length >= 4 * W * W && p.length / W >= 48;
}

inline void run(const SsParams& p, const SsTask& t) {
  if (use_narrow(p, t.nch)) {
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
  c.yr = p.direction == SsDirection::kBidirectional ? take(c.L * W) : nullptr;
  c.dA = t.dA;

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
  if (p.b_var && p.c_var) n16 ? run_task<16, true, true>(c) : run_task<0, true, true>(c);
  else if (p.b_var) n16 ? run_task<16, true, false>(c) : run_task<0, true, false>(c);
  else if (p.c_var) n16 ? run_task<16, false, true>(c) : run_task<0, false, true>(c);
  else n16 ? run_task<16, false, false>(c) : run_task<0, false, false>(c);
}

}  // namespace ss
}  // namespace
}  // namespace jax_selscan
