// Host side of the CUDA selective scan: launch geometry, scratch layout, dtype dispatch.
#include "selective_scan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace jss {
namespace {

constexpr int kCkHost = 8;  // = ssk::kCk (checkpoint interval)

int64_t pow2ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p <<= 1;
  return p;
}

size_t align256(size_t x) { return (x + 255) & ~size_t(255); }

// States per lane: 4 when N allows (the exponentials of 4 states per step keep the lane
// busy between the shuffles of the per-step y sum); fewer, i.e. more lanes per row, when
// there are few rows, so that enough warps are in flight (tuned on the H200: see
// docs/PERFORMANCE_CUDA.md, selective scan).
void geometry(int64_t N, int64_t rows, int* ns_out, int* p_out) {
  int ns = N >= 4 ? 4 : (N >= 2 ? 2 : 1);
  int64_t P = pow2ceil((N + ns - 1) / ns);
  while (ns > 1 && P < 32 && rows * P < 65536) {
    ns /= 2;
    P = pow2ceil((N + ns - 1) / ns);
  }
  *ns_out = ns;
  *p_out = static_cast<int>(P);
}

// Row blocks of one L chunk's grid, and the blocks the GPU holds at once (the kernels'
// occupancy on the H200: staged forward 4 per SM, round-1 forward 16 of 128 threads, staged
// backward 3, round-1 backward 2).
void fwd_grid(const SsProblem& p, int sms, int lanes, int64_t* blocks, int64_t* slots) {
  const bool staged = ss_fwd_staged(p);
  *blocks = staged ? p.batch * ((p.dim + 31) / 32) : (p.batch * p.dim * lanes + 127) / 128;
  *slots = static_cast<int64_t>(sms) * (staged ? 4 : 16);
}
void bwd_grid(const SsProblem& p, int sms, bool staged, int rows_per_block, int64_t* blocks, int64_t* slots) {
  *blocks = p.batch * (p.dim / rows_per_block);
  *slots = static_cast<int64_t>(sms) * (staged ? 3 : 2);
}

// Sub-chunks per chunk for phase A of an L split: its grid is the row blocks times the chunks
// before the last (forward) or after the first (backward), which fills few of the GPU's slots
// when there are few rows (e.g. 160 row blocks x 2 chunks on 528 slots: 61%); walking each
// such chunk as m sub-chunks gives m times the blocks of 1/m the length, and the carries fold
// m times as many aggregates. Of m = 1..8, the one whose waves are busiest (ss_wave_fill; the
// smallest on ties), among those whose sub-chunks keep >= kMinSubTiles tiles: shorter blocks
// lost more to their pipeline's fill and drain than the fill gained (measured on the H200,
// PERFORMANCE_SELECTIVE_SCAN_CUDA 15.1, 16.4). `env` (JAX_SELSCAN_SS_FWD_SUB / _BWD_SUB,
// measurements) forces it.
constexpr int64_t kMinSubTiles = 24;
int64_t phase_a_sub(const char* env, int64_t blocks, int64_t chunks_a, int64_t slots, int64_t tiles_per_chunk) {
  int64_t m = 0;
  if (const char* e = std::getenv(env)) m = std::atoll(e);
  if (m < 1) {
    double best = -1.0;
    for (int64_t k = 1; k <= 8 && (k == 1 || tiles_per_chunk / k >= kMinSubTiles); ++k) {
      const double fill = ss_wave_fill(blocks * chunks_a * k, slots);
      if (fill > best + 1e-9) {
        best = fill;
        m = k;
      }
    }
  }
  return std::max<int64_t>(1, std::min(m, tiles_per_chunk));
}

}  // namespace

int ss_device_sms() {
  // Asked once per device: every staged forward launch and every plan calls this.
  static std::atomic<int> known[64] = {};  // 0: not asked yet
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  const bool cached = dev >= 0 && dev < 64;
  if (cached && (n = known[dev].load(std::memory_order_relaxed)) > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return 132;
  }
  if (cached) known[dev].store(n, std::memory_order_relaxed);
  return n;
}

double ss_wave_fill(int64_t blocks, int64_t slots) {
  const double w = static_cast<double>(blocks) / static_cast<double>(slots > 0 ? slots : 1);
  return w / std::ceil(w);
}

