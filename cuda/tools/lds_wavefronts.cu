// Shared-memory wavefronts per load instruction for the access patterns of the staged
// selective-scan walk (PERFORMANCE_SELECTIVE_SCAN_CUDA 12.1): which 4-, 8- and 16-byte load
// patterns of a warp cost one wavefront and which cost more. One kernel per width, launched once
// per pattern (an argument), each a loop of volatile shared loads (nothing can fuse, hoist or
// drop them); read the answer with Nsight Compute (scripts/gpu_check.sh stage lds does this
// with --csv and tabulates it with cuda/tools/lds_table.py):
//
//   nvcc -O3 -arch=sm_90 -std=c++17 cuda/tools/lds_wavefronts.cu -o lds_wavefronts
//   ncu --clock-control none --metrics smsp__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,\
//       smsp__sass_inst_executed_op_shared_ld.sum ./lds_wavefronts
//
// wavefronts / instructions is the cost of one load of that pattern (the loop's other shared
// loads: none). The grid fills every SM: the l1tex__ counters are read from a few SMs only and
// read ≈ 0 for a one-block launch (first try, session 16). The patterns give the unit (4, 8 or 16 bytes) that lane l reads:
//   distinct  l                every lane its own unit
//   mod8      l % 8            8 lanes' units, the same for each quarter warp (the walk's
//                              (B, C): 8 lanes of a row, 4 rows per warp)
//   div8      l / 8            one unit per quarter warp (the walk's X: a row's 8 lanes)
//   div4      l / 4            8 units, 4 consecutive lanes each (rows fastest)
//   mod16     l % 16           16 units, the same for both half warps
//   mod4      l % 4            4 units
//   same      0                one unit for the warp
//   div2      l / 2            16 units, lane pairs
//   pairrow   (l / 2) % 4      a walk layout with lane pairs (P = 8): the X of row (l / 2) % 4 ...
//   pairq     (l / 8) * 2 + l % 2   ... and the (B, C) of q = (l / 8) * 2 + l % 2
#include <cstdio>

#include "cuda_check.h"

enum Pattern { kDistinct, kMod8, kDiv8, kDiv4, kMod16, kMod4, kSame, kDiv2, kPairRow, kPairQ, kNumPatterns };
static const char* kNames[] = {"distinct", "mod8", "div8", "div4", "mod16", "mod4", "same", "div2", "pairrow", "pairq"};

__device__ __forceinline__ int unit_of(int pat, int l) {
  switch (pat) {
    case kDistinct: return l;
    case kMod8: return l % 8;
    case kDiv8: return l / 8;
    case kDiv4: return l / 4;
    case kMod16: return l % 16;
    case kMod4: return l % 4;
    case kDiv2: return l / 2;
    case kPairRow: return (l / 2) % 4;
    case kPairQ: return (l / 8) * 2 + l % 2;
    default: return 0;
  }
}

constexpr int kIters = 256;

template <int W>
__global__ void lds_kernel(int pat, float* out) {
  __shared__ __align__(16) float buf[32 * 4 * 2];
  for (int i = threadIdx.x; i < 32 * 4 * 2; i += blockDim.x) buf[i] = static_cast<float>(i);
  __syncthreads();
  const int l = threadIdx.x & 31;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(buf)) + unit_of(pat, l) * W;
  float acc = 0.f;
#pragma unroll 8
  for (int i = 0; i < kIters; ++i) {
    float a, b, c, d;
    if constexpr (W == 4) {
      asm volatile("ld.volatile.shared.f32 %0, [%1];" : "=f"(a) : "r"(addr));
      b = c = d = 0.f;
    } else if constexpr (W == 8) {
      asm volatile("ld.volatile.shared.v2.f32 {%0, %1}, [%2];" : "=f"(a), "=f"(b) : "r"(addr));
      c = d = 0.f;
    } else {
      asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(addr));
    }
    acc += a + b + c + d;
  }
  if (acc == -1.f) out[threadIdx.x] = acc;  // never true: keeps the loads
}

int main() {
  float* out = nullptr;
  CK(cudaMalloc(&out, 1024 * sizeof(float)));
  for (int pat = kDistinct; pat < kNumPatterns; ++pat) {
    lds_kernel<4><<<132 * 8, 256>>>(pat, out);
    lds_kernel<8><<<132 * 8, 256>>>(pat, out);
    lds_kernel<16><<<132 * 8, 256>>>(pat, out);
    CK(cudaDeviceSynchronize());
    std::printf("launched pattern %d %s (4, 8, 16 bytes)\n", pat, kNames[pat]);
  }
  CK(cudaFree(out));
  return 0;
}
