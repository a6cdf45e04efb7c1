"""The skip mark of the GPU test files: JAX sees a GPU and jax_selscan._cuda is built.

Without either, those files skip cleanly (CI has no GPU)."""
from __future__ import annotations

import jax
import pytest


def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:  # no backend at all
        return False


def has_cuda_extension() -> bool:
    try:
        import jax_selscan
        return bool(jax_selscan.has_cuda_kernels)
    except Exception:  # pragma: no cover
        return False


requires_cuda = [
    pytest.mark.gpu,
    pytest.mark.skipif(not (has_cuda_extension() and has_gpu()),
                       reason="needs a CUDA GPU and jax_selscan._cuda"),
]