int ss_staged_fwd_lanes(int64_t blocks, int64_t sms, int per_sm4, int per_sm8, bool ys, bool plain,
                        int elem_bytes) {
  per_sm4 = std::max(per_sm4, 1);  // an occupancy query that failed: count one block per SM
  per_sm8 = std::max(per_sm8, 1);
  const double f4 = ss_wave_fill(blocks, sms * per_sm4);
  const double f8 = ss_wave_fill(blocks, sms * per_sm8);
  // The walks without y (the checkpoint sweep) have no y sums across a row's lanes; there 4
  // lanes were the faster at equal fills (notes 17.1).
  if (!ys) return f4 + 0.05 >= f8 ? 4 : 8;
  // The plain forward at equal fills of at least a wave: 4 lanes issue fewer instructions per
  // element (a y reduce-scatter over 4 lanes, each (B, C) load serving 8 rows); 5% (float32)
  // and 9% (bfloat16) faster on an H100 and on the H200 (notes 26.4, 26.5). A grid short of a
  // wave waits on each block's walk, which 8 lanes make shorter.
  if (plain && blocks >= sms * per_sm8 && f4 + 0.05 >= f8) return 4;
  // Where 8 lanes fill the waves better, float32 ran 4 lanes 2-20% slower. 16-bit ran them 3-4%
  // faster at 73% against 97% (a grid just short of one 8-lane wave) and 2% slower at 55-61%
  // against 73-81%, on an H100 and on the H200 alike (notes 26.5; the H200's 14% loss in
  // session 20 was older kernels'). So 16-bit takes 4 lanes while they keep >= 70% of their
  // slots busy and 8 lanes fill at most 25 points more.
  if (plain && elem_bytes == 2 && f4 >= 0.7 && f4 + 0.25 >= f8) return 4;
  // Otherwise 8 lanes unless 4 fill the GPU clearly better: the forward that saves the
  // backward's checkpoints ran 1.5-4% slower on 4 lanes at equal fills (notes 16, 26).
  return f4 > f8 + 0.05 ? 4 : 8;
}

bool ss_supported(const SsProblem& p) {
  return p.N >= 1 && p.N <= 128 && p.batch > 0 && p.dim > 0 && p.L > 0;
}

int ss_states_per_thread(int64_t N, int64_t rows) {
  int ns, P;
  geometry(N, rows, &ns, &P);
  return ns;
}

int ss_lanes_per_row(int64_t N, int64_t rows) {
  int ns, P;
  geometry(N, rows, &ns, &P);
  return P;
}

bool ss_fwd_staged(const SsProblem& p) {
  const char* e = std::getenv("JAX_SELSCAN_SS_FWD");
  return ss_staged_ok(p) && !(e && std::strcmp(e, "rows") == 0);
}

int64_t ss_fwd_chunks(const SsProblem& p, int sms, int lanes) {
  const int64_t L = p.L;
  if (const char* e = std::getenv("JAX_SELSCAN_SS_FWD_CHUNKS")) {
    const long long n = std::atoll(e);
    if (n >= 1) return n;
  }
  const bool staged = ss_fwd_staged(p);
  int64_t blocks, slots;
  fwd_grid(p, sms, lanes, &blocks, &slots);
  // Measured on the H200 (PERFORMANCE_SELECTIVE_SCAN_CUDA 5.6): the staged kernel gains from
  // 160 blocks (of 528 slots) on; the round-1 kernel lost 6-25% when split at 640-768 blocks
  // of 128 threads, so it splits only grids of at most 2 blocks per SM.
  if ((staged ? 2 : 8) * blocks > slots) return 1;
  const int64_t n = std::min(slots / blocks, L / 256);
  return n > 1 ? n : 1;
}

