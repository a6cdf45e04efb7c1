// The fused selective-scan backward kernel (one source for every ISA of simd.h).
//
// Same task as the forward's channel path: `lanes` channels of one batch row (one
// B group, one C group), every vector op on `lanes` independent recurrences.
// Per direction (bidirectional: reverse, then forward, gradients added):
//   1. checkpoint sweep: the forward recurrence in scan order, keeping the state
//      entering every block of `lanes` steps (ckpt, [blocks][N][lanes]); skipped when
//      the forward saved them (SsParams::ckpt, read through SsBwdParams::ckpt: the
//      same bits, copied in, ~1/(N lanes) of the sweep's work);
//   2. blocks in reverse scan order: recompute the block's states from its
//      checkpoint, keeping dA = exp(delta A) and h for its `lanes` steps (E, H:
//      [lanes][N][lanes] each, L1) and y = sum_n C h when z is present; then walk
//      the block's steps backwards with the adjoint g (dL/dh, carried across
//      blocks, starting from the last state's cotangent):
//          gi  = g + C[t] dy[t]                    dy = dout * silu(z)
//          dA += gi delta dA h[t-1]                ddelta += sum_n gi (A dA h[t-1] + u B)
//          du += sum_n gi delta B                  dB[t] += gi delta u    dC[t] += dy h[t]
//          g   = dA gi                             (the adjoint of h[t-1])
//      g after the first step is dL/dh0.
//   3. at the end of each block of the call's last direction: du += k D dy, ddelta
//      (raw) = ddelta * sigmoid(delta + bias) with softplus, dz = dout (y_f + y_r +
//      k D u) silu'(z), dD = k sum dy u (k = 2 for bidirectional), written out as
//      float32 (bidirectional: the reverse half leaves its du / ddelta / y sums in
//      [L][lanes] buffers for the forward half to add).
// Gradients summed over channels (dB, dC when they vary with t) are summed over
// the task's lanes by a register transpose per step, into the task's own partial
// [L][N]; gradients summed over batch and time (dA, dD, ddelta_bias, invariant B /
// C) go to per-task [N][lanes] / [lanes] partials. The driver adds the partials in
// task order, so results do not depend on the thread count or schedule. Varying
// dB / dC partials are per slab (a fixed run of the group's tiles, the tasks of a
// slab run in order on one thread, accumulating): memory slabs * L * N, not tasks * L * N.
// L split (SsBwdTask::split, fewer tasks than threads): run_piece, driven by the driver
// in three phases per direction (see selective_scan_bwd_cpu.cc).
// Work per (t, n): two exp2 of the forward's kind (sweep, recompute; one when the
// forward saved the checkpoints), ~60 vector
// ops in all; memory: delta, u and B are read twice (sweep, walk), C, dout and z
// once, each gradient written once; nothing of size L * N per channel is stored.
#pragma once

#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "selective_scan_rows.h"
#include "selective_scan_bwd_api.h"
#include "selective_scan_bwd_narrow.h"

