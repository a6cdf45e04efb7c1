"""Argument checks shared by the public functions: clear errors at trace time."""
from __future__ import annotations

from typing import Union

import numpy as np
import jax
import jax.numpy as jnp

# What the public functions take for an array argument: jax arrays (tracers included) and NumPy
# arrays or scalars; Python numbers and lists are refused (check_array), so this is narrower
# than jax.typing.ArrayLike.
ArrayInput = Union[jax.Array, np.ndarray, np.generic]

# Inputs the kernels take. bf16/f16 are computed with a float32 state.
SUPPORTED_DTYPES = (jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16, jnp.complex64)
_SUPPORTED = tuple(np.dtype(d) for d in SUPPORTED_DTYPES)
_NAMES = ", ".join(d.name for d in _SUPPORTED)


def check_array(name: str, x) -> ArrayInput:
    """Return x if it is an array (jax, numpy or tracer); otherwise a TypeError naming it."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    return x


def check_dtype(name: str, dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {dtype.name}; supported dtypes are {_NAMES}")
    return dtype


def result_dtype(**named) -> np.dtype:
    """Check each named array's dtype and return their promoted dtype (also checked)."""
    for name, x in named.items():
        check_dtype(name, x.dtype)
    dtype = jnp.result_type(*named.values())
    return check_dtype(" and ".join(named) + " (promoted together)", dtype)


def normalize_axis(axis, ndim: int, name: str = "axis") -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis} is out of range for an array of rank {ndim}")
    return int(axis) % ndim


def check_bool(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def state_dtype(dtype) -> np.dtype:
    """The dtype the recurrence is accumulated in: float32 for 16-bit floats."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)) else dtype
