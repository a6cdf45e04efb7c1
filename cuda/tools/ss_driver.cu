// Standalone driver of the selective-scan kernels (no JAX), for compute-sanitizer
// (memcheck, racecheck, synccheck) in scripts/gpu_check.sh: forward and backward of a few
// small problems covering every direction, varying / grouped / time-invariant B and C,
// h0, z, D, delta_bias + softplus, odd L, float32 and bfloat16, and a padded state count.
// Correctness is the pytest suite's job (tests/test_cuda_selective_scan.py); this runs the
// launches and checks for CUDA errors, non-finite results, bitwise agreement of the saved- and
// swept-checkpoint backwards, and, in a third run with every scratch and result buffer
// poisoned, bitwise the same results (nothing read before written) and intact guards after
// every scratch region (nothing written past one: JAX_SELSCAN_SS_GUARD). Build:
//   nvcc -O2 -std=c++17 -arch=sm_90 -Icuda cuda/tools/ss_driver.cu cuda/selective_scan_*.cu \
//        cuda/selective_scan_host.cc
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "selective_scan.h"
#include "cuda_check.h"
#include "dev_rand.h"


static void* dev_zero(size_t bytes) {
  void* d;
  CK(cudaMalloc(&d, bytes + 16));
  CK(cudaMemset(d, 0, bytes + 16));
  return d;
}

// Every byte 0xFF (a NaN in every float lane): what a kernel that reads a buffer before
// writing it would pick up (XLA's result and scratch buffers are not cleared either).
static void* dev_poison(size_t bytes) {
  void* d;
  CK(cudaMalloc(&d, bytes + 16));
  CK(cudaMemset(d, 0xff, bytes + 16));
  return d;
}

static bool finite_f32(const void* d, size_t n) {
  std::vector<float> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (float v : h)
    if (!std::isfinite(v)) return false;
  return true;
}

// Bitwise equality of two device buffers (null == null).
static bool same_bits(const void* x, const void* y, size_t bytes) {
  if (!x || !y) return x == y;
  std::vector<unsigned char> a(bytes), b(bytes);
  CK(cudaMemcpy(a.data(), x, bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), y, bytes, cudaMemcpyDeviceToHost));
  return a == b;
}

// Whether the bfloat16 buffer b16 holds the float32 buffer f32 rounded to nearest even, bit
// for bit (NaN stays NaN).
static bool rounded_bits(const void* f32, const void* b16, size_t n) {
  std::vector<uint32_t> f(n);
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(f.data(), f32, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h.data(), b16, n * 2, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = f[i];
    if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: any bf16 NaN
      if ((h[i] & 0x7fffu) <= 0x7f80u) return false;
    } else if (h[i] != static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)) {
      return false;
    }
  }
  return true;
}

