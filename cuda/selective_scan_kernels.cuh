// CUDA kernels of Mamba's selective scan (see selective_scan.h for layouts).
//
//   dt    = softplus(delta + delta_bias)               (bias, softplus optional)
//   h[t]  = exp2(dt[t] * A * log2 e) * h[t-1] + dt[t] * u[t] * B[t]     per state n
//   y[t]  = sum_n C[t, n] h[t, n];  out = (y + D u) * silu(z)
//
// Work split: P lanes of one warp own one row (channel of one batch element) and NS
// states each (P * NS >= N), and walk the row's time steps in order with the state in
// registers. The exponentials (one per element and state: the SFU bound of the kernel)
// are computed once; nothing of size (batch, D, N, L) is ever stored. Per step the P
// lanes sum their partial y with xor shuffles. Inputs are read 4 steps at a time
// (16-byte vectors for float32 when L % 4 == 0), softplus(delta) is computed once per
// step and row (lane j of a group does step j % 4 and shares it by shuffle).
//
// Backward (one launch per direction after a checkpoint sweep): the forward kernel
// re-runs with mode kCheckpoint and stores the state entering every kCk-step chunk;
// the backward kernel walks the chunks in reverse, recomputes the chunk's states and
// exponentials into registers from its checkpoint and then runs the adjoint
// recurrence g[t] = C[t] dy[t] + exp(dt[t+1] A) g[t+1] backwards through it.
// Gradients that sum over channels (dB, dC of varying B/C) are reduced in a fixed order:
// first across the block's channels in shared memory, then across blocks (and batch
// elements / directions for dA, dD, ddelta_bias, time-invariant dB/dC) by sum_jobs.
// No floating-point atomics anywhere: the gradients are bitwise reproducible.
//
// Offsets are 64-bit throughout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "selective_scan.h"

