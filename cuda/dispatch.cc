// Host dispatch of linear_scan over dtypes, and the choice behind algorithm="auto".
#include "linear_scan.h"

namespace jss {

int resolve_algorithm(const ScanProblem& p) {
  // From the H200 measurements in docs/PERFORMANCE_CUDA.md (section 4, CUDA events, fp32 /
  // bf16, % of the 4240 GB/s copy):
  //  * contiguous rows, outer >= 512: row_walk (one warp walks a row; no look-back).
  //    4096x16384 86% (lookback_regs 51%), 12288x2048 90% (54%), 65536x256 91% (19%;
  //    lookback_warp ~25%), 1024x65536 90% (51%), 512x131072 68% (52%).
  //  * fewer rows: the look-back tile kernels as before (lookback_warp for L <= 512).
  //  * strided: lookback_regs. strided_walk measured slower at every strided shape tried
  //    ((4096, 24576): 68% vs 80%; (65536, 1024): 3% vs 61%), so auto never picks it.
  if (p.inner == 1) {
    if (p.outer >= 512) return kRowWalk;
    if (p.L <= 512) return kLookbackWarp;
    return kLookbackRegs;
  }
  return kLookbackRegs;
}

size_t scratch_bytes(DType t, const ScanProblem& p) {
  switch (t) {
    case DType::F32: return scratch_bytes_f32(p);
    case DType::F64: return scratch_bytes_f64(p);
    case DType::BF16: return scratch_bytes_bf16(p);
    case DType::F16: return scratch_bytes_f16(p);
    case DType::C64: return scratch_bytes_c64(p);
  }
  return 0;
}

cudaError_t launch_linear_scan(DType t, const ScanProblem& p, void* scratch, cudaStream_t stream) {
  switch (t) {
    case DType::F32: return launch_f32(p, scratch, stream);
    case DType::F64: return launch_f64(p, scratch, stream);
    case DType::BF16: return launch_bf16(p, scratch, stream);
    case DType::F16: return launch_f16(p, scratch, stream);
    case DType::C64: return launch_c64(p, scratch, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace jss
