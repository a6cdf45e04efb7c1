// Planning and threads for the CPU selective scan (baseline target).
#include "selective_scan_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include "dtypes.h"

namespace jax_selscan {

const SsTable* ss_table_named(const std::string& name) {
  std::vector<const SsTable*> all;
#if defined(__x86_64__) || defined(_M_X64)
  all.push_back(ss_table_avx512());
  all.push_back(ss_table_avx2());
#endif
#if defined(__aarch64__)
  all.push_back(ss_table_neon());
#endif
  all.push_back(ss_table_generic());
  const std::string n = name == "scalar" ? "generic" : name;
  for (const SsTable* t : all)
    if (n == t->name && kernel_table_named(n) != nullptr) return t;  // CPU support checked there
  return nullptr;
}

const SsTable* select_ss_table(std::string* error) {
  const KernelTable* k = select_kernel_table(error);
  if (k == nullptr) return nullptr;
  const SsTable* t = ss_table_named(k->name);
  if (t == nullptr && error != nullptr) *error = std::string("no selective-scan kernel for ") + k->name;
  return t;
}

namespace {
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, FreeDeleter>;
Buffer alloc_floats(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64;
  return Buffer(static_cast<float*>(std::aligned_alloc(64, bytes > 0 ? bytes : 64)));
}
}  // namespace

void selective_scan_cpu(const SsParams& p, const SsTable& table, Executor& executor) {
  if (p.batch == 0 || p.dim == 0 || p.length == 0) {
    // Nothing to scan: the last states are h0 (or zeros).
    for (float* last : {p.last_fwd, p.last_rev}) {
      if (last == nullptr) continue;
      const int64_t n = p.batch * p.dim * p.dstate;
      for (int64_t i = 0; i < n; ++i) {
        float v = 0.0f;
        if (p.h0 != nullptr) {
          switch (p.h0_t) {
            case SsType::kF32: v = static_cast<const float*>(p.h0)[i]; break;
            case SsType::kBF16: v = bf16_to_float(static_cast<const uint16_t*>(p.h0)[i]); break;
            default: v = f16_to_float(static_cast<const uint16_t*>(p.h0)[i]); break;
          }
        }
        last[i] = v;
      }
    }
    return;
  }
  const int64_t lanes = table.lanes;
  // Tiles never straddle a B group or a C group: cut D into pieces of gcd(D/Gb, D/Gc).
  int64_t x = p.dim / p.b_groups, y = p.dim / p.c_groups;
  while (y != 0) { const int64_t r = x % y; x = y; y = r; }
  const int64_t per_group = x;
  const int64_t groups = p.dim / per_group;
  const int64_t tiles_per_group = (per_group + lanes - 1) / lanes;
  const int64_t tasks = p.batch * groups * tiles_per_group;
  const bool bidi = p.direction == SsDirection::kBidirectional;
  const int64_t da_floats = p.length * p.dstate * lanes;
  int64_t max_da = kSsMaxDABytes;
  if (const char* env = std::getenv("JAX_SELSCAN_SS_DA_BYTES"); env != nullptr && env[0] != '\0')
    max_da = std::strtoll(env, nullptr, 10);
  const bool keep_da = bidi && da_floats * int64_t(sizeof(float)) <= max_da;
  const int64_t work_floats = ss_work_floats(lanes, p.dstate, p.length);
  // Small calls stay on the calling thread.
  const int64_t cost = p.batch * p.dim * p.length * std::max<int64_t>(p.dstate, 1);
  const int64_t workers =
      cost < (int64_t(1) << 16) ? 1 : std::min<int64_t>(executor.num_threads(), tasks);
  std::atomic<int64_t> next{0};
  auto worker = [&](int64_t) {
    Buffer work = alloc_floats(work_floats);
    Buffer da = keep_da ? alloc_floats(da_floats) : Buffer();
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      const int64_t b = i / (groups * tiles_per_group);
      const int64_t r = i % (groups * tiles_per_group);
      const int64_t g = r / tiles_per_group, tile = r % tiles_per_group;
      SsTask t{};
      t.b = b;
      t.d0 = g * per_group + tile * lanes;
      t.nch = std::min<int64_t>(lanes, per_group - tile * lanes);
      t.work = work.get();
      t.dA = da.get();
      table.run(p, t);
    }
  };
  if (workers <= 1) {
    worker(0);
  } else {
    executor.parallel_for(workers, worker);
  }
}

}  // namespace jax_selscan