namespace jss {
namespace ssk {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kCk = 8;        // checkpoint interval and backward chunk (multiple of 4)
constexpr int kBlock = 128;   // forward block size
constexpr unsigned kFull = 0xffffffffu;

enum Mode : int {
  kFinal = 0,       // out = (y + D u) * silu(z)
  kRawY = 1,        // ybuf = y (first direction of "bidirectional")
  kAddY = 2,        // out = (y + ybuf + 2 D u) * silu(z)
  kCheckpoint = 3,  // states only: ckpt[row, k] = state entering chunk k
  kChunkEnd = 4,    // L split, phase A: an L chunk walked from a zero state; writes its end
                    // state and the sum of dt over it (chunk_h, chunk_S), nothing else
};

template <class H> struct Io;  // float32 here; bfloat16 / float16 below
template <> struct Io<float> {
  static __device__ __forceinline__ float ld(const float* p, int64_t i) { return __ldg(p + i); }
  static __device__ __forceinline__ void ld4(const float* p, int64_t i, float v[4]) {
    float4 x = __ldg(reinterpret_cast<const float4*>(p + i));
    v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
  }
  static __device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
  static __device__ __forceinline__ void st4(float* p, int64_t i, const float v[4]) {
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
  }
};
// The two 16-bit types differ only in their conversions (Cvt16 below); 4 steps are one
// 8-byte vector of two packed pairs.
template <class H> struct Cvt16;
template <> struct Cvt16<__nv_bfloat16> {
  using H2 = __nv_bfloat162;
  static __device__ __forceinline__ float up(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ float2 up2(H2 x) { return __bfloat1622float2(x); }
  static __device__ __forceinline__ __nv_bfloat16 down(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ H2 down2(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct Cvt16<__half> {
  using H2 = __half2;
  static __device__ __forceinline__ float up(__half x) { return __half2float(x); }
  static __device__ __forceinline__ float2 up2(H2 x) { return __half22float2(x); }
  static __device__ __forceinline__ __half down(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ H2 down2(float a, float b) { return __floats2half2_rn(a, b); }
};
template <class H> struct Io {
  using C = Cvt16<H>;
  using H2 = typename C::H2;
  static __device__ __forceinline__ float ld(const H* p, int64_t i) { return C::up(__ldg(p + i)); }
  static __device__ __forceinline__ void ld4(const H* p, int64_t i, float v[4]) {
    uint2 x = __ldg(reinterpret_cast<const uint2*>(p + i));
    float2 a = C::up2(*reinterpret_cast<H2*>(&x.x));
    float2 b = C::up2(*reinterpret_cast<H2*>(&x.y));
    v[0] = a.x; v[1] = a.y; v[2] = b.x; v[3] = b.y;
  }
  static __device__ __forceinline__ void st(H* p, int64_t i, float v) { p[i] = C::down(v); }
  static __device__ __forceinline__ void st4(H* p, int64_t i, const float v[4]) {
    H2 a = C::down2(v[0], v[1]), b = C::down2(v[2], v[3]);
    uint2 x;
    x.x = *reinterpret_cast<unsigned*>(&a);
    x.y = *reinterpret_cast<unsigned*>(&b);
    *reinterpret_cast<uint2*>(p + i) = x;
  }
};

// Time index of step s (steps run backwards through time for the reverse direction).
__device__ __forceinline__ int64_t tmap(int64_t s, int64_t L, bool rev) { return rev ? L - 1 - s : s; }

// Four steps s0..s0+3 (cnt of them valid) of one row starting at element offset `base`.
// vec: L % 4 == 0, so the four time positions form one aligned vector in either direction.
template <class T>
__device__ __forceinline__ void load4(const T* p, int64_t base, int64_t L, int64_t s0, int cnt,
                                      bool rev, bool vec, float v[4]) {
  if (vec && cnt == 4) {
    Io<T>::ld4(p, base + (rev ? L - 4 - s0 : s0), v);
    if (rev) {
      float t0 = v[0], t1 = v[1];
      v[0] = v[3]; v[1] = v[2]; v[2] = t1; v[3] = t0;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = k < cnt ? Io<T>::ld(p, base + tmap(s0 + k, L, rev)) : 0.f;
  }
}
template <class T>
__device__ __forceinline__ void store4(T* p, int64_t base, int64_t L, int64_t s0, int cnt, bool rev,
                                       bool vec, const float v[4]) {
  if (vec && cnt == 4) {
    float w[4] = {v[0], v[1], v[2], v[3]};
    if (rev) { w[0] = v[3]; w[1] = v[2]; w[2] = v[1]; w[3] = v[0]; }
    Io<T>::st4(p, base + (rev ? L - 4 - s0 : s0), w);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (k < cnt) Io<T>::st(p, base + tmap(s0 + k, L, rev), v[k]);
  }
}

// 2^x on the SFU (ex2.approx.ftz: relative error ~2^-22; results below 2^-126 flush to 0,
// which only drops state contributions already smaller than that).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }
// softplus(x) = max(x, 0) + log1p(t), t = exp(-|x|) in (0, 1], without branches: log1p(t) =
// t q(t) with q a degree-8 polynomial (Chebyshev fit of log1p(t) / t on [0, 1]; relative error
// <= 2e-7 evaluated in float32, measured against float64 over the whole range). One SFU
// exponential and 9 FMAs; the earlier form (series below t = 1/8, the SFU's log2 above) compiled
// to a divergent branch and a second SFU operation. Propagates NaN; softplus(+inf) = inf,
// softplus(-inf) = 0. `t_out` is t, from which the backward forms the sigmoid.
__device__ __forceinline__ float softplus_fast(float x, float& t_out) {
  const float t = fast_exp2(-fabsf(x) * kLog2e);
  float q = 0.005126102361828089f;
  q = fmaf(q, t, -0.029074065387248993f);
  q = fmaf(q, t, 0.0775160863995552f);
  q = fmaf(q, t, -0.13602247834205627f);
  q = fmaf(q, t, 0.19076880812644958f);
  q = fmaf(q, t, -0.2483539879322052f);
  q = fmaf(q, t, 0.3331812024116516f);
  q = fmaf(q, t, -0.4999944567680359f);
  q = fmaf(q, t, 0.9999999403953552f);
  t_out = t;
  return fmaxf(x, 0.f) + q * t;
}
__device__ __forceinline__ float softplus_fast(float x) {
  float t;
  return softplus_fast(x, t);
}
// softplus'(x) = sigmoid(x) from softplus_fast's t = exp(-|x|): 1 / (1 + t) for x >= 0, else
// t / (1 + t). One SFU reciprocal.
__device__ __forceinline__ float sigmoid_from_t(float x, float t) {
  return __fdividef(x >= 0.f ? 1.f : t, 1.f + t);
}
// sigmoid and silu with the SFU's flushing exponential and reciprocal (relative error ~2e-7;
// sigmoid is 0 once exp(-x) overflows, below x = -88).
__device__ __forceinline__ float sigmoid_fast(float x) { return __fdividef(1.f, 1.f + fast_exp2(-x * kLog2e)); }
__device__ __forceinline__ float silu_fast(float x) { return __fdividef(x, 1.f + fast_exp2(-x * kLog2e)); }

// Sum over the P lanes (aligned, power of two) that own one row.
__device__ __forceinline__ float group_sum(float v, int P, unsigned mask) {
  for (int o = 1; o < P; o <<= 1) v += __shfl_xor_sync(mask, v, o);
  return v;
}

// Where lane j's state i of row (b, d) reads B or C: a row offset into the varying
// (batch, G, N, L) array, or the time-invariant value itself.
struct BcRef {
  int64_t off;   // varying: element offset of (b, g, n, 0)
  float inv;     // time-invariant: the value (0 for padding states)
};
__device__ __forceinline__ BcRef bc_ref(const void* X, int64_t groups, int64_t b, int64_t d,
                                        int64_t n, bool nval, const SsProblem& p) {
  BcRef r{0, 0.f};
  const int64_t nn = nval ? n : 0;
  if (groups) {
    r.off = ((b * groups + d / (p.dim / groups)) * p.N + nn) * p.L;
  } else {
    r.inv = nval ? static_cast<const float*>(X)[d * p.N + n] : 0.f;
  }
  return r;
}

struct FwdArgs {
  SsProblem p;
  void* out;
  float* last;        // (R, N) or null
  float* ckpt;        // [row][chunk][state], row stride ck_row: written by kCheckpoint and,
                      // when not null, by the output modes (the forward saving them)
  float* ybuf;        // (R, L) for kRawY / kAddY
  int64_t K;          // checkpoints per row: ceil(L / kCk)
  int64_t ck_row;     // floats per row of ckpt (K * N; twice that for a bidirectional residual)
  int P;              // lanes per row
  int mode;
  bool rev;
  // The L split (SsPlan::nch > 1): chunk c = blockIdx.y walks steps [c * chunk_steps,
  // (c + 1) * chunk_steps) of the walking order, entering with chunk_h[row][c][.] (written
  // by chunk_carry) instead of h0; only the last chunk writes `last`. nch <= 1: no split.
  // Phase A runs on sub-chunks (SsPlan::sub per chunk): its launch has nch = ch_slots
  // sub-chunks of one sub-chunk's steps, ch_sub = 1; the walk after the carries enters chunk c
  // with the state entering its first sub-chunk, slot c * ch_sub.
  int64_t nch, chunk_steps, ch_slots, ch_sub;
  float* chunk_h;     // (R, ch_slots, N): phase A's end states, then the entering states
  float* chunk_S;     // (R, ch_slots): phase A's sum of dt per sub-chunk
};

// The state entering chunk c of a walk, for state n of `row` (zero for padding states).
__device__ __forceinline__ float chunk_entry(const FwdArgs& a, int64_t row, int64_t n, bool nval,
                                            int64_t c) {
  if (!nval || a.mode == kChunkEnd) return 0.f;
  if (a.nch > 1) return a.chunk_h[(row * a.ch_slots + c * a.ch_sub) * a.p.N + n];
  return a.p.h0 ? a.p.h0[row * a.p.N + n] : 0.f;
}

// L split, between phase A and phase C: one thread per (row, state) folds `count` of the row's
// `slots` sub-chunk aggregates in the walk's order, h_in[first] = init and h_in[next] =
// exp2(A log2e S_k) h_in[k] + h_end[k] (the product of a sub-chunk's decays is the exponential
// of A times its summed dt), overwriting the end states in ch (R, slots, N) with the entering
// states. The forward folds slots 0, 1, ... upwards from h0; the backward's adjoint
// (g <- E (g + C dy)) folds slots - 1, slots - 2, ... downwards from dlast. The loads of four
// slots go out together, ahead of their stores: one memory round trip per four, not per slot.
static __global__ void chunk_carry(SsProblem p, int64_t slots, int64_t count, float* ch, const float* cS,
                                   const float* init, bool descending) {
  const int64_t N = p.N, R = p.batch * p.dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * N) return;
  const int64_t row = i / N, n = i % N, d = row % p.dim;
  const float a2 = p.A[d * N + n] * kLog2e;
  float h = init ? init[row * N + n] : 0.f;
  for (int64_t k0 = 0; k0 < count; k0 += 4) {
    float end[4], dec[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t k = k0 + u, c = descending ? slots - 1 - k : k;
      const bool more = k + 1 < count;  // the last slot is only written
      end[u] = more ? ch[(row * slots + c) * N + n] : 0.f;
      dec[u] = more ? cS[row * slots + c] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int64_t k = k0 + u, c = descending ? slots - 1 - k : k;
      if (k >= count) break;
      ch[(row * slots + c) * N + n] = h;
      if (k + 1 < count) h = fmaf(fast_exp2(a2 * dec[u]), h, end[u]);
    }
  }
}

__device__ __forceinline__ float sel4(const float v[4], int k) {
  return k == 0 ? v[0] : k == 1 ? v[1] : k == 2 ? v[2] : v[3];
}
__device__ __forceinline__ void share4(float mine, int gbase, unsigned mask, float out[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) out[q] = __shfl_sync(mask, mine, gbase + q);
}

// Per-step scalars (dt, and for the backward sigmoid(dt_raw), silu(z), silu'(z)) are the
// same for the P lanes of a row: with P >= 4 lane j computes step j % 4 and the group
// shares it by shuffle, instead of every lane evaluating exp/log1p for every step.
struct StepScalars {
  float dt[4], sg[4], gate[4], dgate[4];
};
template <bool kBackward>
__device__ __forceinline__ void step_scalars(const float d4[4], const float z4[4], bool has_z,
                                             float bias, bool sp, int P, int j, int gbase,
                                             unsigned mask, StepScalars& o) {
  auto one = [&](float draw, float zz, float& dt, float& sg, float& gate, float& dgate) {
    const float x = draw + bias;
    dt = sp ? softplus(x) : x;
    if (kBackward) {
      sg = sp ? sigmoid(x) : 1.f;
      const float s = sigmoid(zz);
      gate = has_z ? zz * s : 1.f;
      dgate = has_z ? s * (1.f + zz * (1.f - s)) : 0.f;
    }
  };
  if (P >= 4) {
    const int k = j & 3;
    float dt, sg = 1.f, gate = 1.f, dgate = 0.f;
    one(sel4(d4, k), has_z ? sel4(z4, k) : 0.f, dt, sg, gate, dgate);
    share4(dt, gbase, mask, o.dt);
    if (kBackward) {
      share4(sg, gbase, mask, o.sg);
      share4(gate, gbase, mask, o.gate);
      share4(dgate, gbase, mask, o.dgate);
    }
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) one(d4[q], has_z ? z4[q] : 0.f, o.dt[q], o.sg[q], o.gate[q], o.dgate[q]);
  }
}

// The lane of a row's group that finalises step k (k < 8) of a tile or chunk.
__device__ __forceinline__ bool owns(int k, int P, int j) { return (k & (P - 1)) == j; }

template <class T, int NS>
struct FwdTile {
  float u[4], d[4], z[4], b[NS][4], c[NS][4];
};

template <class T, int NS>
__device__ __forceinline__ void fwd_load(FwdTile<T, NS>& x, const SsProblem& p, int64_t base,
                                         const BcRef* rb, const BcRef* rc, const bool* nval,
                                         int64_t s0, int cnt, bool rev, bool vec, bool outputs) {
  const int64_t L = p.L;
  load4(static_cast<const T*>(p.u), base, L, s0, cnt, rev, vec, x.u);
  load4(static_cast<const T*>(p.delta), base, L, s0, cnt, rev, vec, x.d);
  if (p.z && outputs) load4(static_cast<const T*>(p.z), base, L, s0, cnt, rev, vec, x.z);
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    if (p.groups_b) {
      load4(static_cast<const T*>(p.B), rb[i].off, L, s0, cnt, rev, vec, x.b[i]);
      if (!nval[i]) x.b[i][0] = x.b[i][1] = x.b[i][2] = x.b[i][3] = 0.f;
    } else {
      x.b[i][0] = x.b[i][1] = x.b[i][2] = x.b[i][3] = rb[i].inv;
    }
    if (outputs) {
      if (p.groups_c) {
        load4(static_cast<const T*>(p.C), rc[i].off, L, s0, cnt, rev, vec, x.c[i]);
      } else {
        x.c[i][0] = x.c[i][1] = x.c[i][2] = x.c[i][3] = rc[i].inv;
      }
    }
  }
}

template <class T, int NS>
__global__ void __launch_bounds__(kBlock) fwd_kernel(FwdArgs a) {
  const SsProblem& p = a.p;
  const int P = a.P;
  const int64_t R = p.batch * p.dim, L = p.L, N = p.N;
  int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / P;
  const int j = threadIdx.x & (P - 1);
  const int gbase = (threadIdx.x & 31) & ~(P - 1);
  const bool live = row < R;
  if (!live) row = R - 1;  // keeps the lanes converged for the shuffles; stores nothing
  const int64_t b = row / p.dim, d = row % p.dim, base = row * L;
  const bool vec = (L & 3) == 0, rev = a.rev, outputs = a.mode != kCheckpoint && a.mode != kChunkEnd;

  // This block's L chunk (all of L without a split).
  const int64_t c = blockIdx.y, nch = a.nch > 1 ? a.nch : 1;
  const int64_t sb = nch > 1 ? c * a.chunk_steps : 0;
  const int64_t se = nch > 1 && sb + a.chunk_steps < L ? sb + a.chunk_steps : L;
  float a2[NS], h[NS], S = 0.f;
  BcRef rb[NS], rc[NS];
  bool nval[NS];
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int64_t n = static_cast<int64_t>(j) * NS + i;
    nval[i] = n < N;
    a2[i] = nval[i] ? p.A[d * N + n] * kLog2e : 0.f;
    h[i] = chunk_entry(a, row, n, nval[i], c);
    rb[i] = bc_ref(p.B, p.groups_b, b, d, n, nval[i], p);
    rc[i] = bc_ref(p.C, p.groups_c, b, d, n, nval[i], p);
  }
  const float Dd = p.Dskip ? p.Dskip[d] : 0.f;
  const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;

  // Software pipeline: the next tile's loads are in flight while this one is computed.
  FwdTile<T, NS> cur, nxt;
  fwd_load<T, NS>(cur, p, base, rb, rc, nval, sb, se - sb < 4 ? static_cast<int>(se - sb) : 4, rev, vec,
                  outputs);
  for (int64_t s0 = sb; s0 < se; s0 += 4) {
    const int cnt = se - s0 < 4 ? static_cast<int>(se - s0) : 4;
    if (s0 + 4 < se) {
      const int64_t rest = se - s0 - 4;
      fwd_load<T, NS>(nxt, p, base, rb, rc, nval, s0 + 4, rest < 4 ? static_cast<int>(rest) : 4, rev,
                      vec, outputs);
    }
    if (a.ckpt && (s0 % kCk) == 0 && live) {
#pragma unroll
      for (int i = 0; i < NS; ++i)
        if (nval[i]) a.ckpt[row * a.ck_row + (s0 / kCk) * N + j * NS + i] = h[i];
    }
    StepScalars sc;
    step_scalars<false>(cur.d, cur.z, false, bias, p.softplus, P, j, gbase, kFull, sc);
    float y4[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      y4[k] = 0.f;
      if (k < cnt) {
        S += sc.dt[k];
        const float du = sc.dt[k] * cur.u[k];
        float y = 0.f;
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          const float dA = fast_exp2(sc.dt[k] * a2[i]);
          h[i] = fmaf(dA, h[i], du * cur.b[i][k]);
          if (outputs) y = fmaf(cur.c[i][k], h[i], y);
        }
        if (outputs) y4[k] = group_sum(y, P, kFull);
      }
    }
    if (outputs && live) {
      // Every lane holds the four sums; lane k % P finalises step k.
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k < cnt && owns(k, P, j)) {
          const int64_t t = base + tmap(s0 + k, L, rev);
          if (a.mode == kRawY) {
            a.ybuf[t] = y4[k];
          } else {
            float v = y4[k] + Dd * cur.u[k];
            if (a.mode == kAddY) v = y4[k] + a.ybuf[t] + 2.f * Dd * cur.u[k];
            if (p.z) v *= silu(cur.z[k]);
            Io<T>::st(static_cast<T*>(a.out), t, v);
          }
        }
      }
    }
    cur = nxt;
  }
  if (a.mode == kChunkEnd) {
    if (live) {
#pragma unroll
      for (int i = 0; i < NS; ++i)
        if (nval[i]) a.chunk_h[(row * a.ch_slots + c) * N + j * NS + i] = h[i];
      if (j == 0) a.chunk_S[row * a.ch_slots + c] = S;
    }
  } else if (a.last && live && c == nch - 1) {
#pragma unroll
    for (int i = 0; i < NS; ++i)
      if (nval[i]) a.last[row * N + j * NS + i] = h[i];
  }
}


struct BwdArgs {
  SsProblem p;
  const void* dout;
  const float* dlast;     // (R, N) cotangent of this direction's last state, or null
  const float* ckpt;      // [row][chunk][state], row stride ck_row
  int64_t K, ck_row;
  int P, CB;              // lanes per row, rows (channels) per block
  bool rev;
  int dir, ndir;          // this direction's slot in the partial buffers
  // "bidirectional": the first launch (phase 1) parks its du / ddelta / y in float32
  // buffers, the second (phase 2) adds them and writes the final values.
  int phase;              // 0: single direction, 1: first of two, 2: second of two
  float* du_acc;          // (R, L)
  float* dd_acc;          // (R, L)
  float* ybuf;            // (R, L)
  void* du;               // final outputs (phase 0 / 2), in T
  void* ddelta;
  void* dz;
  // Partials (float32), reduced by sum_jobs afterwards:
  float* pdB;             // varying: (batch, D/CB, ndir, N, L); invariant: (batch, ndir, D, N)
  float* pdC;
  float* pdA;             // (batch, ndir, D, N)
  float* pdD;             // (batch, ndir, D)
  float* pdbias;          // (batch, ndir, D)
  float* pdh0;            // (ndir, R, N)
  // The backward's L split (SsPlan::bnch > 1; both backward kernels): chunk c = blockIdx.y +
  // chunk_base walks walking-order steps [c * chunk_steps, (c + 1) * chunk_steps) backwards,
  // entering with chunk_g[row][c][.] instead of dlast. chunk_end (phase A): the adjoint alone
  // from g = 0, writing g and the sum of dt at the chunk's start. The per-row partials (pdA,
  // pdD, pdbias, time-invariant pdB / pdC) get a leading chunk index; chunk 0 writes dh0.
  // Phase A runs on sub-chunks (SsPlan::bsub per chunk; its launch: nch = ch_slots sub-chunks,
  // ch_sub = 1); the backward after the carries enters chunk c with the adjoint entering its
  // last sub-chunk (chunk_g_slot).
  int64_t nch, chunk_steps, chunk_base, ch_slots, ch_sub;
  float* chunk_g;         // (R, ch_slots, N)
  float* chunk_S;         // (R, ch_slots)
  bool chunk_end;
};

// The slot of chunk_g holding the adjoint entering chunk c (walked backwards, so entered from
// its last sub-chunk).
__device__ __forceinline__ int64_t chunk_g_slot(const BwdArgs& a, int64_t row, int64_t c) {
  const int64_t last = (c + 1) * a.ch_sub < a.ch_slots ? (c + 1) * a.ch_sub : a.ch_slots;
  return row * a.ch_slots + last - 1;
}

template <class T, int NS>
__global__ void __launch_bounds__(kBlock) bwd_kernel(BwdArgs a) {
  extern __shared__ float smem[];
  const SsProblem& p = a.p;
  const int P = a.P, CB = a.CB, NP = P * NS;
  const int64_t L = p.L, N = p.N, Dm = p.dim, R = p.batch * Dm;
  const int64_t nblk = Dm / CB;
  const int64_t b = blockIdx.x / nblk, cb = blockIdx.x % nblk;
  const int ch = threadIdx.x / P, j = threadIdx.x & (P - 1);
  const int64_t d = cb * CB + ch, row = b * Dm + d, base = row * L;
  const unsigned mask = blockDim.x >= 32 ? kFull : ((1u << blockDim.x) - 1u);
  const int gbase = (threadIdx.x & 31) & ~(P - 1);
  const bool vec = (L & 3) == 0, rev = a.rev;
  const bool varB = p.groups_b != 0, varC = p.groups_c != 0;
  const T* u = static_cast<const T*>(p.u);
  const T* de = static_cast<const T*>(p.delta);
  const T* z = static_cast<const T*>(p.z);
  const T* dout = static_cast<const T*>(a.dout);
  const T* Bp = static_cast<const T*>(p.B);
  const T* Cp = static_cast<const T*>(p.C);
  float* sB = smem;                       // [kCk][CB][NP]
  float* sC = smem + kCk * CB * NP;

  // This block's L chunk (BwdArgs): checkpoint chunks [kb, ke), walked backwards.
  const int64_t lc = blockIdx.y + a.chunk_base, nch = a.nch > 1 ? a.nch : 1;
  const int64_t kb = nch > 1 ? lc * (a.chunk_steps / kCk) : 0;
  const int64_t ke = nch > 1 && kb + a.chunk_steps / kCk < a.K ? kb + a.chunk_steps / kCk : a.K;
  float an[NS], a2[NS], g[NS], accA[NS], accB[NS], accC[NS], S = 0.f;
  BcRef rb[NS], rc[NS];
  bool nval[NS];
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    const int64_t n = static_cast<int64_t>(j) * NS + i;
    nval[i] = n < N;
    an[i] = nval[i] ? p.A[d * N + n] : 0.f;
    a2[i] = an[i] * kLog2e;
    g[i] = 0.f;
    if (nval[i] && !a.chunk_end) {
      if (nch > 1) g[i] = a.chunk_g[chunk_g_slot(a, row, lc) * N + n];
      else if (a.dlast) g[i] = a.dlast[row * N + n];
    }
    accA[i] = accB[i] = accC[i] = 0.f;
    rb[i] = bc_ref(p.B, p.groups_b, b, d, n, nval[i], p);
    rc[i] = bc_ref(p.C, p.groups_c, b, d, n, nval[i], p);
  }
  const float Dd = p.Dskip ? p.Dskip[d] : 0.f;
  const float bias = p.delta_bias ? p.delta_bias[d] : 0.f;
  const float dmult = a.ndir == 2 ? 2.f : 1.f;
  float accD = 0.f, accBias = 0.f;