namespace jax_selscan {
namespace {
namespace ssb {

using simd::VF;
constexpr int W = VF::kLanes;

struct BCtx {
  const SsBwdParams* q;
  const SsParams* p;
  int64_t b, d0, N, NP, L, nblocks;
  int nch;
  int64_t row0, bbase, cbase;
  float *A2, *Av, *Bi, *Ci, *g, *hs, *accA, *accB, *accC, *gh0;  // [N][W]
  float* Ps;                          // [N][W] (L split) dA's running product, sweep or adjoint
  float *Bb, *Cb;                     // [N][W]: B / C rows of the block's W steps
  float *Dv, *biasv;                  // [W] (Dv = k * D)
  float *ckpt;                        // [nblocks][N][W]
  float *E, *H;                       // [W][N][W]
  float* Ek;                          // bidirectional: the kept E of the last Ek_blocks blocks
  int64_t Ek_blocks;                  // ([Ek_blocks][W][N][W]; blocks nblocks - Ek_blocks ..)
  float *ysum, *dub, *ddt;            // [L][W] (bidirectional: the reverse half's sums)
  float *dl, *uu, *dy, *zb, *dout;    // [W][W] block rows (transposed: [step][lane])
  float *sg, *bdu, *bdd, *by;         // [W][W] sigmoid(delta + bias); the block's sums
  VF accD, accBias;                   // dD / ddelta_bias partial sums (per lane)
  float *redB, *redC;                 // [NP][W] (rows >= N stay zero)
  float dk;                           // k: 2 for bidirectional, else 1
  float dmax;
  bool rows_store;                    // L split, first direction: varying dB / dC rows are
                                      // stored, not added (each written once; no zeroing pass)
  const float* ckrow;                 // the forward's checkpoints: channel d0's row, or null
  bool stream_out;                    // du, ddelta, dz stored past the caches (whole lines;
                                      // their reads for ownership held the walk up:
                                      // PERFORMANCE_CPU, session 36)
};

// B / C rows (n, t0 .. t0 + W) of the block, zero beyond nt.
JSS_INLINE void block_rows(const BCtx& c, const void* src, SsType ty, int64_t base, int64_t t0, int nt,
                           float* dst) {
  for (int64_t n = 0; n < c.N; ++n) {
    const int64_t off = base + n * c.L + t0;
    if (nt == W) {
      simd::store(dst + n * W, ss::ldv(src, ty, off));
    } else {
      for (int tb = 0; tb < W; ++tb) dst[n * W + tb] = tb < nt ? ss::ld1(src, ty, off + tb) : 0.0f;
    }
  }
}

// delta (bias, softplus) and u of the block; with WALK also dy and the C rows.
template <bool BVAR, bool CVAR, bool WALK>
JSS_INLINE void prepare(const BCtx& c, int64_t t0, int nt) {
  const SsParams& p = *c.p;
  ss::gather_block(p.delta, p.delta_t, c.row0, c.L, c.nch, t0, nt, c.dl);
  ss::gather_block(p.u, p.u_t, c.row0, c.L, c.nch, t0, nt, c.uu);
  if (p.delta_bias != nullptr || p.delta_softplus) {
    const VF bias = simd::load(c.biasv);
    for (int tb = 0; tb < W; ++tb) {
      VF d = simd::load(c.dl + tb * W);
      if (p.delta_bias != nullptr) d = simd::add(d, bias);
      if (WALK && p.delta_softplus) simd::store(c.sg + tb * W, simd::sigmoid(d));
      if (p.delta_softplus) d = simd::softplus(d);
      simd::store(c.dl + tb * W, d);
    }
  }
  if (BVAR) block_rows(c, p.B, p.B_t, c.bbase, t0, nt, c.Bb);
  if (WALK) {
    if (CVAR) block_rows(c, p.C, p.C_t, c.cbase, t0, nt, c.Cb);
    ss::gather_block(c.q->dout, c.q->dout_t, c.row0, c.L, c.nch, t0, nt, c.dout);
    if (p.z != nullptr) {
      ss::gather_block(p.z, p.z_t, c.row0, c.L, c.nch, t0, nt, c.zb);
      for (int tb = 0; tb < W; ++tb)
        simd::store(c.dy + tb * W, simd::mul(simd::load(c.dout + tb * W), simd::silu(simd::load(c.zb + tb * W))));
    } else {
      std::memcpy(c.dy, c.dout, sizeof(float) * W * W);
    }
  }
}

// dst[n] += sum over the lanes of red[n] (n < N), by simd::row_sums (pairwise sums)
// (`store`: dst[n] = that sum).
JSS_INLINE void lane_sums(const BCtx& c, const float* red, float* dst, bool store) {
  for (int64_t n0 = 0; n0 < c.NP; n0 += W) {
    VF r[W];
    JSS_UNROLL
    for (int i = 0; i < W; ++i) r[i] = simd::load(red + (n0 + i) * W);
    const VF sum = simd::row_sums(r);
    if (n0 + W <= c.N) {
      simd::store(dst + n0, store ? sum : simd::add(simd::load(dst + n0), sum));
    } else {
      float s[W];
      simd::store(s, sum);
      for (int64_t j = 0; j < c.N - n0; ++j) dst[n0 + j] = store ? s[j] : dst[n0 + j] + s[j];
    }
  }
}

JSS_INLINE bool fast_range(const BCtx& c, VF dlv) { return !simd::any_outside(dlv, 0.0f, c.dmax); }

JSS_INLINE VF exp_da(bool fast, VF x) { return fast ? simd::exp2_inrange(x) : simd::exp2_any(x); }

inline void init_h0(const BCtx& c) {
  const SsParams& p = *c.p;
  for (int64_t n = 0; n < c.N; ++n)
    for (int r = 0; r < W; ++r)
      c.hs[n * W + r] = (p.h0 != nullptr && r < c.nch) ? ss::ld1(p.h0, p.h0_t, (c.b * p.dim + c.d0 + r) * c.N + n)
                                                       : 0.0f;
}

// Every lane and state of x at most kSsCarryDrop (idle lanes hold 0).
inline bool all_dropped(const BCtx& c, const float* x) {
  bool small = true;
  for (int64_t n = 0; n < c.N; ++n) small = small && !simd::any_outside(simd::load(x + n * W), 0.0f, ss::kSsCarryDrop);
  return small;
}

// 1. The state entering every block of scan-order blocks [s0, s1), from c.hs (h0 for a
// whole call). TRACK (L split, a piece's first pass from zero): also keep dA's running
// product in c.Ps and return after the first block at whose end it is <= kSsCarryDrop
// everywhere (the index after it; s1 when that never happens), as the forward's split.
template <int NS, bool BVAR, bool TRACK = false>
int64_t sweep(const BCtx& c, bool rev, int64_t s0, int64_t s1) {
  const int64_t N = NS > 0 ? NS : c.N;
  for (int64_t bi = s0; bi < s1; ++bi) {
    const int64_t blk = rev ? c.nblocks - 1 - bi : bi;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(c.L - t0 < W ? c.L - t0 : W);
    std::memcpy(c.ckpt + blk * N * W, c.hs, sizeof(float) * N * W);
    if (bi + 1 == c.nblocks) break;
    prepare<BVAR, false, false>(c, t0, nt);
    VF hr[NS > 0 ? NS : 1];
    if constexpr (NS > 0) {
      JSS_UNROLL
      for (int n = 0; n < NS; ++n) hr[n] = simd::load(c.hs + n * W);
    }
    for (int k = 0; k < nt; ++k) {
      const int tb = rev ? nt - 1 - k : k;
      const VF dlv = simd::load(c.dl + tb * W);
      const VF duv = simd::mul(dlv, simd::load(c.uu + tb * W));
      const bool fast = fast_range(c, dlv);
      // Shaped like the forward's pass (ss::pass: one loop per exp2 variant, chosen by a
      // compile-time tag) so that the compiler treats delta * A2 alike (contracting it into
      // exp2's first add / sub or not): the states are bitwise the forward's, which lets
      // the forward's checkpoints (SsParams::ckpt) stand in for this sweep.
      auto all_states = [&](auto fast_tag) JSS_INLINE_LAMBDA {
        auto step = [&](int64_t n, VF h) JSS_INLINE_LAMBDA {
          const VF x = simd::mul(dlv, simd::load(c.A2 + n * W));
          const VF a = decltype(fast_tag)::value ? simd::exp2_inrange(x) : simd::exp2_any(x);
          if constexpr (TRACK) simd::store(c.Ps + n * W, simd::mul(a, simd::load(c.Ps + n * W)));
          const VF bb = BVAR ? simd::broadcast(c.Bb[n * W + tb]) : simd::load(c.Bi + n * W);
          return simd::fma(a, h, simd::mul(duv, bb));
        };
        if constexpr (NS > 0) {
          JSS_UNROLL
          for (int n = 0; n < NS; ++n) hr[n] = step(n, hr[n]);
        } else {
          for (int64_t n = 0; n < N; ++n) simd::store(c.hs + n * W, step(n, simd::load(c.hs + n * W)));
        }
      };
      if (fast) all_states(std::true_type());
      else all_states(std::false_type());
    }
    if constexpr (NS > 0) {
      JSS_UNROLL
      for (int n = 0; n < NS; ++n) simd::store(c.hs + n * W, hr[n]);
    }
    if constexpr (TRACK) {
      if (all_dropped(c, c.Ps)) return bi + 1;
    }
  }
  return s1;
}

// 1'. The same checkpoints from the forward (SsBwdParams::ckpt): set `set` of the rows,
// scan-order blocks [s0, s1).
inline void load_ckpt(const BCtx& c, int64_t set, bool rev, int64_t s0, int64_t s1) {
  const int64_t NB = c.nblocks * c.N;
  for (int64_t s = s0; s < s1; ++s)
    for (int r = 0; r < W; ++r) {
      const int64_t blk = rev ? c.nblocks - 1 - s : s;
      const float* src = r < c.nch ? c.ckrow + r * c.q->ckpt_row + 1 + set * NB + blk * c.N : nullptr;
      for (int64_t n = 0; n < c.N; ++n) c.ckpt[(blk * c.N + n) * W + r] = src != nullptr ? src[n] : 0.0f;
    }
}

// 2. Blocks in reverse scan order: recompute, then the adjoint walk.
// The block's du, ddelta, dz: with `final` (the call's last direction) finished and
// written out (adding the first half's sums when bidirectional), else kept in the
// [L][W] sums for the other direction.
inline void block_out(BCtx& c, int64_t t0, int nt, bool final, bool bidi) {
  const SsParams& p = *c.p;
  const SsBwdParams& q = *c.q;
  if (!final) {
    for (int tb = 0; tb < nt; ++tb) {
      const int64_t tt = t0 + tb;
      simd::store(c.dub + tt * W, simd::load(c.bdu + tb * W));
      simd::store(c.ddt + tt * W, simd::load(c.bdd + tb * W));
      if (p.z != nullptr) simd::store(c.ysum + tt * W, simd::load(c.by + tb * W));
    }
    return;
  }
  // Two-level sums (per block, then over blocks): error ~ (W + L / W) eps, not L eps.
  VF blkD = simd::broadcast(0.0f), blkBias = simd::broadcast(0.0f);
  const VF dv = simd::load(c.Dv);
  for (int tb = 0; tb < nt; ++tb) {
    const int64_t tt = t0 + tb;
    const VF dyv = simd::load(c.dy + tb * W);
    const VF uv = simd::load(c.uu + tb * W);
    VF du = simd::load(c.bdu + tb * W), dd = simd::load(c.bdd + tb * W);
    if (bidi) {
      du = simd::add(du, simd::load(c.dub + tt * W));
      dd = simd::add(dd, simd::load(c.ddt + tt * W));
    }
    if (p.z != nullptr) {
      const VF zv = simd::load(c.zb + tb * W);
      const VF s = simd::sigmoid(zv);
      // silu'(z) = s (1 + z (1 - s))
      const VF ds = simd::mul(s, simd::fma(zv, simd::sub(simd::broadcast(1.0f), s), simd::broadcast(1.0f)));
      VF y = simd::load(c.by + tb * W);
      if (bidi) y = simd::add(y, simd::load(c.ysum + tt * W));
      simd::store(c.by + tb * W, simd::mul(simd::mul(simd::load(c.dout + tb * W), ds), simd::fma(dv, uv, y)));
    }
    blkD = simd::fma(dyv, uv, blkD);
    simd::store(c.bdu + tb * W, simd::fma(dv, dyv, du));
    if (p.delta_softplus) dd = simd::mul(dd, simd::load(c.sg + tb * W));
    blkBias = simd::add(blkBias, dd);
    simd::store(c.bdd + tb * W, dd);
  }
  c.accD = simd::add(c.accD, blkD);
  c.accBias = simd::add(c.accBias, blkBias);
  ss::scatter_block(q.du, SsType::kF32, c.row0, c.L, c.nch, t0, nt, c.bdu, c.stream_out);
  ss::scatter_block(q.ddelta, SsType::kF32, c.row0, c.L, c.nch, t0, nt, c.bdd, c.stream_out);
  if (q.dz != nullptr) ss::scatter_block(q.dz, SsType::kF32, c.row0, c.L, c.nch, t0, nt, c.by, c.stream_out);
}

inline void init_g(const BCtx& c, const float* dlast) {
  const SsParams& p = *c.p;
  for (int64_t n = 0; n < c.N; ++n)
    for (int r = 0; r < W; ++r)
      c.g[n * W + r] = (dlast != nullptr && r < c.nch) ? dlast[(c.b * p.dim + c.d0 + r) * c.N + n] : 0.0f;
}

// The walk's prefetch (ss::prefetch_burst, in the walk's order): the rows the walk reads, and
// those it writes when `final`. Without it the backward ran 16% slower at L 1024 and 2048 than
// at 1040 and 2064 with page-aligned rows (PERFORMANCE_CPU, session 33).
JSS_INLINE void prefetch_walk(const BCtx& c, int64_t s, int64_t t0, bool down, bool final, int sub, int nsub) {
  ss::prefetch_burst(s, t0, down, c.L, c.nch, [&](int64_t tp, int r0, int r1) JSS_INLINE_LAMBDA {
    const SsParams& p = *c.p;
    const SsBwdParams& q = *c.q;
    const int64_t base = c.row0 + r0 * c.L;
    const int nr = r1 - r0;
    ss::prefetch_rows(p.delta, p.delta_t, base, c.L, nr, tp, false);
    ss::prefetch_rows(p.u, p.u_t, base, c.L, nr, tp, false);
    ss::prefetch_rows(q.dout, q.dout_t, base, c.L, nr, tp, false);
    if (p.z != nullptr) ss::prefetch_rows(p.z, p.z_t, base, c.L, nr, tp, false);
    if (final && !c.stream_out) {
      ss::prefetch_rows(q.du, SsType::kF32, base, c.L, nr, tp, true);
      ss::prefetch_rows(q.ddelta, SsType::kF32, base, c.L, nr, tp, true);
      if (q.dz != nullptr) ss::prefetch_rows(q.dz, SsType::kF32, base, c.L, nr, tp, true);
    }
  }, sub, nsub);
}

// The adjoint walk over scan-order blocks s_hi - 1 down to s_lo, from the adjoint in c.g
// (left there at the end), accumulating every gradient. With c.Ek (bidirectional, unsplit)
// the reverse walk writes the E of the blocks t >= (nblocks - Ek_blocks) W into c.Ek, and
// the forward walk, which visits them first, reads them there instead of recomputing the
// exponentials (the same values: the gradients do not change).
template <int NS, bool BVAR, bool CVAR>
void walk(BCtx& c, const SsBwdTask& t, bool rev, bool final, int64_t s_hi, int64_t s_lo) {
  // The context's buffers as locals: the SIMD stores may alias anything (the intrinsics'
  // may_alias types), so pointers read through `c` would be reloaded after every store
  // (PERFORMANCE_CPU, session 36).
  float *const accA = c.accA, *const accB = c.accB, *const accC = c.accC, *const redB = c.redB,
               *const redC = c.redC, *const H = c.H, *const by = c.by, *const bdu = c.bdu, *const bdd = c.bdd;
  const float *const Av = c.Av, *const Bi = c.Bi, *const Ci = c.Ci, *const Bb = c.Bb, *const Cb = c.Cb,
              *const A2 = c.A2, *const dl = c.dl, *const uu = c.uu, *const dy = c.dy;
  const bool bidi = c.p->direction == SsDirection::kBidirectional;
  const SsParams& p = *c.p;
  const int64_t N = NS > 0 ? NS : c.N;
  const bool want_y = p.z != nullptr;
  VF gr[NS > 0 ? NS : 1];
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) gr[n] = simd::load(c.g + n * W);
  }
  for (int64_t s = s_hi - 1; s >= s_lo; --s) {
    const int64_t blk = rev ? c.nblocks - 1 - s : s;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(c.L - t0 < W ? c.L - t0 : W);
    prepare<BVAR, CVAR, true>(c, t0, nt);
    const float* ck = c.ckpt + blk * N * W;
    const int64_t kslot = blk - (c.nblocks - c.Ek_blocks);
    const bool kept = c.Ek != nullptr && kslot >= 0;
    float* const E = kept ? c.Ek + kslot * W * N * W : c.E;
    const bool read_e = kept && !rev;
    // Recompute the block's states (scan order).
    auto recompute = [&](auto read_tag) JSS_INLINE_LAMBDA {
      VF hr[NS > 0 ? NS : 1];
      if constexpr (NS > 0) {
        JSS_UNROLL
        for (int n = 0; n < NS; ++n) hr[n] = simd::load(ck + n * W);
      } else {
        std::memcpy(c.hs, ck, sizeof(float) * N * W);
      }
      for (int k = 0; k < nt; ++k) {
        // The walk's prefetch, one slice per step (PERFORMANCE_CPU, session 35).
        constexpr int kEvery = W / ss::kSsBwdPrefetchSub;
        if (k % kEvery == 0) prefetch_walk(c, s_hi - 1 - s, t0, !rev, final, k / kEvery, ss::kSsBwdPrefetchSub);
        const int tb = rev ? nt - 1 - k : k;
        const VF dlv = simd::load(dl + tb * W);
        const VF duv = simd::mul(dlv, simd::load(uu + tb * W));
        const bool fast = decltype(read_tag)::value || fast_range(c, dlv);
        float* Ek = E + tb * N * W;
        float* Hk = H + tb * N * W;
        VF y = simd::broadcast(0.0f);
        auto step = [&](int64_t n, VF h) JSS_INLINE_LAMBDA {
          VF a;
          if constexpr (decltype(read_tag)::value) {
            a = simd::load(Ek + n * W);
          } else {
            a = exp_da(fast, simd::mul(dlv, simd::load(A2 + n * W)));
            simd::store(Ek + n * W, a);
          }
          const VF bb = BVAR ? simd::broadcast(Bb[n * W + tb]) : simd::load(Bi + n * W);
          h = simd::fma(a, h, simd::mul(duv, bb));
          simd::store(Hk + n * W, h);
          if (want_y) {
            const VF cc = CVAR ? simd::broadcast(Cb[n * W + tb]) : simd::load(Ci + n * W);
            y = simd::fma(cc, h, y);
          }
          return h;
        };
        if constexpr (NS > 0) {
          JSS_UNROLL
          for (int n = 0; n < NS; ++n) hr[n] = step(n, hr[n]);
        } else {
          for (int64_t n = 0; n < N; ++n) simd::store(c.hs + n * W, step(n, simd::load(c.hs + n * W)));
        }
        if (want_y) simd::store(by + tb * W, y);
      }
    };
    if (read_e) recompute(std::true_type());
    else recompute(std::false_type());
    // The adjoint, steps in reverse scan order.
    for (int k = nt - 1; k >= 0; --k) {
      const int tb = rev ? nt - 1 - k : k;
      const float* hp = k == 0 ? ck : H + (rev ? tb + 1 : tb - 1) * N * W;
      const float* Ek = E + tb * N * W;
      const float* Hk = H + tb * N * W;
      const VF dyv = simd::load(dy + tb * W);
      const VF dtv = simd::load(dl + tb * W);
      const VF uv = simd::load(uu + tb * W);
      VF dd = simd::broadcast(0.0f), dus = simd::broadcast(0.0f);
      auto step = [&](int64_t n, VF g) JSS_INLINE_LAMBDA {
        const VF cc = CVAR ? simd::broadcast(Cb[n * W + tb]) : simd::load(Ci + n * W);
        const VF bb = BVAR ? simd::broadcast(Bb[n * W + tb]) : simd::load(Bi + n * W);
        const VF gi = simd::fma(cc, dyv, g);
        const VF a = simd::load(Ek + n * W);
        const VF ah = simd::mul(a, simd::load(hp + n * W));
        const VF gdt = simd::mul(gi, dtv);
        simd::store(accA + n * W, simd::fma(gdt, ah, simd::load(accA + n * W)));
        dd = simd::fma(gi, simd::fma(simd::load(Av + n * W), ah, simd::mul(uv, bb)), dd);
        dus = simd::fma(gdt, bb, dus);
        const VF db = simd::mul(gdt, uv);
        if (BVAR) simd::store(redB + n * W, db);
        else simd::store(accB + n * W, simd::add(simd::load(accB + n * W), db));
        const VF dc = simd::mul(dyv, simd::load(Hk + n * W));
        if (CVAR) simd::store(redC + n * W, dc);
        else simd::store(accC + n * W, simd::add(simd::load(accC + n * W), dc));
        return simd::mul(a, gi);
      };
      if constexpr (NS > 0) {
        JSS_UNROLL
        for (int n = 0; n < NS; ++n) gr[n] = step(n, gr[n]);
      } else {
        for (int64_t n = 0; n < N; ++n) simd::store(c.g + n * W, step(n, simd::load(c.g + n * W)));
      }
      const int64_t tt = t0 + tb;
      simd::store(bdu + tb * W, dus);
      simd::store(bdd + tb * W, dd);
      if (BVAR) lane_sums(c, redB, t.pB + tt * N, c.rows_store);
      if (CVAR) lane_sums(c, redC, t.pC + tt * N, c.rows_store);
    }
    block_out(c, t0, nt, final, bidi);
  }
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) simd::store(c.g + n * W, gr[n]);
  }
}

