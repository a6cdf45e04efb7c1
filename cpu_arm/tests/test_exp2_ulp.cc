// Maximum error of the vector exp2 of simd_math.h (exp2_nonpos, used by the
// selective scan on delta * A * log2 e <= 0) against double exp2, per ISA,
// over x in [-151, 0]: down past the smallest subnormal result (2^-149). Also
// reports softplus and silu against double. Fails when exp2 exceeds 2 ULP.
//
//   ./test_exp2_ulp            every float in [-151, 0] (about 1.1e9 of them)
//   ./test_exp2_ulp --stride K every K-th float bit pattern (for emulators)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../selective_scan_cpu.h"

using namespace jax_selscan;

namespace {

float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// ULP of a float32 result near `ref` (subnormal spacing below 2^-126).
double ulp_at(double ref) {
  const double a = std::fabs(ref);
  if (a < std::ldexp(1.0, -126)) return std::ldexp(1.0, -149);
  return std::ldexp(1.0, std::ilogb(a) - 23);
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t stride = 1;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--stride" && i + 1 < argc) stride = std::strtoul(argv[++i], nullptr, 10);
  int failures = 0;
  const uint32_t lo = to_bits(-0.0f), hi = to_bits(-151.0f);  // negative floats: bits grow with |x|
  for (const KernelTable* k : supported_kernel_tables()) {
    const SsTable* t = ss_table_named(k->name);
    if (t == nullptr) continue;
    const int64_t chunk = 1 << 16;
    std::vector<float> x(chunk), y(chunk);
    double worst = 0;
    float worst_x = 0;
    uint64_t count = 0;
    for (uint64_t b = lo; b <= hi;) {
      int64_t n = 0;
      for (; n < chunk && b <= hi; ++n, b += stride) x[n] = from_bits(static_cast<uint32_t>(b));
      t->exp2(x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double ref = std::exp2(static_cast<double>(x[i]));
        const double e = std::fabs(y[i] - ref) / ulp_at(ref);
        if (e > worst) { worst = e; worst_x = x[i]; }
      }
      count += n;
    }
    // Edge values.
    const float edges[] = {0.0f, -0.0f, -0.5f, 0.5f - 1.0f, -125.0f, -125.5f, -126.0f, -149.0f,
                           -149.5f, -150.0f, -150.5f, -151.0f, -200.0f, -1e30f, -INFINITY};
    float ey[sizeof(edges) / sizeof(edges[0])];
    t->exp2(edges, sizeof(edges) / sizeof(edges[0]), ey);
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); ++i) {
      const double ref = std::exp2(static_cast<double>(edges[i]));
      const double e = std::fabs(ey[i] - ref) / ulp_at(ref);
      if (e > worst) { worst = e; worst_x = edges[i]; }
    }
    // softplus / silu against double, relative error (absolute near 0).
    const int64_t m = 200001;
    std::vector<float> sx(m), sy(m), zy(m);
    for (int64_t i = 0; i < m; ++i) sx[i] = -80.0f + 160.0f * static_cast<float>(i) / (m - 1);
    t->softplus(sx.data(), m, sy.data());
    t->silu(sx.data(), m, zy.data());
    double sp_worst = 0, si_worst = 0;
    for (int64_t i = 0; i < m; ++i) {
      const double v = sx[i];
      const double sp = v > 0 ? v + std::log1p(std::exp(-v)) : std::log1p(std::exp(v));
      const double si = v / (1.0 + std::exp(-v));
      sp_worst = std::fmax(sp_worst, std::fabs(sy[i] - sp) / ulp_at(sp));
      si_worst = std::fmax(si_worst, std::fabs(zy[i] - si) / ulp_at(si));
    }
    const bool ok = worst <= 2.0;
    failures += !ok;
    std::printf("%-8s exp2 on [-151, 0]: %llu points (stride %u), max error %.3f ULP at x = %.9g %s;"
                " softplus max %.2f ULP, silu max %.2f ULP on [-80, 80]\n",
                t->name, static_cast<unsigned long long>(count), stride, worst, worst_x,
                ok ? "(ok, <= 2)" : "(FAIL, > 2)", sp_worst, si_worst);
  }
  return failures == 0 ? 0 : 1;
}
