// Random device arrays for the standalone tools (ss_driver, ss_fwd_time): a fixed-seed LCG per
// translation unit, values in [lo, hi) stored as T (float or bf16), 16 bytes of slack allocated
// past the end.
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static float urand() {
  rs = rs * 6364136223846793005ull + 1442695040888963407ull;
  return ((rs >> 40) & 0xffffff) / float(1 << 24);
}

template <class T> static T cvt(float x) { return static_cast<T>(x); }
template <> __nv_bfloat16 cvt<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
static void* dev_rand(size_t n, float lo, float hi) {
  std::vector<T> h(n);
  for (auto& v : h) v = cvt<T>(lo + (hi - lo) * urand());
  void* d;
  CK(cudaMalloc(&d, n * sizeof(T) + 16));
  CK(cudaMemcpy(d, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
