// Backward timing for few tasks and long L (the L split): batch 1, D channels, N states,
// L steps, float32, Mamba-like inputs (softplus delta, A = -exp(normal / 2), B and C
// varying, D, z), best ISA, medians over `reps` calls on warm buffers, for each thread
// count given (test::ThreadExecutor: a fresh set of threads per parallel region).
// Usage: bench_selective_bwd D N log2L reps threads...
// Build as build_selective_tests.sh builds test_selective_scan (the ISA objects, driver.cc,
// dispatch.cc, selective_scan_cpu.cc, selective_scan_bwd_cpu.cc, -pthread).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "test_util.h"
#include "../selective_scan_bwd_cpu.h"

using namespace jax_selscan;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s D N log2L reps threads...\n", argv[0]);
    return 2;
  }
  const int64_t D = std::atoll(argv[1]), N = std::atoll(argv[2]);
  // BWD_L=n: L = n instead of 2^log2L (lengths whose rows alias in the caches or not;
  // PERFORMANCE_CPU, session 33).
  const int64_t L = std::getenv("BWD_L") ? std::atoll(std::getenv("BWD_L")) : int64_t(1) << std::atoi(argv[3]);
  const int reps = std::atoi(argv[4]);
  std::mt19937 g(0);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // BWD_ALIGN=1: the (D, L) arrays start on 4 KiB boundaries (as XLA's large buffers can), else
  // where the allocator puts them.
  const bool align = std::getenv("BWD_ALIGN") && std::getenv("BWD_ALIGN")[0] == '1';
  std::vector<std::vector<float>> store;
  auto rows = [&](float scale, float shift) {
    store.emplace_back(D * L + 1024);
    float* f = store.back().data();
    if (align) f = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(f) + 4095) & ~uintptr_t(4095));
    for (int64_t i = 0; i < D * L; ++i) f[i] = nd(g) * scale + shift;
    return f;
  };
  store.reserve(7);
  float *u = rows(1.0f, 0.0f), *dl = rows(0.5f, -1.0f), *z = rows(1.0f, 0.0f), *dout = rows(1.0f, 0.0f);
  float *du = rows(0.0f, 0.0f), *dd = rows(0.0f, 0.0f), *dz = rows(0.0f, 0.0f);
  std::vector<float> A(D * N), B(N * L), C(N * L), Dv(D), bias(D);
  for (auto& v : A) v = -std::exp(nd(g) * 0.5f);
  for (auto& v : B) v = nd(g);
  for (auto& v : C) v = nd(g);
  for (auto& v : Dv) v = nd(g);
  for (auto& v : bias) v = nd(g) * 0.2f;
  std::vector<float> dA(D * N), dB(N * L), dC(N * L), dD(D), dbias(D);
  SsBwdParams q{};
  SsParams& p = q.fwd;
  p.u = u; p.delta = dl; p.A = A.data();
  p.B = B.data(); p.b_var = true; p.C = C.data(); p.c_var = true;
  p.D = Dv.data(); p.z = z; p.delta_bias = bias.data(); p.delta_softplus = true;
  p.direction = SsDirection::kForward;
  // BWD_DIR=r / b: the reverse or bidirectional scan; BWD_PLAIN=1: no z, D, bias or softplus.
  if (const char* e = std::getenv("BWD_DIR"); e != nullptr && e[0] == 'r') p.direction = SsDirection::kReverse;
  if (const char* e = std::getenv("BWD_DIR"); e != nullptr && e[0] == 'b') p.direction = SsDirection::kBidirectional;
  // BWD_INV=1: B and C invariant ((D, N), no rows over time).
  if (const char* e = std::getenv("BWD_INV"); e != nullptr && e[0] == '1') {
    p.b_var = p.c_var = false;
    q.dB = dB.data(); q.dC = dC.data();  // (D * N <= N * L here)
  }
  if (const char* e = std::getenv("BWD_PLAIN"); e != nullptr && e[0] == '1') {
    p.z = nullptr; p.D = nullptr; p.delta_bias = nullptr; p.delta_softplus = false;
  }
  p.batch = 1; p.dim = D; p.dstate = N; p.length = L; p.b_groups = 1; p.c_groups = 1;
  q.dout = dout;
  q.du = du; q.ddelta = dd; q.dz = p.z != nullptr ? dz : nullptr; q.dA = dA.data(); q.dB = dB.data(); q.dC = dC.data();
  q.dD = p.D != nullptr ? dD.data() : nullptr;
  q.ddelta_bias = p.delta_bias != nullptr ? dbias.data() : nullptr;
  std::string err;
  const SsBwdTable* table = select_ss_bwd_table(&err);
  for (int a = 5; a < argc; ++a) {
    const int nt = std::atoi(argv[a]);
    test::ThreadExecutor ex(nt);
    std::vector<double> ts;
    selective_scan_bwd_cpu(q, *table, ex);  // warm-up
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      selective_scan_bwd_cpu(q, *table, ex);
      ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    std::printf("bwd %s batch 1 D %lld N %lld L %lld threads %d: median %.2f ms (min %.2f, max %.2f, %d calls), "
                "%.3f ns per (t, d, n)\n", table->name, (long long)D, (long long)N, (long long)L, nt,
                ts[ts.size() / 2], ts.front(), ts.back(), reps, ts[ts.size() / 2] * 1e6 / double(D * L * N));
  }
  return 0;
}
