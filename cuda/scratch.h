// Stream-ordered scratch for the CUDA selective-scan handlers (the linear_scan ones take theirs
// as an XLA result, see ffi_module.cc): cudaMallocFromPoolAsync on the handler's
// stream from a per-device pool of our own (ffi_module.cc), freed with cudaFreeAsync on the
// same stream after the last kernel that uses it, so it is never reused while in use.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace jss {
cudaError_t scratch_alloc(cudaStream_t stream, size_t bytes, void** out);

// launch(void* scratch) with `bytes` of scratch (null when 0); returns the first error.
template <class Launch>
cudaError_t with_scratch(cudaStream_t stream, size_t bytes, Launch&& launch) {
  void* buf = nullptr;
  cudaError_t err = scratch_alloc(stream, bytes, &buf);
  if (err == cudaSuccess) err = launch(buf);
  if (buf) {
    cudaError_t e2 = cudaFreeAsync(buf, stream);
    if (err == cudaSuccess) err = e2;
  }
  return err;
}
}  // namespace jss