  for (int64_t kc = ke - 1; kc >= kb; --kc) {
    const int64_t s_begin = kc * kCk;
    const int cnt = L - s_begin < kCk ? static_cast<int>(L - s_begin) : kCk;
    float hst[NS], hs[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      hst[i] = (nval[i] && !a.chunk_end) ? a.ckpt[row * a.ck_row + kc * N + j * NS + i] : 0.f;
      hs[i] = hst[i];
    }
    // Recompute the chunk: states H, exponentials E, per-step scalars, y.
    float H[kCk][NS], E[kCk][NS], dtv[kCk], uv[kCk], sg[kCk], gt[kCk], dgt[kCk], yv[kCk], gov[kCk];
#pragma unroll
    for (int half = 0; half < kCk / 4; ++half) {
      const int64_t s0 = s_begin + 4 * half;
      const int c4 = cnt - 4 * half;  // may be <= 0
      const int cl = c4 < 0 ? 0 : (c4 > 4 ? 4 : c4);
      float u4[4], d4[4], o4[4], z4[4] = {0.f, 0.f, 0.f, 0.f};
      load4(u, base, L, s0, cl, rev, vec, u4);
      load4(de, base, L, s0, cl, rev, vec, d4);
      load4(dout, base, L, s0, cl, rev, vec, o4);
      if (z) load4(z, base, L, s0, cl, rev, vec, z4);
      float bv[NS][4], cv[NS][4];
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        if (varB) {
          load4(Bp, rb[i].off, L, s0, cl, rev, vec, bv[i]);
          if (!nval[i]) bv[i][0] = bv[i][1] = bv[i][2] = bv[i][3] = 0.f;
        } else {
          bv[i][0] = bv[i][1] = bv[i][2] = bv[i][3] = rb[i].inv;
        }
        if (varC) {
          load4(Cp, rc[i].off, L, s0, cl, rev, vec, cv[i]);
        } else {
          cv[i][0] = cv[i][1] = cv[i][2] = cv[i][3] = rc[i].inv;
        }
      }
      StepScalars sc;
      step_scalars<true>(d4, z4, z != nullptr, bias, p.softplus, P, j, gbase, mask, sc);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int k = 4 * half + q;
        dtv[k] = sc.dt[q];
        sg[k] = sc.sg[q];
        gt[k] = sc.gate[q];
        dgt[k] = sc.dgate[q];
        uv[k] = u4[q];
        gov[k] = o4[q];
        float y = 0.f;
        const float du = dtv[k] * uv[k];
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          E[k][i] = fast_exp2(dtv[k] * a2[i]);
          hs[i] = fmaf(E[k][i], hs[i], du * bv[i][q]);
          H[k][i] = hs[i];
          y = fmaf(cv[i][q], hs[i], y);
        }
        yv[k] = group_sum(y, P, mask);
      }
    }
    if (a.chunk_end) {  // phase A of the L split: the adjoint alone (no barrier below is skipped
                        // by part of the block: chunk_end is uniform)
#pragma unroll
      for (int k = kCk - 1; k >= 0; --k) {
        if (k < cnt) {
          const int64_t t = tmap(s_begin + k, L, rev);
          const float dy = gov[k] * gt[k];
          S += dtv[k];
#pragma unroll
          for (int i = 0; i < NS; ++i) {
            float cvi;
            if (varC) cvi = nval[i] ? Io<T>::ld(Cp, rc[i].off + t) : 0.f; else cvi = rc[i].inv;
            g[i] = E[k][i] * fmaf(cvi, dy, g[i]);
          }
        }
      }
      continue;
    }
    // The adjoint, backwards through the chunk.
