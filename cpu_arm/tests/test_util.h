// What the CPU kernels' C++ tests share: a counting CHECK and an Executor with
// real threads (a fresh set per call: simple, fine for tests).
#pragma once
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../linear_scan_cpu.h"  // Executor

namespace jax_selscan {
namespace test {

inline int g_failures = 0, g_checks = 0;

class ThreadExecutor final : public Executor {
 public:
  explicit ThreadExecutor(int n) : n_(n) {}
  int64_t num_threads() const override { return n_; }
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    std::atomic<int64_t> next{0};
    auto work = [&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) fn(i);
    };
    std::vector<std::thread> ts;
    for (int i = 1; i < n_ && i < n; ++i) ts.emplace_back(work);
    work();
    for (auto& t : ts) t.join();
  }

 private:
  int n_;
};

// Whether to test the ISA `name`: all of them, or those JSS_TEST_ISAS lists (comma-separated).
// The qemu runs test only NEON: on aarch64 the portable kernels are a fallback that no CPU
// selects (every aarch64 CPU has NEON), and their arithmetic is tested natively on x86-64;
// under emulation they would double the run.
inline bool isa_selected(const char* name) {
  const char* only = std::getenv("JSS_TEST_ISAS");
  if (only == nullptr || only[0] == '\0') return true;
  return ("," + std::string(only) + ",").find("," + std::string(name) + ",") != std::string::npos;
}

}  // namespace test
}  // namespace jax_selscan

// Counts every check; prints the first 30 failures with their location.
#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    ++::jax_selscan::test::g_checks;                                      \
    if (!(cond) && ++::jax_selscan::test::g_failures <= 30) {             \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__);                    \
      std::printf(__VA_ARGS__);                                           \
      std::printf("\n");                                                  \
    }                                                                     \
  } while (0)
