// The interface between the selective-scan driver (selective_scan_cpu.cc:
// threads, workspace) and the per-ISA selective-scan kernels
// (selective_scan_isa.cc). Plain structs only: included by translation units
// built with different -m flags.
#pragma once

#include <cstdint>

namespace jax_selscan {

// Storage type of one operand; the state and all arithmetic are float32.
enum class SsType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

enum class SsDirection : int32_t { kForward = 0, kReverse = 1, kBidirectional = 2 };

// One selective_scan call (mamba_ssm layout), all arrays row-major:
//   u, delta, z, out: (batch, dim, length)
//   A: (dim, dstate);  D, delta_bias: (dim,);  h0: (batch, dim, dstate)
//   B: (dim, dstate) when !b_var, else (batch, b_groups, dstate, length);
//      channel d uses group d / (dim / b_groups); C likewise with c_groups
//   last_fwd, last_rev: (batch, dim, dstate) float32 (null: not wanted)
// Optional inputs are null when absent.
struct SsParams {
  const void* u; SsType u_t;
  const void* delta; SsType delta_t;
  const void* A; SsType A_t;
  const void* B; SsType B_t; bool b_var;
  const void* C; SsType C_t; bool c_var;
  const void* D; SsType D_t;
  const void* z; SsType z_t;
  const void* delta_bias; SsType delta_bias_t;
  const void* h0; SsType h0_t;
  bool delta_softplus;
  SsDirection direction;
  int64_t batch, dim, dstate, length, b_groups, c_groups;
  void* out; SsType out_t;
  float* last_fwd;
  float* last_rev;
  // Checkpoints for the backward (null: not wanted), (batch, dim, ckpt_row) float32,
  // see ss_ckpt_row. Row (b, d): element 0 is `lanes` (as a float) when the forward
  // wrote that channel's checkpoints, 0 when it did not (the along-L path, the L
  // split, or ckpt_row != ss_ckpt_row(lanes, ...): the backward then runs its own
  // sweep); then per direction set (bidirectional: the reverse set first, then the
  // forward set; otherwise the call's one direction) [blocks][dstate]: the state
  // entering block k of `lanes` steps (steps [k lanes, (k + 1) lanes), entered at
  // its first step in scan order: the end of the block for reverse), exactly the
  // state the backward's checkpoint sweep computes (same arithmetic, same bits).
  float* ckpt;
  int64_t ckpt_row;
};

// Floats per (batch, channel) row of the checkpoints: a flag, then one state per
// block of `lanes` steps and direction.
inline int64_t ss_ckpt_row(int64_t lanes, int64_t dstate, int64_t length, SsDirection dir) {
  const int64_t blocks = (length + lanes - 1) / lanes;
  return 1 + (dir == SsDirection::kBidirectional ? 2 : 1) * blocks * dstate;
}

// One task: batch row `b`, channels [d0, d0 + nch) with nch <= lanes, all in
// one B group and one C group. `work` holds ss_work_floats(...) floats (64-byte
// aligned); `dA` (bidirectional only, may be null: then the forward pass
// recomputes exp(delta A)) holds dA_blocks * lanes * dstate * lanes floats: the
// exponentials of the first dA_blocks blocks of lanes steps, kept by the reverse
// pass for the forward pass (the rest are recomputed). Likewise the prepared rows (delta
// after softplus, delta * u, u) of the first `prep_blocks` blocks, kept in `work`.
//
// L split (split = 1): the task is one direction (`reverse`) of one piece
// `piece` of `pieces` contiguous ranges of the scanned axis (ranges of whole
// scan units: lanes-step blocks, or along-L chunks; see ss_units). Phase 1 runs
// the piece from h0 (piece 0) or from zero (others), writes its outputs, and
// reports the end state `hend` and the product of every dA over the piece `ptot`
// ([nch][dstate] each; 0 once the running product fell to <= 2^-30 in every lane
// and state: that term is dropped) and in `window` the scan unit after which that
// happened (the piece's end when it never did). Phase 3 (pieces >= 1) reruns units
// [piece start, *window) from the true entering state `hin` ([nch][dstate]); every
// later output is then exact up to the dropped term, <= 2^-30 |hin| in the state
// (below float32 resolution of hin). A NaN or +-Inf in `hin` is not dropped: the driver
// sets such a piece's window to its end, so it reruns whole, as in one sequential scan.
// With bidirectional calls the reverse half writes its y (before D and the gate) to `yr` (float, [L][lanes],
// or [L] on the along-L path) and the forward half adds it.
struct SsTask {
  int64_t b, d0, nch;
  float* work;
  float* dA;
  int64_t dA_blocks;
  int64_t prep_blocks;
  int32_t split, phase, reverse, yr_mode;  // yr_mode: 0 none, 1 write yr, 2 add yr
  int64_t piece, pieces;
  const float* hin;
  float* hend;
  float* ptot;
  int64_t* window;
  float* yr;
};

// The along-L ("narrow") path: a task of at most lanes / 4 channels on a long
// sequence runs each channel with the time axis in the lanes (lanes segments of
// ss_seg_len steps per chunk). The driver then makes one task per channel.
inline bool ss_use_narrow(int64_t lanes, int64_t nch, int64_t length) {
  return nch * 4 <= lanes && length >= 4 * lanes * lanes && length / lanes >= 48;
}
// Segment length of the along-L path: lanes, so that a chunk (lanes segments)
// is one lanes x lanes tile of contiguous steps: every array is then read as one
// sequential stream (rows of longer segments are lanes streams per array, more
// than the hardware prefetchers follow: measured 4x slower at 64-step segments).
inline int64_t ss_seg_len(int64_t lanes, int64_t /*dstate*/) { return lanes; }
// Scan units of a task: along-L chunks (+ 1 for a partial tail) or lanes-step blocks.
inline int64_t ss_units(int64_t lanes, int64_t nch, int64_t dstate, int64_t length) {
  if (ss_use_narrow(lanes, nch, length)) {
    const int64_t chunk = ss_seg_len(lanes, dstate) * lanes;
    return length / chunk + (length % chunk != 0 ? 1 : 0);
  }
  return (length + lanes - 1) / lanes;
}

struct SsTable {
  const char* name;  // "avx512", "avx2", "neon", "generic" (as KernelTable::name)
  int32_t lanes;     // channels per task
  void (*run)(const SsParams& p, const SsTask& t);
  // exp2_nonpos / softplus / silu of this ISA over arrays (for the tests).
  void (*exp2)(const float* x, int64_t n, float* y);
  void (*softplus)(const float* x, int64_t n, float* y);
  void (*silu)(const float* x, int64_t n, float* y);
};

// Floats of scratch one task needs besides dA (a multiple of 16).
// `yr`: room for what an unsplit bidirectional task keeps from its first pass for its second:
// the reverse half's y ([length][lanes] on the channel path, [length] on the along-L path) and,
// on the channel path, the prepared rows of its first `prep_blocks` blocks
// ([prep_blocks][3][lanes][lanes], SsTask::prep_blocks); directional calls and L-split pieces
// (whose yr is the caller's) need none, so their scratch does not grow with L.
inline int64_t ss_work_floats(int64_t lanes, int64_t dstate, int64_t length, bool yr, int64_t prep_blocks = 0) {
  const int64_t chunk = ss_seg_len(lanes, dstate) * lanes;
  const int64_t kept = yr ? length * lanes + 16 + 3 * prep_blocks * lanes * lanes : 0;
  return (10 * dstate * lanes + 12 * lanes * lanes + 2 * dstate * lanes * lanes + kept +
          (dstate + 2) * chunk + 8 * dstate + 1024 + 15) / 16 * 16;
}

const SsTable* ss_table_generic();
#if defined(__x86_64__) || defined(_M_X64)
const SsTable* ss_table_avx2();
const SsTable* ss_table_avx512();
#endif
#if defined(__aarch64__)
const SsTable* ss_table_neon();
#endif

}  // namespace jax_selscan