#pragma unroll
    for (int k = kCk - 1; k >= 0; --k) {
      if (k < cnt) {
        const int64_t t = tmap(s_begin + k, L, rev);
        const float dy = gov[k] * gt[k];
        float ddt = 0.f, dua = 0.f;
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          float bvi, cvi;
          if (varB) bvi = nval[i] ? Io<T>::ld(Bp, rb[i].off + t) : 0.f; else bvi = rb[i].inv;
          if (varC) cvi = nval[i] ? Io<T>::ld(Cp, rc[i].off + t) : 0.f; else cvi = rc[i].inv;
          const float gi = fmaf(cvi, dy, g[i]);
          const float hp = k > 0 ? H[k > 0 ? k - 1 : 0][i] : hst[i];
          const float gdt = gi * dtv[k];
          const float eh = E[k][i] * hp;
          const float dBc = gdt * uv[k];
          const float dCc = dy * H[k][i];
          ddt = fmaf(gi, fmaf(bvi, uv[k], an[i] * eh), ddt);
          dua = fmaf(gdt, bvi, dua);
          accA[i] = fmaf(gdt, eh, accA[i]);
          g[i] = E[k][i] * gi;
          if (varB) sB[(k * CB + ch) * NP + j * NS + i] = dBc; else accB[i] += dBc;
          if (varC) sC[(k * CB + ch) * NP + j * NS + i] = dCc; else accC[i] += dCc;
        }
        ddt = group_sum(ddt, P, mask);
        dua = group_sum(dua, P, mask);
        if (owns(k, P, j)) {  // every lane holds the sums; lane k % P finalises step k
          float dd = ddt * sg[k];
          if (a.phase == 1) {
            a.du_acc[base + t] = dua;
            a.dd_acc[base + t] = dd;
            a.ybuf[base + t] = yv[k];
          } else {
            float ytot = yv[k] + Dd * uv[k];
            if (a.phase == 2) {
              dua += a.du_acc[base + t];
              dd += a.dd_acc[base + t];
              ytot = yv[k] + a.ybuf[base + t] + 2.f * Dd * uv[k];
            }
            Io<T>::st(static_cast<T*>(a.du), base + t, fmaf(dmult * Dd, dy, dua));
            Io<T>::st(static_cast<T*>(a.ddelta), base + t, dd);
            if (z) Io<T>::st(static_cast<T*>(a.dz), base + t, gov[k] * ytot * dgt[k]);
            accD = fmaf(dmult * dy, uv[k], accD);
            accBias += dd;
          }
        }
      }
    }
    // Fixed-order reduction of this chunk's dB / dC over the block's channels.
    if (varB || varC) {
      __syncthreads();
      for (int q = threadIdx.x; q < kCk * NP; q += blockDim.x) {
        const int n = q % NP, k = q / NP;
        if (k < cnt && n < N) {
          const int64_t t = tmap(s_begin + k, L, rev);
          const int64_t o = (((b * nblk + cb) * a.ndir + a.dir) * N + n) * L + t;
          if (varB) {
            float s = 0.f;
            for (int c = 0; c < CB; ++c) s += sB[(k * CB + c) * NP + n];
            a.pdB[o] = s;
          }
          if (varC) {
            float s = 0.f;
            for (int c = 0; c < CB; ++c) s += sC[(k * CB + c) * NP + n];
            a.pdC[o] = s;
          }
        }
      }
      __syncthreads();
    }
  }
  if (a.chunk_end) {
#pragma unroll
    for (int i = 0; i < NS; ++i)
      if (nval[i]) a.chunk_g[(row * a.ch_slots + lc) * N + j * NS + i] = g[i];
    if (j == 0) a.chunk_S[row * a.ch_slots + lc] = S;
    return;
  }
  const int64_t pslot = ((lc * p.batch + b) * a.ndir + a.dir) * Dm + d;  // (chunk, batch, ndir, D)
