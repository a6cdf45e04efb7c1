// Host dispatch of linear_scan over dtypes, and the choice behind algorithm="auto".
#include "linear_scan.h"

namespace jss {

int resolve_algorithm(const ScanProblem& p) {
  // See docs/PERFORMANCE_CUDA.md: lookback_regs is the fastest measured kernel at every
  // benchmarked shape in both layouts (the other algorithms exist as the ladder).
  (void)p;
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
