// Launch sequences of the selective scan for one activation dtype T (included by the
// per-dtype files selective_scan_{f32,bf16,f16}.cu).
#pragma once

#include <cstdlib>
#include <cstring>

#include "selective_scan_kernels.cuh"
#include "selective_scan_staged.cuh"
#include "selective_scan_staged_bwd.cuh"
#include "selective_scan_ws.cuh"

namespace jss {
namespace ssk {

inline char* at(void* scratch, size_t off) { return static_cast<char*>(scratch) + off; }

template <class T, int NS>
cudaError_t launch_fwd(const FwdArgs& a, int chunks, cudaStream_t stream) {
  const int64_t threads = a.p.batch * a.p.dim * a.P;
  const int64_t blocks = (threads + kBlock - 1) / kBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  fwd_kernel<T, NS><<<dim3(static_cast<unsigned>(blocks), chunks), kBlock, 0, stream>>>(a);
  return cudaGetLastError();
}

// The forward kernel for a launch: the staged kernel (round 3) where it applies (varying
// B/C whose groups do not split a block of rows), else the lanes-per-row kernel (round 1).
// JAX_SELSCAN_SS_FWD=rows forces round 1 (read per launch, for comparisons). (Round 2, the
// in-warp scan "tiles" kernel, measured 12x its prediction and was removed: see
// docs/PERFORMANCE_SELECTIVE_SCAN_CUDA.md.)
// (The same choice as ss_fwd_staged, which the plan's L split is sized for.)
inline bool use_staged(const FwdArgs& a) { return ss_fwd_staged(a.p); }

// One launch over `chunks` L chunks (1 without a split).
template <class T>
cudaError_t fwd_launch(const FwdArgs& a, int NS, int chunks, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {  // the warp-specialised forward, on request (notes 29)
    if (use_staged(a) && ws_fwd_ok(a, chunks)) return launch_ws<T>(a, stream);
  }
  if (ws_fwd_env() == 2) return cudaErrorNotSupported;
  if (use_staged(a)) return fwd_staged<T>(a, chunks, stream);
  switch (NS) {
    case 1: return launch_fwd<T, 1>(a, chunks, stream);
    case 2: return launch_fwd<T, 2>(a, chunks, stream);
    case 4: return launch_fwd<T, 4>(a, chunks, stream);
  }
  return cudaErrorInvalidValue;
}

// A forward walk (any mode but kChunkEnd), split along L when the plan says so: phase A
// (kChunkEnd) on the sub-chunks of chunks 0 .. nch-2, the carries, then the walk itself on
// every chunk. Phase A depends only on the problem, so a checkpoint sweep split the same way
// as the forward that saved checkpoints reproduces them bitwise.
template <class T>
cudaError_t fwd(FwdArgs a, const SsPlan& plan, void* scratch, cudaStream_t stream) {
  a.nch = plan.nch;
  a.chunk_steps = plan.chunk_steps;
  a.ch_slots = plan.nsub;
  a.ch_sub = plan.sub;
  if (plan.nch <= 1) return fwd_launch<T>(a, plan.NS, 1, stream);
  a.chunk_h = reinterpret_cast<float*>(at(scratch, plan.chunk_h));
  a.chunk_S = reinterpret_cast<float*>(at(scratch, plan.chunk_S));
  FwdArgs pa = a;
  pa.mode = kChunkEnd;
  pa.last = nullptr;
  pa.ckpt = nullptr;
  pa.nch = plan.nsub;
  pa.chunk_steps = plan.sub_steps;
  pa.ch_sub = 1;
  const int64_t walked = (plan.nch - 1) * plan.sub;  // the sub-chunks before the last chunk
  cudaError_t err = fwd_launch<T>(pa, plan.NS, static_cast<int>(walked), stream);
  if (err != cudaSuccess) return err;
  const int64_t carries = a.p.batch * a.p.dim * a.p.N;
  chunk_carry<<<static_cast<unsigned>((carries + 255) / 256), 256, 0, stream>>>(
      a.p, plan.nsub, walked + 1, a.chunk_h, a.chunk_S, a.p.h0, false);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return fwd_launch<T>(a, plan.NS, static_cast<int>(plan.nch), stream);
}

template <class T, int NS>
cudaError_t launch_bwd(const BwdArgs& a, int chunks, cudaStream_t stream) {
  const int64_t blocks = a.p.batch * (a.p.dim / a.CB);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const size_t smem = 2 * sizeof(float) * kCk * a.CB * a.P * NS;
  bwd_kernel<T, NS><<<dim3(static_cast<unsigned>(blocks), chunks), a.CB * a.P, smem, stream>>>(a);
  return cudaGetLastError();
}

// `chunks`: the grid's L chunks (blockIdx.y), from chunk a.chunk_base.
template <class T>
cudaError_t bwd(const BwdArgs& a, int NS, int chunks, cudaStream_t stream) {
  switch (NS) {
    case 1: return launch_bwd<T, 1>(a, chunks, stream);
    case 2: return launch_bwd<T, 2>(a, chunks, stream);
    case 4: return launch_bwd<T, 4>(a, chunks, stream);
  }
  return cudaErrorInvalidValue;
}

// Collects the backward's reductions (out[o, i] = sum_q in[o, q, i]) and runs them as one
// sum_jobs launch; an output in T (out_t) is rounded there, which saves XLA a convert.
template <class T>
struct Reductions {
  SumJobs jobs{};
  int64_t blocks = 0;
  bool overflow = false;  // more jobs than SumJobs holds: launch() refuses rather than drop one
  void add(const float* in, void* out, int64_t outer, int64_t Q, int64_t inner, bool out_t = false) {
    const int64_t total = outer * inner;
    if (!out || total == 0) return;
    if (jobs.n == kMaxSumJobs) {
      overflow = true;
      return;
    }
    // A thread per output once there are enough of them to fill the GPU, or the sums are short.
    const int split = total >= 32768 || Q < 2 * kSumWarps ? 1 : kSumWarps;
    const int64_t tiles = (total + sum_tile(split) - 1) / sum_tile(split);
    const int64_t nb = tiles < (int64_t{1} << 24) ? tiles : (int64_t{1} << 24);
    jobs.job[jobs.n++] = SumJob{in, out, out_t, outer, Q, inner, split, nb};
    blocks += nb;
  }
  cudaError_t launch(cudaStream_t stream) const {
    if (overflow) return cudaErrorInvalidValue;
    if (jobs.n == 0) return cudaSuccess;
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    sum_jobs<T><<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(jobs);
    return cudaGetLastError();
  }
};

template <class T>
cudaError_t forward(const SsProblem& p, const SsForwardOut& o, void* scratch, cudaStream_t stream) {
  const SsPlan plan = ss_plan(p, false);
  FwdArgs a{};
  a.p = p;
  a.out = o.out;
  a.K = plan.K;
  a.P = plan.P;
  a.ck_row = ss_ckpt_row(p);
  // the forward-saved checkpoints, [row][direction][chunk][state]
  auto ckpt_of = [&](bool rev) { return o.ckpt ? o.ckpt + (p.direction == 2 && rev ? plan.K * p.N : 0) : nullptr; };
  if (p.direction != 2) {
    a.mode = kFinal;
    a.rev = p.direction == 1;
    a.last = a.rev ? o.last_rev : o.last_fwd;
    a.ckpt = ckpt_of(a.rev);
    return fwd<T>(a, plan, scratch, stream);
  }
  // Bidirectional: the reverse pass parks its y in float32, the forward pass adds it.
  a.ybuf = reinterpret_cast<float*>(at(scratch, plan.ybuf));
  a.mode = kRawY;
  a.rev = true;
  a.last = o.last_rev;
  a.ckpt = ckpt_of(true);
  cudaError_t err = fwd<T>(a, plan, scratch, stream);
  if (err != cudaSuccess) return err;
  a.mode = kAddY;
  a.rev = false;
  a.last = o.last_fwd;
  a.ckpt = ckpt_of(false);
  return fwd<T>(a, plan, scratch, stream);
}

// The backward of one direction (staged or round-1 kernel, as planned), split along L when the
// plan says so: phase A (the adjoint alone) on the sub-chunks of chunks 1 .. bnch-1, the
// carries downwards from dlast, then the backward itself on every chunk.
template <class T>
cudaError_t bwd_split(BwdArgs b, const SsPlan& plan, void* scratch, cudaStream_t stream) {
  auto launch = [&](const BwdArgs& x, int chunks) {
    return plan.staged_bwd ? bwd_staged<T>(x, chunks, stream) : bwd<T>(x, plan.NS, chunks, stream);
  };
  b.nch = plan.bnch;
  b.chunk_steps = plan.bchunk_steps;
  b.chunk_base = 0;
  b.chunk_end = false;
  b.ch_slots = plan.bnsub;
  b.ch_sub = plan.bsub;
  if (plan.bnch <= 1) return launch(b, 1);
  b.chunk_g = reinterpret_cast<float*>(at(scratch, plan.bchunk_g));
  b.chunk_S = reinterpret_cast<float*>(at(scratch, plan.bchunk_S));
  BwdArgs pa = b;
  pa.chunk_end = true;
  pa.nch = plan.bnsub;
  pa.chunk_steps = plan.bsub_steps;
  pa.ch_sub = 1;
  pa.chunk_base = plan.bsub;  // the sub-chunks after the first chunk
  const int64_t walked = plan.bnsub - plan.bsub;
  cudaError_t err = launch(pa, static_cast<int>(walked));
  if (err != cudaSuccess) return err;
  const int64_t carries = b.p.batch * b.p.dim * b.p.N;
  chunk_carry<<<static_cast<unsigned>((carries + 255) / 256), 256, 0, stream>>>(
      b.p, plan.bnsub, walked + 1, b.chunk_g, b.chunk_S, b.dlast, true);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return launch(b, static_cast<int>(plan.bnch));
}

template <class T>
cudaError_t backward(const SsProblem& p, const SsBackwardIO& io, void* scratch, cudaStream_t stream) {
  const bool saved = io.ckpt != nullptr;  // the forward saved the checkpoints: no sweep
  const SsPlan plan = ss_plan(p, true, saved);
  const int ndir = p.direction == 2 ? 2 : 1;
  float* ckpt = saved ? nullptr : reinterpret_cast<float*>(at(scratch, plan.ckpt));
  BwdArgs b{};
  b.p = p;
  b.dout = io.dout;
  b.ckpt = ckpt;
  b.K = plan.K;
  b.ck_row = saved ? ss_ckpt_row(p) : plan.K * p.N;
  b.P = plan.P;
  b.CB = plan.CB;
  b.ndir = ndir;
  b.du = io.du;
  b.ddelta = io.ddelta;
  b.dz = io.dz;
  b.pdB = reinterpret_cast<float*>(at(scratch, plan.pdB));
  b.pdC = reinterpret_cast<float*>(at(scratch, plan.pdC));
  b.pdA = reinterpret_cast<float*>(at(scratch, plan.pdA));
  b.pdD = reinterpret_cast<float*>(at(scratch, plan.pdD));
  b.pdbias = reinterpret_cast<float*>(at(scratch, plan.pdbias));
  b.pdh0 = p.h0 ? reinterpret_cast<float*>(at(scratch, plan.pdh0)) : nullptr;
  if (ndir == 2) {
    b.du_acc = reinterpret_cast<float*>(at(scratch, plan.du_acc));
    b.dd_acc = reinterpret_cast<float*>(at(scratch, plan.dd_acc));
    b.ybuf = reinterpret_cast<float*>(at(scratch, plan.ybuf));
  }
  FwdArgs f{};
  f.p = p;
  f.mode = kCheckpoint;
  f.ckpt = ckpt;
  f.K = plan.K;
  f.ck_row = plan.K * p.N;
  f.P = plan.P;
  // One direction at a time: checkpoint sweep, then the adjoint sweep. For
  // "bidirectional" the reverse direction goes first (phase 1) and the forward one
  // finishes (phase 2).
  const int dirs[2] = {p.direction == 2 ? 1 : p.direction, 0};
  for (int k = 0; k < ndir; ++k) {
    const bool rev = dirs[k] == 1;
    cudaError_t err = cudaSuccess;
    if (saved) {
      b.ckpt = io.ckpt + (ndir == 2 && rev ? plan.K * p.N : 0);
    } else {
      f.rev = rev;
      err = fwd<T>(f, plan, scratch, stream);
      if (err != cudaSuccess) return err;
    }
    b.rev = rev;
    b.dir = k;
    b.phase = ndir == 1 ? 0 : k + 1;
    b.dlast = rev ? io.dlast_rev : io.dlast_fwd;
    err = bwd_split<T>(b, plan, scratch, stream);
    if (err != cudaSuccess) return err;
  }
  const int64_t R = p.batch * p.dim, Dm = p.dim, N = p.N, bn = p.batch * ndir;
  const int64_t bnc = bn * plan.bnch;  // per-row partials: (chunk, batch, direction, ...)
  Reductions<T> red;
  red.add(b.pdA, io.dA, 1, bnc, Dm * N);
  if (p.groups_b)
    red.add(b.pdB, io.dB, p.batch * p.groups_b, (Dm / p.groups_b / plan.CB) * ndir, N * p.L, io.dB_in_t);
  else
    red.add(b.pdB, io.dB, 1, bnc, Dm * N);
  if (p.groups_c)
    red.add(b.pdC, io.dC, p.batch * p.groups_c, (Dm / p.groups_c / plan.CB) * ndir, N * p.L, io.dC_in_t);
  else
    red.add(b.pdC, io.dC, 1, bnc, Dm * N);
  red.add(b.pdD, io.dD, 1, bnc, Dm);
  red.add(b.pdbias, io.ddelta_bias, 1, bnc, Dm);
  if (b.pdh0) red.add(b.pdh0, io.dh0, 1, ndir, R * N);
  return red.launch(stream);
}

}  // namespace ssk
}  // namespace jss

#define JSS_SS_DEFINE(NAME, TYPE)                                                             \
  namespace jss {                                                                             \
  cudaError_t ss_forward_##NAME(const SsProblem& p, const SsForwardOut& o, void* scratch,      \
                                cudaStream_t stream) {                                        \
    return ssk::forward<TYPE>(p, o, scratch, stream);                                         \
  }                                                                                           \
  cudaError_t ss_backward_##NAME(const SsProblem& p, const SsBackwardIO& io, void* scratch,    \
                                 cudaStream_t stream) {                                       \
    return ssk::backward<TYPE>(p, io, scratch, stream);                                       \
  }                                                                                           \
  }
