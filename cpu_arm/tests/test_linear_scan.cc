// C++ tests of the CPU linear scan: every dtype, layout, direction, h0, a_prod,
// odd/prime lengths, the chunked and multithreaded paths, against a float64
// (complex128) reference, with each ISA forced in turn via JAX_SELSCAN_CPU_ISA.
// Also checks each ISA's vector bf16/f16 conversions bit for bit against the
// scalar ones. Build: see build_tests.sh (x86-64) or run_cross_arm.sh (aarch64).
//
//   ./test_linear_scan            all ISAs this CPU runs
//   ./test_linear_scan --quick    fewer large cases (for emulators)
#include <atomic>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "../dtypes.h"
#include "test_util.h"
#include "../huge_pages.h"
#include "../linear_scan_cpu.h"

using namespace jax_selscan;
using cd = std::complex<double>;

namespace {

using test::g_checks;
using test::g_failures;
using test::ThreadExecutor;

#if defined(__linux__)
// Pages of [p, p + bytes) resident now (mincore), out of all of them.
size_t resident_pages(const char* p, size_t bytes, size_t* total) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) & ~(page - 1);
  std::vector<unsigned char> v((hi - lo) / page);
  *total = v.size();
  if (mincore(reinterpret_cast<void*>(lo), hi - lo, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}
#endif

// prepare_output (huge_pages.h) on buffers of more than 4 MiB at an odd offset: a buffer's
// contents stay as they were, and a fresh mapping's pages are all mapped in afterwards where
// MADV_POPULATE_WRITE works (Linux >= 5.14; not under every emulator: probed on a page first).
void test_prepare_output() {
#if defined(__linux__)
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = (size_t(9) << 20) + 12345, offset = 100;
  const size_t map = (offset + bytes + page - 1) / page * page;
  ThreadExecutor threads(4);
  char* fresh = static_cast<char*>(mmap(nullptr, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char* probe = static_cast<char*>(mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  CHECK(fresh != MAP_FAILED && probe != MAP_FAILED, "mmap for the prefault test");
  if (fresh == MAP_FAILED || probe == MAP_FAILED) return;
  size_t total = 0;
  bool populates = false;
#if defined(MADV_POPULATE_WRITE)
  populates = madvise(probe, page, MADV_POPULATE_WRITE) == 0 && resident_pages(probe, page, &total) == 1;
#endif
  const size_t before = resident_pages(fresh + offset, bytes, &total);
  setenv("JAX_SELSCAN_CPU_PREFAULT", "0", 1);
  prepare_output(fresh + offset, bytes, threads);
  CHECK(resident_pages(fresh + offset, bytes, &total) == before, "JAX_SELSCAN_CPU_PREFAULT=0 faulted pages in");
  unsetenv("JAX_SELSCAN_CPU_PREFAULT");
  prepare_output(fresh + offset, bytes, threads);
  const size_t after = resident_pages(fresh + offset, bytes, &total);
  if (populates)
    CHECK(before == 0 && after == total, "prefault: %zu of %zu pages resident (%zu before)", after, total, before);
  else
    std::printf("prefault: MADV_POPULATE_WRITE has no effect here; residency not checked\n");
  // Contents: a pattern written first survives.
  for (size_t i = 0; i < bytes; ++i) fresh[offset + i] = static_cast<char>(i * 131 + 7);
  prepare_output(fresh + offset, bytes, threads);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += fresh[offset + i] != static_cast<char>(i * 131 + 7);
  CHECK(wrong == 0, "prefault changed %zu bytes of the buffer", wrong);
  munmap(fresh, map);
  munmap(probe, page);
#endif
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kC64: return "c64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

// ---- storage <-> complex<double>, for the reference ---------------------------
template <class T> cd to_cd(const T& x);
template <> cd to_cd(const float& x) { return x; }
template <> cd to_cd(const double& x) { return x; }
template <> cd to_cd(const c64_t& x) { return {x.re, x.im}; }
template <> cd to_cd(const bf16_t& x) { return bf16_to_float(x.bits); }
template <> cd to_cd(const f16_t& x) { return f16_to_float(x.bits); }

template <class T> T from_cd(cd x);
template <> float from_cd(cd x) { return float(x.real()); }
template <> double from_cd(cd x) { return x.real(); }
template <> c64_t from_cd(cd x) { return {float(x.real()), float(x.imag())}; }
template <> bf16_t from_cd(cd x) { return {float_to_bf16(float(x.real()))}; }
template <> f16_t from_cd(cd x) { return {float_to_f16(float(x.real()))}; }

// Plain complex product (no C99 Annex G infinity recovery, like the kernels).
cd cmul(cd x, cd y) {
  return {x.real() * y.real() - x.imag() * y.imag(), x.real() * y.imag() + x.imag() * y.real()};
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<c64_t>() { return DType::kC64; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::kBF16; }
template <> constexpr DType dtype_of<f16_t>() { return DType::kF16; }

template <class T> double tolerance();
template <> double tolerance<float>() { return 2e-5; }
template <> double tolerance<double>() { return 1e-12; }
template <> double tolerance<c64_t>() { return 2e-5; }
template <> double tolerance<bf16_t>() { return 1e-2; }
template <> double tolerance<f16_t>() { return 1e-2; }

struct Case {
  int64_t outer, length, inner;
  double a_lo, a_hi;  // a drawn from [a_lo, a_hi] (random sign for |a| < 1 cases)
  int specials;       // 1: a NaN in b; 2: also an Inf (only where no chunking: there
                      // P*carry + E turns inf into NaN once P underflows, as in any
                      // chunked or associative scan)
};

template <class T>
void run_case(const KernelTable& table, const Case& c, bool reverse, bool with_h0, bool with_prod,
              Executor& ex, std::mt19937_64& rng) {
  const int64_t n = c.outer * c.length * c.inner, ns = c.outer * c.inner;
  std::uniform_real_distribution<double> ua(c.a_lo, c.a_hi), ub(-1.0, 1.0);
  const bool complex = dtype_of<T>() == DType::kC64;
  std::vector<T> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)), h0(static_cast<size_t>(ns));
  std::vector<T> h(static_cast<size_t>(n)), p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    cd av = complex ? std::polar(std::abs(ua(rng)), ub(rng) * 3.14159) : cd(ua(rng));
    a[i] = from_cd<T>(av);
    b[i] = from_cd<T>(complex ? cd(ub(rng), ub(rng)) : cd(ub(rng)));
  }
  if (c.specials && n > 0) {
    b[size_t(n / 3)] = from_cd<T>(cd(std::nan("")));
    if (c.specials > 1) b[size_t(2 * n / 3)] = from_cd<T>(cd(INFINITY));
  }
  for (int64_t i = 0; i < ns; ++i) h0[i] = from_cd<T>(complex ? cd(ub(rng), ub(rng)) : cd(ub(rng)));
  // Poison the outputs: every element must be written.
  std::memset(h.data(), 0xff, h.size() * sizeof(T));
  std::memset(p.data(), 0xff, p.size() * sizeof(T));

  LinearScanArgs args;
  args.dtype = dtype_of<T>();
  args.a = a.data();
  args.b = b.data();
  args.h0 = with_h0 ? h0.data() : nullptr;
  args.h = h.data();
  args.a_prod = with_prod ? p.data() : nullptr;
  args.outer = c.outer;
  args.length = c.length;
  args.inner = c.inner;
  args.reverse = reverse;
  linear_scan_cpu(args, table, ex);

  // Reference, and the error relative to the scale of each sequence.
  int bad = 0;
  for (int64_t o = 0; o < c.outer; ++o) {
    for (int64_t j = 0; j < c.inner; ++j) {
      cd hr = with_h0 ? to_cd(h0[o * c.inner + j]) : cd(0), pr = 1;
      std::vector<cd> href(size_t(c.length)), pref(size_t(c.length));
      double hscale = std::abs(hr), pscale = 1;
      for (int64_t s = 0; s < c.length; ++s) {
        const int64_t t = reverse ? c.length - 1 - s : s;
        const int64_t i = (o * c.length + t) * c.inner + j;
        const cd av = to_cd(a[i]), bv = to_cd(b[i]);
        hr = complex ? cmul(av, hr) + bv : cd(av.real() * hr.real() + bv.real());
        pr = complex ? cmul(av, pr) : cd(av.real() * pr.real());
        href[t] = hr;
        pref[t] = pr;
        if (std::isfinite(std::abs(hr))) hscale = std::max(hscale, std::abs(hr));
        if (std::isfinite(std::abs(pr))) pscale = std::max(pscale, std::abs(pr));
      }
      for (int64_t t = 0; t < c.length; ++t) {
        const int64_t i = (o * c.length + t) * c.inner + j;
        auto close = [&](cd got, cd want, double scale) {  // component-wise
          auto one = [&](double g, double w) {
            if (std::isnan(w) || std::isnan(g)) return std::isnan(w) == std::isnan(g);
            if (std::isinf(w)) return g == w;
            return std::abs(g - w) <= tolerance<T>() * (scale + 1e-30);
          };
          return one(got.real(), want.real()) && one(got.imag(), want.imag());
        };
        if (!close(to_cd(h[i]), href[t], hscale) && bad++ < 3)
          CHECK(false, "%s %s h (outer=%lld L=%lld inner=%lld rev=%d h0=%d prod=%d thr=%lld) at o=%lld t=%lld j=%lld: got (%g,%g) want (%g,%g) scale %g",
                table.name, dtype_name(dtype_of<T>()), (long long)c.outer, (long long)c.length,
                (long long)c.inner, reverse, with_h0, with_prod, (long long)ex.num_threads(),
                (long long)o, (long long)t, (long long)j, to_cd(h[i]).real(), to_cd(h[i]).imag(),
                href[t].real(), href[t].imag(), hscale);
        if (with_prod && !close(to_cd(p[i]), pref[t], pscale) && bad++ < 3)
          CHECK(false, "%s %s a_prod (outer=%lld L=%lld inner=%lld rev=%d) at o=%lld t=%lld j=%lld: got (%g,%g) want (%g,%g)",
                table.name, dtype_name(dtype_of<T>()), (long long)c.outer, (long long)c.length,
                (long long)c.inner, reverse, (long long)o, (long long)t, (long long)j,
                to_cd(p[i]).real(), to_cd(p[i]).imag(), pref[t].real(), pref[t].imag());
      }
    }
  }
  ++g_checks;
}

template <class T>
void run_dtype(const KernelTable& table, const std::vector<Case>& cases, Executor& ex,
               std::mt19937_64& rng) {
  for (const Case& c : cases)
    for (int rev = 0; rev < 2; ++rev)
      for (int h0 = 0; h0 < 2; ++h0)
        for (int prod = 0; prod < 2; ++prod) run_case<T>(table, c, rev, h0, prod, ex, rng);
}

void run_all_dtypes(const KernelTable& table, const std::vector<Case>& cases, Executor& ex,
                    std::mt19937_64& rng) {
  run_dtype<float>(table, cases, ex, rng);
  run_dtype<double>(table, cases, ex, rng);
  run_dtype<c64_t>(table, cases, ex, rng);
  run_dtype<bf16_t>(table, cases, ex, rng);
  run_dtype<f16_t>(table, cases, ex, rng);
}

// Vector conversions must equal the scalar ones bit for bit (NaN: both NaN).
void test_conversions(const KernelTable& table, std::mt19937_64& rng) {
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> wide(65536);
  for (int k = 0; k < 2; ++k) {
    table.widen16[k](all.data(), 65536, wide.data());
    for (int i = 0; i < 65536; ++i) {
      const float want = k == 0 ? bf16_to_float(uint16_t(i)) : f16_to_float(uint16_t(i));
      const bool ok = std::isnan(want) ? std::isnan(wide[i]) : float_bits(want) == float_bits(wide[i]);
      if (!ok) { CHECK(false, "%s widen%s(0x%04x)", table.name, k ? "f16" : "bf16", i); break; }
    }
  }
  // Narrowing: special values, boundaries around the rounding points, random bit patterns.
  std::vector<float> f = {0.f, -0.f, 1.f, -1.f, INFINITY, -INFINITY, std::nanf(""), -std::nanf(""),
                          65504.f, 65519.99f, 65520.f, 65536.f, 1e-8f, 2.98023224e-8f, 2.98023253e-8f,
                          5.96046448e-8f, 6.1035156e-5f, 6.09755516e-5f, 3.3895314e38f, 3.4028235e38f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) f.push_back(bits_float(bits(rng)));
  for (uint32_t e = 90; e < 160; ++e)  // halfway cases of both formats
    for (uint32_t m : {0x1000u, 0x3000u, 0x8000u, 0x18000u, 0x7fffffu, 0x400000u, 0x401000u})
      f.push_back(bits_float((e << 23) | m));
  std::vector<uint16_t> out(f.size());
  for (int k = 0; k < 2; ++k) {
    table.narrow16[k](f.data(), int64_t(f.size()), out.data());
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t want = k == 0 ? float_to_bf16(f[i]) : float_to_f16(f[i]);
      const float wf = k == 0 ? bf16_to_float(want) : f16_to_float(want);
      const float gf = k == 0 ? bf16_to_float(out[i]) : f16_to_float(out[i]);
      const bool ok = std::isnan(wf) ? std::isnan(gf) : want == out[i];
      if (!ok) {
        CHECK(false, "%s narrow%s(%a = 0x%08x): got 0x%04x want 0x%04x", table.name,
              k ? "f16" : "bf16", f[i], float_bits(f[i]), out[i], want);
        break;
      }
    }
  }
  // Scalar f16 against the exact value: every f16 converts to float and back unchanged.
  for (int i = 0; i < 65536; ++i) {
    const float x = f16_to_float(uint16_t(i));
    if (!std::isnan(x)) CHECK(float_to_f16(x) == uint16_t(i), "f16 roundtrip 0x%04x", i);
    const float y = bf16_to_float(uint16_t(i));
    if (!std::isnan(y)) CHECK(float_to_bf16(y) == uint16_t(i), "bf16 roundtrip 0x%04x", i);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::mt19937_64 rng(1234);

  // Small shapes: every layout and tail (odd, prime, shorter than a vector, empty).
  std::vector<Case> small = {
      {1, 0, 1, -.95, .95, 0},  {0, 5, 1, -.95, .95, 0},  {2, 5, 0, -.95, .95, 0},
      {1, 1, 1, -.95, .95, 0},  {1, 2, 1, -.95, .95, 0},  {3, 7, 1, -.95, .95, 0},
      {5, 17, 1, -.95, .95, 0}, {16, 33, 1, -.95, .95, 0}, {17, 100, 1, -.95, .95, 0},
      {1, 1000, 1, -.95, .95, 0}, {2, 4099, 1, -.95, .95, 0}, {33, 129, 1, -.95, .95, 2},
      {1, 5, 2, -.95, .95, 0},  {1, 7, 3, -.95, .95, 0},  {2, 9, 8, -.95, .95, 0},
      {3, 13, 17, -.95, .95, 2}, {1, 31, 64, -.95, .95, 0}, {2, 50, 100, -.95, .95, 0},
      {4, 3, 1000, -.95, .95, 0}, {1, 37, 129, -.95, .95, 0}, {2, 1, 7, -.95, .95, 0},
      // Row strides of (nearly) 4 KiB multiples: the staggered rows kernel.
      {17, 1024, 1, -.95, .95, 0}, {9, 2048, 1, -.95, .95, 0}, {7, 1025, 1, -.95, .95, 2},
      // |a| slightly above 1 with short sequences.
      {3, 61, 1, 1.0, 1.05, 0}, {2, 47, 5, 1.0, 1.05, 0}, {1, 64, 33, 1.0, 1.05, 0},
  };
  // Large shapes: chunked and threaded paths (>= kMinParallelElements elements).
  std::vector<Case> large = {
      {1, 200003, 1, -.95, .95, 0}, {3, 40009, 1, -.95, .95, 1}, {64, 1031, 1, -.95, .95, 0},
      {1, 50021, 5, -.95, .95, 0},  {2, 3001, 300, -.95, .95, 0}, {1, 65537, 2, -.95, .95, 1},
      {1, 70001, 16, -.95, .95, 0},
  };
  if (quick) large = {{1, 100003, 1, -.95, .95, 1}, {1, 20011, 7, -.95, .95, 0}};

  test_prepare_output();
  const std::vector<const KernelTable*> tables = supported_kernel_tables();
  std::printf("ISAs on this CPU:");
  for (const KernelTable* t : tables) std::printf(" %s", t->name);
  std::printf("\n");

  for (const KernelTable* t : tables) {
    if (!test::isa_selected(t->name)) {
      std::printf("%-8s not tested (JSS_TEST_ISAS)\n", t->name);
      continue;
    }
    // Force the ISA the way users do, through the environment variable.
    setenv("JAX_SELSCAN_CPU_ISA", t->name, 1);
    std::string err;
    const KernelTable* forced = select_kernel_table(&err);
    CHECK(forced == t, "JAX_SELSCAN_CPU_ISA=%s selected %s (%s)", t->name,
          forced ? forced->name : "null", err.c_str());
    if (forced == nullptr) continue;
    const int before = g_failures;
    test_conversions(*forced, rng);
    InlineExecutor inline_ex;
    ThreadExecutor threads(3);
    run_all_dtypes(*forced, small, inline_ex, rng);
    run_all_dtypes(*forced, large, inline_ex, rng);
    run_all_dtypes(*forced, large, threads, rng);
    std::printf("%-8s %s\n", forced->name, g_failures == before ? "ok" : "FAILED");
  }
  setenv("JAX_SELSCAN_CPU_ISA", "no-such-isa", 1);
  std::string err;
  CHECK(select_kernel_table(&err) == nullptr && !err.empty(), "unknown ISA name accepted");
  setenv("JAX_SELSCAN_CPU_ISA", "scalar", 1);
  CHECK(select_kernel_table(&err) == kernel_table_named("generic"), "scalar alias");
  unsetenv("JAX_SELSCAN_CPU_ISA");
  CHECK(select_kernel_table(&err) == tables.front(), "default is the best ISA");

  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
