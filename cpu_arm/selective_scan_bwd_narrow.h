// The selective-scan backward for few channels: time in the lanes (one source for every ISA;
// included by selective_scan_bwd.h, whose run() hands it the tasks ss_use_narrow picks).
//
// The channel path (selective_scan_bwd.h) puts a task's channels in the lanes; a task of one
// channel uses 1 lane of 16 and ran at ~70 ns per step. Here each channel of the task runs
// with W consecutive steps in the lanes of a vector (a "unit"; the last L mod W steps form a
// scalar unit, last in memory); the task's channels take each unit in turn, so that B's and
// C's lines are read once per unit. Per direction:
//   sweep: the forward recurrence unit by unit in scan order: a unit's states by a
//     Kogge-Stone scan of the affine pairs (dA, delta u B) over its lanes and one fma with
//     the state entering it, which is kept as the unit's checkpoint (ck, [units][N]);
//   walk: units in reverse scan order: the unit's states again from its checkpoint, then
//     the adjoint G[t] = C[t] dy[t] + dA[t'] G[t'] (t': the next step in scan order) by the
//     mirrored scan of the pairs (dA moved by one lane, C dy) and one fma with the adjoint
//     carried in (g = dA G of the unit's first step), and every gradient from G, h[t-1] and
//     h[t] as in the channel path's walk.
// L split (SsBwdTask::split; the driver's three phases, selective_scan_bwd_cpu.cc):
//   1: the piece's sweep from zero (piece 0: from h0), keeping with each checkpoint dA's
//      product since the piece's start (ckP); hend, ptot: the piece's end state and product;
//   2: the checkpoints made true (ck += ckP hin); the last piece walks in full from the
//      last state's cotangent; the others run the adjoint alone from zero (gend, and qtot:
//      the product of dA over the piece), leaving their whole piece to phase 3;
//   3: the walk in full from the adjoint entering the piece (gin).
// Sums over time (dA, dD, delta_bias, invariant B / C) are kept per lane in blocks of kBlk
// units, then added over blocks and lanes in a fixed order; varying dB / dC rows, summed
// over the task's channels in order, go to the task's [L][N] partial, or straight into the
// gradient's [N][L] rows when the task is alone in its group (SsBwdTask::direct_b / _c):
// deterministic, as the channel path. Bidirectional: the reverse half leaves its du, ddelta
// and y sums in the du, ddelta and dz rows, which the forward half finishes in place.
// Work per (t, n): two exp2 (three for a split piece but the last), two lane scans.
#pragma once

#include <cmath>
#include <cstring>

#include "selective_scan_rows.h"
#include "selective_scan_bwd_api.h"