#pragma unroll
  for (int i = 0; i < NS; ++i) {
    if (!nval[i]) continue;
    const int64_t n = static_cast<int64_t>(j) * NS + i;
    a.pdA[pslot * N + n] = accA[i];
    if (!varB) a.pdB[pslot * N + n] = accB[i];
    if (!varC) a.pdC[pslot * N + n] = accC[i];
    if (a.pdh0 && lc == 0) a.pdh0[(a.dir * R + row) * N + n] = g[i];
  }
  accD = group_sum(accD, P, mask);        // each lane summed its own steps
  accBias = group_sum(accBias, P, mask);
  if (j == 0) {
    if (a.pdD) a.pdD[pslot] = accD;
    if (a.pdbias) a.pdbias[pslot] = accBias;
  }
}

// The backward's partial sums, all of them in one launch: job j is out[o, i] = sum over q < Q
// of in[o, q, i], in an order fixed by the job's shape (so the gradients stay bitwise
// reproducible). Two layouts, per job:
// * split 1 (many outputs: dB, dC of varying B/C, dh0): a thread per output sums q = 0, 1, ...
//   in order, kSumUnroll loads in flight at a time; consecutive threads, consecutive outputs;
// * split kSumWarps (few outputs with long sums: dA, dD, ddelta_bias over batch x chunks x
//   directions): a block takes 32 consecutive outputs, warp w sums q = w, w + 8, ... in order,
//   then warp 0 adds the 8 partial sums in warp order; one thread per output would wait
//   Q / kSumUnroll memory round trips in a handful of blocks.
constexpr int kSumWarps = 8;
constexpr int kSumThreads = 32 * kSumWarps;
constexpr int kSumUnroll = 8;
constexpr int kMaxSumJobs = 8;
struct SumJob {
  const float* in;
  void* out;       // float32, or the kernel's T where out_t (dB / dC of a varying B / C)
  bool out_t;
  int64_t outer, Q, inner;
  int split;       // 1 or kSumWarps
  int64_t blocks;  // blocks of this job; each strides over the job's tiles
};
struct SumJobs {
  SumJob job[kMaxSumJobs];
  int n;
};
// Outputs per tile (one block iteration) of a job.
__host__ __device__ constexpr int64_t sum_tile(int split) { return split == 1 ? kSumThreads : 32; }

