// Standalone driver of the linear_scan kernels (no JAX): used by scripts/gpu_check.sh
// for compute-sanitizer (memcheck, racecheck, synccheck), the determinism check and the
// > 2^31-element check. Build:
//   nvcc -O2 -std=c++17 -arch=sm_90 -Icuda cuda/tools/scan_driver.cu cuda/scan_*.cu cuda/dispatch.cc
// Modes:  check [NAME]     all algorithms (or only NAME) x layouts x dtypes (f32, f64, bf16, c64)
//                          on small shapes
//         determinism N [S] N runs of one input, bitwise compared on the device (cases matching S)
//         tiny [NAME]      the sanitizer shapes (only kernel NAME, e.g. strided_stage)
//         big              more than 2^31 elements, contiguous and strided, checked in windows
//         graph [N]        one launch per kernel captured in a CUDA graph, replayed N times,
//                          bitwise equal to a direct launch
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "linear_scan.h"
#include "cuda_check.h"


static const char* kNames[] = {"auto", "blelloch", "three_pass", "lookback_serial", "lookback_warp",
                               "lookback_regs", "hillis_steele", "row_walk", "strided_walk",
                               "strided_stage", "row_rounds", "row_stage", "strided_pipe", "row_pipe",
                               "strided_pipe_narrow", "strided_whole"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == jss::kNumInternal, "a name for every kernel family");

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand() {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return ((rng_state >> 11) & ((1ull << 53) - 1)) / double(1ull << 53);
}

template <class T> struct Host;
template <> struct Host<float> {
  static constexpr jss::DType dt = jss::DType::F32;
  using C = double;
  static float from(C v) { return (float)v; }
  static C to(float v) { return v; }
  static double tol() { return 2e-5; }
};
template <> struct Host<double> {
  static constexpr jss::DType dt = jss::DType::F64;
  using C = double;
  static double from(C v) { return v; }
  static C to(double v) { return v; }
  static double tol() { return 1e-12; }
};
template <> struct Host<__nv_bfloat16> {
  static constexpr jss::DType dt = jss::DType::BF16;
  using C = double;
  static __nv_bfloat16 from(C v) { return __float2bfloat16((float)v); }
  static C to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static double tol() { return 1e-2; }
};
struct cf {
  float x, y;
};
template <> struct Host<cf> {
  static constexpr jss::DType dt = jss::DType::C64;
  using C = std::complex<double>;
  static cf from(C v) { return {(float)v.real(), (float)v.imag()}; }
  static C to(cf v) { return {v.x, v.y}; }
  static double tol() { return 2e-5; }
};

template <class T>
typename Host<T>::C rnd_a() {
  using C = typename Host<T>::C;
  if constexpr (std::is_same<C, double>::value) return 0.5 + 0.49 * urand();
  else return std::polar(0.5 + 0.49 * urand(), 0.3 * (urand() - 0.5));
}
template <class T>
typename Host<T>::C rnd_b() {
  using C = typename Host<T>::C;
  if constexpr (std::is_same<C, double>::value) return urand() - 0.5;
  else return C(urand() - 0.5, urand() - 0.5);
}

