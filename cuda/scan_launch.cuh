// Host helpers every launcher shares: the kernel parameters of a problem, the arrays'
// alignment, the resident-block count of a persistent grid, and shared memory padded to cap
// the blocks an SM holds.
#pragma once

#include <algorithm>
#include <atomic>

#include "scan_common.cuh"

namespace jss {

// The problem's pointers, sizes and direction as kernel parameters (each launcher fills in
// its tiling, its scratch and the vector flag).
inline Dev dev_params(const ScanProblem& p) {
  Dev d{};
  d.a = p.a;
  d.b = p.b;
  d.h0 = p.h0;
  d.h = p.h;
  d.aprod = p.aprod;
  d.L = p.L;
  d.inner = p.inner;
  d.reverse = p.reverse;
  return d;
}

// The low address bits of the four arrays together (16-byte vectors need (bits & 15) == 0).
inline uintptr_t align_bits(const ScanProblem& p) {
  return reinterpret_cast<uintptr_t>(p.a) | reinterpret_cast<uintptr_t>(p.b) |
         reinterpret_cast<uintptr_t>(p.h) | reinterpret_cast<uintptr_t>(p.aprod);
}

// Blocks of `kernel` that fit on the current device at once (occupancy x SMs, at least 1),
// asked once per device and remembered in `cache` (one slot per device, 0: not asked yet).
template <class K>
cudaError_t resident_blocks(K kernel, int threads, size_t smem, std::atomic<int> (&cache)[64], int& out) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  out = cache[dev & 63].load(std::memory_order_relaxed);
  if (out > 0) return cudaSuccess;
  int per_sm = 0, sms = 0;
  // The opt-in is needed once static + dynamic shared memory pass the default 48 KB (the
  // static part counts: bf16 strided_stage at 8 warps x 4 steps has 32 KB dynamic + 18 KB
  // static and failed to launch, "invalid argument", when only the dynamic part was checked).
  cudaFuncAttributes fa{};
  err = cudaFuncGetAttributes(&fa, kernel);
  if (err == cudaSuccess && smem + fa.sharedSizeBytes > 48 * 1024)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  out = per_sm * sms > 0 ? per_sm * sms : 1;
  cache[dev & 63].store(out, std::memory_order_relaxed);
  return cudaSuccess;
}

// Dynamic shared memory for a kernel whose blocks need `need` bytes, padded so that an SM holds
// at most `cap` of them (cap 0: `need` alone). Only the allocation caps the blocks; the kernel
// touches its `need` bytes. The SM's shared memory and the per-block reservation are asked once
// per device; the share is rounded down to the 128-byte allocation unit, and the padding stops
// at 48 KB (no opt-in needed: a cap below 5 is not reached).
inline cudaError_t capped_smem(size_t need, int cap, size_t& out) {
  out = need;
  if (cap <= 0) return cudaSuccess;
  static std::atomic<int> per_sm_cache[64], reserved_cache[64];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int per_sm = per_sm_cache[dev & 63].load(std::memory_order_acquire);  // after reserved's store
  int reserved = reserved_cache[dev & 63].load(std::memory_order_relaxed);
  if (per_sm <= 0) {
    err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    if (err != cudaSuccess) return err;
    reserved_cache[dev & 63].store(reserved, std::memory_order_relaxed);
    per_sm_cache[dev & 63].store(per_sm, std::memory_order_release);
  }
  const size_t share = (size_t(per_sm) / size_t(cap)) & ~size_t(127);
  const size_t pad = share > size_t(reserved) ? share - size_t(reserved) : 0;
  out = std::min(std::max(need, pad), std::max(need, size_t(48) * 1024));
  return cudaSuccess;
}

}  // namespace jss
