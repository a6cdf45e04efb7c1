// Planning and threads for the CPU selective scan (baseline target).
#include "selective_scan_cpu.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include <unistd.h>

#include "dtypes.h"
#include "ss_host_util.h"

namespace jax_selscan {

const SsTable* ss_table_named(const std::string& name) {
  return isa_table_named<SsTable>({JSS_ISA_TABLES(ss_table_)}, name);
}

const SsTable* select_ss_table(std::string* error) {
  return select_isa_table(ss_table_named, "selective-scan", error);
}

int64_t ss_default_da_bytes() {
  static const int64_t bytes = [] {
    int64_t b = kSsMaxDABytes;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && defined(_SC_LEVEL2_CACHE_SIZE)
    // Measured on one Intel core only (and on Zen 4, where 128 KiB stays the limit).
    if (__builtin_cpu_is("intel")) {
      const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
      if (l2 > 0) b = std::max<int64_t>(b, l2 / 2);
    }
#endif
    return b;
  }();
  return bytes;
}

int64_t ss_kept_da_blocks(int64_t lanes, int64_t dstate, int64_t length) {
  int64_t max_da = ss_default_da_bytes();
  if (const char* env = std::getenv("JAX_SELSCAN_SS_DA_BYTES"); env != nullptr && env[0] != '\0')
    max_da = std::strtoll(env, nullptr, 10);
  const int64_t block_bytes = lanes * dstate * lanes * int64_t(sizeof(float));
  return std::min((length + lanes - 1) / lanes, std::max<int64_t>(0, max_da) / block_bytes);
}

int64_t ss_kept_prep_blocks(int64_t lanes, int64_t length) {
  int64_t max_bytes = kSsMaxPrepBytes;
  if (const char* env = std::getenv("JAX_SELSCAN_SS_PREP_BYTES"); env != nullptr && env[0] != '\0')
    max_bytes = std::strtoll(env, nullptr, 10);
  const int64_t block_bytes = 3 * lanes * lanes * int64_t(sizeof(float));
  return std::min((length + lanes - 1) / lanes, std::max<int64_t>(0, max_bytes) / block_bytes);
}

void selective_scan_cpu(const SsParams& p_in, const SsTable& table, Executor& executor) {
  // Checkpoints: every row's flag starts at 0 ("not written"); the channel-path tasks
  // (not the along-L path, not the L split) write theirs and set it. A row length
  // other than this ISA's leaves them all unwritten.
  SsParams p = p_in;
  if (p.ckpt != nullptr) {
    if (p.ckpt_row >= 1)
      for (int64_t i = 0; i < p.batch * p.dim; ++i) p.ckpt[i * p.ckpt_row] = 0.0f;
    if (p.ckpt_row != ss_ckpt_row(table.lanes, p.dstate, p.length, p.direction)) p.ckpt = nullptr;
  }
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
  // Tasks: (batch row, tile of `lanes` channels of one group); one channel per task
  // when every tile would take the along-L path (ss_use_narrow).
  const int64_t tile = ss_use_narrow(lanes, std::min(lanes, per_group), p.length) ? 1 : lanes;
  const int64_t tiles_per_group = (per_group + tile - 1) / tile;
  const int64_t tasks = p.batch * groups * tiles_per_group;
  auto task_at = [&](int64_t i, SsTask& t) {
    const int64_t b = i / (groups * tiles_per_group);
    const int64_t r = i % (groups * tiles_per_group);
    const int64_t g = r / tiles_per_group, k = r % tiles_per_group;
    t.b = b;
    t.d0 = g * per_group + k * tile;
    t.nch = std::min<int64_t>(tile, per_group - k * tile);
  };
  const bool bidi = p.direction == SsDirection::kBidirectional;
  // Small calls stay on the calling thread.
  const int64_t cost = p.batch * p.dim * p.length * std::max<int64_t>(p.dstate, 1);
  const int64_t threads = cost < (int64_t(1) << 16) ? 1 : executor.num_threads();
  // Fewer tasks than threads: split L into `pieces` per task (>= kSsMinPieceSteps each).
  int64_t min_piece = kSsMinPieceSteps;
  if (const char* env = std::getenv("JAX_SELSCAN_SS_PIECE_STEPS"); env != nullptr && env[0] != '\0')
    min_piece = std::max<int64_t>(1, std::strtoll(env, nullptr, 10));
  int64_t pieces = 1;
  if (threads > 1 && tasks < threads) {
    int64_t units = p.length;  // the fewest scan units of any task bounds the pieces
    for (int64_t nch : {std::min(tile, per_group), per_group % tile == 0 ? tile : per_group % tile})
      units = std::min(units, ss_units(lanes, nch, p.dstate, p.length));
    pieces = std::min({(threads + tasks - 1) / tasks, std::max<int64_t>(1, p.length / min_piece), units});
  }
  if (pieces > 1) p.ckpt = nullptr;
  const int64_t prep_blocks = bidi && pieces <= 1 ? ss_kept_prep_blocks(lanes, p.length) : 0;
  const int64_t work_floats = ss_work_floats(lanes, p.dstate, p.length, bidi && pieces <= 1, prep_blocks);
  if (pieces <= 1) {
    // Bidirectional: the exponentials of as many leading blocks as the limit allows are kept.
    const int64_t da_blocks = bidi ? ss_kept_da_blocks(lanes, p.dstate, p.length) : 0;
    const int64_t da_floats = da_blocks * lanes * p.dstate * lanes;
    const bool keep_da = da_blocks > 0;
    const int64_t workers = std::min<int64_t>(threads, tasks);
    std::atomic<int64_t> next{0};
    auto worker = [&](int64_t) {
      FloatBuffer work = alloc_floats(work_floats);
      FloatBuffer da = keep_da ? alloc_floats(da_floats) : FloatBuffer();
      for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
        SsTask t{};
        task_at(i, t);
        t.work = work.get();
        t.dA = da.get();
        t.dA_blocks = da_blocks;
        t.prep_blocks = prep_blocks;
        table.run(p, t);
      }
    };
    if (workers <= 1) worker(0);
    else executor.parallel_for(workers, worker);
    return;
  }
  // L split: per direction, phase 1 (every piece from zero, piece 0 from h0), the
  // carries between pieces (sequential, tiny), phase 3 (pieces >= 1 rerun the
  // steps before their dA product underflowed, from the true entering state).
  const int64_t N = p.dstate, per = lanes * N;
  std::vector<float> hend(tasks * pieces * per), ptot(tasks * pieces * per), hin(tasks * pieces * per);
  std::vector<int64_t> window(tasks * pieces);
  const int64_t yr_stride = tile == 1 ? p.length : p.length * lanes;
  FloatBuffer yr = bidi ? alloc_floats(tasks * yr_stride) : FloatBuffer();
  std::vector<SsDirection> dirs;
  if (bidi) dirs = {SsDirection::kReverse, SsDirection::kForward};
  else dirs = {p.direction};
  for (SsDirection dir : dirs) {
    const bool reverse = dir == SsDirection::kReverse;
    auto run_item = [&](int64_t task, int64_t piece, int phase) {
      FloatBuffer work = alloc_floats(work_floats);
      SsTask t{};
      task_at(task, t);
      set_split_piece(t, work.get(), phase, reverse, piece, pieces);
      t.yr_mode = bidi ? (reverse ? 1 : 2) : 0;
      const int64_t k = task * pieces + piece;
      t.hin = hin.data() + k * per;
      t.hend = hend.data() + k * per;
      t.ptot = ptot.data() + k * per;
      t.window = window.data() + k;
      t.yr = bidi ? yr.get() + task * yr_stride : nullptr;
      table.run(p, t);
    };
    executor.parallel_for(tasks * pieces, [&](int64_t i) { run_item(i / pieces, i % pieces, 1); });
    float* last = reverse ? p.last_rev : p.last_fwd;
    for (int64_t task = 0; task < tasks; ++task) {
      SsTask t{};
      task_at(task, t);
      const int64_t m = t.nch * N;
      std::vector<float> X(m, 0.0f);
      for (int64_t k = 0; k < pieces; ++k) {
        const int64_t o = (task * pieces + k) * per;
        for (int64_t i = 0; i < m; ++i) {
          hin[o + i] = X[i];
          X[i] = ss_carry(X[i], hend[o + i], ptot[o + i]);  // piece 0: ptot = 0, hend from h0
        }
        // A NaN or +-Inf entering state is not dropped: phase 3 reruns the whole piece.
        if (k > 0 && !ss_all_finite(hin.data() + o, m))
          window[task * pieces + k] = (k + 1) * ss_units(lanes, t.nch, N, p.length) / pieces;
      }
      if (last != nullptr)
        for (int64_t i = 0; i < m; ++i) last[(t.b * p.dim + t.d0) * N + i] = X[i];
    }
    if (pieces > 1)
      executor.parallel_for(tasks * (pieces - 1), [&](int64_t i) {
        run_item(i / (pieces - 1), 1 + i % (pieces - 1), 3);
      });
  }
}

}  // namespace jax_selscan