// One case: returns the relative error of h and of a_prod against a float64 reference.
template <class T>
bool run_case(int64_t outer, int64_t L, int64_t inner, bool reverse, int algo) {
  using H = Host<T>;
  using C = typename H::C;
  const int64_t n = outer * L * inner, nh = outer * inner;
  std::vector<T> a(n), b(n), h0(nh), h(n), ap(n);
  for (auto& v : a) v = H::from(rnd_a<T>());
  for (auto& v : b) v = H::from(rnd_b<T>());
  for (auto& v : h0) v = H::from(rnd_b<T>());
  T *da, *db, *dh0, *dh, *dap;
  CK(cudaMalloc(&da, n * sizeof(T) + 16));
  CK(cudaMalloc(&db, n * sizeof(T) + 16));
  CK(cudaMalloc(&dh0, nh * sizeof(T) + 16));
  CK(cudaMalloc(&dh, n * sizeof(T) + 16));
  CK(cudaMalloc(&dap, n * sizeof(T) + 16));
  CK(cudaMemcpy(da, a.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, b.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dh0, h0.data(), nh * sizeof(T), cudaMemcpyHostToDevice));
  CK(cudaMemset(dh, 0xff, n * sizeof(T)));  // poison
  CK(cudaMemset(dap, 0xff, n * sizeof(T)));
  jss::ScanProblem p;
  p.a = da; p.b = db; p.h0 = dh0; p.h = dh; p.aprod = dap;
  p.outer = outer; p.L = L; p.inner = inner; p.reverse = reverse; p.algorithm = algo;
  size_t sb = jss::scratch_bytes(H::dt, p);
  void* scratch = nullptr;
  if (sb) CK(cudaMalloc(&scratch, sb));
  CK(jss::launch_linear_scan(H::dt, p, scratch, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h.data(), dh, n * sizeof(T), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ap.data(), dap, n * sizeof(T), cudaMemcpyDeviceToHost));
  // again without a_prod (some kernels take another store path then: row_pipe's bulk copy)
  std::vector<T> h2(n);
  CK(cudaMemset(dh, 0xff, n * sizeof(T)));
  p.aprod = nullptr;
  CK(jss::launch_linear_scan(H::dt, p, scratch, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h2.data(), dh, n * sizeof(T), cudaMemcpyDeviceToHost));
  double eh = 0, nrm = 0, ea = 0, na = 0, eh2 = 0;
  bool finite = true;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < inner; ++c) {
      C st = H::to(h0[o * inner + c]);
      C pr = 1.0;
      for (int64_t s = 0; s < L; ++s) {
        const int64_t t = reverse ? L - 1 - s : s;
        const int64_t i = (o * L + t) * inner + c;
        st = H::to(a[i]) * st + H::to(b[i]);
        pr = H::to(a[i]) * pr;
        C gh = H::to(h[i]), ga = H::to(ap[i]), gh2 = H::to(h2[i]);
        if (!std::isfinite(std::abs(gh)) || !std::isfinite(std::abs(ga)) || !std::isfinite(std::abs(gh2)))
          finite = false;
        eh += std::norm(gh - st); nrm += std::norm(st);
        eh2 += std::norm(gh2 - st);
        ea += std::norm(ga - pr); na += std::norm(pr);
      }
    }
  double rh = std::sqrt(eh / (nrm + 1e-300)), ra = std::sqrt(ea / (na + 1e-300));
  const double rh2 = std::sqrt(eh2 / (nrm + 1e-300));
  bool ok = finite && rh < H::tol() && ra < H::tol() && rh2 < H::tol();
  std::printf("%-5s %-16s outer=%-4lld L=%-6lld inner=%-4lld rev=%d  err_h=%.2e err_prod=%.2e err_h(no a_prod)=%.2e %s\n",
              sizeof(T) == 2 ? "bf16" : (sizeof(T) == 4 ? "f32" : (std::is_same<T, cf>::value ? "c64" : "f64")),
              kNames[algo], (long long)outer, (long long)L, (long long)inner, reverse, rh, ra, rh2, ok ? "ok" : "FAIL");
  cudaFree(da); cudaFree(db); cudaFree(dh0); cudaFree(dh); cudaFree(dap);
  if (scratch) cudaFree(scratch);
  return ok;
}

static int g_only_algo = -1;  // "tiny NAME" / "quick NAME": only that kernel