template <class T>
static int run(jss::SsDType t, int64_t batch, int64_t dim, int64_t L, int64_t N, int64_t gb, int64_t gc,
               int direction, bool opts) {
  jss::SsProblem p;
  p.t = t;
  p.batch = batch; p.dim = dim; p.L = L; p.N = N; p.groups_b = gb; p.groups_c = gc;
  const size_t act = batch * dim * L;
  p.u = dev_rand<T>(act, -1, 1);
  p.delta = dev_rand<T>(act, -1, 0.5f);
  p.z = opts ? dev_rand<T>(act, -1, 1) : nullptr;
  p.B = gb ? dev_rand<T>(batch * gb * N * L, -1, 1) : dev_rand<float>(dim * N, -1, 1);
  p.C = gc ? dev_rand<T>(batch * gc * N * L, -1, 1) : dev_rand<float>(dim * N, -1, 1);
  p.A = static_cast<const float*>(dev_rand<float>(dim * N, -2, -0.1f));
  p.Dskip = opts ? static_cast<const float*>(dev_rand<float>(dim, -1, 1)) : nullptr;
  p.delta_bias = opts ? static_cast<const float*>(dev_rand<float>(dim, 0, 0.5f)) : nullptr;
  p.h0 = opts ? static_cast<const float*>(dev_rand<float>(batch * dim * N, -1, 1)) : nullptr;
  p.softplus = opts;
  p.direction = direction;
  const size_t st = batch * dim * N;
  jss::SsForwardOut o;
  o.out = dev_zero(act * sizeof(T));
  o.last_fwd = static_cast<float*>(dev_zero(st * 4));
  o.last_rev = static_cast<float*>(dev_zero(st * 4));
  void* scratch = dev_zero(jss::ss_forward_scratch_bytes(p));
  CK(jss::ss_forward(p, o, scratch, 0));
  CK(cudaDeviceSynchronize());
  jss::SsBackwardIO io;
  io.dout = dev_rand<T>(act, -1, 1);
  io.dlast_fwd = static_cast<const float*>(dev_rand<float>(st, -1, 1));
  io.dlast_rev = static_cast<const float*>(dev_rand<float>(st, -1, 1));
  const size_t nb = gb ? batch * gb * N * L : dim * N, nc = gc ? batch * gc * N * L : dim * N;
  // the gradient results of `g`, freshly allocated by `alloc` (dev_zero or dev_poison)
  auto alloc_grads = [&](jss::SsBackwardIO& g, void* (*alloc)(size_t)) {
    g.du = alloc(act * sizeof(T));
    g.ddelta = alloc(act * sizeof(T));
    g.dz = opts ? alloc(act * sizeof(T)) : nullptr;
    g.dA = static_cast<float*>(alloc(dim * N * 4));
    g.dB = static_cast<float*>(alloc(nb * 4));
    g.dC = static_cast<float*>(alloc(nc * 4));
    g.dD = opts ? static_cast<float*>(alloc(dim * 4)) : nullptr;
    g.ddelta_bias = opts ? static_cast<float*>(alloc(dim * 4)) : nullptr;
    g.dh0 = opts ? static_cast<float*>(alloc(st * 4)) : nullptr;
  };
  alloc_grads(io, dev_zero);
  void* bscratch = dev_zero(jss::ss_backward_scratch_bytes(p));
  CK(jss::ss_backward(p, io, bscratch, 0));
  CK(cudaDeviceSynchronize());
  bool ok = finite_f32(io.dA, dim * N) && finite_f32(io.dB, nb) && finite_f32(io.dC, nc);
  // Again with the forward saving the checkpoints and the backward reading them: the same
  // output and bitwise the same gradients as with the backward's own sweep.
  jss::SsForwardOut o2 = o;
  o2.out = dev_zero(act * sizeof(T));
  o2.ckpt = static_cast<float*>(dev_zero(batch * dim * jss::ss_ckpt_row(p) * 4));
  void* scratch2 = dev_zero(jss::ss_forward_scratch_bytes(p));
  CK(jss::ss_forward(p, o2, scratch2, 0));
  jss::SsBackwardIO io2 = io;
  io2.ckpt = o2.ckpt;
  alloc_grads(io2, dev_zero);
  void* bscratch2 = dev_zero(jss::ss_backward_scratch_bytes(p, true));
  CK(jss::ss_backward(p, io2, bscratch2, 0));
  CK(cudaDeviceSynchronize());
  // the first result of (fo, g) that differs bitwise from the first run's (o, io), or null
  // (lasts: compare the last states too; the second run shares the first one's)
  auto first_diff = [&](const jss::SsForwardOut& fo, const jss::SsBackwardIO& g, bool lasts) -> const char* {
    return !same_bits(o.out, fo.out, act * sizeof(T)) ? "out"
           : lasts && direction != 1 && !same_bits(o.last_fwd, fo.last_fwd, st * 4) ? "last_fwd"
           : lasts && direction != 0 && !same_bits(o.last_rev, fo.last_rev, st * 4) ? "last_rev"
           : !same_bits(io.du, g.du, act * sizeof(T)) ? "du"
           : !same_bits(io.ddelta, g.ddelta, act * sizeof(T)) ? "ddelta"
           : !same_bits(io.dz, g.dz, opts ? act * sizeof(T) : 0) ? "dz"
           : !same_bits(io.dA, g.dA, dim * N * 4) ? "dA"
           : !same_bits(io.dB, g.dB, nb * 4) ? "dB"
           : !same_bits(io.dC, g.dC, nc * 4) ? "dC"
           : !same_bits(io.dD, g.dD, opts ? dim * 4 : 0) ? "dD"
           : !same_bits(io.ddelta_bias, g.ddelta_bias, opts ? dim * 4 : 0) ? "ddelta_bias"
           : !same_bits(io.dh0, g.dh0, opts ? st * 4 : 0) ? "dh0"
           : nullptr;
  };
  const bool same = first_diff(o2, io2, false) == nullptr;
  // dB / dC of a varying bf16 B / C written in bf16 by the reduction (what the JAX lowering
  // asks for): the float32 sums of the first run rounded to nearest even, bit for bit.
  bool rounded = true;
  if (std::is_same<T, __nv_bfloat16>::value && (gb || gc)) {
    jss::SsBackwardIO io4 = io;
    alloc_grads(io4, dev_zero);
    if (gb) io4.dB = dev_zero(nb * 2), io4.dB_in_t = true;
    if (gc) io4.dC = dev_zero(nc * 2), io4.dC_in_t = true;
    void* bscratch4 = dev_zero(jss::ss_backward_scratch_bytes(p));
    CK(jss::ss_backward(p, io4, bscratch4, 0));
    CK(cudaDeviceSynchronize());
    rounded = (!gb || rounded_bits(io.dB, io4.dB, nb)) && (!gc || rounded_bits(io.dC, io4.dC, nc));
  }
  // Once more with every scratch and result buffer poisoned (NaN bytes) before the calls:
  // bitwise the first run's results, or something is read before it is written.
  jss::SsForwardOut o3 = o;
  o3.out = dev_poison(act * sizeof(T));
  o3.last_fwd = static_cast<float*>(dev_poison(st * 4));
  o3.last_rev = static_cast<float*>(dev_poison(st * 4));
  void* fscratch3 = dev_poison(jss::ss_forward_scratch_bytes(p));
  CK(jss::ss_forward(p, o3, fscratch3, 0));
  jss::SsBackwardIO io3 = io;
  alloc_grads(io3, dev_poison);
  void* bscratch3 = dev_poison(jss::ss_backward_scratch_bytes(p));
  CK(jss::ss_backward(p, io3, bscratch3, 0));
  CK(cudaDeviceSynchronize());
  // every region's guard still holds the poison: nothing was written past a region's end
  auto guards_intact = [](const jss::SsPlan& pl, const void* scratch) {
    std::vector<unsigned char> g(jss::SsPlan::kGuardBytes);
    for (int i = 0; i < pl.nguards; ++i) {
      CK(cudaMemcpy(g.data(), static_cast<const char*>(scratch) + pl.guard[i], g.size(), cudaMemcpyDeviceToHost));
      for (unsigned char c : g)
        if (c != 0xff) return false;
    }
    return true;
  };
  const bool guards_ok = guards_intact(jss::ss_plan(p, false), fscratch3) &&
                         guards_intact(jss::ss_plan(p, true), bscratch3);
  const char* pz = first_diff(o3, io3, true);
  std::printf("%-5s b%ld D%ld L%ld N%ld gb%ld gc%ld dir%d opts%d: %s%s%s%s%s%s%s\n",
              t == jss::SsDType::F32 ? "f32" : "bf16", (long)batch, (long)dim, (long)L, (long)N,
              (long)gb, (long)gc, direction, (int)opts, ok ? "ok" : "NON-FINITE",
              same ? "" : " (saved checkpoints: DIFFERENT gradients)",
              pz ? " (poisoned buffers: DIFFERENT " : "", pz ? pz : "", pz ? ")" : "",
              guards_ok ? "" : " (WRITTEN PAST A SCRATCH REGION)",
              rounded ? "" : " (dB / dC in bf16: NOT THE ROUNDED float32 SUMS)");
  return ok && same && !pz && guards_ok && rounded ? 0 : 1;
}

