// Baseline: CUB DeviceScan::InclusiveScan over affine pairs (a, b) with the combine
//   op(earlier=(a1, b1), later=(a2, b2)) = (a2*a1, a2*b1 + b2),
// timed end to end as a user would run it: pack a, b into float2 pairs (the first element
// of every row gets a = 0, which restarts the recurrence at row boundaries with h0 = 0),
// one flat inclusive scan over rows*L pairs, unpack h. CUDA events, median of 20.
//   nvcc -O3 -std=c++17 -arch=sm_90 benchmarks/cub_affine_scan.cu -o cub_affine_scan
//   ./cub_affine_scan ROWS L float32|bfloat16      -> prints {"seconds": ..., "check": ...}
#include <cub/device/device_scan.cuh>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct Affine {
  __device__ __forceinline__ float2 operator()(const float2& e, const float2& l) const {
    return make_float2(l.x * e.x, fmaf(l.x, e.y, l.y));
  }
};

template <class T> __device__ float up(T v);
template <> __device__ float up<float>(float v) { return v; }
template <> __device__ float up<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ T down(float v);
template <> __device__ float down<float>(float v) { return v; }
template <> __device__ __nv_bfloat16 down<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <class T>
__global__ void pack(const T* a, const T* b, float2* p, int64_t n, int64_t L) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = make_float2(i % L == 0 ? 0.f : up(a[i]), up(b[i]));
}
template <class T>
__global__ void unpack(const float2* p, T* h, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    h[i] = down<T>(p[i].y);
}
template <class T>
__global__ void fill(T* a, T* b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t z = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 32);
    z ^= z >> 15; z *= 0x2c1b3c6du; z ^= z >> 12;
    a[i] = down<T>(0.5f * (z & 0xffff) / 65536.f);
    b[i] = down<T>((z >> 16) / 65536.f - 0.5f);
  }
}

template <class T>
int run(int64_t rows, int64_t L) {
  const int64_t n = rows * L;
  T *a, *b, *h;
  float2 *p, *q;
  cudaMalloc(&a, n * sizeof(T)); cudaMalloc(&b, n * sizeof(T)); cudaMalloc(&h, n * sizeof(T));
  cudaMalloc(&p, n * sizeof(float2)); cudaMalloc(&q, n * sizeof(float2));
  fill<<<2048, 256>>>(a, b, n);
  size_t tb = 0;
  cub::DeviceScan::InclusiveScan(nullptr, tb, p, q, Affine{}, n);
  void* tmp; cudaMalloc(&tmp, tb);
  cudaEvent_t s, e; cudaEventCreate(&s); cudaEventCreate(&e);
  std::vector<float> ts;
  for (int r = 0; r < 23; ++r) {
    cudaEventRecord(s);
    pack<T><<<2048, 256>>>(a, b, p, n, L);
    cub::DeviceScan::InclusiveScan(tmp, tb, p, q, Affine{}, n);
    unpack<T><<<2048, 256>>>(q, h, n);
    cudaEventRecord(e);
    cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, s, e);
    if (r >= 3) ts.push_back(ms);
  }
  std::sort(ts.begin(), ts.end());
  cudaError_t err = cudaGetLastError();
  // spot check of the first row's start against a host recurrence
  std::vector<T> ha(64), hb(64), hh(64);
  cudaMemcpy(ha.data(), a, 64 * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), b, 64 * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(hh.data(), h, 64 * sizeof(T), cudaMemcpyDeviceToHost);
  double st = 0, worst = 0;
  for (int i = 0; i < 64 && i < L; ++i) {
    float av, bv, hv;
    if constexpr (sizeof(T) == 4) { av = (float)ha[i]; bv = (float)hb[i]; hv = (float)hh[i]; }
    else { av = __bfloat162float(ha[i]); bv = __bfloat162float(hb[i]); hv = __bfloat162float(hh[i]); }
    st = (i == 0 ? 0.0 : av * st) + bv;
    worst = std::max(worst, std::abs(st - hv) / (1 + std::abs(st)));
  }
  std::printf("{\"seconds\": %.9g, \"check\": %.3g, \"error\": \"%s\"}\n", ts[ts.size() / 2] / 1e3, worst,
              cudaGetErrorString(err));
  return err != cudaSuccess;
}

int main(int argc, char** argv) {
  if (argc < 4) { std::printf("usage: %s ROWS L float32|bfloat16\n", argv[0]); return 2; }
  int64_t rows = std::atoll(argv[1]), L = std::atoll(argv[2]);
  if (!std::strcmp(argv[3], "bfloat16")) return run<__nv_bfloat16>(rows, L);
  return run<float>(rows, L);
}