// On a GPU whose blocks may have 227 KB of shared memory (H100 / H200), "auto" must run the
// pipelines, not their fallbacks: a fallback gives the right numbers, so only this shows it.
static int check_pipelines_run() {
  int dev = 0, optin = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (optin < 227 * 1024) {
    std::printf("pipelines: %d bytes of shared memory per block, fallbacks expected\n", optin);
    return 0;
  }
  struct K { const char* what; jss::DType t; int64_t o, L, i; int want; };
  const K ks[] = {{"f32 1 x 2^26", jss::DType::F32, 1, 1 << 26, 1, jss::kRowPipe},
                  {"bf16 1 x 2^26", jss::DType::BF16, 1, 1 << 26, 1, jss::kRowPipe},
                  {"f16 64 x 2^20", jss::DType::F16, 64, 1 << 20, 1, jss::kRowPipe},
                  {"f32 (4096, 24576) axis 0", jss::DType::F32, 1, 4096, 24576, jss::kStridedPipe},
                  {"bf16 (4096, 24576) axis 0", jss::DType::BF16, 1, 4096, 24576, jss::kStridedPipe},
                  {"bf16 (65536, 1024) axis 0", jss::DType::BF16, 1, 65536, 1024, jss::kStridedPipeNarrow},
                  {"f32 (65536, 256) axis 0", jss::DType::F32, 1, 65536, 256, jss::kStridedPipeNarrow},
                  {"bf16 (65536, 256) axis 0", jss::DType::BF16, 1, 65536, 256, jss::kStridedPipeNarrow},
                  {"f16 (2048, 32, 1024) axis 1", jss::DType::F16, 2048, 32, 1024, jss::kStridedPipeNarrow}};
  int fails = 0;
  for (const K& k : ks) {
    jss::ScanProblem p;
    p.outer = k.o; p.L = k.L; p.inner = k.i;
    int got = -1;
    CK(jss::launched_algorithm(k.t, p, got));
    std::printf("pipelines: %-26s runs %-14s %s\n", k.what, got >= 0 ? kNames[got] : "?", got == k.want ? "ok" : "FAIL");
    fails += got != k.want;
  }
  return fails;
}

