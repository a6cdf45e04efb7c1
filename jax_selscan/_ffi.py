"""Loads the compiled extensions and registers their XLA FFI targets with JAX.

Each extension is optional: without it the primitives lower to the pure-JAX
fallback, so the package imports and works everywhere.
"""
from __future__ import annotations

import jax

# FFI target names (must match the handler names registered below).
LINEAR_SCAN = "jax_selscan_linear_scan"
LINEAR_SCAN_PROD = "jax_selscan_linear_scan_prod"
SELECTIVE_SCAN = "jax_selscan_selective_scan"            # CPU (forward)
SELECTIVE_SCAN_BWD = "jax_selscan_selective_scan_bwd_cpu"  # CPU (backward)
SELECTIVE_SCAN_CKPT = "jax_selscan_selective_scan_ckpt"    # CPU (forward + checkpoints)
SELECTIVE_SCAN_FWD_CUDA = "jax_selscan_selective_scan_fwd"
SELECTIVE_SCAN_BWD_CUDA = "jax_selscan_selective_scan_bwd"
SELECTIVE_SCAN_FWD_CKPT_CUDA = "jax_selscan_selective_scan_fwd_ckpt"  # + the checkpoints


def _register(module_name: str, platform: str) -> bool:
    try:
        module = __import__(f"jax_selscan.{module_name}", fromlist=["registrations"])
    except ImportError:
        return False
    for name, capsule in module.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform=platform)
    return True


HAS_CPU = _register("_cpu", "cpu")
HAS_CUDA = _register("_cuda", "CUDA")


def ss_lanes() -> int:
    """Steps per checkpoint block of the CPU selective scan's ISA now (0: no CPU kernel)."""
    if not HAS_CPU:
        return 0
    from . import _cpu  # type: ignore[attr-defined]  # the compiled extension
    return int(_cpu.ss_lanes())