// L split: the adjoint alone (g <- dA (g + C dy)) over scan-order blocks s_hi - 1 down to
// s_lo, from c.g, with the product of dA in c.Ps; stops after the first block at whose
// start (in scan order) that product is <= kSsCarryDrop everywhere. Returns that block
// (s_lo when it never happens): the blocks the piece's entering adjoint still reaches.
template <int NS, bool CVAR>
int64_t light_walk(BCtx& c, bool rev, int64_t s_hi, int64_t s_lo) {
  const int64_t N = NS > 0 ? NS : c.N;
  VF gr[NS > 0 ? NS : 1];
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) gr[n] = simd::load(c.g + n * W);
  }
  int64_t s = s_hi;
  while (s > s_lo) {
    --s;
    const int64_t blk = rev ? c.nblocks - 1 - s : s;
    const int64_t t0 = blk * W;
    const int nt = static_cast<int>(c.L - t0 < W ? c.L - t0 : W);
    prepare<false, CVAR, true>(c, t0, nt);
    for (int k = nt - 1; k >= 0; --k) {
      const int tb = rev ? nt - 1 - k : k;
      const VF dlv = simd::load(c.dl + tb * W);
      const VF dyv = simd::load(c.dy + tb * W);
      const bool fast = fast_range(c, dlv);
      auto step = [&](int64_t n, VF g) JSS_INLINE_LAMBDA {
        const VF cc = CVAR ? simd::broadcast(c.Cb[n * W + tb]) : simd::load(c.Ci + n * W);
        const VF a = exp_da(fast, simd::mul(dlv, simd::load(c.A2 + n * W)));
        simd::store(c.Ps + n * W, simd::mul(a, simd::load(c.Ps + n * W)));
        return simd::mul(a, simd::fma(cc, dyv, g));
      };
      if constexpr (NS > 0) {
        JSS_UNROLL
        for (int n = 0; n < NS; ++n) gr[n] = step(n, gr[n]);
      } else {
        for (int64_t n = 0; n < N; ++n) simd::store(c.g + n * W, step(n, simd::load(c.g + n * W)));
      }
    }
    if (all_dropped(c, c.Ps)) break;
  }
  if constexpr (NS > 0) {
    JSS_UNROLL
    for (int n = 0; n < NS; ++n) simd::store(c.g + n * W, gr[n]);
  }
  return s;
}

