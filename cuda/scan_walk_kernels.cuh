// The walk kernels: one warp per sequence (row_walk, strided_walk).
#pragma once

#include "scan_block.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// Walk kernels (chosen by "auto" only): one warp owns a whole sequence and walks it from
// start to end with the carry in registers. No inter-block communication at all, so the
// result is trivially deterministic. Loads go through a per-warp ring of STAGES shared-
// memory stages filled with cp.async, so that STAGES-1 stages of loads are always in
// flight while the warp scans the oldest one. Each lane copies and later reads only its
// own 16/8/4-byte slots, so no barrier is needed: cp.async.wait_group makes a lane's own
// copies visible to that lane. One warp per block (dynamic shared memory), so that the

// One sub-chunk of a row: lane l holds logical items [l*VEC, +VEC) in x. Serial scan in
// the lane, Kogge-Stone over the lanes, then y = (carry o lane-exclusive) o x; the carry
// moves on by the sub-chunk total (lane 31's inclusive value).
template <class S, int VEC>
__device__ __forceinline__ void warp_sub_scan(Pair<S> (&x)[VEC], Pair<S>& carry, int lane) {
  using P = Pair<S>;
  P ex;
  const P w = thread_warp_scan<S, VEC>(x, lane, ex);
  const P pre = combine(carry, ex);
#pragma unroll
  for (int e = 0; e < VEC; ++e) x[e] = combine(pre, x[e]);
  carry = combine(carry, shfl_idx(w, 31));
}

// One sub-chunk of a row: the lane's 16-byte vectors ra (of a) and rb (of b), read from its ring
// stage, scanned into the warp's carry; h (and a_prod) stored. p: the lane's first logical item.
template <class T>
__device__ __forceinline__ void row_walk_sub(const Dev& d, int64_t p, int64_t L, T* h, T* ap,
                                             Pair<typename Elem<T>::S>& carry, int lane, const uint4& ra,
                                             const uint4& rb, bool valid) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int VEC = 16 / sizeof(T);
  P x[VEC];
  Vec16<T> va, vb;
  *reinterpret_cast<uint4*>(&va) = ra;
  *reinterpret_cast<uint4*>(&vb) = rb;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int i = d.reverse ? VEC - 1 - e : e;
    x[i] = valid ? P{E::up(va.v[e]), E::up(vb.v[e])} : identity<S>();
  }
  warp_sub_scan<S, VEC>(x, carry, lane);
  if (valid) {
    const int64_t q = d.reverse ? L - p - VEC : p;
    Vec16<T> vh, vp;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const int i = d.reverse ? VEC - 1 - e : e;
      vh.v[e] = E::down(x[i].b);
      vp.v[e] = E::down(x[i].a);
    }
    store16(h + q, vh);
    if (ap) store16(ap + q, vp);
  }
}