// The sum of src[q * inner] for q = q0, q0 + dq, ... < Q, added from 0 in that order,
// kSumUnroll loads issued before their adds.
__device__ __forceinline__ float sum_terms(const float* src, int64_t inner, int64_t q0, int64_t dq, int64_t Q) {
  float acc = 0.f;
  for (; q0 < Q; q0 += dq * kSumUnroll) {
    float v[kSumUnroll];
#pragma unroll
    for (int k = 0; k < kSumUnroll; ++k) {
      const int64_t q = q0 + k * dq;
      v[k] = q < Q ? src[q * inner] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < kSumUnroll; ++k) acc += v[k];
  }
  return acc;
}

// out[idx] = v in the job's output dtype (T: rounded to nearest even, as XLA's convert).
template <class T>
__device__ __forceinline__ void sum_store(const SumJob& jb, int64_t idx, float v) {
  if (jb.out_t) Io<T>::st(static_cast<T*>(jb.out), idx, v);
  else static_cast<float*>(jb.out)[idx] = v;
}

template <class T>
static __global__ void __launch_bounds__(kSumThreads) sum_jobs(SumJobs jobs) {
  __shared__ float part[kSumWarps][32];
  int64_t blk = blockIdx.x;
  int j = 0;
  while (j < jobs.n - 1 && blk >= jobs.job[j].blocks) blk -= jobs.job[j++].blocks;  // uniform
  const SumJob& jb = jobs.job[j];
  const int64_t total = jb.outer * jb.inner, per = sum_tile(jb.split), tiles = (total + per - 1) / per;
  if (jb.split == 1) {
    for (int64_t t = blk; t < tiles; t += jb.blocks) {
      const int64_t idx = t * per + threadIdx.x;
      if (idx >= total) continue;
      const int64_t o = idx / jb.inner, i = idx % jb.inner;
      sum_store<T>(jb, idx, sum_terms(jb.in + o * jb.Q * jb.inner + i, jb.inner, 0, 1, jb.Q));
    }
    return;
  }
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  for (int64_t t = blk; t < tiles; t += jb.blocks) {
    const int64_t idx = t * per + lane;
    float acc = 0.f;
    if (idx < total) {
      const int64_t o = idx / jb.inner, i = idx % jb.inner;
      acc = sum_terms(jb.in + o * jb.Q * jb.inner + i, jb.inner, w, kSumWarps, jb.Q);
    }
    part[w][lane] = acc;
    __syncthreads();
    if (w == 0 && idx < total) {
      float sum = part[0][lane];
#pragma unroll
      for (int k = 1; k < kSumWarps; ++k) sum += part[k][lane];
      sum_store<T>(jb, idx, sum);
    }
    __syncthreads();
  }
}

}  // namespace ssk
}  // namespace jss
