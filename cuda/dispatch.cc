// Host dispatch of linear_scan over dtypes, and the choice behind algorithm="auto".
#include "linear_scan.h"

namespace jss {

int resolve_algorithm(const ScanProblem& p) {
  // From the H200 measurements in docs/PERFORMANCE_CUDA.md: lookback_regs wins wherever a
  // row fills its tiles; for short contiguous rows (L <= 512, e.g. 65536 x 256) the
  // 256-element tiles of lookback_warp waste less and measured faster (1231 vs 1028 GB/s
  // fp32, 590 vs 453 bf16). The strided layout always uses lookback_regs.
  if (p.inner == 1 && p.L <= 512) return kLookbackWarp;
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