static int mode_check(bool quick, bool tiny = false) {
  int fails = check_pipelines_run();
  struct S { int64_t o, L, i; };
  // strided_stage needs inner % (16 / sizeof(T)) == 0 (else it falls back to lookback_regs):
  // (2, 300, 132) and (1, 777, 264) run it for every dtype but bf16 at 132; (1, 5000, 136)
  // has 79 chunks of 64 steps (a look-back window of 32 and more) and partial channel tiles
  std::vector<S> shapes = {{3, 5000, 1}, {2, 4099, 1}, {1, 20000, 1}, {2, 300, 132}, {1, 1000, 130},
                           {3, 7, 5},    {1, 777, 264}, {1, 5000, 136}};
  // (2, 600000, 1): row_rounds with more tiles (294) than resident blocks (264 on an H200):
  // two rounds, a row starting inside the first round, a partial last round
  if (!quick) shapes.push_back({2, 600000, 1});
  // strided_pipe: 118 chunks of 64 steps on 33 (fp32) or 17 (bf16) chains, a partial last chunk
  // (strided_pipe_narrow: 33 chains of 128 channels, the last one partial)
  if (!quick && (g_only_algo == jss::kStridedPipe || g_only_algo == jss::kStridedPipeNarrow))
    shapes.push_back({1, 7501, 4224});
  // row_pipe: 184 (fp32) / 92 (bf16) tiles on one row, more than the 128-word window and
  // than the ring slots of the resident blocks; 70000 steps: a partial last tile
  if (!quick && g_only_algo == jss::kRowPipe) {
    shapes.push_back({1, 1500000, 1});
    shapes.push_back({5, 70000, 1});
  }
  if (quick) shapes = {{2, 5000, 1}, {1, 9001, 1}, {2, 300, 132}, {1, 200, 130}, {1, 777, 264}};
  if (tiny) shapes = {{2, 5000, 1}, {1, 300, 132}, {1, 333, 264}};
  if (tiny && g_only_algo == jss::kRowRounds) shapes.push_back({2, 600000, 1});
  if (tiny && g_only_algo == jss::kRowStage) shapes.push_back({2, 40000, 1});  // 5 tiles a row
  // strided_pipe: more tiles than ring slots x resident blocks on one chain (a block's ring
  // wraps around several times, the look-back window moves back), a partial last chunk
  if (tiny && (g_only_algo == jss::kStridedPipe || g_only_algo == jss::kStridedPipeNarrow))
    shapes.push_back({1, 30001, 264});
  // strided_whole: 1024 channels over 1100 steps, the geometries auto takes there: fp32 4
  // vectors a block (5 rounds of 256 steps, the last partial), 16-bit 2 (3 rounds of 512)
  if (tiny && g_only_algo == jss::kStridedWhole) shapes.push_back({2, 1100, 1024});
  // row_pipe: 5 tiles a row, and 135 fp32 tiles on one row (past the window, rings wrap)
  if (tiny && g_only_algo == jss::kRowPipe) {
    shapes.push_back({2, 40000, 1});
    shapes.push_back({1, 1100000, 1});
  }
  // every named algorithm and the internal walk kernels (kRowWalk on a strided shape runs
  // the strided walk and vice versa, so each walk kernel is checked in both layouts' list)
  for (int algo = 0; algo < jss::kNumInternal; ++algo)
    for (auto s : shapes)
      if (g_only_algo < 0 || algo == g_only_algo)
      for (int rev = 0; rev < 2; ++rev) {
        fails += !run_case<float>(s.o, s.L, s.i, rev, algo);
        fails += !run_case<double>(s.o, s.L, s.i, rev, algo);
        if (!quick || rev == 0) {
          fails += !run_case<__nv_bfloat16>(s.o, s.L, s.i, rev, algo);
          fails += !run_case<cf>(s.o, s.L, s.i, rev, algo);
        }
      }
  std::printf("check: %d failures\n", fails);
  return fails ? 1 : 0;
}

__global__ void fill_kernel(float* a, float* b, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u1 = (z & 0xffffff) / float(1 << 24), u2 = ((z >> 24) & 0xffffff) / float(1 << 24);
    a[i] = 0.45f + 0.45f * u1;  // in [0.45, 0.9): influence dies out within a few hundred steps
    b[i] = u2 - 0.5f;
  }
}
__global__ void diff_kernel(const unsigned* x, const unsigned* y, int64_t n, unsigned* bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (x[i] != y[i]) atomicAdd(bad, 1u);
}

__global__ void to_bf16_kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_f32_kernel(const __nv_bfloat16* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __bfloat162float(x[i]);
}

