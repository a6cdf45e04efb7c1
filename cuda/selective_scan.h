// Host-side interface of the CUDA selective-scan kernels (plain C++, no CUDA syntax),
// shared by the FFI handlers (selective_scan_ffi.cc) and the per-dtype kernel files.
//
// Layouts (row-major, as in jax_selscan.selective_scan): u, delta, z, out and their
// gradients (batch, D, L); A (D, N); B, C either time-invariant (D, N) or varying
// (batch, G, N, L) with channel d in group d / (D / G); D, delta_bias (D,); h0 and the
// last states (batch, D, N). "Row" r = b * D + d is one channel of one batch element.
// The activations (u, delta, z, varying B/C, out, du, ddelta, dz) share one storage
// dtype (float32, bfloat16 or float16); everything else is float32 (the FFI wrapper
// casts). The state is always float32.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace jss {

enum class SsDType { F32, BF16, F16 };

struct SsProblem {
  SsDType t = SsDType::F32;
  int64_t batch = 0, dim = 0, L = 0, N = 0;
  int64_t groups_b = 0, groups_c = 0;  // 0: that operand is time-invariant (D, N), float32
  const void* u = nullptr;
  const void* delta = nullptr;
  const void* z = nullptr;             // optional
  const void* B = nullptr;             // (batch, G, N, L) in t, or (D, N) float32
  const void* C = nullptr;
  const float* A = nullptr;
  const float* Dskip = nullptr;        // optional
  const float* delta_bias = nullptr;   // optional
  const float* h0 = nullptr;           // optional
  bool softplus = false;
  int direction = 0;                   // 0 forward, 1 reverse, 2 bidirectional
};

struct SsForwardOut {
  void* out = nullptr;        // (batch, D, L) in t
  float* last_fwd = nullptr;  // (batch, D, N), optional
  float* last_rev = nullptr;  // (batch, D, N), optional
  float* ckpt = nullptr;      // (batch, D, ss_ckpt_row(p)) float32, optional: the states the
                              // backward needs (saves its checkpoint sweep)
};

// Cotangents in, gradients out. dout is (batch, D, L) in t; dlast_* (batch, D, N) float32
// or null (zero). Gradients: du, ddelta, dz in t (dz only with z); dA (D, N), dB/dC in
// their operand's shape (float32, or t where dB_in_t / dC_in_t: a varying B / C in t, so that
// the reduction writes the operand's dtype and no cast follows), dD, ddelta_bias (D,), dh0
// (batch, D, N) float32 (each optional: null when the operand is absent).
struct SsBackwardIO {
  const float* ckpt = nullptr;  // the forward's checkpoints (SsForwardOut::ckpt) or null
  const void* dout = nullptr;
  const float* dlast_fwd = nullptr;
  const float* dlast_rev = nullptr;
  void* du = nullptr;
  void* ddelta = nullptr;
  void* dz = nullptr;
  float* dA = nullptr;
  void* dB = nullptr;
  void* dC = nullptr;
  bool dB_in_t = false, dC_in_t = false;
  float* dD = nullptr;
  float* ddelta_bias = nullptr;
  float* dh0 = nullptr;
};

// Whether the kernels take this problem (N <= 128 states); otherwise the caller falls
// back to the pure-JAX formulation.
bool ss_supported(const SsProblem& p);

// Scratch bytes (256-byte aligned pieces) the forward / backward launch needs.
size_t ss_forward_scratch_bytes(const SsProblem& p);
size_t ss_backward_scratch_bytes(const SsProblem& p, bool saved_ckpt = false);

// Launch on `stream`; scratch must hold the bytes above. Returns the first CUDA error.
cudaError_t ss_forward(const SsProblem& p, const SsForwardOut& o, void* scratch, cudaStream_t stream);
cudaError_t ss_backward(const SsProblem& p, const SsBackwardIO& io, void* scratch, cudaStream_t stream);

// Test hooks (no GPU needed): states per thread and lanes per channel the launch uses.
int ss_states_per_thread(int64_t N, int64_t rows);
int ss_lanes_per_row(int64_t N, int64_t rows);

// Per-dtype entry points (one translation unit each).
#define JSS_SS_DECLARE(NAME)                                                                  \
  cudaError_t ss_forward_##NAME(const SsProblem& p, const SsForwardOut& o, void* scratch,      \
                                cudaStream_t stream);                                         \
  cudaError_t ss_backward_##NAME(const SsProblem& p, const SsBackwardIO& io, void* scratch,    \
                                 cudaStream_t stream);
JSS_SS_DECLARE(f32)
JSS_SS_DECLARE(bf16)
JSS_SS_DECLARE(f16)
#undef JSS_SS_DECLARE

}  // namespace jss