// Contiguous layout, one warp per d.rows_per_warp consecutive rows. Sub-chunk j of a row covers
// logical items [j*SUB, (j+1)*SUB), SUB = 32*VEC; lane l holds [j*SUB + l*VEC, +VEC) (one
// 16-byte vector of a and one of b, physical start p (forward) or L-p-VEC (reverse, items in
// reversed order)).
//  * MULTI = false (one row a warp): stage j % STAGES of the warp's ring holds sub-chunk j.
//  * MULTI = true (short rows, several a warp): the ring runs on across the warp's rows, so that
//    its STAGES-1 stages of loads stay in flight from one row into the next instead of draining
//    at every row's end (docs/PERFORMANCE_CUDA.md section 21); the warp's n-th sub-chunk, counted
//    over its rows, sits in stage n % STAGES. Its cursor costs issue slots that one row a warp
//    does not need: run with one row, bf16 rows of 8-32 KB ran at 75-80% of copy on an H100
//    against 87-94% for the one-row loop (kernel alone; docs/PERFORMANCE_CUDA.md 23.4), and at
//    72-74% on an H200 against the one-row loop's 84-90% of session 49; hence two loops.
template <class T, int STAGES, bool MULTI>
__global__ void __launch_bounds__(32) row_walk_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int VEC = 16 / sizeof(T);
  constexpr int SUB = 32 * VEC;
  extern __shared__ uint4 s_ring[];  // [STAGES][2][32]
  const int lane = threadIdx.x;
  const int64_t L = d.L;
  const int64_t r0 = int64_t(blockIdx.x) * d.rows_per_warp;
  const int64_t left = d.nchains - r0;
  const int64_t nrows = d.rows_per_warp < left ? d.rows_per_warp : left;  // this warp's rows
  const int64_t nsub = (L + SUB - 1) / SUB;
  if (d.vec && !MULTI) {
    const int64_t r = r0;
    const T* a = static_cast<const T*>(d.a) + r * L;
    const T* b = static_cast<const T*>(d.b) + r * L;
    T* h = static_cast<T*>(d.h) + r * L;
    T* ap = d.aprod ? static_cast<T*>(d.aprod) + r * L : nullptr;
    P carry = h0_pair<T>(d, r);
    auto issue = [&](int64_t j) {
      const int64_t p = j * SUB + (int64_t)lane * VEC;
      if (j < nsub && p < L) {
        const int64_t q = d.reverse ? L - p - VEC : p;
        uint4* st = s_ring + (j % STAGES) * 64;
        cp_async<16>(st + lane, a + q);
        cp_async<16>(st + 32 + lane, b + q);
      }
      cp_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int64_t j = 0; j < nsub; ++j) {
      cp_wait<STAGES - 2>();
      const uint4* st = s_ring + (j % STAGES) * 64;
      const int64_t p = j * SUB + (int64_t)lane * VEC;
      const bool valid = p < L;
      uint4 ra, rb;  // read only where valid
      if (valid) { ra = st[lane]; rb = st[32 + lane]; }
      issue(j + STAGES - 1);  // into the stage read in the previous iteration
      row_walk_sub<T>(d, p, L, h, ap, carry, lane, ra, rb, valid);
    }
    cp_wait<0>();
  } else if (d.vec) {
    // The issue cursor: the warp's next sub-chunk to load, (row ik, sub-chunk ij), and its
    // running count ni (its stage).
    int64_t ik = 0, ij = 0, ni = 0;
    auto issue = [&]() {
      const int64_t p = ij * SUB + (int64_t)lane * VEC;
      if (ik < nrows && p < L) {
        const int64_t q = (r0 + ik) * L + (d.reverse ? L - p - VEC : p);
        uint4* st = s_ring + (ni % STAGES) * 64;
        cp_async<16>(st + lane, static_cast<const T*>(d.a) + q);
        cp_async<16>(st + 32 + lane, static_cast<const T*>(d.b) + q);
      }
      cp_commit();
      ++ni;
      if (++ij == nsub) { ij = 0; ++ik; }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue();
    int64_t n = 0;  // the running count of the sub-chunk scanned
    for (int64_t k = 0; k < nrows; ++k) {
      const int64_t r = r0 + k;
      T* h = static_cast<T*>(d.h) + r * L;
      T* ap = d.aprod ? static_cast<T*>(d.aprod) + r * L : nullptr;
      P carry = h0_pair<T>(d, r);
      for (int64_t j = 0; j < nsub; ++j, ++n) {
        cp_wait<STAGES - 2>();
        const uint4* st = s_ring + (n % STAGES) * 64;
        const int64_t p = j * SUB + (int64_t)lane * VEC;
        const bool valid = p < L;
        uint4 ra, rb;  // read only where valid
        if (valid) { ra = st[lane]; rb = st[32 + lane]; }
        issue();  // sub-chunk n + STAGES - 1, into the stage read in the previous iteration
        row_walk_sub<T>(d, p, L, h, ap, carry, lane, ra, rb, valid);
      }
    }
    cp_wait<0>();
  } else {  // unaligned or L not a multiple of VEC: scalar loads, same item mapping
    for (int64_t k = 0; k < nrows; ++k) {
      const int64_t r = r0 + k;
      const T* a = static_cast<const T*>(d.a) + r * L;
      const T* b = static_cast<const T*>(d.b) + r * L;
      T* h = static_cast<T*>(d.h) + r * L;
      T* ap = d.aprod ? static_cast<T*>(d.aprod) + r * L : nullptr;
      P carry = h0_pair<T>(d, r);
      for (int64_t j = 0; j < nsub; ++j) {
        const int64_t p = j * SUB + (int64_t)lane * VEC;
        P x[VEC];
        load_items<T, VEC>(d, a, b, p, x);  // d.vec is false: scalar loads, identity past L
        warp_sub_scan<S, VEC>(x, carry, lane);
        store_items<T, VEC>(d, h, ap, p, x);
      }
    }
  }
}