template <int NS, bool BVAR, bool CVAR>
void run_dirs(BCtx& c, const SsBwdTask& t) {
  const SsParams& p = *c.p;
  const int64_t NW = c.N * W;
  if (p.direction != SsDirection::kForward) {
    if (c.ckrow != nullptr) {
      load_ckpt(c, 0, false, 0, c.nblocks);
    } else {
      init_h0(c);
      sweep<NS, BVAR>(c, true, 0, c.nblocks);
    }
    init_g(c, c.q->dlast_rev);
    walk<NS, BVAR, CVAR>(c, t, true, p.direction == SsDirection::kReverse, c.nblocks, 0);
    for (int64_t i = 0; i < NW; ++i) c.gh0[i] += c.g[i];
  }
  if (p.direction != SsDirection::kReverse) {
    if (c.ckrow != nullptr) {
      load_ckpt(c, p.direction == SsDirection::kBidirectional ? 1 : 0, false, 0, c.nblocks);
    } else {
      init_h0(c);
      sweep<NS, BVAR>(c, false, 0, c.nblocks);
    }
    init_g(c, c.q->dlast_fwd);
    walk<NS, BVAR, CVAR>(c, t, false, true, c.nblocks, 0);
    for (int64_t i = 0; i < NW; ++i) c.gh0[i] += c.g[i];
  }
}

