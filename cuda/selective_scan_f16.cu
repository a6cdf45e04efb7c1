// Selective-scan kernels instantiated for f16 activations (one file per dtype: parallel builds).
#include "selective_scan_launch.cuh"

JSS_SS_DEFINE(f16, __half)