// Strided layout, one warp per group of CWW = 32*NCH consecutive channels (NCH = 2 for
// 16-bit types, else 1: 4 or 8 bytes per lane, 128 or 256 bytes per warp and step),
// walking the whole scanned axis. Warp g: o = g / nct, channel group cg = g % nct; lane l
// owns channels c0 = cg*CWW + l*NCH .. +NCH. Ring stage s holds K consecutive steps.
template <class T>
struct WalkCfg {
  static constexpr int NCH = sizeof(T) >= 4 ? 1 : 4 / sizeof(T);
  static constexpr int VB = NCH * sizeof(T);
  static constexpr int CWW = 32 * NCH;
};
template <class T, int STAGES, int K>
__global__ void __launch_bounds__(32) strided_walk_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NCH = WalkCfg<T>::NCH;
  constexpr int VB = WalkCfg<T>::VB;
  constexpr int CWW = WalkCfg<T>::CWW;
  struct alignas(VB) Raw {
    T v[NCH];
  };
  extern __shared__ uint4 s_ring_raw[];
  Raw* ring = reinterpret_cast<Raw*>(s_ring_raw);  // [STAGES][K][2][32]
  const int lane = threadIdx.x;
  const int64_t g = blockIdx.x;
  const int64_t o = g / d.nct, cg = g % d.nct;
  const int64_t L = d.L, inner = d.inner;
  const int64_t c0 = cg * CWW + (int64_t)lane * NCH;
  const T* a = static_cast<const T*>(d.a) + o * L * inner + c0;
  const T* b = static_cast<const T*>(d.b) + o * L * inner + c0;
  T* h = static_cast<T*>(d.h) + o * L * inner + c0;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + o * L * inner + c0 : nullptr;
  P carry[NCH];
#pragma unroll
  for (int e = 0; e < NCH; ++e)
    carry[e] = c0 + e < inner ? h0_pair<T>(d, o * inner + c0 + e) : identity<S>();
  if (d.vec) {  // inner % NCH == 0 and aligned: whole vectors
    const bool active = c0 < inner;
    const int64_t ngrp = (L + K - 1) / K;
    auto issue = [&](int64_t j) {
      if (active && j < ngrp) {
        Raw* st = ring + (j % STAGES) * (K * 64);
#pragma unroll
        for (int kk = 0; kk < K; ++kk) {
          const int64_t p = j * K + kk;
          if (p < L) {
            const int64_t q = d.reverse ? L - 1 - p : p;
            cp_async<VB>(st + kk * 64 + lane, a + q * inner);
            cp_async<VB>(st + kk * 64 + 32 + lane, b + q * inner);
          }
        }
      }
      cp_commit();
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue(s);
    for (int64_t j = 0; j < ngrp; ++j) {
      cp_wait<STAGES - 2>();
      const Raw* st = ring + (j % STAGES) * (K * 64);
      Raw ra[K], rb[K];
#pragma unroll
      for (int kk = 0; kk < K; ++kk) {
        ra[kk] = st[kk * 64 + lane];
        rb[kk] = st[kk * 64 + 32 + lane];
      }
      issue(j + STAGES - 1);
      if (active) {
#pragma unroll
        for (int kk = 0; kk < K; ++kk) {
          const int64_t p = j * K + kk;
          if (p < L) {
            const int64_t q = d.reverse ? L - 1 - p : p;
            Raw rh, rp;
#pragma unroll
            for (int e = 0; e < NCH; ++e) {
              carry[e] = combine(carry[e], P{E::up(ra[kk].v[e]), E::up(rb[kk].v[e])});
              rh.v[e] = E::down(carry[e].b);
              rp.v[e] = E::down(carry[e].a);
            }
            *reinterpret_cast<Raw*>(h + q * inner) = rh;
            if (ap) *reinterpret_cast<Raw*>(ap + q * inner) = rp;
          }
        }
      }
    }
    cp_wait<0>();
  } else {
    for (int64_t p = 0; p < L; ++p) {
      const int64_t q = d.reverse ? L - 1 - p : p;
#pragma unroll
      for (int e = 0; e < NCH; ++e) {
        if (c0 + e < inner) {
          const int64_t off = q * inner + e;
          carry[e] = combine(carry[e], P{E::up(a[off]), E::up(b[off])});
          h[off] = E::down(carry[e].b);
          if (ap) ap[off] = E::down(carry[e].a);
        }
      }
    }
  }
}

}  // namespace jss
