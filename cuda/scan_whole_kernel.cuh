// strided_whole: short strided axes scanned by one block per channel tile, through the whole
// axis (kernel and launcher). docs/PERFORMANCE_CUDA.md section 20.
//
// Why: at 2^20 elements, e.g. (L=1024, C=1024) axis 0, the look-back kernels cut the axis into
// 16 chunks of 64 steps on 4-8 chains; the chunks' look-backs run one after another, so a call
// is bound by that chain's latency (and by the memset of its status words), not by memory.
// Here a block owns NCV 16-byte channel vectors of one outer index and the whole axis, so
// nothing crosses blocks: no scratch, no memset, no flags, deterministic by construction.
#pragma once

#include "scan_block.cuh"
#include "scan_launch.cuh"
#include "scan_stage_kernels.cuh"

namespace jss {

// Geometry. THREADS = 256 threads; thread t owns channel vector cv = t % NCV of the block's
// NCV (V = 16 / sizeof(T) channels each; neighbouring lanes read neighbouring vectors of one
// row) and step group g = t / NCV of NG = 256 / NCV. A round covers NG * S steps: group g
// takes the S consecutive steps [r0 + g*S, +S) (physical L-1-p in reverse). Per round, each
// thread:
//   1. loads its S steps (16-byte vectors, one per step and operand) and folds them;
//   2. scans the groups' folds: Kogge-Stone over the warp's GW = 32 / NCV groups of its
//      vector (shuffles by multiples of NCV lanes), then the 8 warps' totals through shared
//      memory, folded in warp order: prefix = carry o (warps before) o (groups before);
//   3. walks its S steps again from registers, storing h (and a_prod);
//   4. moves the carry by the round's total: carry o warp 0 o ... o warp 7.
// Every thread computes the same carry from the same words in the same order (left fold), so
// the round's carry is one value per channel. The totals are double-buffered by round parity:
// a thread writes round r+1's words only after the barrier of round r+1, which every thread
// reaches only after its reads of round r.
struct WholeCfg {
  static constexpr int THREADS = 256, NW = 8, S = 4;
  static constexpr int round_steps(int ncv) { return THREADS / ncv * S; }
};

// S: steps a thread folds (WholeCfg::S in the package; the variant bench times others);
// MINB: blocks an SM the registers are budgeted for (0: unsaid, as in the package, which lets
// ptxas pick 91 / 147 registers in fp32 / bf16; an explicit 1 gives 126 / 229; the bench times 2-3)
template <class T, int NCV, int S = WholeCfg::S, int MINB = 0>
__global__ void __launch_bounds__(WholeCfg::THREADS, MINB) strided_whole_kernel(Dev d) {
  using E = Elem<T>;
  using SS = typename E::S;
  using P = Pair<SS>;
  constexpr int V = StageCfg<T>::V;
  constexpr int NW = WholeCfg::NW;
  constexpr int NG = WholeCfg::THREADS / NCV, GW = 32 / NCV;
  static_assert(NCV >= 1 && NCV <= 32 && (NCV & (NCV - 1)) == 0, "NCV: a power of two <= 32");
  __shared__ P s_tot[2][NW][NCV][V];

  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const int cv = tid % NCV, g = tid / NCV, gl = lane / NCV;  // gl: the group within the warp
  const int64_t L = d.L, inner = d.inner;
  const int64_t nvec = inner / V;                 // vectors per outer index (inner % V == 0)
  const int64_t nvt = (nvec + NCV - 1) / NCV;     // blocks per outer index
  const int64_t o = blockIdx.x / nvt;
  const int64_t vg = (int64_t)(blockIdx.x % nvt) * NCV + cv;
  const bool active = vg < nvec;
  const int64_t c0 = vg * V;
  const int64_t step = d.reverse ? -inner : inner;
  const T* A = static_cast<const T*>(d.a);
  const T* B = static_cast<const T*>(d.b);
  T* H = static_cast<T*>(d.h);
  T* AP = static_cast<T*>(d.aprod);

  P carry[V];
#pragma unroll
  for (int e = 0; e < V; ++e) carry[e] = active ? h0_pair<T>(d, o * inner + c0 + e) : identity<SS>();

  const int64_t nround = (L + (int64_t)NG * S - 1) / ((int64_t)NG * S);
  for (int64_t r = 0; r < nround; ++r) {
    const int64_t p0 = r * NG * S + (int64_t)g * S;  // logical first step of the thread
    const int64_t rem = L - p0;
    const int n = !active || rem <= 0 ? 0 : (rem < S ? (int)rem : S);
    const int64_t q0 = d.reverse ? L - 1 - p0 : p0;
    const int64_t off = n > 0 ? (o * L + q0) * inner + c0 : 0;

    // 1. loads, then the thread's fold
    Vec16<T> va[S], vb[S];
#pragma unroll
    for (int i = 0; i < S; ++i)
      if (i < n) {
        va[i] = load16(A + off + i * step);
        vb[i] = load16(B + off + i * step);
      }
    P x[V];
#pragma unroll
    for (int e = 0; e < V; ++e) x[e] = identity<SS>();
#pragma unroll
    for (int i = 0; i < S; ++i)
      if (i < n) {
#pragma unroll
        for (int e = 0; e < V; ++e) x[e] = combine(x[e], P{E::up(va[i].v[e]), E::up(vb[i].v[e])});
      }

    // 2. groups before this one: in the warp (lanes NCV apart hold the same vector), then warps
#pragma unroll
    for (int dd = 1; dd < GW; dd <<= 1) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const P y = shfl_up(x[e], dd * NCV);
        if (gl >= dd) x[e] = combine(y, x[e]);  // y is earlier
      }
    }
    const int par = (int)(r & 1);
    if (gl == GW - 1) {
#pragma unroll
      for (int e = 0; e < V; ++e) s_tot[par][w][cv][e] = x[e];
    }
    P c[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const P y = shfl_up(x[e], NCV);  // the inclusive value of the group before, in the warp
      c[e] = gl > 0 ? y : identity<SS>();
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < V; ++e) {
      P pre = carry[e], tot = carry[e];
#pragma unroll
      for (int q = 0; q < NW; ++q) {
        const P t = s_tot[par][q][cv][e];
        if (q < w) pre = combine(pre, t);
        tot = combine(tot, t);
      }
      c[e] = combine(pre, c[e]);
      carry[e] = tot;  // 4. (the next round's carry)
    }

