// Executor on XLA's intra-op pool (ffi::ThreadPool), shared by the CPU FFI handlers
// (ffi_module.cc, selective_scan_ffi.cc).
//
// Items are claimed from a shared counter by the caller and by up to num_threads - 1 helper
// tasks; the caller then waits only for items already claimed, so it never waits on a task the
// pool has not started (no deadlock when the caller is itself a pool thread). The shared state is
// reference-counted because a helper may start after the call has returned; such a helper finds
// no items left and never touches `fn`. An exception thrown by an item (std::bad_alloc from a
// scratch buffer) must not leave a pool thread: the first one is kept and rethrown on the caller
// once every claimed item is done, and the items not yet claimed are skipped.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "linear_scan_cpu.h"  // Executor
#include "xla/ffi/api/ffi.h"

namespace jax_selscan {

class PoolExecutor final : public Executor {
 public:
  // `cap_env`: an environment variable read here that, when set to k > 0, caps the threads at k.
  explicit PoolExecutor(xla::ffi::ThreadPool& pool, const char* cap_env = nullptr)
      : pool_(pool), threads_(pool.num_threads()) {
    if (const char* env = cap_env != nullptr ? std::getenv(cap_env) : nullptr; env != nullptr && env[0] != '\0') {
      const int64_t cap = std::strtoll(env, nullptr, 10);
      if (cap > 0 && cap < threads_) threads_ = cap;
    }
  }

  int64_t num_threads() const override { return threads_ > 0 ? threads_ : 1; }

  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    if (n <= 1 || threads_ <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    struct State {
      const std::function<void(int64_t)>* fn;
      int64_t n;
      std::atomic<int64_t> next{0}, done{0};
      std::atomic<bool> failed{false};
      std::exception_ptr error;  // the first item's exception (guarded by mu)
      std::mutex mu;
      std::condition_variable cv;
    };
    auto st = std::make_shared<State>();
    st->fn = &fn;
    st->n = n;
    auto work = [](State& s) {
      for (int64_t i; (i = s.next.fetch_add(1, std::memory_order_relaxed)) < s.n;) {
        if (!s.failed.load(std::memory_order_relaxed)) {
          try {
            (*s.fn)(i);
          } catch (...) {
            std::lock_guard<std::mutex> lock(s.mu);
            if (!s.error) s.error = std::current_exception();
            s.failed.store(true, std::memory_order_relaxed);
          }
        }
        if (s.done.fetch_add(1, std::memory_order_acq_rel) + 1 == s.n) {
          std::lock_guard<std::mutex> lock(s.mu);
          s.cv.notify_all();
        }
      }
    };
    const int64_t helpers = std::min<int64_t>(threads_, n) - 1;
    for (int64_t k = 0; k < helpers; ++k) pool_.Schedule([st, work] { work(*st); });
    work(*st);
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->done.load(std::memory_order_acquire) == n; });
    if (st->error) std::rethrow_exception(st->error);
  }

 private:
  xla::ffi::ThreadPool& pool_;
  int64_t threads_;
};

// The handlers' error for scratch that could not be allocated (std::bad_alloc out of a kernel
// call run through a PoolExecutor): XLA's RESOURCE_EXHAUSTED instead of a dead process.
inline xla::ffi::Error scratch_exhausted(const std::string& where) {
  return xla::ffi::Error(xla::ffi::ErrorCode::kResourceExhausted,
                         where + "could not allocate the kernel's scratch memory");
}

}  // namespace jax_selscan
