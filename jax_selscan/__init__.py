"""jax_selscan: linear recurrences and Mamba's selective scan as fast JAX primitives."""
from .linear_scan import affine_combine, linear_scan
from .primitives import ALGORITHMS
from ._checks import SUPPORTED_DTYPES
from ._ffi import HAS_CPU as has_cpu_kernels, HAS_CUDA as has_cuda_kernels

__all__ = [
    "ALGORITHMS", "SUPPORTED_DTYPES", "affine_combine", "linear_scan",
    "has_cpu_kernels", "has_cuda_kernels",
]
__version__ = "0.1.0"
