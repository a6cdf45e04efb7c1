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
// Few channels (at most lanes / 4 per task): the along-L path of
// selective_scan_narrow.h (time in the lanes). Fewer tasks than threads: a task is also run as pieces of
// its sequence (SsTask::split; run_piece here, the split branch of run_narrow).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "selective_scan_api.h"
#include "simd_math.h"
#include "selective_scan_narrow.h"
#include "selective_scan_rows.h"

namespace jax_selscan {
namespace {
namespace ss {

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

// Where a pass's prepared rows (dl, du, ub) live: kOwn, the task's one-block scratch; kKeep,
// computed into c.kp's block (the first pass of bidirectional); kKept, read from there (the
// second pass: the same values without the gathers and the softplus). Blocks from
// c.kp_blocks on have no kept rows and use kOwn.
enum class Prep { kOwn, kKeep, kKept };

// DA: 0 compute exp, 1 compute and keep in c.dA, 2 read c.dA. NS: N when it is a
// compile-time constant (state in registers), 0 for any N (state in c.hs).
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
