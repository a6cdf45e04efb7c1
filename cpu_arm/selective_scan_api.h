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
};

// One task: batch row `b`, channels [d0, d0 + nch) with nch <= lanes, all in
// one B group and one C group. `work` holds work_floats(...) floats (64-byte aligned); `dA`
// (bidirectional only, may be null: then the reverse pass recomputes
// exp(delta A)) holds length * dstate * lanes floats.
struct SsTask {
  int64_t b, d0, nch;
  float* work;
  float* dA;
};

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
inline int64_t ss_work_floats(int64_t lanes, int64_t dstate, int64_t length) {
  return (8 * dstate * lanes + 8 * lanes * lanes + 2 * dstate * lanes * lanes + 2 * length * lanes +
          2 * length + 1024 + 15) / 16 * 16;
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
