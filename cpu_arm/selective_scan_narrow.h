// The fused selective scan's along-L path: few channels per task, time in the lanes
// (chosen by ss_use_narrow; selective_scan.h's run() dispatches here).
#pragma once

#include <cmath>
#include <cstdint>

#include "selective_scan_api.h"
#include "selective_scan_rows.h"

namespace jax_selscan {
namespace {
namespace ss {

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

}  // namespace ss
}  // namespace
}  // namespace jax_selscan