// One direction of one piece of an L-split task (SsBwdTask::split; the driver runs the
// phases and the carries between them, see selective_scan_bwd_cpu.cc).
template <int NS, bool BVAR, bool CVAR>
void run_piece(BCtx& c, const SsBwdTask& t) {
  const SsParams& p = *c.p;
  const bool rev = t.reverse != 0;
  const bool final = !rev || p.direction == SsDirection::kReverse;
  const int64_t s0 = t.piece * c.nblocks / t.pieces, s1 = (t.piece + 1) * c.nblocks / t.pieces;
  const int64_t NW = c.N * W;
  const bool last_piece = t.piece + 1 == t.pieces;
  c.rows_store = p.direction != SsDirection::kBidirectional || rev;
  auto set_active = [&](float* x) {  // 1 on the task's lanes; idle lanes count as dropped
    for (int64_t n = 0; n < c.N; ++n)
      for (int r = 0; r < W; ++r) x[n * W + r] = r < c.nch ? 1.0f : 0.0f;
  };
  if (t.phase == 1) {  // the sweep from zero (piece 0: from h0), or the forward's checkpoints
    std::memset(c.Ps, 0, sizeof(float) * NW);
    if (c.ckrow != nullptr) {
      load_ckpt(c, rev || p.direction != SsDirection::kBidirectional ? 0 : 1, rev, s0, s1);
      std::memset(c.hs, 0, sizeof(float) * NW);
      *t.hwin = s0;
    } else if (t.piece == 0) {
      init_h0(c);
      sweep<NS, BVAR>(c, rev, s0, s1);
      *t.hwin = s0;
    } else {
      std::memset(c.hs, 0, sizeof(float) * NW);
      set_active(c.Ps);
      const int64_t w = sweep<NS, BVAR, true>(c, rev, s0, s1);
      if (w < s1) {
        sweep<NS, BVAR>(c, rev, w, s1);
        std::memset(c.Ps, 0, sizeof(float) * NW);  // the dropped term
      }
      *t.hwin = w;
    }
    std::memcpy(t.hend, c.hs, sizeof(float) * NW);
    std::memcpy(t.ptot, c.Ps, sizeof(float) * NW);
    return;
  }
  if (t.phase == 2) {
    // The sweep's window from the true entering state, then the adjoint from zero (the
    // last piece: from the last state's cotangent): first alone over the blocks the
    // entering adjoint still reaches (left to phase 3), then in full over the rest.
    if (t.piece > 0 && *t.hwin > s0) {
      std::memcpy(c.hs, t.hin, sizeof(float) * NW);
      sweep<NS, BVAR>(c, rev, s0, *t.hwin);
    }
    int64_t gw = s1;
    std::memset(c.Ps, 0, sizeof(float) * NW);
    if (last_piece) {
      init_g(c, rev ? c.q->dlast_rev : c.q->dlast_fwd);
    } else {
      std::memset(c.g, 0, sizeof(float) * NW);
      set_active(c.Ps);
      gw = light_walk<NS, CVAR>(c, rev, s1, s0);
      if (all_dropped(c, c.Ps)) std::memset(c.Ps, 0, sizeof(float) * NW);
    }
    walk<NS, BVAR, CVAR>(c, t, rev, final, gw, s0);
    std::memcpy(t.gend, c.g, sizeof(float) * NW);
    std::memcpy(t.qtot, c.Ps, sizeof(float) * NW);
    *t.gwin = gw;
    return;
  }
  // Phase 3: the window's blocks in full from the true entering adjoint.
  if (*t.gwin < s1) {
    std::memcpy(c.g, t.gin, sizeof(float) * NW);
    walk<NS, BVAR, CVAR>(c, t, rev, final, s1, *t.gwin);
  }
}

