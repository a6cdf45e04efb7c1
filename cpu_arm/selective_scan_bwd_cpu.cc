// Planning, threads and the deterministic reductions of the CPU selective-scan
// backward (baseline target).
#include "selective_scan_bwd_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "selective_scan_cpu.h"  // ss_table_named (the forward's ISA check)
#include "ss_host_util.h"

namespace jax_selscan {

const SsBwdTable* ss_bwd_table_named(const std::string& name) {
  return isa_table_named<SsBwdTable>({JSS_ISA_TABLES(ss_bwd_table_)}, name);
}

const SsBwdTable* select_ss_bwd_table(std::string* error) {
  return select_isa_table(ss_bwd_table_named, "selective-scan backward", error);
}

namespace {
void zero(float* p, int64_t n) {
  if (p != nullptr && n > 0) std::memset(p, 0, sizeof(float) * static_cast<size_t>(n));
}
}  // namespace

void selective_scan_bwd_cpu(const SsBwdParams& q, const SsBwdTable& table, Executor& executor) {
  const SsParams& p = q.fwd;
  const int64_t N = p.dstate, L = p.length, Dm = p.dim, batch = p.batch;
  // The small gradients start at zero (they are sums); the rest is written in full.
  zero(q.dA, Dm * N);
  zero(q.dD, Dm);
  zero(q.ddelta_bias, Dm);
  if (!p.b_var) zero(q.dB, Dm * N);
  if (!p.c_var) zero(q.dC, Dm * N);
  if (batch == 0 || Dm == 0 || L == 0) {
    // Nothing scanned: the last states are h0, so dh0 = the last states' cotangents.
    if (q.dh0 != nullptr) {
      const int64_t n = batch * Dm * N;
      for (int64_t i = 0; i < n; ++i) {
        float v = 0.0f;
        if (q.dlast_fwd != nullptr && p.direction != SsDirection::kReverse) v += q.dlast_fwd[i];
        if (q.dlast_rev != nullptr && p.direction != SsDirection::kForward) v += q.dlast_rev[i];
        q.dh0[i] = v;
      }
    }
    return;
  }
  const int64_t lanes = table.lanes;
  // Tiles never straddle a B group or a C group (as the forward): pieces of gcd(D/Gb, D/Gc).
  int64_t x = Dm / p.b_groups, y = Dm / p.c_groups;
  while (y != 0) { const int64_t r = x % y; x = y; y = r; }
  const int64_t per_group = x;
  const int64_t groups = Dm / per_group;
  const int64_t tiles_per_group = (per_group + lanes - 1) / lanes;
  const int64_t tasks = batch * groups * tiles_per_group;
  auto task_at = [&](int64_t i, SsBwdTask& t) {
    const int64_t b = i / (groups * tiles_per_group);
    const int64_t r = i % (groups * tiles_per_group);
    const int64_t g = r / tiles_per_group, k = r % tiles_per_group;
    t.b = b;
    t.d0 = g * per_group + k * lanes;
    t.nch = std::min<int64_t>(lanes, per_group - k * lanes);
  };
  const int64_t NW = N * lanes;
  // Slabs: a group's tiles cut into at most kSsBwdSlabs runs (fixed, independent of the
  // threads); one work item = the tiles of one slab, in order, summing the varying
  // dB / dC into the slab's [L][N] partial. Per-channel partials stay per task.
  const int64_t slabs = std::min(tiles_per_group, kSsBwdSlabs);
  const int64_t items = batch * groups * slabs;
  const bool var = p.b_var || p.c_var;
  const int64_t pb_floats = p.b_var ? L * N : NW, pc_floats = p.c_var ? L * N : NW;
  const int64_t pb_count = p.b_var ? items : tasks, pc_count = p.c_var ? items : tasks;
  FloatBuffer pA = alloc_floats(tasks * NW), pB = alloc_floats(pb_count * pb_floats),
              pC = alloc_floats(pc_count * pc_floats), pD = alloc_floats(tasks * lanes),
              pbias = alloc_floats(tasks * lanes);
  const int64_t work_floats = ss_bwd_work_floats(lanes, N, L);
  const int64_t cost = batch * Dm * L * std::max<int64_t>(N, 1);
  const int64_t threads = cost < (int64_t(1) << 16) ? 1 : executor.num_threads();
  const int64_t workers = std::min<int64_t>(threads, var ? items : tasks);
  std::atomic<int64_t> next{0};
  auto run_task = [&](int64_t i, int64_t item, bool accumulate, float* work) {
    SsBwdTask t{};
    task_at(i, t);
    t.work = work;
    t.pA = pA.get() + i * NW;
    t.pB = pB.get() + (p.b_var ? item : i) * pb_floats;
    t.pC = pC.get() + (p.c_var ? item : i) * pc_floats;
    t.pD = pD.get() + i * lanes;
    t.pbias = pbias.get() + i * lanes;
    t.accumulate = accumulate ? 1 : 0;
    table.run(q, t);
  };
  auto worker = [&](int64_t) {
    FloatBuffer work = alloc_floats(work_floats);
    if (!var) {
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) run_task(i, 0, false, work.get());
      return;
    }
    for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const int64_t bg = it / slabs, s = it % slabs;  // bg = b * groups + g
      const int64_t k0 = s * tiles_per_group / slabs, k1 = (s + 1) * tiles_per_group / slabs;
      for (int64_t k = k0; k < k1; ++k) run_task(bg * tiles_per_group + k, it, k > k0, work.get());
    }
  };
  if (workers <= 1) worker(0);
  else executor.parallel_for(workers, worker);

  // Per-channel sums over batch (and time, already inside the partials), in batch order.
  auto task_of = [&](int64_t b, int64_t d, int64_t* lane) {
    const int64_t g = d / per_group, off = d % per_group;
    *lane = off % lanes;
    return (b * groups + g) * tiles_per_group + off / lanes;
  };
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t d = 0; d < Dm; ++d) {
      int64_t r;
      const int64_t i = task_of(b, d, &r);
      for (int64_t n = 0; n < N; ++n) {
        q.dA[d * N + n] += pA.get()[i * NW + n * lanes + r];
        if (!p.b_var) q.dB[d * N + n] += pB.get()[i * pb_floats + n * lanes + r];
        if (!p.c_var) q.dC[d * N + n] += pC.get()[i * pc_floats + n * lanes + r];
      }
      if (q.dD != nullptr) q.dD[d] += pD.get()[i * lanes + r];
      if (q.ddelta_bias != nullptr) q.ddelta_bias[d] += pbias.get()[i * lanes + r];
    }
  // Varying B / C: out (b, G, N, L) = sum, in task order, of the [L][N] partials of the
  // tasks of batch row b whose channels are in group g. Parallel over (b, g, range of t);
  // each output element is summed by one thread in a fixed order.
  auto reduce_var = [&](float* out, const float* part, int64_t G) {
    const int64_t per = Dm / G;
    constexpr int64_t kT = 256;
    const int64_t nt = (L + kT - 1) / kT;
    executor.parallel_for(batch * G * nt, [&](int64_t item) {
      const int64_t b = item / (G * nt), g = (item / nt) % G, t0 = (item % nt) * kT;
      const int64_t t1 = std::min(L, t0 + kT);
      std::vector<float> acc((t1 - t0) * N, 0.0f);
      for (int64_t gi = 0; gi < groups; ++gi) {
        if ((gi * per_group) / per != g) continue;  // a gcd-group lies inside one B/C group
        for (int64_t s = 0; s < slabs; ++s) {
          const int64_t it = (b * groups + gi) * slabs + s;
          const float* src = part + it * L * N + t0 * N;
          for (int64_t j = 0; j < (t1 - t0) * N; ++j) acc[j] += src[j];
        }
      }
      float* dst = out + (b * G + g) * N * L;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t t = t0; t < t1; ++t) dst[n * L + t] = acc[(t - t0) * N + n];
    });
  };
  if (p.b_var) reduce_var(q.dB, pB.get(), p.b_groups);
  if (p.c_var) reduce_var(q.dC, pC.get(), p.c_groups);
}

}  // namespace jax_selscan
