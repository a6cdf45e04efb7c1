// CK(call): exit(2) with the CUDA error, file and line when `call` fails (the standalone
// tools in this folder only).
#pragma once

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(2);                                                                         \
    }                                                                                       \
  } while (0)
