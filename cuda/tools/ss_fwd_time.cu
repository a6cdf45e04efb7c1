// The selective-scan forward timed alone (no JAX), for A/B of kernel variants built from the
// same source with different -D flags: each binary prints, per dtype and shape, the median of
// SS_REPS launches timed with CUDA events and an FNV-1a hash of the output's bits, so that two
// variants meant to give identical results can be checked to do so in the same call.
// Inputs as in benchmarks/gpu_selective_scan.py's main case: varying B and C (one group), z,
// D, delta_bias with softplus; random values, a fixed seed.
//   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -Icuda \
//        cuda/tools/ss_fwd_time.cu cuda/selective_scan_f32.cu cuda/selective_scan_bf16.cu \
//        cuda/selective_scan_f16.cu cuda/selective_scan_host.cc -o .bin/ss_fwd_time
//   SS_SHAPES="8,1536,2048,16 64,768,512,16" SS_REPS=20 .bin/ss_fwd_time
// Options (environment): SS_DIR=1 the reverse direction; SS_NOZ=1 no z; SS_H0=1 an initial state
// (and the last state hashed with the output); SS_WS_AB=1 each case twice in one process, with
// JAX_SELSCAN_SS_FWD_WS=0 then =1 (the warp-specialised forward, notes 29), so that the two
// kernels' times and hashes sit side by side on the same inputs (set JAX_SELSCAN_SS_FWD_LANES=4
// for the staged geometry whose outputs it should match bit for bit).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "dev_rand.h"
#include "selective_scan.h"

namespace {

bool env_on(const char* k) {
  const char* e = std::getenv(k);
  return e && e[0] == '1';
}

uint64_t fnv(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
void run(jss::SsDType t, const char* name, int64_t b, int64_t D, int64_t L, int64_t N, int reps) {
  jss::SsProblem p;
  p.t = t;
  p.batch = b, p.dim = D, p.L = L, p.N = N, p.groups_b = 1, p.groups_c = 1;
  const size_t act = size_t(b) * D * L, bc = size_t(b) * N * L;
  p.u = dev_rand<T>(act, -1.f, 1.f);
  p.delta = dev_rand<T>(act, -3.f, 1.f);
  p.z = dev_rand<T>(act, -2.f, 2.f);
  p.B = dev_rand<T>(bc, -1.f, 1.f);
  p.C = dev_rand<T>(bc, -1.f, 1.f);
  p.A = static_cast<const float*>(dev_rand<float>(size_t(D) * N, -4.f, -0.1f));
  p.Dskip = static_cast<const float*>(dev_rand<float>(D, 0.5f, 1.5f));
  p.delta_bias = static_cast<const float*>(dev_rand<float>(D, -1.f, 0.f));
  p.softplus = true;
  const bool h0 = env_on("SS_H0");
  p.direction = env_on("SS_DIR") ? 1 : 0;
  if (env_on("SS_NOZ")) { CK(cudaFree(const_cast<void*>(p.z))); p.z = nullptr; }
  if (h0) p.h0 = static_cast<const float*>(dev_rand<float>(size_t(b) * D * N, -1.f, 1.f));
  jss::SsForwardOut o;
  CK(cudaMalloc(&o.out, act * sizeof(T)));
  if (h0) CK(cudaMalloc(&o.last_fwd, size_t(b) * D * N * sizeof(float)));
  const size_t sb = jss::ss_forward_scratch_bytes(p);
  void* scratch = nullptr;
  if (sb) CK(cudaMalloc(&scratch, sb));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const bool ab = env_on("SS_WS_AB");
  for (int ws = 0; ws <= (ab ? 1 : 0); ++ws) {
    if (ab) setenv("JAX_SELSCAN_SS_FWD_WS", ws ? "1" : "0", 1);
    CK(cudaMemset(o.out, 0xff, act * sizeof(T)));  // every output element must be written
    for (int i = 0; i < 3; ++i) CK(jss::ss_forward(p, o, scratch, 0));
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(e0));
      CK(jss::ss_forward(p, o, scratch, 0));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float m = 0.f;
      CK(cudaEventElapsedTime(&m, e0, e1));
      ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    std::vector<unsigned char> host(act * sizeof(T));
    CK(cudaMemcpy(host.data(), o.out, host.size(), cudaMemcpyDeviceToHost));
    uint64_t hl = 0;
    if (h0) {
      std::vector<unsigned char> hh(size_t(b) * D * N * sizeof(float));
      CK(cudaMemcpy(hh.data(), o.last_fwd, hh.size(), cudaMemcpyDeviceToHost));
      hl = fnv(hh.data(), hh.size());
    }
    std::printf("%-8s (%lld, %lld, %lld, %lld)%s  median %8.1f us  min %8.1f us  out-hash %016llx%s", name,
                (long long)b, (long long)D, (long long)L, (long long)N, ab ? (ws ? " ws=1" : " ws=0") : "",
                1e3 * ms[ms.size() / 2], 1e3 * ms[0], (unsigned long long)fnv(host.data(), host.size()),
                p.direction ? " rev" : "");
    if (h0) std::printf("  last-hash %016llx", (unsigned long long)hl);
    std::printf("\n");
  }
  if (ab) unsetenv("JAX_SELSCAN_SS_FWD_WS");
  for (const void* q : {p.u, p.delta, p.z, p.B, p.C, (const void*)p.A, (const void*)p.Dskip,
                        (const void*)p.delta_bias, (const void*)p.h0, (const void*)o.out, (const void*)o.last_fwd,
                        (const void*)scratch})
    if (q) CK(cudaFree(const_cast<void*>(q)));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

}  // namespace

int main() {
  const char* sh = std::getenv("SS_SHAPES");
  const char* dts = std::getenv("SS_DTYPES");
  const int reps = std::getenv("SS_REPS") ? std::atoi(std::getenv("SS_REPS")) : 20;
  std::string shapes = sh ? sh : "8,1536,2048,16 8,2560,4096,16 1,5120,16384,16 64,768,512,16";
  std::string dtypes = dts ? dts : "bfloat16 float32";
  for (size_t pos = 0; pos < shapes.size();) {
    size_t end = shapes.find(' ', pos);
    if (end == std::string::npos) end = shapes.size();
    long long b, D, L, N;
    if (std::sscanf(shapes.substr(pos, end - pos).c_str(), "%lld,%lld,%lld,%lld", &b, &D, &L, &N) == 4) {
      if (dtypes.find("bfloat16") != std::string::npos) run<__nv_bfloat16>(jss::SsDType::BF16, "bfloat16", b, D, L, N, reps);
      if (dtypes.find("float32") != std::string::npos) run<float>(jss::SsDType::F32, "float32", b, D, L, N, reps);
    }
    pos = end + 1;
  }
  return 0;
}
