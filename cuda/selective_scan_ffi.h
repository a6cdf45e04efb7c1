// XLA FFI handlers of the CUDA selective scan (defined in selective_scan_ffi.cc).
#pragma once

#include "xla/ffi/api/ffi.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSelectiveScanFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSelectiveScanBwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JssSelectiveScanFwdCkptCuda);