    // 3. the walk from registers
    if (n > 0) {
      T* ph = H + off;
      T* pp = AP ? AP + off : nullptr;
#pragma unroll
      for (int i = 0; i < S; ++i)
        if (i < n) {
          Vec16<T> vh, vp;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            c[e] = combine(c[e], P{E::up(va[i].v[e]), E::up(vb[i].v[e])});
            vh.v[e] = E::down(c[e].b);
            vp.v[e] = E::down(c[e].a);
          }
          store16(ph + i * step, vh);
          if (pp) store16(pp + i * step, vp);
        }
    }
  }
}

// The block's channel vectors: the largest power of two NCV <= 32 whose round (1024 / NCV steps)
// still covers the axis, no more than the row's vectors rounded up to a power of two, and
//  * at least 2 where the row has 2 vectors: with NCV = 1 a warp's 16-byte loads and stores each
//    use half of a 32-byte sector (ncu: 49% excess sectors), so axes of 513-1024 steps take 2
//    rounds of NCV = 2 (docs/PERFORMANCE_CUDA.md section 22.6: fp32 (1024, 1024) 9.5 -> 6.4 us a
//    call);
//  * up to 4 (more rounds) while that leaves >= 128 blocks: fewer, longer blocks streamed better
//    where there are many (sections 22.7.1, 22.8, fp32 (1024, 4096) axis 0 59 -> 66% of copy, (1024,
//    16384) 73 -> 83%; bf16 (1024, 4096) 44 -> 48%), and lost where 64 or 32 remained ((1024,
//    1024) fp32 39 -> 36%, bf16 20 -> 13%).
inline int whole_ncv(int64_t L, int64_t nvec, int64_t outer) {
  int ncv = nvec >= 2 ? 2 : 1;
  while (ncv < 32 && WholeCfg::round_steps(2 * ncv) >= L && ncv < nvec) ncv *= 2;
  while (ncv < 4 && ncv < nvec && outer * ((nvec + 2 * ncv - 1) / (2 * ncv)) >= 128) ncv *= 2;
  return ncv;
}

// It runs where strided_stage does (16-byte vectors along the channels: stage_legal<T>). A row
// of the outer index holds whole_vectors<T>(p) vectors; the block takes whole_ncv() of them.
template <class T>
int64_t whole_vectors(const ScanProblem& p) {
  return p.inner / StageCfg<T>::V;
}

template <class T, int NCV, int S = WholeCfg::S, int MINB = 0>
cudaError_t whole_launch_ncv(const ScanProblem& p, cudaStream_t stream) {
  const int64_t nvec = whole_vectors<T>(p);
  const int64_t blocks = p.outer * ((nvec + NCV - 1) / NCV);
  if (blocks >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  Dev d = dev_params(p);
  d.vec = true;
  strided_whole_kernel<T, NCV, S, MINB><<<(unsigned)blocks, WholeCfg::THREADS, 0, stream>>>(d);
  return cudaGetLastError();
}

// Registers for one block an SM more than ptxas picks unasked (91 -> 80 in fp32: 3 blocks, not
// 2; 147 -> 128 in 16-bit types, 8 bytes of spills: 2, not 1). Measured on an H200 (section
// 23, kernel alone, % of copy): fp32 (64, 1024, 1024) axis 1 79 -> 86%, (1024, 16384) 69 -> 74%,
// (1000, 65536) 73 -> 77%; bf16 (1024, 4096) 34 -> 41%, (1024, 16384) 37 -> 53%; ties at the
// 2^20-2^21-element shapes. On an H100 (23.4) the bf16 gain held and fp32 lost 1-3 points (92
// -> 89% at (64, 1024, 1024) axis 1): kept for the H200. 8-byte types keep ptxas's choice (not
// measured).
template <class T>
constexpr int whole_min_blocks() {
  return sizeof(T) == 4 ? 3 : sizeof(T) == 2 ? 2 : 0;
}

template <class T>
cudaError_t whole_launch(const ScanProblem& p, cudaStream_t stream) {
  constexpr int S = WholeCfg::S, MB = whole_min_blocks<T>();
  switch (whole_ncv(p.L, whole_vectors<T>(p), p.outer)) {
    case 1: return whole_launch_ncv<T, 1, S, MB>(p, stream);
    case 2: return whole_launch_ncv<T, 2, S, MB>(p, stream);
    case 4: return whole_launch_ncv<T, 4, S, MB>(p, stream);
    case 8: return whole_launch_ncv<T, 8, S, MB>(p, stream);
    case 16: return whole_launch_ncv<T, 16, S, MB>(p, stream);
    default: return whole_launch_ncv<T, 32, S, MB>(p, stream);
  }
}

}  // namespace jss
