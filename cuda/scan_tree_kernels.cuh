// The tree scans of a tile (blelloch, hillis_steele) and the three-pass middle pass
// (carry_scan_kernel) that blelloch, hillis_steele and three_pass share.
#pragma once

#include "scan_block.cuh"

namespace jss {

// ---------------------------------------------------------------------------------
// Blelloch (work-efficient) tile scan: up-sweep and down-sweep in shared memory, two
// elements per thread, carries from the three-pass arrays.
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) blelloch_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int N = 2 * THREADS;
  __shared__ P s[N];
  const unsigned id = blockIdx.x;
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int tid = threadIdx.x;
  const int64_t row0 = chain * d.L, L = d.L;
  const T* a = static_cast<const T*>(d.a) + row0;
  const T* b = static_cast<const T*>(d.b) + row0;
  P x[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // coalesced: element tid and tid + THREADS of the tile
    const int64_t p = k * N + tid + r * THREADS;
    if (p < L) {
      const int64_t q = d.reverse ? L - 1 - p : p;
      x[r] = {E::up(a[q]), E::up(b[q])};
    } else {
      x[r] = identity<S>();
    }
    s[tid + r * THREADS] = x[r];
  }
  int off = 1;
#pragma unroll
  for (int n = N >> 1; n > 0; n >>= 1) {  // up-sweep: s[bi] = s[ai] (earlier) o s[bi]
    __syncthreads();
    if (tid < n) {
      const int ai = off * (2 * tid + 1) - 1, bi = off * (2 * tid + 2) - 1;
      s[bi] = combine(s[ai], s[bi]);
    }
    off <<= 1;
  }
  if (tid == 0) s[N - 1] = identity<S>();
#pragma unroll
  for (int n = 1; n < N; n <<= 1) {  // down-sweep: left gets the prefix, right prefix o left sum
    off >>= 1;
    __syncthreads();
    if (tid < n) {
      const int ai = off * (2 * tid + 1) - 1, bi = off * (2 * tid + 2) - 1;
      const P t = s[ai];
      s[ai] = s[bi];
      s[bi] = combine(s[bi], t);
    }
  }
  __syncthreads();
  const P excl = static_cast<const P*>(d.carry)[id];
  T* h = static_cast<T*>(d.h) + row0;
  T* ap = d.aprod ? static_cast<T*>(d.aprod) + row0 : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t p = k * N + tid + r * THREADS;
    if (p < L) {
      const int64_t q = d.reverse ? L - 1 - p : p;
      const P y = combine(excl, combine(s[tid + r * THREADS], x[r]));
      h[q] = E::down(y.b);
      if (ap) ap[q] = E::down(y.a);
    }
  }
}

// Hillis-Steele / Kogge-Stone tile scan held in registers: one element per thread,
// log2(32) shuffle steps in the warp, then log2(NW) steps over the warp totals (double-
// buffered in shared memory), carries from the three-pass arrays.
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) hillis_steele_kernel(Dev d) {
  using E = Elem<T>;
  using S = typename E::S;
  using P = Pair<S>;
  constexpr int NW = THREADS / 32;
  __shared__ P s_tot[2][NW];
  const unsigned id = blockIdx.x;
  const int64_t chain = id % d.nchains, k = id / d.nchains;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row0 = chain * d.L, L = d.L;
  const int64_t p = k * THREADS + tid;
  const int64_t q = d.reverse ? L - 1 - p : p;
  P x = identity<S>();
  if (p < L) x = {E::up(static_cast<const T*>(d.a)[row0 + q]), E::up(static_cast<const T*>(d.b)[row0 + q])};
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    P u = shfl_up(x, o);
    if (lane >= o) x = combine(u, x);
  }
  if (lane == 31) s_tot[0][warp] = x;
  __syncthreads();
  int cur = 0;
#pragma unroll
  for (int o = 1; o < NW; o <<= 1) {  // Kogge-Stone over the warp totals
    if (tid < NW) s_tot[cur ^ 1][tid] = tid >= o ? combine(s_tot[cur][tid - o], s_tot[cur][tid]) : s_tot[cur][tid];
    __syncthreads();
    cur ^= 1;
  }
  P y = x;
  if (warp > 0) y = combine(s_tot[cur][warp - 1], x);
  y = combine(static_cast<const P*>(d.carry)[id], y);
  if (p < L) {
    static_cast<T*>(d.h)[row0 + q] = E::down(y.b);
    if (d.aprod) static_cast<T*>(d.aprod)[row0 + q] = E::down(y.a);
  }
}

// ---------------------------------------------------------------------------------
// Three-pass middle pass: per sequence (a chain, or a channel of a chain), replace the
// tile aggregates agg[chunk] (at index (chunk * nchains) * cw + seq_in) by the exclusive
// prefixes inc[chunk-1], folding strictly left to right from (1, h0).
template <class T, int THREADS>
__global__ void __launch_bounds__(THREADS) carry_scan_kernel(Dev d, int cw) {
  using S = typename Elem<T>::S;
  using P = Pair<S>;
  __shared__ P s_seg[THREADS];
  const int64_t seq = blockIdx.x;  // = chain * cw + ch
  const int64_t chain = seq / cw, ch = seq % cw;
  const int64_t o = chain / d.nct, ct = chain % d.nct;
  const int64_t c = ct * cw + ch;
  P h0p = identity<S>();
  if (c < d.inner) h0p = h0_pair<T>(d, o * d.inner + c);
  P* agg = static_cast<P*>(d.carry);
  const int64_t n = d.nchunks, stride = d.nchains * cw;
  const int64_t seg = (n + THREADS - 1) / THREADS;
  const int64_t lo = threadIdx.x * seg, hi = lo + seg < n ? lo + seg : n;
  P t = identity<S>();
  for (int64_t m = lo; m < hi; ++m) t = combine(t, agg[m * stride + seq]);
  s_seg[threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    P acc = h0p;
    for (int i = 0; i < THREADS; ++i) {
      const P s = s_seg[i];
      s_seg[i] = acc;
      acc = combine(acc, s);
    }
  }
  __syncthreads();
  // Re-fold the segment from its carry-in: identical association to a serial left fold
  // only segment by segment, which is deterministic (fixed THREADS and n).
  P acc = s_seg[threadIdx.x];
  for (int64_t m = lo; m < hi; ++m) {
    const P g = agg[m * stride + seq];
    agg[m * stride + seq] = acc;
    acc = combine(acc, g);
  }
}

}  // namespace jss
