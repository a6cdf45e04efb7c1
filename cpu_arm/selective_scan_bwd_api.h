// The interface between the selective-scan backward driver
// (selective_scan_bwd_cpu.cc: threads, partial sums, deterministic reductions)
// and the per-ISA backward kernels (selective_scan_bwd_isa.cc). Plain structs
// only: included by translation units built with different -m flags.
#pragma once

#include <cstdint>

#include "selective_scan_api.h"

namespace jax_selscan {

// One backward call: the forward's inputs and options (fwd; its out / last_*
// fields are unused), the cotangents, and the gradients.
//   dout: (batch, dim, length) in dout_t;  dlast_fwd / dlast_rev: (batch, dim,
//   dstate) float32 or null (zero).
//   Gradients, all float32, in the operands' shapes; null when the operand is
//   absent (D, z, delta_bias, h0): du, ddelta, dz (batch, dim, length); dA
//   (dim, dstate); dB, dC like B, C; dD, ddelta_bias (dim,); dh0 (batch, dim, dstate).
//   ddelta is the gradient of the raw delta (before bias and softplus).
struct SsBwdParams {
  SsParams fwd;
  const void* dout; SsType dout_t;
  const float* dlast_fwd;
  const float* dlast_rev;
  float *du, *ddelta, *dz, *dA, *dB, *dC, *dD, *ddelta_bias, *dh0;
  // The forward's checkpoints (SsParams::ckpt, (batch, dim, ckpt_row)) or null. A task
  // whose channels all carry the flag `lanes` (and ckpt_row = ss_ckpt_row(...)) reads
  // its checkpoints from there instead of running the sweep; bitwise the same result.
  const float* ckpt;
  int64_t ckpt_row;
};

// One task: batch row b, channels [d0, d0 + nch) (nch <= lanes), in one B group
// and one C group. The kernel writes du / ddelta / dz / dh0 of its channels
// directly and its share of the summed gradients into per-task partials (lane r
// = channel d0 + r), which the driver adds up in a fixed order:
//   pA [dstate][lanes];  pD, pbias [lanes];
//   pB: [length][dstate] summed over the task's channels when B varies (b_var),
//       added to what is there when `accumulate` (the tasks of one slab share it),
//       else [dstate][lanes]; pC likewise.
// `work` holds ss_bwd_work_floats(...) floats, 64-byte aligned.
//
// L split (split = 1, fewer tasks than threads): the task is one direction (`reverse`)
// of one piece `piece` of `pieces` contiguous ranges of scan-order blocks of `lanes`
// steps, in one of three phases (the driver carries between them; every [dstate][lanes]
// array below is per (task, piece)):
//   1. the checkpoint sweep from zero (piece 0: from h0), keeping dA's running product
//      P until it is <= 2^-30 everywhere (block `hwin`, the piece's end when never);
//      writes the piece's checkpoints into `ckbuf` ([blocks][dstate][lanes], the task's)
//      and `hend`, `ptot` (P, 0 once dropped) for the carry hin[k+1] = hend[k] + ptot[k] hin[k];
//   2. the sweep again over [piece start, hwin) from `hin`; then the adjoint from zero
//      (the last piece: from the last state's cotangent), alone (no gradients) while
//      the product Q of dA from the piece's end is > 2^-30 somewhere (blocks [gwin,
//      piece end)), in full over the rest; writes `gend`, `qtot` (Q, 0 once dropped) for
//      the carry gin[k-1] = gend[k] + qtot[k] gin[k] (gin[0]'s carry out is dh0);
//   3. the adjoint in full over [gwin, piece end) from `gin`.
// Dropping P (Q) once <= 2^-30 drops a term below float32 resolution of the entering
// state (adjoint); where an entering state or adjoint is NaN or infinite the driver computes
// the task again unsplit instead, so that NaN and Inf reach the gradients as in one pass.
// Phases 2 and 3 write their own pA / pD / pbias (and invariant pB / pC) partials; varying
// pB / pC is the task's [length][dstate] (accumulate = 1; the pieces write disjoint rows,
// stored by the first direction, added by the second); bidirectional sums live in `sums`
// (3 x [length][lanes], the task's); dh0 is left to the driver.
struct SsBwdTask {
  int64_t b, d0, nch;
  float* work;
  float *pA, *pB, *pC, *pD, *pbias;
  int32_t accumulate;
  // Along-L tasks alone in their B (C) group: pB (pC) is the gradient's own [N][L] block of
  // that group (b, g), written directly (no partial, no reduction).
  int32_t direct_b, direct_c;
  int32_t split, phase, reverse;
  int64_t piece, pieces;
  float *ckbuf, *sums;
  const float* hin;
  float *hend, *ptot;
  int64_t* hwin;
  const float* gin;
  float *gend, *qtot;
  int64_t* gwin;
  // Bidirectional, unsplit: a buffer for the exp(delta A) of the last dA_blocks blocks of
  // lanes steps ([dA_blocks][lanes][dstate][lanes]), written by the reverse half's walk and
  // read by the forward half's (null / 0: both recompute).
  float* dA;
  int64_t dA_blocks;
};

struct SsBwdTable {
  const char* name;  // as SsTable::name
  int32_t lanes;
  void (*run)(const SsBwdParams& q, const SsBwdTask& t);
};

// Scratch floats of one task (a multiple of 16): the checkpoints ([blocks][dstate]
// [lanes], one per block of `lanes` steps), one block's dA and states, for a bidirectional
// call three [length][lanes] sums (the reverse half's, for the forward half), and small
// per-block buffers. `split`: an L-split piece, whose checkpoints and sums are the task's
// (SsBwdTask::ckbuf, sums).
inline int64_t ss_bwd_work_floats(int64_t lanes, int64_t dstate, int64_t length, bool split,
                                  bool bidi) {
  const int64_t blocks = split ? 0 : (length + lanes - 1) / lanes;
  const int64_t sums = split || !bidi ? 0 : 3 * length * lanes;
  const int64_t np = (dstate + lanes - 1) / lanes * lanes;
  return (blocks * dstate * lanes + 2 * lanes * dstate * lanes + sums +
          13 * dstate * lanes + 2 * np * lanes + 12 * lanes * lanes + 64 * 16 + 15) / 16 * 16;
}

const SsBwdTable* ss_bwd_table_generic();
#if defined(__x86_64__) || defined(_M_X64)
const SsBwdTable* ss_bwd_table_avx2();
const SsBwdTable* ss_bwd_table_avx512();
#endif
#if defined(__aarch64__)
const SsBwdTable* ss_bwd_table_neon();
#endif

}  // namespace jax_selscan
