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

// The L split (see SsBwdTask): per direction (bidirectional: reverse, then forward),
// three parallel phases over (task, piece) with the sequential carries between them.
// Fills the same per-task partials as the unsplit path (varying pB / pC: one [L][N] per
// task), adding the pieces' partials in a fixed order, and writes dh0. The partition
// depends only on the thread count: bit-reproducible for a given count.
// A task whose state or adjoint entering some piece is NaN or infinite is computed again
// unsplit (in the same partials): the split drops an entering term once dA's product is
// below 2^-30, which would leave finite gradients where one sequential pass has NaN / Inf.
template <class TaskAt>
void run_split(const SsBwdParams& q, const SsBwdTable& table, Executor& executor, int64_t tasks,
               int64_t pieces, const TaskAt& task_at, float* pA, float* pB, float* pC, float* pD,
               float* pbias) {
  const SsParams& p = q.fwd;
  const int64_t N = p.dstate, L = p.length, lanes = table.lanes, NW = N * lanes;
  const int64_t nblocks = (L + lanes - 1) / lanes;
  const bool bidi = p.direction == SsDirection::kBidirectional;
  std::vector<SsDirection> dirs;
  if (bidi) dirs = {SsDirection::kReverse, SsDirection::kForward};
  else dirs = {p.direction};
  const int64_t ndirs = static_cast<int64_t>(dirs.size());
  const int64_t kp = tasks * pieces;
  FloatBuffer ck = alloc_floats(tasks * nblocks * NW);
  FloatBuffer sums = bidi ? alloc_floats(tasks * 3 * L * lanes) : FloatBuffer();
  std::vector<float> hin(kp * NW), hend(kp * NW), ptot(kp * NW), gin(kp * NW), gend(kp * NW), qtot(kp * NW);
  std::vector<float> gh0(tasks * NW, 0.0f);
  std::vector<int64_t> hwin(kp), gwin(kp);
  std::vector<char> redo(tasks, 0);  // a NaN / Inf entered some piece: the task again, unsplit
  // Partials of every (task, piece, direction, phase 2 / 3), added up in that order below.
  const int64_t slots = kp * ndirs * 2;
  std::vector<float> sA(slots * NW), sB(p.b_var ? 0 : slots * NW), sC(p.c_var ? 0 : slots * NW),
      sD(slots * lanes), sbias(slots * lanes);
  const int64_t work_floats = ss_bwd_work_floats(lanes, N, L, true, false);
  for (int64_t di = 0; di < ndirs; ++di) {
    const bool reverse = dirs[di] == SsDirection::kReverse;
    auto run_item = [&](int64_t task, int64_t piece, int phase) {
      FloatBuffer work = alloc_floats(work_floats);
      SsBwdTask t{};
      task_at(task, t);
      set_split_piece(t, work.get(), phase, reverse, piece, pieces);
      t.ckbuf = ck.get() + task * nblocks * NW;
      t.sums = bidi ? sums.get() + task * 3 * L * lanes : nullptr;
      const int64_t k = task * pieces + piece;
      t.hin = hin.data() + k * NW;
      t.hend = hend.data() + k * NW;
      t.ptot = ptot.data() + k * NW;
      t.hwin = hwin.data() + k;
      t.gin = gin.data() + k * NW;
      t.gend = gend.data() + k * NW;
      t.qtot = qtot.data() + k * NW;
      t.gwin = gwin.data() + k;
      t.accumulate = 1;
      if (phase != 1) {
        const int64_t slot = (k * ndirs + di) * 2 + (phase == 3 ? 1 : 0);
        t.pA = sA.data() + slot * NW;
        if (!t.direct_b) t.pB = p.b_var ? pB + task * L * N : sB.data() + slot * NW;
        if (!t.direct_c) t.pC = p.c_var ? pC + task * L * N : sC.data() + slot * NW;
        t.pD = sD.data() + slot * lanes;
        t.pbias = sbias.data() + slot * lanes;
      }
      table.run(q, t);
    };
    executor.parallel_for(kp, [&](int64_t i) { run_item(i / pieces, i % pieces, 1); });
    for (int64_t task = 0; task < tasks; ++task) {  // states entering the pieces
      std::vector<float> X(NW, 0.0f);
      for (int64_t k = task * pieces; k < (task + 1) * pieces; ++k)
        for (int64_t i = 0; i < NW; ++i) {
          hin[k * NW + i] = X[i];
          X[i] = ss_carry(X[i], hend[k * NW + i], ptot[k * NW + i]);  // piece 0: ptot = 0
        }
    }
    executor.parallel_for(kp, [&](int64_t i) { run_item(i / pieces, i % pieces, 2); });
    for (int64_t task = 0; task < tasks; ++task) {  // adjoints entering the pieces (backwards)
      std::vector<float> X(NW, 0.0f);
      for (int64_t k = (task + 1) * pieces - 1; k >= task * pieces; --k)
        for (int64_t i = 0; i < NW; ++i) {
          gin[k * NW + i] = X[i];
          X[i] = ss_carry(X[i], gend[k * NW + i], qtot[k * NW + i]);  // last piece: qtot = 0
        }
      const int64_t span = pieces * NW;
      if (!ss_all_finite(hin.data() + task * span, span) || !ss_all_finite(gin.data() + task * span, span))
        redo[task] = 1;
      for (int64_t i = 0; i < NW; ++i) gh0[task * NW + i] += X[i];
    }
    executor.parallel_for(tasks * (pieces - 1), [&](int64_t i) { run_item(i / (pieces - 1), i % (pieces - 1), 3); });
  }
  for (int64_t task = 0; task < tasks; ++task) {
    if (redo[task]) continue;
    float* a = pA + task * NW;
    float* d = pD + task * lanes;
    float* bs = pbias + task * lanes;
    zero(a, NW);
    zero(d, lanes);
    zero(bs, lanes);
    if (!p.b_var) zero(pB + task * NW, NW);
    if (!p.c_var) zero(pC + task * NW, NW);
    for (int64_t slot = task * pieces * ndirs * 2; slot < (task + 1) * pieces * ndirs * 2; ++slot) {
      for (int64_t i = 0; i < NW; ++i) {
        a[i] += sA[slot * NW + i];
        if (!p.b_var) pB[task * NW + i] += sB[slot * NW + i];
        if (!p.c_var) pC[task * NW + i] += sC[slot * NW + i];
      }
      for (int64_t r = 0; r < lanes; ++r) {
        d[r] += sD[slot * lanes + r];
        bs[r] += sbias[slot * lanes + r];
      }
    }
    if (q.dh0 != nullptr) {
      SsBwdTask t{};
      task_at(task, t);
      for (int64_t r = 0; r < t.nch; ++r)
        for (int64_t n = 0; n < N; ++n) q.dh0[(t.b * p.dim + t.d0 + r) * N + n] = gh0[task * NW + n * lanes + r];
    }
  }
  std::vector<int64_t> again;
  for (int64_t task = 0; task < tasks; ++task)
    if (redo[task]) again.push_back(task);
  if (again.empty()) return;
  const int64_t whole_floats = ss_bwd_work_floats(lanes, N, L, false, bidi);
  executor.parallel_for(static_cast<int64_t>(again.size()), [&](int64_t i) {
    const int64_t task = again[i];
    FloatBuffer work = alloc_floats(whole_floats);
    SsBwdTask t{};
    task_at(task, t);  // split = 0: one sequential pass per direction, dh0 written by the kernel
    t.work = work.get();
    t.pA = pA + task * NW;
    if (!t.direct_b) t.pB = p.b_var ? pB + task * L * N : pB + task * NW;
    if (!t.direct_c) t.pC = p.c_var ? pC + task * L * N : pC + task * NW;
    t.pD = pD + task * lanes;
    t.pbias = pbias + task * lanes;
    table.run(q, t);
  });
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
  // Along-L tasks (one per gcd-group) alone in their B (C) group write its varying dB (dC)
  // straight into the gradient's [N][L] rows: no partial, no reduction.
  const bool narrow_tasks = ss_use_narrow(lanes, per_group, L);  // (implies one tile per group)
  const bool direct_b = p.b_var && narrow_tasks && per_group == Dm / p.b_groups;
  const bool direct_c = p.c_var && narrow_tasks && per_group == Dm / p.c_groups;
  auto task_at = [&](int64_t i, SsBwdTask& t) {
    const int64_t b = i / (groups * tiles_per_group);
    const int64_t r = i % (groups * tiles_per_group);
    const int64_t g = r / tiles_per_group, k = r % tiles_per_group;
    t.b = b;
    t.d0 = g * per_group + k * lanes;
    t.nch = std::min<int64_t>(lanes, per_group - k * lanes);
    t.direct_b = direct_b ? 1 : 0;
    t.direct_c = direct_c ? 1 : 0;
    if (direct_b) t.pB = q.dB + (b * p.b_groups + g) * N * L;
    if (direct_c) t.pC = q.dC + (b * p.c_groups + g) * N * L;
  };
  const int64_t NW = N * lanes;
  const int64_t cost = batch * Dm * L * std::max<int64_t>(N, 1);
  const int64_t threads = cost < (int64_t(1) << 16) ? 1 : executor.num_threads();
  const int64_t nblocks = (L + lanes - 1) / lanes;
  // Fewer tasks than threads: split L into `pieces` per task, as the forward
  // (>= kSsMinPieceSteps steps each; JAX_SELSCAN_SS_PIECE_STEPS lowers it for tests).
  int64_t pieces = 1;
  if (threads > 1 && tasks < threads) {
    int64_t min_piece = kSsMinPieceSteps;
    if (const char* env = std::getenv("JAX_SELSCAN_SS_PIECE_STEPS"); env != nullptr && env[0] != '\0')
      min_piece = std::max<int64_t>(1, std::strtoll(env, nullptr, 10));
    pieces = std::min({(threads + tasks - 1) / tasks, std::max<int64_t>(1, L / min_piece), nblocks});
  }
  const bool split = pieces > 1;
  // Slabs: a group's tiles cut into at most kSsBwdSlabs runs (fixed, independent of the
  // threads); one work item = the tiles of one slab, in order, summing the varying
  // dB / dC into the slab's [L][N] partial. Per-channel partials stay per task.
  // L split: one [L][N] partial per task (the slab of one tile).
  const int64_t slabs = split ? tiles_per_group : std::min(tiles_per_group, kSsBwdSlabs);
  const int64_t items = batch * groups * slabs;
  const bool var = p.b_var || p.c_var;
  const int64_t pb_floats = p.b_var ? L * N : NW, pc_floats = p.c_var ? L * N : NW;
  const int64_t pb_count = direct_b ? 0 : p.b_var ? items : tasks;
  const int64_t pc_count = direct_c ? 0 : p.c_var ? items : tasks;
  FloatBuffer pA = alloc_floats(tasks * NW), pB = alloc_floats(pb_count * pb_floats),
              pC = alloc_floats(pc_count * pc_floats), pD = alloc_floats(tasks * lanes),
              pbias = alloc_floats(tasks * lanes);
  if (split) {
    run_split(q, table, executor, tasks, pieces, task_at, pA.get(), pB.get(), pC.get(), pD.get(), pbias.get());
  } else {
    const int64_t work_floats =
        ss_bwd_work_floats(lanes, N, L, false, p.direction == SsDirection::kBidirectional);
    const int64_t workers = std::min<int64_t>(threads, var ? items : tasks);
    // Bidirectional: the exp(delta A) of as many of the last blocks as the forward's limit
    // allows pass from the reverse half's walk to the forward half's.
    const int64_t block_floats = lanes * N * lanes;
    const int64_t da_blocks =
        p.direction == SsDirection::kBidirectional && !narrow_tasks ? ss_kept_da_blocks(lanes, N, L) : 0;
    std::atomic<int64_t> next{0};
    auto run_task = [&](int64_t i, int64_t item, bool accumulate, float* work, float* da) {
      SsBwdTask t{};
      task_at(i, t);
      t.work = work;
      t.dA = da;
      t.dA_blocks = da != nullptr ? da_blocks : 0;
      t.pA = pA.get() + i * NW;
      if (!t.direct_b) t.pB = pB.get() + (p.b_var ? item : i) * pb_floats;
      if (!t.direct_c) t.pC = pC.get() + (p.c_var ? item : i) * pc_floats;
      t.pD = pD.get() + i * lanes;
      t.pbias = pbias.get() + i * lanes;
      t.accumulate = accumulate ? 1 : 0;
      table.run(q, t);
    };
    auto worker = [&](int64_t) {
      FloatBuffer work = alloc_floats(work_floats);
      FloatBuffer da = da_blocks > 0 ? alloc_floats(da_blocks * block_floats) : FloatBuffer();
      if (!var) {
        for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tasks;)
          run_task(i, 0, false, work.get(), da.get());
        return;
      }
      for (int64_t it; (it = next.fetch_add(1, std::memory_order_relaxed)) < items;) {
        const int64_t bg = it / slabs, s = it % slabs;  // bg = b * groups + g
        const int64_t k0 = s * tiles_per_group / slabs, k1 = (s + 1) * tiles_per_group / slabs;
        for (int64_t k = k0; k < k1; ++k) run_task(bg * tiles_per_group + k, it, k > k0, work.get(), da.get());
      }
    };
    if (workers <= 1) worker(0);
    else executor.parallel_for(workers, worker);
  }

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
    // Items of >= 2^14 floats (256 steps at N = 64): fewer, longer items for small N (a
    // SISO call at L = 2^20 made 4096 items of 256 floats: 10% of its backward).
    const int64_t kT = std::max<int64_t>(256, (int64_t(1) << 14) / std::max<int64_t>(N, 1));
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
  if (p.b_var && !direct_b) reduce_var(q.dB, pB.get(), p.b_groups);
  if (p.c_var && !direct_c) reduce_var(q.dC, pC.get(), p.c_groups);
}

}  // namespace jax_selscan