int64_t ss_bwd_chunks(const SsProblem& p, int sms, bool staged, int rows_per_block) {
  if (const char* e = std::getenv("JAX_SELSCAN_SS_BWD_CHUNKS")) {
    const long long n = std::atoll(e);
    if (n >= 1) return n;
  }
  // Staged: 3 blocks per SM, split at <= half of them; round 1 (128-thread blocks): as its
  // forward, only grids of at most 2 blocks per SM.
  int64_t blocks, slots;
  bwd_grid(p, sms, staged, rows_per_block, &blocks, &slots);
  if (blocks < 1 || (staged ? 2 : 1) * blocks > slots) return 1;
  const int64_t base = slots / blocks;
  int64_t n = base;
  if (staged) {
    // The smallest n from slots / blocks up to twice that + 3 whose grid keeps its waves
    // >= 90% busy (ss_wave_fill); else, where slots / blocks is 2 or 3, twice as many. Measured on the H200
    // (PERFORMANCE_SELECTIVE_SCAN_CUDA 14.1, 17.3), fwd+bwd of (1, 5120, 16384), 160 row blocks:
    // 2 chunks (81%) 6.68 ms, 3 (61%) 7.21, 4 (1.62 waves) 6.32 in one run; 4 chunks 6.16,
    // 7 (2.83 waves, 94%) 5.91 in another; at 132 row blocks 3 chunks (one full wave) beat 6.
    int64_t pick = 0;
    for (int64_t k = base; k <= 2 * base + 3 && !pick; ++k)
      if (ss_wave_fill(blocks * k, slots) >= 0.9) pick = k;
    n = pick ? pick : (base <= 3 ? 2 * base : base);
  }
  n = std::min(n, p.L / 256);
  return n > 1 ? n : 1;
}

bool ss_staged_bwd_ok(const SsProblem& p) {
  const char* e = std::getenv("JAX_SELSCAN_SS_BWD");
  if (e && std::strcmp(e, "rows") == 0) return false;
  return ss_staged_ok(p) && p.dim % 32 == 0 && p.N <= 16;
}

int64_t ss_ckpt_row(const SsProblem& p) {
  return (p.direction == 2 ? 2 : 1) * ((p.L + kCkHost - 1) / kCkHost) * p.N;
}