static int mode_determinism(int runs, const std::string& filter) {
  struct D { const char* what; int64_t o, L, i; int algo; bool bf16 = false; };
  std::vector<D> cases = {
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kLookbackRegs},
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kLookbackWarp},
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kLookbackSerial},
      {"contiguous 256x65536", 256, 65536, 1, jss::kLookbackRegs},
      {"strided L=65536 C=1024", 1, 65536, 1024, jss::kLookbackRegs},
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kRowRounds},
      {"contiguous 100x2^18", 100, 1 << 18, 1, jss::kRowRounds},
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kRowStage},
      {"contiguous 100x2^18", 100, 1 << 18, 1, jss::kRowStage},
      {"contiguous 1x2^24 auto", 1, 1 << 24, 1, jss::kAuto},  // auto: row_stage
      {"contiguous 4096x4096", 4096, 4096, 1, jss::kRowWalk},
      {"strided L=4096 C=24576", 1, 4096, 24576, jss::kStridedWalk},
      {"contiguous 4096x4096 auto", 4096, 4096, 1, jss::kAuto},
      {"contiguous 65536x256 auto", 65536, 256, 1, jss::kAuto},  // row_walk (rows a warp by section 21.2's rule)
      {"strided L=4096 C=24576 auto", 1, 4096, 24576, jss::kAuto},
      {"strided L=65536 C=1024", 1, 65536, 1024, jss::kStridedStage},
      {"strided L=4096 C=24576", 1, 4096, 24576, jss::kStridedStage},
      {"strided L=65536 C=1024 auto", 1, 65536, 1024, jss::kAuto},
      {"strided L=1024 C=24576 auto", 1, 1024, 24576, jss::kAuto},  // auto: strided_stage
      {"strided L=65536 C=1024", 1, 65536, 1024, jss::kStridedPipe},
      {"strided L=4096 C=24576", 1, 4096, 24576, jss::kStridedPipe},
      {"strided L=2^20 C=256", 1, 1 << 20, 256, jss::kStridedPipe},  // 2 chains of 16384 tiles
      {"strided L=65536 C=1024 bf16", 1, 65536, 1024, jss::kStridedPipeNarrow, true},
      {"strided L=2^20 C=256 bf16", 1, 1 << 20, 256, jss::kStridedPipeNarrow, true},  // 2 chains
      {"strided 2048x32x1024 bf16 auto", 2048, 32, 1024, jss::kAuto, true},  // auto: the narrow pipe
      {"strided L=2^20 C=256 f32", 1, 1 << 20, 256, jss::kStridedPipeNarrow},  // 4 chains of 64 channels
      {"contiguous 1x2^24", 1, 1 << 24, 1, jss::kRowPipe},
      {"contiguous 100x2^18", 100, 1 << 18, 1, jss::kRowPipe},
      {"contiguous 256x65536", 256, 65536, 1, jss::kRowPipe},
      {"contiguous 1x2^24 bf16", 1, 1 << 24, 1, jss::kRowPipe, true},  // the 16-bit re-walk
      {"contiguous 100x2^18 bf16", 100, 1 << 18, 1, jss::kRowPipe, true},
      {"strided L=1024 C=1024 auto", 1, 1024, 1024, jss::kAuto},  // strided_whole (its default rule)
      {"strided L=4096 C=1024", 1, 4096, 1024, jss::kStridedWhole},  // 4 rounds
  };
  int fails = 0;
  for (auto& c : cases) {
    if (!filter.empty() && (std::string(c.what) + " " + kNames[c.algo]).find(filter) == std::string::npos) continue;
    const int64_t n = c.o * c.L * c.i;
    float *a, *b, *h0, *h, *ref;
    unsigned* bad;
    CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&h, n * 4)); CK(cudaMalloc(&ref, n * 4));
    CK(cudaMalloc(&h0, c.o * c.i * 4)); CK(cudaMalloc(&bad, 4));
    fill_kernel<<<1024, 256>>>(a, b, n, 7);
    CK(cudaMemset(h0, 0, c.o * c.i * 4));
    // a close to 1 keeps long-range dependence, so the carries matter at every tile
    jss::ScanProblem p;
    p.a = a; p.b = b; p.h0 = h0; p.h = ref; p.outer = c.o; p.L = c.L; p.inner = c.i; p.algorithm = c.algo;
    const jss::DType dt = c.bf16 ? jss::DType::BF16 : jss::DType::F32;
    const int64_t words = c.bf16 ? n / 2 : n;  // 32-bit words compared (n even for bf16)
    __nv_bfloat16 *a16 = nullptr, *b16 = nullptr;
    if (c.bf16) {  // bf16 copies of a, b (h0 stays zero: its first half read as bf16)
      CK(cudaMalloc(&a16, n * 2)); CK(cudaMalloc(&b16, n * 2));
      to_bf16_kernel<<<1024, 256>>>(a, a16, n);
      to_bf16_kernel<<<1024, 256>>>(b, b16, n);
      p.a = a16; p.b = b16;
    }
    size_t sb = jss::scratch_bytes(dt, p);
    void* s; CK(cudaMalloc(&s, sb));
    CK(jss::launch_linear_scan(dt, p, s, 0));
    p.h = h;
    CK(cudaMemset(bad, 0, 4));
    for (int r = 0; r < runs; ++r) {
      CK(cudaMemsetAsync(h, 0xff, n * 4, 0));
      CK(jss::launch_linear_scan(dt, p, s, 0));
      diff_kernel<<<1024, 256>>>((const unsigned*)h, (const unsigned*)ref, words, bad);
    }
    CK(cudaDeviceSynchronize());
    unsigned nb; CK(cudaMemcpy(&nb, bad, 4, cudaMemcpyDeviceToHost));
    const int64_t tiles = (int64_t)(sb / 16);
    std::printf("determinism %-26s %-16s runs=%d  ~%lld status words  differing elements (all runs): %u %s\n",
                c.what, kNames[c.algo], runs, (long long)tiles, nb, nb ? "FAIL" : "ok");
    fails += nb != 0;
    cudaFree(a); cudaFree(b); cudaFree(h); cudaFree(ref); cudaFree(h0); cudaFree(bad); cudaFree(s);
    cudaFree(a16); cudaFree(b16);
  }
  return fails ? 1 : 0;
}

