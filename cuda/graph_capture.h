// How many handler calls ran while XLA was recording their stream into a CUDA graph.
//
// XLA records an FFI handler declared kCmdBufferCompatible into a command buffer by stream
// capture: the handler runs while the stream is capturing, and later executions replay the
// recorded launches (and memsets) without calling it until the buffers' addresses change,
// when XLA records again. jax's default flags do this too, in jitted functions large enough
// for a graph. XLA forms command buffers from its thunks, after HLO, so the compiled HLO does
// not show which calls were captured: the GPU tests read this count
// (jax_selscan._cuda.captured_calls()) to know that the graph path really ran before they
// trust its results.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

namespace jss {

inline std::atomic<int64_t>& captured_calls() {
  static std::atomic<int64_t> n{0};
  return n;
}

// A query of the stream's state: no synchronisation, legal while capturing.
inline void note_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive)
    captured_calls().fetch_add(1, std::memory_order_relaxed);
}

}  // namespace jss
