// SISO benchmark: batch 1, D 1, N 1, L = 2^20, float32, one core.
// A plain scalar C++ loop of the recurrence (std::exp per step) against the
// selective-scan kernel (best ISA, one thread). Prints one JSON line last.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../selective_scan_cpu.h"

using namespace jax_selscan;

int main() {
  const int64_t L = int64_t(1) << 20;
  std::mt19937 g(0);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> u(L), delta(L), B(L), C(L), out(L), ref(L);
  for (int64_t t = 0; t < L; ++t) {
    u[t] = nd(g); delta[t] = std::fabs(nd(g)) * 0.1f; B[t] = nd(g); C[t] = nd(g);
  }
  const float A = -0.5f;
  auto time_ms = [](auto&& f) {
    std::vector<double> ts;
    for (int r = 0; r < 7; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      f();
      ts.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
  };
  const double scalar = time_ms([&] {
    float h = 0.0f;
    for (int64_t t = 0; t < L; ++t) {
      h = std::exp(delta[t] * A) * h + delta[t] * B[t] * u[t];
      ref[t] = C[t] * h;
    }
  });
  SsParams p{};
  p.u = u.data(); p.delta = delta.data(); p.A = &A;
  p.B = B.data(); p.b_var = true; p.C = C.data(); p.c_var = true;
  p.direction = SsDirection::kForward;
  p.batch = 1; p.dim = 1; p.dstate = 1; p.length = L; p.b_groups = 1; p.c_groups = 1;
  p.out = out.data();
  std::string err;
  const SsTable* table = select_ss_table(&err);
  InlineExecutor one;
  const double kernel = time_ms([&] { selective_scan_cpu(p, *table, one); });
  double e = 0, s = 0;
  for (int64_t t = 0; t < L; ++t) { e = std::fmax(e, std::fabs(out[t] - ref[t])); s = std::fmax(s, std::fabs(ref[t])); }
  std::printf("scalar loop %.3f ms, kernel (%s) %.3f ms, max |diff| / max |y| = %.2g\n", scalar,
              table->name, kernel, e / s);
  std::printf("{\"length\": %lld, \"scalar_ms\": %.4f, \"kernel_ms\": %.4f, \"speedup\": %.3f, \"isa\": \"%s\"}\n",
              (long long)L, scalar, kernel, scalar / kernel, table->name);
  return 0;
}