// CUDA graphs: one launch (memsets + kernels, scratch preallocated) captured on a stream,
// the graph replayed `runs` times, every replay bitwise equal to a direct launch. What this
// shows: the kernels reset their own state on the stream, so a replay starts clean. (The
// FFI handlers also allocate their scratch inside the call, which is why they are not
// declared command-buffer compatible: docs/PERFORMANCE_CUDA.md section 6.2.)
static int mode_graph(int runs) {
  struct G { const char* what; int64_t o, L, i; int algo; };
  std::vector<G> cases = {
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kLookbackRegs},
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kLookbackWarp},
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kRowRounds},  // a cooperative launch
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kRowStage},
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kThreePass},
      {"contiguous 1024x4096", 1024, 4096, 1, jss::kRowWalk},
      {"strided L=4096 C=4096", 1, 4096, 4096, jss::kStridedStage},
      {"strided L=4096 C=4096", 1, 4096, 4096, jss::kLookbackRegs},
      {"strided L=4096 C=4096", 1, 4096, 4096, jss::kStridedPipe},
      {"contiguous 1x2^22", 1, 1 << 22, 1, jss::kRowPipe},
  };
  int fails = 0;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (auto& c : cases) {
    const int64_t n = c.o * c.L * c.i;
    float *a, *b, *h0, *h, *ref;
    unsigned* bad;
    CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&h, n * 4)); CK(cudaMalloc(&ref, n * 4));
    CK(cudaMalloc(&h0, c.o * c.i * 4)); CK(cudaMalloc(&bad, 4));
    fill_kernel<<<1024, 256, 0, st>>>(a, b, n, 9);
    CK(cudaMemsetAsync(h0, 0, c.o * c.i * 4, st));
    jss::ScanProblem p;
    p.a = a; p.b = b; p.h0 = h0; p.h = ref; p.outer = c.o; p.L = c.L; p.inner = c.i; p.algorithm = c.algo;
    void* s = nullptr;
    const size_t sb = jss::scratch_bytes(jss::DType::F32, p);
    if (sb) CK(cudaMalloc(&s, sb));
    CK(jss::launch_linear_scan(jss::DType::F32, p, s, st));  // the direct launch
    p.h = h;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const cudaError_t lerr = jss::launch_linear_scan(jss::DType::F32, p, s, st);
    CK(cudaStreamEndCapture(st, &graph));
    CK(lerr);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaMemsetAsync(bad, 0, 4, st));
    for (int r = 0; r < runs; ++r) {
      CK(cudaMemsetAsync(h, 0xff, n * 4, st));
      CK(cudaGraphLaunch(exec, st));
      diff_kernel<<<1024, 256, 0, st>>>((const unsigned*)h, (const unsigned*)ref, n, bad);
    }
    CK(cudaStreamSynchronize(st));
    unsigned nb;
    CK(cudaMemcpy(&nb, bad, 4, cudaMemcpyDeviceToHost));
    std::printf("graph %-24s %-16s replays=%d  differing elements (all replays): %u %s\n", c.what,
                kNames[c.algo], runs, nb, nb ? "FAIL" : "ok");
    fails += nb != 0;
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    cudaFree(a); cudaFree(b); cudaFree(h); cudaFree(ref); cudaFree(h0); cudaFree(bad); cudaFree(s);
  }
  CK(cudaStreamDestroy(st));
  return fails ? 1 : 0;
}

