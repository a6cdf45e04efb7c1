// Selective-scan kernels instantiated for bf16 activations (one file per dtype: parallel builds).
#include "selective_scan_launch.cuh"

JSS_SS_DEFINE(bf16, __nv_bfloat16)