namespace jax_selscan {
namespace {
namespace ssbn {

using simd::VF;
using ss::down;
using ss::first;
using ss::last;
using ss::scan_level;
using ss::up;
constexpr int W = VF::kLanes;
constexpr int64_t kBlk = 64;  // units per block of the two-level sums over time

// One channel's parameters, state and sums.
struct Chan {
  int64_t row;                // offset of the channel's row in u / delta / z / dout
  float bias, dv, dmax;       // delta bias, k * D, delta range of the fast exp2
  float *A2, *Av, *Bc, *Cc;   // [N]
  float *ck, *ckP;            // [units][N]
  float *hb, *g, *P;          // [N][W], every lane alike: state, adjoint carry, dA's product
  float *accA, *accB, *accC, *blkA, *blkB, *blkC;  // [N][W]
  float *accD, *accBias, *blkD, *blkBias;          // [W]
  float *sy, *sdu, *sdd;      // [L]: the reverse half's sums (bidirectional), or null: the
                              // channel's rows of dz, du and ddelta, which the forward half
                              // then finishes in place (no scratch of size L to fault in)
};

struct NCtx {
  const SsBwdParams* q;
  const SsParams* p;
  int64_t N, NP, L, nvec, tail, units;
  int64_t bb, cb;             // the task's B / C rows
  int nch;
  Chan ch[W];                 // the task's channels (nch <= W / 4)
  float *tileB, *tileC;       // [NP][W]: a unit's varying dB / dC summed over the channels
  float *pB, *pC;             // [L][N] partials (varying B / C), or [N][L] gradient rows
  bool direct_b, direct_c;    // (SsBwdTask::direct_b / direct_c)
  bool store_rows;            // the first channel writes its dB / dC rows (=) rather than adding
  float *ta, *th;             // [W][N]: a tail unit's dA and states
  int64_t blk_units;          // units summed into the blk arrays so far
};

JSS_INLINE float scalar_sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Scan-order unit u: its first step in memory and its length (W, or the tail's).
JSS_INLINE int64_t unit_start(const NCtx& c, bool rev, int64_t u, int* nt) {
  const int64_t v = !rev ? u : c.tail != 0 ? (u == 0 ? c.nvec : c.nvec - u) : c.nvec - 1 - u;
  *nt = v == c.nvec ? static_cast<int>(c.tail) : W;
  return v * W;
}

JSS_INLINE float lane0(const float* x) { return x[0]; }
JSS_INLINE void set_all(float* x, float v) { simd::store(x, simd::broadcast(v)); }

// The sweep's and the walk's prefetch: at every kBurst-th unit, the lines of the kBurst units
// from kAhead units on in their direction (one line per row and unit: W floats) of every row
// they read (B, C, delta, u, dout, z) and write (dB / dC rows written directly; du, ddelta,
// dz). Without it the walk ran at half speed with N = 16: its 2 N rows of B and C (and of
// dB and dC), taken downwards one line per unit, are more streams than the hardware
// prefetchers follow. One line per unit 8 units ahead gained a third of that; bursts of 8
// from the next unit on, a third more (farther bursts were slower: the lines of two bursts
// outgrow L1 at N = 16; PERFORMANCE_CPU, session 34). Always inlined (see ss::prefetch_burst).
#ifndef JSS_NB_AHEAD
#define JSS_NB_AHEAD 1
#endif
#ifndef JSS_NB_BURST
#define JSS_NB_BURST 8
#endif
constexpr int64_t kAhead = JSS_NB_AHEAD, kBurst = JSS_NB_BURST;
JSS_INLINE void prefetch_unit(const NCtx& c, int64_t t, bool walk) {
  if (t < 0 || t >= c.L) return;
  const SsParams& p = *c.p;
  const SsBwdParams& q = *c.q;
  const int n = static_cast<int>(c.N);
  if (p.b_var) ss::prefetch_rows(p.B, p.B_t, c.bb, c.L, n, t, false);
  if (walk && p.c_var) ss::prefetch_rows(p.C, p.C_t, c.cb, c.L, n, t, false);
  if (walk && c.direct_b) ss::prefetch_rows(c.pB, SsType::kF32, 0, c.L, n, t, true);
  if (walk && c.direct_c) ss::prefetch_rows(c.pC, SsType::kF32, 0, c.L, n, t, true);
  for (int r = 0; r < c.nch; ++r) {
    const int64_t row = c.ch[r].row;
    ss::prefetch_rows(p.delta, p.delta_t, row, 0, 1, t, false);
    ss::prefetch_rows(p.u, p.u_t, row, 0, 1, t, false);
    if (!walk) continue;
    ss::prefetch_rows(q.dout, q.dout_t, row, 0, 1, t, false);
    if (p.z != nullptr) ss::prefetch_rows(p.z, p.z_t, row, 0, 1, t, false);
    // du, ddelta, dz: written by every walk (the reverse half of a bidirectional call keeps its
    // sums there).
    ss::prefetch_rows(q.du, SsType::kF32, row, 0, 1, t, true);
    ss::prefetch_rows(q.ddelta, SsType::kF32, row, 0, 1, t, true);
    if (q.dz != nullptr) ss::prefetch_rows(q.dz, SsType::kF32, row, 0, 1, t, true);
  }
}

// delta (bias, softplus; sg: the softplus' derivative) and u of a unit, as vectors.
struct UnitIn {
  VF dl, sg, uv, duv;
  bool fast;
};
JSS_INLINE UnitIn unit_in(const NCtx& c, const Chan& h, int64_t t0, bool want_sg) {
  const SsParams& p = *c.p;
  UnitIn r;
  VF d = simd::add(ss::ldv(p.delta, p.delta_t, h.row + t0), simd::broadcast(h.bias));
  r.sg = simd::broadcast(1.0f);
  if (p.delta_softplus) d = want_sg ? simd::softplus_sigmoid(d, &r.sg) : simd::softplus(d);
  r.dl = d;
  r.uv = ss::ldv(p.u, p.u_t, h.row + t0);
  r.duv = simd::mul(d, r.uv);
  r.fast = !simd::any_outside(d, 0.0f, h.dmax);
  return r;
}

JSS_INLINE float scalar_delta(const NCtx& c, const Chan& h, int64_t t, float* sg) {
  const SsParams& p = *c.p;
  float d = ss::ld1(p.delta, p.delta_t, h.row + t) + h.bias;
  *sg = 1.0f;
  if (p.delta_softplus) {
    *sg = scalar_sigmoid(d);
    d = ss::softplus1(d);
  }
  return d;
}

// A tail unit's dA and states (ta, th: [k][N], k in scan order) from the state in hb, which
// is left at the unit's end state; P (if tracking) times the unit's dA.
inline void tail_states(NCtx& c, Chan& h, bool rev, int64_t t0, int nt, bool track) {
  const SsParams& p = *c.p;
  for (int k = 0; k < nt; ++k) {
    const int64_t t = rev ? t0 + nt - 1 - k : t0 + k;
    float sg;
    const float dl = scalar_delta(c, h, t, &sg);
    const float du = dl * ss::ld1(p.u, p.u_t, h.row + t);
    for (int64_t n = 0; n < c.N; ++n) {
      const float b = p.b_var ? ss::ld1(p.B, p.B_t, c.bb + n * c.L + t) : h.Bc[n];
      const float a = std::exp2(dl * h.A2[n]);
      const float x = a * lane0(h.hb + n * W) + du * b;
      set_all(h.hb + n * W, x);
      if (track) set_all(h.P + n * W, lane0(h.P + n * W) * a);
      c.ta[k * c.N + n] = a;
      c.th[k * c.N + n] = x;
    }
  }
}

// The sweep over scan-order units [u0, u1) from each channel's hb (left at the end state),
// each unit's entering state into ck; with `track`, dA's product since u0 (in P) into ckP.
template <bool REV, bool BVAR>
void sweep(NCtx& c, int64_t u0, int64_t u1, bool track) {
  const SsParams& p = *c.p;
  const int64_t N = c.N;
  for (int64_t u = u0; u < u1; ++u) {
    int nt;
    const int64_t t0 = unit_start(c, REV, u, &nt);
    if ((u - u0) % kBurst == 0)
      for (int64_t k = 0; k < kBurst; ++k) prefetch_unit(c, REV ? t0 - (kAhead + k) * W : t0 + (kAhead + k) * W, false);
    for (int r = 0; r < c.nch; ++r) {
      Chan& h = c.ch[r];
      for (int64_t n = 0; n < N; ++n) {
        h.ck[u * N + n] = lane0(h.hb + n * W);
        if (track) h.ckP[u * N + n] = lane0(h.P + n * W);
      }
      if (nt < W) {
        tail_states(c, h, REV, t0, nt, track);
        continue;
      }
      const UnitIn in = unit_in(c, h, t0, false);
      for (int64_t n = 0; n < N; ++n) {
        const VF x = simd::mul(in.dl, simd::broadcast(h.A2[n]));
        VF Pv = in.fast ? simd::exp2_inrange(x) : simd::exp2_any(x);
        VF H = simd::mul(in.duv, BVAR ? ss::ldv(p.B, p.B_t, c.bb + n * c.L + t0) : simd::broadcast(h.Bc[n]));
        scan_level<1, REV>(Pv, H);
        scan_level<2, REV>(Pv, H);
        scan_level<4, REV>(Pv, H);
        scan_level<8, REV>(Pv, H);
        const VF hv = simd::fma(Pv, simd::load(h.hb + n * W), H);
        simd::store(h.hb + n * W, REV ? first(hv) : last(hv));
        if (track) simd::store(h.P + n * W, simd::mul(simd::load(h.P + n * W), REV ? first(Pv) : last(Pv)));
      }
    }
  }
}

// dst[(t0 + tb) * N + n] (+)= tile[n * W + tb] for tb < W (store: =); `direct`: the
// gradient's [N][L] rows, dst[n * L + t0 + tb].
JSS_INLINE void rows_out(const NCtx& c, float* dst, const float* tile, int64_t t0, bool store, bool direct) {
  const int64_t N = c.N;
  if (direct) {
    for (int64_t n = 0; n < N; ++n) {
      float* o = dst + n * c.L + t0;
      const VF v = simd::load(tile + n * W);
      simd::store(o, store ? v : simd::add(simd::load(o), v));
    }
    return;
  }
  if (N == 1) {
    const VF v = simd::load(tile);
    simd::store(dst + t0, store ? v : simd::add(simd::load(dst + t0), v));
    return;
  }
  if (N % W == 0) {
    for (int64_t n0 = 0; n0 < N; n0 += W) {
      VF r[W];
      JSS_UNROLL
      for (int i = 0; i < W; ++i) r[i] = simd::load(tile + (n0 + i) * W);
      simd::transpose(r);  // r[tb]: states n0 .. n0 + W at step tb
      JSS_UNROLL
      for (int tb = 0; tb < W; ++tb) {
        float* o = dst + (t0 + tb) * N + n0;
        simd::store(o, store ? r[tb] : simd::add(simd::load(o), r[tb]));
      }
    }
    return;
  }
  for (int tb = 0; tb < W; ++tb)
    for (int64_t n = 0; n < N; ++n) {
      float* o = dst + (t0 + tb) * N + n;
      *o = store ? tile[n * W + tb] : *o + tile[n * W + tb];
    }
}

inline void flush_blk(NCtx& c) {
  const int64_t NW = c.N * W;
  for (int r = 0; r < c.nch; ++r) {
    Chan& h = c.ch[r];
    for (int64_t i = 0; i < NW; i += W) {
      simd::store(h.accA + i, simd::add(simd::load(h.accA + i), simd::load(h.blkA + i)));
      simd::store(h.accB + i, simd::add(simd::load(h.accB + i), simd::load(h.blkB + i)));
      simd::store(h.accC + i, simd::add(simd::load(h.accC + i), simd::load(h.blkC + i)));
    }
    simd::store(h.accD, simd::add(simd::load(h.accD), simd::load(h.blkD)));
    simd::store(h.accBias, simd::add(simd::load(h.accBias), simd::load(h.blkBias)));
    for (float* z : {h.blkA, h.blkB, h.blkC}) std::memset(z, 0, sizeof(float) * NW);
    std::memset(h.blkD, 0, sizeof(float) * W);
    std::memset(h.blkBias, 0, sizeof(float) * W);
  }
  c.blk_units = 0;
}

// du, ddelta, dz of a unit from the walk's sums dus, dd, y: with `final` finished and
// written, else kept in the bidirectional sums.
struct UnitOut {
  VF dus, dd, y, dy, dout, z, sz, uv, sg;  // sz: sigmoid(z)
};
JSS_INLINE void unit_out(const NCtx& c, Chan& h, int64_t t0, const UnitOut& o, bool final) {
  const SsParams& p = *c.p;
  const SsBwdParams& q = *c.q;
  const bool bidi = p.direction == SsDirection::kBidirectional;
  if (!final) {
    simd::store(h.sdu + t0, o.dus);
    simd::store(h.sdd + t0, o.dd);
    if (h.sy != nullptr) simd::store(h.sy + t0, o.y);
    return;
  }
  VF du = o.dus, dd = o.dd, y = o.y;
  if (bidi) {
    du = simd::add(du, simd::load(h.sdu + t0));
    dd = simd::add(dd, simd::load(h.sdd + t0));
    if (h.sy != nullptr) y = simd::add(y, simd::load(h.sy + t0));
  }
  const VF dv = simd::broadcast(h.dv);
  if (q.dz != nullptr) {
    const VF s = o.sz;
    const VF ds = simd::mul(s, simd::fma(o.z, simd::sub(simd::broadcast(1.0f), s), simd::broadcast(1.0f)));
    simd::store(q.dz + h.row + t0, simd::mul(simd::mul(o.dout, ds), simd::fma(dv, o.uv, y)));
  }
  simd::store(q.du + h.row + t0, simd::fma(dv, o.dy, du));
  if (p.delta_softplus) dd = simd::mul(dd, o.sg);
  simd::store(q.ddelta + h.row + t0, dd);
  simd::store(h.blkD, simd::fma(o.dy, o.uv, simd::load(h.blkD)));
  simd::store(h.blkBias, simd::add(simd::load(h.blkBias), dd));
}

// A tail unit's walk for one channel: scalar steps in reverse scan order from the adjoint
// carry in g. `store`: this channel's dB / dC rows are written (=), not added.
inline void tail_walk(NCtx& c, Chan& h, bool rev, int64_t u, int64_t t0, int nt, bool grads, bool final,
                      bool store) {
  const SsParams& p = *c.p;
  const SsBwdParams& q = *c.q;
  const int64_t N = c.N;
  const bool bidi = p.direction == SsDirection::kBidirectional;
  for (int64_t n = 0; n < N; ++n) set_all(h.hb + n * W, h.ck[u * N + n]);
  tail_states(c, h, rev, t0, nt, false);
  for (int k = nt - 1; k >= 0; --k) {
    const int64_t t = rev ? t0 + nt - 1 - k : t0 + k;
    float sg;
    const float dl = scalar_delta(c, h, t, &sg);
    const float uv = ss::ld1(p.u, p.u_t, h.row + t);
    const float dout = ss::ld1(q.dout, q.dout_t, h.row + t);
    const float zv = p.z != nullptr ? ss::ld1(p.z, p.z_t, h.row + t) : 0.0f;
    const float dy = p.z != nullptr ? dout * zv * scalar_sigmoid(zv) : dout;
    float dd = 0.0f, dus = 0.0f, y = 0.0f;
    for (int64_t n = 0; n < N; ++n) {
      const float a = c.ta[k * N + n], hv = c.th[k * N + n];
      const float hp = k == 0 ? h.ck[u * N + n] : c.th[(k - 1) * N + n];
      const float b = p.b_var ? ss::ld1(p.B, p.B_t, c.bb + n * c.L + t) : h.Bc[n];
      const float cc = p.c_var ? ss::ld1(p.C, p.C_t, c.cb + n * c.L + t) : h.Cc[n];
      const float G = cc * dy + lane0(h.g + n * W);
      set_all(h.g + n * W, a * G);
      if (!grads) {
        set_all(h.P + n * W, lane0(h.P + n * W) * a);
        continue;
      }
      const float ah = a * hp, gdt = G * dl;
      h.blkA[n * W] += gdt * ah;
      dd += G * (h.Av[n] * ah + uv * b);
      dus += gdt * b;
      const float db = gdt * uv, dc = dy * hv;
      if (p.b_var) {
        float& o = c.pB[c.direct_b ? n * c.L + t : t * N + n];
        o = store ? db : o + db;
      } else {
        h.blkB[n * W] += db;
      }
      if (p.c_var) {
        float& o = c.pC[c.direct_c ? n * c.L + t : t * N + n];
        o = store ? dc : o + dc;
      } else {
        h.blkC[n * W] += dc;
      }
      y += cc * hv;
    }
    if (!grads) continue;
    if (!final) {
      h.sdu[t] = dus;
      h.sdd[t] = dd;
      if (h.sy != nullptr) h.sy[t] = y;
      continue;
    }
    if (bidi) {
      dus += h.sdu[t];
      dd += h.sdd[t];
      if (h.sy != nullptr) y += h.sy[t];
    }
    if (q.dz != nullptr) {
      const float s = scalar_sigmoid(zv);
      q.dz[h.row + t] = dout * (s * (1.0f + zv * (1.0f - s))) * (h.dv * uv + y);
    }
    q.du[h.row + t] = h.dv * dy + dus;
    if (p.delta_softplus) dd *= sg;
    q.ddelta[h.row + t] = dd;
    h.blkD[0] += dy * uv;
    h.blkBias[0] += dd;
  }
}

// The walk over scan-order units u1 - 1 down to u0 from each channel's adjoint carry in g
// (left at the carry out of unit u0). GRADS false: the adjoint alone, dA's product over the
// units into P. The task's channels take each unit in turn (B and C lines read once).
template <bool REV, bool BVAR, bool CVAR, bool GRADS>
void walk(NCtx& c, int64_t u1, int64_t u0, bool final) {
  const SsParams& p = *c.p;
  const SsBwdParams& q = *c.q;
  const int64_t N = c.N;
  const bool has_z = p.z != nullptr;
  const VF one = simd::broadcast(1.0f), zero = simd::broadcast(0.0f);
  for (int64_t u = u1 - 1; u >= u0; --u) {
    int nt;
    const int64_t t0 = unit_start(c, REV, u, &nt);
    if (nt < W) {
      for (int r = 0; r < c.nch; ++r) tail_walk(c, c.ch[r], REV, u, t0, nt, GRADS, final, c.store_rows && r == 0);
      if (GRADS && ++c.blk_units == kBlk) flush_blk(c);
      continue;
    }
    if ((u1 - 1 - u) % kBurst == 0)
      for (int64_t k = 0; k < kBurst; ++k) prefetch_unit(c, REV ? t0 + (kAhead + k) * W : t0 - (kAhead + k) * W, true);
    for (int r = 0; r < c.nch; ++r) {
      Chan& h = c.ch[r];
      const UnitIn in = unit_in(c, h, t0, GRADS && final);
      UnitOut o;
      o.dout = ss::ldv(q.dout, q.dout_t, h.row + t0);
      o.z = has_z ? ss::ldv(p.z, p.z_t, h.row + t0) : zero;
      o.sz = has_z ? simd::sigmoid(o.z) : zero;
      o.dy = has_z ? simd::mul(o.dout, simd::mul(o.z, o.sz)) : o.dout;  // dout * silu(z)
      o.dus = o.dd = o.y = zero;
      for (int64_t n = 0; n < N; ++n) {
        const VF x = simd::mul(in.dl, simd::broadcast(h.A2[n]));
        const VF a = in.fast ? simd::exp2_inrange(x) : simd::exp2_any(x);
        const VF cn = CVAR ? ss::ldv(p.C, p.C_t, c.cb + n * c.L + t0) : simd::broadcast(h.Cc[n]);
        // The adjoint: G = beta + alpha G', the mirrored scan (alpha: dA of the next step in
        // scan order; 1 in the unit's last lane, where the carry g enters).
        VF al = REV ? up<1>(a, one) : down<1>(a, one);
        VF G = simd::mul(cn, o.dy);
        scan_level<1, !REV>(al, G);
        scan_level<2, !REV>(al, G);
        scan_level<4, !REV>(al, G);
        scan_level<8, !REV>(al, G);
        G = simd::fma(al, simd::load(h.g + n * W), G);
        const VF aG = simd::mul(a, G);
        simd::store(h.g + n * W, REV ? last(aG) : first(aG));
        if constexpr (!GRADS) {
          const VF pa = simd::mul(a, al);  // dA's product over the unit, in its first lane
          simd::store(h.P + n * W, simd::mul(simd::load(h.P + n * W), REV ? last(pa) : first(pa)));
          continue;
        }
        // The states again, and h[t-1] (the checkpoint in the unit's first lane).
        const VF bn = BVAR ? ss::ldv(p.B, p.B_t, c.bb + n * c.L + t0) : simd::broadcast(h.Bc[n]);
        VF Pv = a, H = simd::mul(in.duv, bn);
        scan_level<1, REV>(Pv, H);
        scan_level<2, REV>(Pv, H);
        scan_level<4, REV>(Pv, H);
        scan_level<8, REV>(Pv, H);
        const VF hin = simd::broadcast(h.ck[u * N + n]);
        const VF hv = simd::fma(Pv, hin, H);
        const VF hp = REV ? down<1>(hv, hin) : up<1>(hv, hin);
        const VF ah = simd::mul(a, hp), gdt = simd::mul(G, in.dl);
        simd::store(h.blkA + n * W, simd::fma(gdt, ah, simd::load(h.blkA + n * W)));
        o.dd = simd::fma(G, simd::fma(simd::broadcast(h.Av[n]), ah, simd::mul(in.uv, bn)), o.dd);
        o.dus = simd::fma(gdt, bn, o.dus);
        const VF db = simd::mul(gdt, in.uv), dc = simd::mul(o.dy, hv);
        if (BVAR) simd::store(c.tileB + n * W, r == 0 ? db : simd::add(simd::load(c.tileB + n * W), db));
        else simd::store(h.blkB + n * W, simd::add(simd::load(h.blkB + n * W), db));
        if (CVAR) simd::store(c.tileC + n * W, r == 0 ? dc : simd::add(simd::load(c.tileC + n * W), dc));
        else simd::store(h.blkC + n * W, simd::add(simd::load(h.blkC + n * W), dc));
        if (has_z) o.y = simd::fma(cn, hv, o.y);
      }
      if constexpr (GRADS) {
        o.uv = in.uv;
        o.sg = in.sg;
        unit_out(c, h, t0, o, final);
      }
    }
    if constexpr (GRADS) {
      if (BVAR) rows_out(c, c.pB, c.tileB, t0, c.store_rows, c.direct_b);
      if (CVAR) rows_out(c, c.pC, c.tileC, t0, c.store_rows, c.direct_c);
      if (++c.blk_units == kBlk) flush_blk(c);
    }
  }
}

template <bool REV>
void walk_any(NCtx& c, int64_t u1, int64_t u0, bool final, bool grads) {
  const SsParams& p = *c.p;
  if (!grads) {
    if (p.c_var) walk<REV, false, true, false>(c, u1, u0, final);
    else walk<REV, false, false, false>(c, u1, u0, final);
  } else if (p.b_var && p.c_var) walk<REV, true, true, true>(c, u1, u0, final);
  else if (p.b_var) walk<REV, true, false, true>(c, u1, u0, final);
  else if (p.c_var) walk<REV, false, true, true>(c, u1, u0, final);
  else walk<REV, false, false, true>(c, u1, u0, final);
}

inline void sweep_any(NCtx& c, bool rev, int64_t u0, int64_t u1, bool track) {
  if (c.p->b_var) rev ? sweep<true, true>(c, u0, u1, track) : sweep<false, true>(c, u0, u1, track);
  else rev ? sweep<true, false>(c, u0, u1, track) : sweep<false, false>(c, u0, u1, track);
}

inline void walk_dir(NCtx& c, bool rev, int64_t u1, int64_t u0, bool final, bool grads) {
  c.blk_units = 0;
  rev ? walk_any<true>(c, u1, u0, final, grads) : walk_any<false>(c, u1, u0, final, grads);
  if (grads) flush_blk(c);
}

// Lane sums in a fixed order (pairwise).
JSS_INLINE float hsum(const float* x) {
  float s[W];
  for (int i = 0; i < W; ++i) s[i] = x[i];
  for (int w = 1; w < W; w *= 2)
    for (int i = 0; i + w < W; i += 2 * w) s[i] += s[i + w];
  return s[0];
}

inline void run(const SsBwdParams& q, const SsBwdTask& t) {
  const SsParams& p = q.fwd;
  NCtx c;
  c.q = &q;
  c.p = &p;
  c.N = p.dstate;
  c.NP = (c.N + W - 1) / W * W;
  c.L = p.length;
  c.nvec = c.L / W;
  c.tail = c.L % W;
  c.units = c.nvec + (c.tail != 0 ? 1 : 0);
  c.nch = static_cast<int>(t.nch);
  const int64_t N = c.N, NW = N * W, L = c.L;
  const bool bidi = p.direction == SsDirection::kBidirectional;
  const float k = bidi ? 2.0f : 1.0f;
  c.bb = (t.b * p.b_groups + t.d0 / (p.dim / p.b_groups)) * N * L;
  c.cb = (t.b * p.c_groups + t.d0 / (p.dim / p.c_groups)) * N * L;
  c.pB = t.pB;
  c.pC = t.pC;
  c.direct_b = t.direct_b != 0;
  c.direct_c = t.direct_c != 0;
  float* w = t.work;
  auto take = [&](int64_t n) { float* r = w; w += (n + 15) / 16 * 16; return r; };
  c.tileB = take(c.NP * W); c.tileC = take(c.NP * W);
  c.ta = take(W * N); c.th = take(W * N);
  float* gsum = take(c.nch * N);  // dh0 (the directions' adjoint carries out)
  for (int r = 0; r < c.nch; ++r) {
    Chan& h = c.ch[r];
    const int64_t d = t.d0 + r;
    h.A2 = take(N); h.Av = take(N); h.Bc = take(N); h.Cc = take(N);
    h.hb = take(NW); h.g = take(NW); h.P = take(NW);
    h.accA = take(NW); h.accB = take(NW); h.accC = take(NW);
    h.blkA = take(NW); h.blkB = take(NW); h.blkC = take(NW);
    h.accD = take(W); h.accBias = take(W); h.blkD = take(W); h.blkBias = take(W);
    if (t.split) {
      h.ck = t.ckbuf + r * 2 * c.units * N;
      h.ckP = h.ck + c.units * N;
    } else {
      h.ck = take(c.units * N);
      h.ckP = nullptr;
    }
    h.row = (t.b * p.dim + d) * L;
    h.sy = bidi && q.dz != nullptr ? q.dz + h.row : nullptr;
    h.sdu = bidi ? q.du + h.row : nullptr;
    h.sdd = bidi ? q.ddelta + h.row : nullptr;
    h.bias = p.delta_bias != nullptr ? ss::ld1(p.delta_bias, p.delta_bias_t, d) : 0.0f;
    h.dv = p.D != nullptr ? k * ss::ld1(p.D, p.D_t, d) : 0.0f;
    float a_min = 0.0f, a_max = -1.0f;
    for (int64_t n = 0; n < N; ++n) {
      const float a = ss::ld1(p.A, p.A_t, d * N + n);
      h.Av[n] = a;
      h.A2[n] = a * simd::kLog2e;
      h.Bc[n] = p.b_var ? 0.0f : ss::ld1(p.B, p.B_t, d * N + n);
      h.Cc[n] = p.c_var ? 0.0f : ss::ld1(p.C, p.C_t, d * N + n);
      a_min = h.A2[n] < a_min ? h.A2[n] : a_min;
      a_max = h.A2[n] > a_max ? h.A2[n] : a_max;
    }
    h.dmax = !(a_max <= 0.0f) ? -1.0f : a_min < 0.0f ? -125.0f / a_min : 3.0e38f;
    for (float* z : {h.accA, h.accB, h.accC, h.blkA, h.blkB, h.blkC}) std::memset(z, 0, sizeof(float) * NW);
    for (float* z : {h.accD, h.accBias, h.blkD, h.blkBias}) std::memset(z, 0, sizeof(float) * W);
  }
  auto h0_of = [&](int r, int64_t n) {
    return p.h0 != nullptr ? ss::ld1(p.h0, p.h0_t, (t.b * p.dim + t.d0 + r) * N + n) : 0.0f;
  };
  auto dlast_of = [&](bool rev, int r, int64_t n) {
    const float* dlast = rev ? q.dlast_rev : q.dlast_fwd;
    return dlast != nullptr ? dlast[(t.b * p.dim + t.d0 + r) * N + n] : 0.0f;
  };
  bool grads = true;  // whether this call walked with gradients (partials to write)
  if (!t.split) {
    for (int64_t i = 0; i < c.nch * N; ++i) gsum[i] = 0.0f;
    for (const bool rev : {true, false}) {
      if (rev && p.direction == SsDirection::kForward) continue;
      if (!rev && p.direction == SsDirection::kReverse) continue;
      // Varying rows: the slab's first task stores them in its first direction (every row
      // once), everything after adds.
      c.store_rows = !t.accumulate && (rev || p.direction == SsDirection::kForward);
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) {
          set_all(c.ch[r].hb + n * W, h0_of(r, n));
          set_all(c.ch[r].g + n * W, dlast_of(rev, r, n));
        }
      sweep_any(c, rev, 0, c.units, false);
      walk_dir(c, rev, c.units, 0, !rev || p.direction == SsDirection::kReverse, true);
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) gsum[r * N + n] += lane0(c.ch[r].g + n * W);
    }
    if (q.dh0 != nullptr)
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) q.dh0[(t.b * p.dim + t.d0 + r) * N + n] = gsum[r * N + n];
  } else {
    const bool rev = t.reverse != 0;
    const bool final = !rev || p.direction == SsDirection::kReverse;
    const int64_t s0 = t.piece * c.units / t.pieces, s1 = (t.piece + 1) * c.units / t.pieces;
    const bool last_piece = t.piece + 1 == t.pieces;
    // Varying rows: each written once per direction; stored in the first (or only) one.
    c.store_rows = !bidi || rev;
    if (t.phase == 1) {
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) {
          set_all(c.ch[r].hb + n * W, t.piece == 0 ? h0_of(r, n) : 0.0f);
          set_all(c.ch[r].P + n * W, 1.0f);
        }
      sweep_any(c, rev, s0, s1, true);
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) {
          t.hend[n * W + r] = lane0(c.ch[r].hb + n * W);
          t.ptot[n * W + r] = t.piece == 0 ? 0.0f : lane0(c.ch[r].P + n * W);
        }
      *t.hwin = s0;
      return;
    }
    if (t.phase == 2) {
      if (t.piece > 0)
        for (int r = 0; r < c.nch; ++r)
          for (int64_t u = s0; u < s1; ++u)
            for (int64_t n = 0; n < N; ++n) c.ch[r].ck[u * N + n] += c.ch[r].ckP[u * N + n] * t.hin[n * W + r];
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) {
          set_all(c.ch[r].g + n * W, last_piece ? dlast_of(rev, r, n) : 0.0f);
          set_all(c.ch[r].P + n * W, 1.0f);
        }
      grads = last_piece;
      walk_dir(c, rev, s1, s0, final, grads);
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) {
          t.gend[n * W + r] = lane0(c.ch[r].g + n * W);
          t.qtot[n * W + r] = last_piece ? 0.0f : lane0(c.ch[r].P + n * W);
        }
      *t.gwin = last_piece ? s1 : s0;
    } else {  // phase 3 (never the last piece)
      for (int r = 0; r < c.nch; ++r)
        for (int64_t n = 0; n < N; ++n) set_all(c.ch[r].g + n * W, t.gin[n * W + r]);
      walk_dir(c, rev, s1, s0, final, true);
    }
  }
  if (!grads) return;
  // The per-lane partials (lane r: channel d0 + r; idle lanes 0).
  for (int r = 0; r < W; ++r) {
    const Chan* h = r < c.nch ? &c.ch[r] : nullptr;
    for (int64_t n = 0; n < N; ++n) {
      t.pA[n * W + r] = h != nullptr ? hsum(h->accA + n * W) : 0.0f;
      if (!p.b_var) t.pB[n * W + r] = h != nullptr ? hsum(h->accB + n * W) : 0.0f;
      if (!p.c_var) t.pC[n * W + r] = h != nullptr ? hsum(h->accC + n * W) : 0.0f;
    }
    t.pD[r] = h != nullptr ? k * hsum(h->accD) : 0.0f;
    t.pbias[r] = h != nullptr ? hsum(h->accBias) : 0.0f;
  }
}

}  // namespace ssbn
}  // namespace
}  // namespace jax_selscan