// > 2^31 elements: check windows against a float64 recurrence started 400 steps earlier
// from 0 (a < 0.9, so the neglected history weighs < 0.9^400).
static int mode_big(const std::string& filter) {
  int fails = 0;
  struct B { const char* what; int64_t o, L, i; int algo = jss::kAuto; bool bf16 = false; };
  // (one row of 2^31 + 2^20 + 4: a multiple of 4, so auto runs row_stage's 16-byte vectors)
  std::vector<B> cases = {{"contiguous 1 x (2^31+2^20+4)", 1, (1ll << 31) + (1 << 20) + 4, 1},
                          {"contiguous rows 2048 x (2^20+4)", 2048, (1 << 20) + 4, 1},
                          {"strided (L=2^17+1, C=16388) axis 0", 1, (1 << 17) + 1, 16388},
                          // auto's strided_whole (fp32, L <= 1024: docs/PERFORMANCE_CUDA.md 22.8)
                          {"strided (L=1000, C=2^21+2^16) axis 0 whole", 1, 1000, (1 << 21) + (1 << 16)},
                          {"contiguous 1 x (2^31+2^20+4) row_pipe", 1, (1ll << 31) + (1 << 20) + 4, 1, jss::kRowPipe},
                          {"strided (L=2^17+1, C=16388) narrow bf16", 1, (1 << 17) + 1, 16388,
                           jss::kStridedPipeNarrow, true},
                          {"strided (L=2^17+1, C=16388) narrow f32", 1, (1 << 17) + 1, 16388,
                           jss::kStridedPipeNarrow},
                          // the 16-bit re-walk (L a multiple of 8: 16-byte vectors of bf16)
                          {"contiguous 1 x (2^31+2^20+8) row_pipe bf16", 1, (1ll << 31) + (1 << 20) + 8, 1,
                           jss::kRowPipe, true}};
  for (auto& c : cases) {
    if (!filter.empty() && std::string(c.what).find(filter) == std::string::npos) continue;
    const int64_t n = c.o * c.L * c.i;
    float *a, *b, *h0, *h;
    CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&h, n * 4));
    CK(cudaMalloc(&h0, c.o * c.i * 4)); CK(cudaMemset(h0, 0, c.o * c.i * 4));
    fill_kernel<<<4096, 256>>>(a, b, n, 11);
    CK(cudaMemset(h, 0xff, n * 4));
    jss::ScanProblem p;
    p.a = a; p.b = b; p.h0 = h0; p.h = h; p.outer = c.o; p.L = c.L; p.inner = c.i; p.algorithm = c.algo;
    const jss::DType dt = c.bf16 ? jss::DType::BF16 : jss::DType::F32;
    __nv_bfloat16 *a16 = nullptr, *b16 = nullptr, *h16 = nullptr;
    if (c.bf16) {  // bf16 a, b, h; the check below then reads their float conversions
      CK(cudaMalloc(&a16, n * 2)); CK(cudaMalloc(&b16, n * 2)); CK(cudaMalloc(&h16, n * 2));
      to_bf16_kernel<<<4096, 256>>>(a, a16, n);
      to_bf16_kernel<<<4096, 256>>>(b, b16, n);
      CK(cudaMemset(h16, 0xff, n * 2));  // (h0 is zero: the same bits as bf16)
      p.a = a16; p.b = b16; p.h = h16;
    }
    size_t sb = jss::scratch_bytes(dt, p);
    void* s; CK(cudaMalloc(&s, sb));
    CK(jss::launch_linear_scan(dt, p, s, 0));
    if (c.bf16) {
      to_f32_kernel<<<4096, 256>>>(a16, a, n);
      to_f32_kernel<<<4096, 256>>>(b16, b, n);
      to_f32_kernel<<<4096, 256>>>(h16, h, n);
    }
    CK(cudaDeviceSynchronize());
    // windows of steps t (per channel for the strided case)
    std::vector<int64_t> ts, chans;
    if (c.i == 1 && c.o == 1) {
      ts = {0, 5000, (1ll << 31) - 700, (1ll << 31) + 5, c.L - 600};
      chans = {0};
    } else if (c.i == 1) {  // rows: "chans" are rows; row 2047 starts past 2^31
      ts = {0, 5000, c.L - 600};
      chans = {0, 1, c.o - 1};
    } else {
      ts = {0, c.L / 2, c.L - 500};
      chans = {0, 1, 4097, c.i - 1};
    }
    double worst = 0;
    for (int64_t ch : chans)
      for (int64_t t0 : ts) {
        const int64_t lo = t0 >= 400 ? t0 - 400 : 0, hi = std::min<int64_t>(t0 + 500, c.L);
        const int64_t m = hi - lo;
        std::vector<float> va(m), vb(m), vh(m);
        const int64_t base = c.i == 1 ? ch * c.L + lo : lo * c.i + ch;
        CK(cudaMemcpy2D(va.data(), 4, a + base, c.i * 4, 4, m, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy2D(vb.data(), 4, b + base, c.i * 4, 4, m, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy2D(vh.data(), 4, h + base, c.i * 4, 4, m, cudaMemcpyDeviceToHost));
        double st = 0;
        for (int64_t k = 0; k < m; ++k) {
          st = (double)va[k] * st + vb[k];
          if (lo + k >= t0 || lo == 0) {
            double err = std::fabs(st - vh[k]) / (1.0 + std::fabs(st));
            if (!(err <= worst)) worst = std::isnan(err) ? 1e30 : std::max(worst, err);
          }
        }
      }
    bool ok = worst < (c.bf16 ? 1e-2 : 1e-4);  // bf16: h rounded to 8 bits (2^-9 relative)
    std::printf("big %-36s n=%lld (> 2^31: %s) worst window error %.2e %s\n", c.what, (long long)n,
                n > (1ll << 31) ? "yes" : "no", worst, ok ? "ok" : "FAIL");
    fails += !ok;
    cudaFree(a); cudaFree(b); cudaFree(h); cudaFree(h0); cudaFree(s);
    cudaFree(a16); cudaFree(b16); cudaFree(h16);
  }
  return fails ? 1 : 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "check";
  if ((mode == "tiny" || mode == "quick" || mode == "check") && argc > 2)
    for (int k = 0; k < jss::kNumInternal; ++k)
      if (std::string(argv[2]) == kNames[k]) g_only_algo = k;
  if (mode == "check") return mode_check(false);
  if (mode == "quick") return mode_check(true);
  if (mode == "tiny") return mode_check(true, true);
  if (mode == "determinism") return mode_determinism(argc > 2 ? std::atoi(argv[2]) : 500, argc > 3 ? argv[3] : "");
  if (mode == "big") return mode_big(argc > 2 ? argv[2] : "");  // big [substring of the case names]
  if (mode == "graph") return mode_graph(argc > 2 ? std::atoi(argv[2]) : 100);
  std::printf("unknown mode %s\n", mode.c_str());
  return 2;
}