namespace jss {

// The launch geometry and scratch layout, shared by the host code and the kernels' launch
// functions. Offsets are in bytes into the scratch buffer (each piece 256-byte aligned);
// a piece a launch does not use has size 0.
struct SsPlan {
  bool staged_bwd = false;  // backward on the staged kernel (then CB = 32)
  int NS = 0;        // states per lane (1, 2 or 4)
  int P = 0;         // lanes per row (power of two <= 32)
  int CB = 0;        // backward: rows per block
  int64_t K = 0;     // checkpoints per row
  // The forward's L split (also used by the backward's checkpoint sweep): nch chunks of
  // chunk_steps steps (a multiple of 32), or nch = 1. See ss_fwd_chunks. Its phase A walks
  // sub-chunks, sub per chunk, of sub_steps steps, nsub of them in all (chunk c is
  // sub-chunks [c * sub, (c + 1) * sub) clipped to nsub); sub = 1, nsub = nch: none.
  int64_t nch = 1, chunk_steps = 0, sub = 1, sub_steps = 0, nsub = 1;
  // The backward's own L split (ss_bwd_chunks): bnch chunks of bchunk_steps steps, its
  // phase A on bnsub sub-chunks of bsub_steps, bsub per chunk.
  int64_t bnch = 1, bchunk_steps = 0, bsub = 1, bsub_steps = 0, bnsub = 1;
  size_t ybuf = 0, ckpt = 0, pdB = 0, pdC = 0, pdA = 0, pdD = 0, pdbias = 0, pdh0 = 0,
         du_acc = 0, dd_acc = 0, chunk_h = 0, chunk_S = 0, bchunk_g = 0, bchunk_S = 0, total = 0;
  // JAX_SELSCAN_SS_GUARD=1 (cuda/tools/ss_driver): kGuardBytes right after the exact end of
  // every region, which no kernel may write; the driver fills them and checks them after the
  // launches (an undersized region shows as a changed guard, even inside the scratch).
  static constexpr size_t kGuardBytes = 256;
  static constexpr int kMaxGuards = 24;
  size_t guard[kMaxGuards] = {};
  int nguards = 0;
};
// dh0 scratch iff p.h0 is set; no checkpoint scratch when the forward saved them
SsPlan ss_plan(const SsProblem& p, bool backward, bool saved_ckpt = false);

// Floats per (batch, channel) row of the forward-saved checkpoints: the state entering every
// 8-step chunk, [direction][chunk][state] (direction slot 1: the reverse pass of
// "bidirectional"), so that a vmapped batch folds like any (batch, D, .) operand.
int64_t ss_ckpt_row(const SsProblem& p);

// The staged kernels (selective_scan_staged*.cuh) take varying B and C whose groups hold
// whole 32-row blocks (Mamba's case); the staged backward also needs D % 32 == 0, N <= 16.
// JAX_SELSCAN_SS_BWD=rows forces the round-1 backward (read when the launch is planned).
inline bool ss_staged_ok(const SsProblem& p) {
  auto fits = [&](int64_t g) { return g == 1 || ((p.dim / g) % 32) == 0; };
  return p.groups_b && p.groups_c && fits(p.groups_b) && fits(p.groups_c) && p.N <= 128;
}
bool ss_staged_bwd_ok(const SsProblem& p);
// Whether the forward runs the staged kernel: ss_staged_ok, unless JAX_SELSCAN_SS_FWD=rows
// forces round 1 (read per call, for comparisons).
bool ss_fwd_staged(const SsProblem& p);

// L chunks of the forward walk (1: no split). Split when the row blocks fill at most half of
// the GPU's block slots (`sms` SMs; 4 staged blocks per SM), or an eighth of them for the
// round-1 kernel (16 blocks of 128 threads per SM): as many chunks as fill the slots, each at
// least 256 steps. JAX_SELSCAN_SS_FWD_CHUNKS=n forces n (tests). `lanes`: the round-1
// kernel's lanes per row.
int64_t ss_fwd_chunks(const SsProblem& p, int sms, int lanes);
// The same for the backward (staged: 3 blocks per SM; round 1: `rows_per_block` rows of 128
// threads, split only at <= 2 blocks per SM); JAX_SELSCAN_SS_BWD_CHUNKS=n forces n.
int64_t ss_bwd_chunks(const SsProblem& p, int sms, bool staged, int rows_per_block);

// SMs of the current device (132 when it cannot be asked: a plan must not fail).
int ss_device_sms();

// The busy fraction of the waves of a grid of `blocks` on `slots` resident blocks, blocks /
// (waves x slots) (the plans' chunk counts and the forward's lanes are chosen by it).
double ss_wave_fill(int64_t blocks, int64_t slots);

// The staged forward's lanes per row at N <= 16, 4 (4 states each) or 8 (2 states), from the
// fills of its grid of `blocks` on `sms` SMs holding per_sm4 / per_sm8 blocks of either.
// `ys`: the walk sums y (every mode but the checkpoint sweep); `plain`: the forward that
// neither saves checkpoints nor feeds a bidirectional pass (kFinal without ckpt); `elem_bytes`:
// the size of u's elements (2 for bfloat16 / float16). PERFORMANCE_SELECTIVE_SCAN_CUDA 16, 17.1, 26.
int ss_staged_fwd_lanes(int64_t blocks, int64_t sms, int per_sm4, int per_sm8, bool ys, bool plain,
                        int elem_bytes);

}  // namespace jss
