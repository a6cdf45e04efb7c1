// SISO benchmark: batch 1, D 1, N 1, L = 2^20, float32, one core.
// A plain scalar C++ loop of the recurrence (std::exp per step) against the
// selective-scan kernel (best ISA, one thread). Prints one JSON line last.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "../selective_scan_cpu.h"

using namespace jax_selscan;

// The memory floor: one elementwise pass over the same bytes (reads u, delta, B, C,
// writes out), vectorised by the compiler.
#if defined(__x86_64__) && (defined(__GNUC__) && !defined(__clang__))
__attribute__((optimize("O3"), target("avx2")))
#endif
static void elementwise(const float* u, const float* d, const float* B, const float* C, float* o,
                        int64_t n) {
  for (int64_t t = 0; t < n; ++t) o[t] = C[t] * d[t] * B[t] * u[t];
}

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
    for (int r = 0; r < 15; ++r) {
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
  std::vector<float> tmp(L);
  const double elem = time_ms([&] { elementwise(u.data(), delta.data(), B.data(), C.data(), tmp.data(), L); });
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
  std::printf("scalar loop %.3f ms, kernel (%s) %.3f ms (%.3f ns/step), elementwise pass over the same "
              "bytes %.3f ms, max |diff| / max |y| = %.2g\n", scalar, table->name, kernel, kernel * 1e6 / L,
              elem, e / s);
  // One core, Mamba-like tile: batch 1, D 128, L 2048, N 16 (B, C variable, softplus):
  // forward, reverse and the fused bidirectional call (same kernel as the JAX path).
  {
    const int64_t D = std::getenv("TILE_D") ? std::atoll(std::getenv("TILE_D")) : 128, N = 16;
    const int64_t L2 = std::getenv("TILE_L") ? std::atoll(std::getenv("TILE_L")) : 2048;
    // TILE_ALIGN=1: u, delta, z and out start on 4 KiB boundaries (as XLA's large buffers can),
    // else where the allocator puts them. TILE_HUGE=1: on 2 MiB boundaries, in transparent huge
    // pages where the kernel grants them (madvise before the first touch): the same 4 KiB
    // alignment of the rows without the TLB's 4 KiB pages (PERFORMANCE_CPU, session 33).
    const bool huge = std::getenv("TILE_HUGE") && std::getenv("TILE_HUGE")[0] == '1';
    const bool align = huge || (std::getenv("TILE_ALIGN") && std::getenv("TILE_ALIGN")[0] == '1');
    std::vector<void*> owned;
    auto big = [&](std::vector<float>& v) {
      if (huge) {
        const size_t hp = size_t(1) << 21, bytes = ((D * L2 + 1024) * sizeof(float) + hp - 1) / hp * hp;
        void* m = std::aligned_alloc(hp, bytes);
        if (m == nullptr) std::abort();
#if defined(__linux__)
        madvise(m, bytes, MADV_HUGEPAGE);
#endif
        owned.push_back(m);
        return static_cast<float*>(m);
      }
      v.resize(D * L2 + 1024);
      float* f = v.data();
      if (align) f = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(f) + 4095) & ~uintptr_t(4095));
      return f;
    };
    std::vector<float> u2v, d2v, o2v, z2v, A2(D * N), B2(N * L2), C2(N * L2), D2(D);
    float *u2 = big(u2v), *d2 = big(d2v), *o2 = big(o2v);
    for (int64_t i = 0; i < D * L2; ++i) u2[i] = nd(g);
    for (int64_t i = 0; i < D * L2; ++i) d2[i] = nd(g) * 0.5f - 1.0f;
    for (auto& v : A2) v = -std::exp(nd(g) * 0.5f);
    for (auto& v : B2) v = nd(g);
    for (auto& v : C2) v = nd(g);
    SsParams q{};
    q.u = u2; q.delta = d2; q.A = A2.data();
    q.B = B2.data(); q.b_var = true; q.C = C2.data(); q.c_var = true;
    q.delta_softplus = true;
    q.batch = 1; q.dim = D; q.dstate = N; q.length = L2; q.b_groups = 1; q.c_groups = 1;
    q.out = o2;
    // TILE_Z=1: with z and D too (the Mamba call: four (D, L) arrays; PERFORMANCE_CPU, session 25).
    if (std::getenv("TILE_Z") && std::getenv("TILE_Z")[0] == '1') {
      float* z2 = big(z2v);
      for (int64_t i = 0; i < D * L2; ++i) z2[i] = nd(g);
      for (auto& v : D2) v = nd(g);
      q.z = z2; q.D = D2.data();
    }
    // TILE_ONLY=0 / 1 / 2: time only that direction (forward, reverse, bidirectional), 30 calls
    // after one, for a profiler.
    if (const char* only = std::getenv("TILE_ONLY"); only != nullptr && only[0] != '\0') {
      q.direction = static_cast<SsDirection>(std::atoi(only));
      selective_scan_cpu(q, *table, one);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 30; ++i) selective_scan_cpu(q, *table, one);
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("direction %d: %.3f ms per call (30 calls)\n", int(q.direction), t / 30);
      return 0;
    }
    double ms[3];
    for (int dir = 0; dir < 3; ++dir) {
      q.direction = static_cast<SsDirection>(dir);
      ms[dir] = time_ms([&] { selective_scan_cpu(q, *table, one); });
    }
    std::printf("one core, batch 1, D %lld, L %lld, N %lld: forward %.3f ms, reverse %.3f ms, "
                "bidirectional (fused) %.3f ms, fused vs two calls %.2fx, %.3f ns per (t, d, n) forward\n",
                (long long)D, (long long)L2, (long long)N, ms[0], ms[1], ms[2], (ms[0] + ms[1]) / ms[2],
                ms[0] * 1e6 / double(D * L2 * N));
    for (void* m : owned) std::free(m);
  }
  std::printf("{\"length\": %lld, \"scalar_ms\": %.4f, \"kernel_ms\": %.4f, \"speedup\": %.3f, "
              "\"elementwise_ms\": %.4f, \"isa\": \"%s\"}\n",
              (long long)L, scalar, kernel, scalar / kernel, elem, table->name);
  return 0;
}