inline void run(const SsBwdParams& q, const SsBwdTask& t) {
  const SsParams& p = q.fwd;
  if (ss_use_narrow(W, t.nch, p.length)) {  // few channels: time in the lanes
    ssbn::run(q, t);
    return;
  }
  BCtx c;
  c.q = &q;
  c.p = &p;
  c.b = t.b;
  c.d0 = t.d0;
  c.nch = static_cast<int>(t.nch);
  c.N = p.dstate;
  c.NP = (c.N + W - 1) / W * W;
  c.L = p.length;
  c.nblocks = (c.L + W - 1) / W;
  c.row0 = (t.b * p.dim + t.d0) * p.length;
  c.bbase = (t.b * p.b_groups + t.d0 / (p.dim / p.b_groups)) * p.dstate * p.length;
  c.cbase = (t.b * p.c_groups + t.d0 / (p.dim / p.c_groups)) * p.dstate * p.length;
  float* w = t.work;
  auto take = [&](int64_t n) { float* r = w; w += (n + 15) / 16 * 16; return r; };
  const int64_t NW = c.N * W;
  c.A2 = take(NW); c.Av = take(NW); c.Bi = take(NW); c.Ci = take(NW); c.g = take(NW); c.hs = take(NW);
  c.accA = take(NW); c.accB = take(NW); c.accC = take(NW); c.gh0 = take(NW);
  c.Bb = take(NW); c.Cb = take(NW);
  c.Dv = take(W); c.biasv = take(W);
  // L split: the checkpoints and the bidirectional sums are the task's, shared by its pieces.
  c.ckpt = t.split ? t.ckbuf : take(c.nblocks * NW);
  c.E = take(W * NW); c.H = take(W * NW);
  const bool bidi = p.direction == SsDirection::kBidirectional;
  c.Ek = bidi && !t.split && t.dA_blocks > 0 ? t.dA : nullptr;
  c.Ek_blocks = c.Ek != nullptr ? (t.dA_blocks < c.nblocks ? t.dA_blocks : c.nblocks) : 0;
  if (bidi && t.split) {
    c.ysum = t.sums; c.dub = t.sums + c.L * W; c.ddt = t.sums + 2 * c.L * W;
  } else if (bidi) {
    c.ysum = take(c.L * W); c.dub = take(c.L * W); c.ddt = take(c.L * W);
  } else {
    c.ysum = c.dub = c.ddt = nullptr;
  }
  c.dl = take(W * W); c.uu = take(W * W); c.dy = take(W * W); c.zb = take(W * W); c.dout = take(W * W);
  c.sg = take(W * W); c.bdu = take(W * W); c.bdd = take(W * W); c.by = take(W * W);
  c.accD = simd::broadcast(0.0f);
  c.accBias = simd::broadcast(0.0f);
  c.redB = take(c.NP * W); c.redC = take(c.NP * W);
  c.Ps = take(NW);
  c.dk = p.direction == SsDirection::kBidirectional ? 2.0f : 1.0f;
  c.rows_store = false;
  c.stream_out = ss::lines_streamable(q.du, SsType::kF32, c.row0, c.L) &&
                 ss::lines_streamable(q.ddelta, SsType::kF32, c.row0, c.L) &&
                 (q.dz == nullptr || ss::lines_streamable(q.dz, SsType::kF32, c.row0, c.L));
  // The forward's checkpoints when it wrote them for every channel of the task.
  c.ckrow = nullptr;
  if (q.ckpt != nullptr && q.ckpt_row == ss_ckpt_row(W, c.N, c.L, p.direction)) {
    const float* row = q.ckpt + (t.b * p.dim + t.d0) * q.ckpt_row;
    bool all = true;
    for (int r = 0; r < c.nch; ++r) all = all && row[r * q.ckpt_row] == static_cast<float>(W);
    if (all) c.ckrow = row;
  }
  for (int r = 0; r < W; ++r) {
    const bool in = r < c.nch;
    const int64_t d = t.d0 + r;
    c.Dv[r] = (in && p.D != nullptr) ? c.dk * ss::ld1(p.D, p.D_t, d) : 0.0f;
    c.biasv[r] = (in && p.delta_bias != nullptr) ? ss::ld1(p.delta_bias, p.delta_bias_t, d) : 0.0f;
    for (int64_t n = 0; n < c.N; ++n) {
      const float a = in ? ss::ld1(p.A, p.A_t, d * c.N + n) : 0.0f;
      c.Av[n * W + r] = a;
      c.A2[n * W + r] = a * simd::kLog2e;
      c.Bi[n * W + r] = (in && !p.b_var) ? ss::ld1(p.B, p.B_t, d * c.N + n) : 0.0f;
      c.Ci[n * W + r] = (in && !p.c_var) ? ss::ld1(p.C, p.C_t, d * c.N + n) : 0.0f;
    }
  }
  float a_min = 0.0f, a_max = -1.0f;
  for (int64_t i = 0; i < NW; ++i) {
    a_min = c.A2[i] < a_min ? c.A2[i] : a_min;
    a_max = c.A2[i] > a_max ? c.A2[i] : a_max;
  }
  c.dmax = !(a_max <= 0.0f) ? -1.0f : a_min < 0.0f ? -125.0f / a_min : 3.0e38f;
  for (float* z : {c.accA, c.accB, c.accC, c.gh0}) std::memset(z, 0, sizeof(float) * NW);
  std::memset(c.redB, 0, sizeof(float) * c.NP * W);
  std::memset(c.redC, 0, sizeof(float) * c.NP * W);
  if (p.b_var && !t.accumulate) std::memset(t.pB, 0, sizeof(float) * c.L * c.N);
  if (p.c_var && !t.accumulate) std::memset(t.pC, 0, sizeof(float) * c.L * c.N);
  const bool n16 = c.N == 16;
  if (t.split) {
    if (p.b_var && p.c_var) n16 ? run_piece<16, true, true>(c, t) : run_piece<0, true, true>(c, t);
    else if (p.b_var) n16 ? run_piece<16, true, false>(c, t) : run_piece<0, true, false>(c, t);
    else if (p.c_var) n16 ? run_piece<16, false, true>(c, t) : run_piece<0, false, true>(c, t);
    else n16 ? run_piece<16, false, false>(c, t) : run_piece<0, false, false>(c, t);
    if (t.phase == 1) {  // no gradients yet; dh0 comes from the driver's carries
      if (c.stream_out) simd::stream_fence();
      return;
    }
  } else {
    if (p.b_var && p.c_var) n16 ? run_dirs<16, true, true>(c, t) : run_dirs<0, true, true>(c, t);
    else if (p.b_var) n16 ? run_dirs<16, true, false>(c, t) : run_dirs<0, true, false>(c, t);
    else if (p.c_var) n16 ? run_dirs<16, false, true>(c, t) : run_dirs<0, false, true>(c, t);
    else n16 ? run_dirs<16, false, false>(c, t) : run_dirs<0, false, false>(c, t);
  }
  if (c.stream_out) simd::stream_fence();  // the streamed lines ordered before the task ends
  simd::store(t.pD, simd::mul(c.accD, simd::broadcast(c.dk)));
  simd::store(t.pbias, c.accBias);
  std::memcpy(t.pA, c.accA, sizeof(float) * NW);
  if (!p.b_var) std::memcpy(t.pB, c.accB, sizeof(float) * NW);
  if (!p.c_var) std::memcpy(t.pC, c.accC, sizeof(float) * NW);
  if (q.dh0 != nullptr && !t.split)
    for (int r = 0; r < c.nch; ++r)
      for (int64_t n = 0; n < c.N; ++n) q.dh0[(t.b * p.dim + t.d0 + r) * c.N + n] = c.gh0[n * W + r];
}

}  // namespace ssb
}  // namespace
}  // namespace jax_selscan
