// Selective-scan kernels instantiated for f32 activations (one file per dtype: parallel builds).
#include "selective_scan_launch.cuh"

JSS_SS_DEFINE(f32, float)
