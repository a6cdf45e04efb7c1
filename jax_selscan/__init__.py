"""jax_selscan: linear recurrences and Mamba's selective scan as fast JAX primitives."""
from ._checks import SUPPORTED_DTYPES
from ._ffi import HAS_CPU as has_cpu_kernels, HAS_CUDA as has_cuda_kernels
from .associative_scan import associative_scan
from .linear_scan import affine_combine, linear_scan
from .primitives import ALGORITHMS
from .reference import selective_scan_ref
from .selective_scan import DIRECTIONS, selective_scan, selective_state_update
from .sharded import sharded_linear_scan, sharded_selective_scan

__all__ = [
    "ALGORITHMS", "DIRECTIONS", "SUPPORTED_DTYPES", "affine_combine", "associative_scan",
    "has_cpu_kernels", "has_cuda_kernels", "linear_scan", "selective_scan", "selective_scan_ref",
    "selective_state_update", "sharded_linear_scan", "sharded_selective_scan",
]
__version__ = "0.1.0"