int main() {
  setenv("JAX_SELSCAN_SS_GUARD", "1", 1);  // guards after every scratch region (checked in run)
  int bad = 0;
  for (int dir = 0; dir < 3; ++dir) {
    bad += run<float>(jss::SsDType::F32, 2, 64, 37, 16, 1, 2, dir, true);
    bad += run<float>(jss::SsDType::F32, 1, 12, 19, 5, 0, 3, dir, false);
    bad += run<__nv_bfloat16>(jss::SsDType::BF16, 2, 32, 40, 16, 2, 0, dir, true);
  }
  bad += run<float>(jss::SsDType::F32, 1, 3, 9, 1, 1, 1, 0, true);
  // The staged forward: a partial 32-row block with aligned bf16 vectors; 16 lanes per row.
  bad += run<__nv_bfloat16>(jss::SsDType::BF16, 2, 40, 64, 16, 1, 1, 1, true);
  bad += run<float>(jss::SsDType::F32, 1, 32, 35, 128, 1, 1, 2, true);
  // 32768 rows, N = 8 (2 lanes per row in the forward's geometry) and N = 2: the staged
  // backward's dB / dC partials per 32-row block (memcheck: the buffer once held half / a quarter)
  bad += run<float>(jss::SsDType::F32, 16, 2048, 40, 8, 1, 1, 0, true);
  bad += run<float>(jss::SsDType::F32, 16, 2048, 40, 2, 1, 1, 2, true);
  // The staged backward with N % 4 != 0: its checkpoints are read state by state, not as float4.
  bad += run<float>(jss::SsDType::F32, 1, 32, 45, 6, 1, 1, 2, true);
  // The L split forced (3 chunks of whole 32-step tiles, the last partial): both forward
  // kernels; the backward's checkpoint sweep is split the same way, so the saved-checkpoint
  // gradients must still match it bitwise.
  setenv("JAX_SELSCAN_SS_FWD_CHUNKS", "3", 1);
  for (int dir = 0; dir < 3; ++dir) {
    bad += run<float>(jss::SsDType::F32, 2, 64, 300, 16, 1, 2, dir, true);
    bad += run<float>(jss::SsDType::F32, 1, 12, 300, 5, 0, 3, dir, true);
  }
  bad += run<__nv_bfloat16>(jss::SsDType::BF16, 1, 32, 301, 16, 1, 1, 1, true);
  // ... and the backward's own split (phase A, downward carries, chunked partials), on the
  // staged kernel and the round-1 one (time-invariant B: chunked dB partials too).
  setenv("JAX_SELSCAN_SS_BWD_CHUNKS", "4", 1);
  for (int dir = 0; dir < 3; ++dir) {
    bad += run<float>(jss::SsDType::F32, 2, 64, 300, 16, 1, 2, dir, true);
    bad += run<float>(jss::SsDType::F32, 1, 12, 300, 5, 0, 3, dir, true);
  }
  bad += run<__nv_bfloat16>(jss::SsDType::BF16, 1, 32, 333, 16, 1, 1, 0, true);
  // ... with phase A on sub-chunks in both (these small grids get none by default)
  setenv("JAX_SELSCAN_SS_FWD_SUB", "4", 1);  // what the earlier rule gave these grids
  setenv("JAX_SELSCAN_SS_BWD_SUB", "3", 1);
  for (int dir = 0; dir < 3; ++dir) {
    bad += run<float>(jss::SsDType::F32, 2, 64, 300, 16, 1, 2, dir, true);
    bad += run<float>(jss::SsDType::F32, 1, 12, 300, 5, 0, 3, dir, true);
  }
  bad += run<__nv_bfloat16>(jss::SsDType::BF16, 1, 32, 333, 16, 1, 1, 1, true);
  unsetenv("JAX_SELSCAN_SS_FWD_SUB");
  unsetenv("JAX_SELSCAN_SS_BWD_SUB");
  unsetenv("JAX_SELSCAN_SS_BWD_CHUNKS");
  unsetenv("JAX_SELSCAN_SS_FWD_CHUNKS");
  // Both N <= 16 lane geometries of the staged forward whichever the fill rule picks for
  // these small grids (8 lanes here by default), every direction, with and without a split.
  setenv("JAX_SELSCAN_SS_FWD_LANES", "4", 1);
  for (int dir = 0; dir < 3; ++dir) bad += run<__nv_bfloat16>(jss::SsDType::BF16, 2, 32, 40, 16, 2, 0, dir, true);
  setenv("JAX_SELSCAN_SS_FWD_CHUNKS", "3", 1);
  bad += run<float>(jss::SsDType::F32, 2, 64, 300, 16, 1, 2, 2, true);
  unsetenv("JAX_SELSCAN_SS_FWD_CHUNKS");
  unsetenv("JAX_SELSCAN_SS_FWD_LANES");
  std::printf(bad ? "FAILED\n" : "all ok\n");
  return bad ? 1 : 0;
}
