// linear_scan kernels instantiated for one storage dtype (one file per dtype: parallel builds).
#include "scan_kernels.cuh"

JSS_DEFINE_DTYPE(f64, double)
