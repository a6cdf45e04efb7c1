// The selective-scan kernel table of one ISA: compiled once per ISA with that
// ISA's flags, like kernels_isa.cc (see CMakeLists.txt). No standard-library
// templates here (their out-of-line copies could be shared across ISAs).
#include "selective_scan.h"

#ifndef JSS_ISA_NAME
#error "define JSS_ISA_NAME (avx512, avx2, neon or generic)"
#endif
#define JSS_SS_CAT2(a, b) a##b
#define JSS_SS_CAT(a, b) JSS_SS_CAT2(a, b)

namespace jax_selscan {
namespace {

template <simd::VF (*F)(simd::VF)>
void map_fn(const float* x, int64_t n, float* y) {
  constexpr int W = simd::VF::kLanes;
  int64_t i = 0;
  for (; i + W <= n; i += W) simd::store(y + i, F(simd::load(x + i)));
  if (i < n) {
    float in[W] = {}, out[W];
    for (int64_t j = i; j < n; ++j) in[j - i] = x[j];
    simd::store(out, F(simd::load(in)));
    for (int64_t j = i; j < n; ++j) y[j] = out[j - i];
  }
}
simd::VF exp2_v(simd::VF x) { return simd::exp2_nonpos(x); }
simd::VF softplus_v(simd::VF x) { return simd::softplus(x); }
simd::VF silu_v(simd::VF x) { return simd::silu(x); }

void run_fn(const SsParams& p, const SsTask& t) { ss::run(p, t); }

constexpr SsTable kSsTable = {
    simd::kBackend, simd::VF::kLanes, run_fn,
    map_fn<exp2_v>, map_fn<softplus_v>, map_fn<silu_v>,
};

}  // namespace

const SsTable* JSS_SS_CAT(ss_table_, JSS_ISA_NAME)() { return &kSsTable; }

}  // namespace jax_selscan
