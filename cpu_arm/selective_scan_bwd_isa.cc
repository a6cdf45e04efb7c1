// The selective-scan backward kernel table of one ISA: compiled once per ISA with
// that ISA's flags, like selective_scan_isa.cc (see CMakeLists.txt).
#include "selective_scan_bwd.h"

#ifndef JSS_ISA_NAME
#error "define JSS_ISA_NAME (avx512, avx2, neon or generic)"
#endif
#define JSS_SSB_CAT2(a, b) a##b
#define JSS_SSB_CAT(a, b) JSS_SSB_CAT2(a, b)

namespace jax_selscan {
namespace {

void run_bwd_fn(const SsBwdParams& q, const SsBwdTask& t) { ssb::run(q, t); }

constexpr SsBwdTable kSsBwdTable = {simd::kBackend, simd::VF::kLanes, run_bwd_fn};

}  // namespace

const SsBwdTable* JSS_SSB_CAT(ss_bwd_table_, JSS_ISA_NAME)() { return &kSsBwdTable; }

}  // namespace jax_selscan