SsPlan ss_plan(const SsProblem& p, bool backward, bool saved_ckpt) {
  SsPlan s;
  const int64_t R = p.batch * p.dim;
  geometry(p.N, R, &s.NS, &s.P);
  s.K = (p.L + kCkHost - 1) / kCkHost;
  const int ndir = p.direction == 2 ? 2 : 1;
  size_t off = 0;
  const char* g = std::getenv("JAX_SELSCAN_SS_GUARD");
  const bool guard = g && g[0] == '1';
  auto take = [&](size_t floats) {
    size_t at = off;
    off += floats * sizeof(float);
    if (guard && s.nguards < SsPlan::kMaxGuards) {
      s.guard[s.nguards++] = off;
      off += SsPlan::kGuardBytes;
    }
    off = align256(off);
    return at;
  };
  // Whole 32-step tiles per chunk and per sub-chunk, at most 65535 of either (the grid's y
  // extent); `sub_env`, blocks, slots: phase_a_sub.
  const int sms = ss_device_sms();
  auto split = [&](int64_t want, const char* sub_env, int64_t blocks, int64_t slots, int64_t* nch,
                   int64_t* steps, int64_t* sub, int64_t* sub_steps, int64_t* nsub) {
    const int64_t tiles = (p.L + 31) / 32;
    const int64_t n = std::min<int64_t>(std::min<int64_t>(want, tiles), 65535);
    if (n <= 1) return;
    int64_t per = (tiles + n - 1) / n;
    const int64_t m = std::min<int64_t>(phase_a_sub(sub_env, blocks, (tiles + per - 1) / per - 1, slots, per),
                                        65535 / n);
    const int64_t sub_tiles = (per + m - 1) / m;
    per = sub_tiles * m;
    if ((tiles + per - 1) / per <= 1) return;
    *nch = (tiles + per - 1) / per;
    *steps = per * 32;
    *sub = m;
    *sub_steps = sub_tiles * 32;
    *nsub = (tiles + sub_tiles - 1) / sub_tiles;
  };
  // The forward walk's L split (the forward, and the backward's checkpoint sweep).
  if (!backward || !saved_ckpt) {
    int64_t blocks, slots;
    fwd_grid(p, sms, s.P, &blocks, &slots);
    split(ss_fwd_chunks(p, sms, s.P), "JAX_SELSCAN_SS_FWD_SUB", blocks, slots, &s.nch, &s.chunk_steps,
          &s.sub, &s.sub_steps, &s.nsub);
    if (s.nch > 1) {
      s.chunk_h = take(static_cast<size_t>(R * s.nsub * p.N));
      s.chunk_S = take(static_cast<size_t>(R * s.nsub));
    }
  }
  if (!backward) {
    if (ndir == 2) s.ybuf = take(static_cast<size_t>(R * p.L));
    s.total = off;
    return s;
  }
  // Rows per block: the block's rows must lie in one B group and one C group (its dB/dC
  // are summed over them), so CB divides D / G of each varying operand.
  int CB = 128 / s.P;  // (the staged backward: 32, see ss_staged_bwd_ok)
  auto bad = [&](int cb) {
    return (p.dim % cb) || (p.groups_b && (p.dim / p.groups_b) % cb) ||
           (p.groups_c && (p.dim / p.groups_c) % cb);
  };
  while (CB > 1 && bad(CB)) CB /= 2;
  s.staged_bwd = ss_staged_bwd_ok(p);
  s.CB = s.staged_bwd ? 32 : CB;
  {
    int64_t blocks, slots;
    bwd_grid(p, sms, s.staged_bwd, s.CB, &blocks, &slots);
    split(ss_bwd_chunks(p, sms, s.staged_bwd, s.CB), "JAX_SELSCAN_SS_BWD_SUB", blocks, slots, &s.bnch,
          &s.bchunk_steps, &s.bsub, &s.bsub_steps, &s.bnsub);
  }
  const size_t bn = static_cast<size_t>(s.bnch);  // the per-row partials get a chunk index
  // (s.CB, the blocks the kernel runs: the staged backward's 32 rows, not 128 / P, which is 64
  // for N <= 8 on >= 32768 rows and made this buffer too small, notes 8.8)
  const size_t varsz = static_cast<size_t>(p.batch * (p.dim / s.CB) * ndir * p.N * p.L);
  const size_t invsz = static_cast<size_t>(p.batch * ndir * p.dim * p.N);
  if (!saved_ckpt) s.ckpt = take(static_cast<size_t>(R * s.K * p.N));
  s.pdB = take(p.groups_b ? varsz : invsz * bn);
  s.pdC = take(p.groups_c ? varsz : invsz * bn);
  s.pdA = take(invsz * bn);
  s.pdD = take(static_cast<size_t>(p.batch * ndir * p.dim) * bn);
  s.pdbias = take(static_cast<size_t>(p.batch * ndir * p.dim) * bn);
  if (s.bnch > 1) {
    s.bchunk_g = take(static_cast<size_t>(R * s.bnsub * p.N));
    s.bchunk_S = take(static_cast<size_t>(R * s.bnsub));
  }
  if (p.h0) s.pdh0 = take(static_cast<size_t>(ndir * R * p.N));
  if (ndir == 2) {
    s.du_acc = take(static_cast<size_t>(R * p.L));
    s.dd_acc = take(static_cast<size_t>(R * p.L));
    s.ybuf = take(static_cast<size_t>(R * p.L));
  }
  s.total = off;
  return s;
}

size_t ss_forward_scratch_bytes(const SsProblem& p) { return ss_plan(p, false).total; }
size_t ss_backward_scratch_bytes(const SsProblem& p, bool saved_ckpt) {
  return ss_plan(p, true, saved_ckpt).total;
}

cudaError_t ss_forward(const SsProblem& p, const SsForwardOut& o, void* scratch, cudaStream_t stream) {
  switch (p.t) {
    case SsDType::F32: return ss_forward_f32(p, o, scratch, stream);
    case SsDType::BF16: return ss_forward_bf16(p, o, scratch, stream);
    case SsDType::F16: return ss_forward_f16(p, o, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t ss_backward(const SsProblem& p, const SsBackwardIO& io, void* scratch, cudaStream_t stream) {
  switch (p.t) {
    case SsDType::F32: return ss_backward_f32(p, io, scratch, stream);
    case SsDType::BF16: return ss_backward_bf16(p, io, scratch, stream);
    case SsDType::F16: return ss_backward_f16(p, io, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jss
