// Stream-ordered scratch for the CUDA handlers (ffi_module.cc): cudaMallocFromPoolAsync on
// the handler's stream from a per-device pool of our own; free it with cudaFreeAsync on
// the same stream after the last kernel that uses it.
#pragma once

#include <cstddef>

#include <cuda_runtime_api.h>

namespace jss {
cudaError_t scratch_alloc(cudaStream_t stream, size_t bytes, void** out);
}  // namespace jss
