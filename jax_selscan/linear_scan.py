"""linear_scan: the public entry point for h[t] = a[t] * h[t-1] + b[t]."""
from __future__ import annotations

from typing import Literal, overload

import numpy as np
import jax.numpy as jnp
from jax import Array

from . import primitives
from ._checks import ArrayInput, check_array, check_bool, normalize_axis, result_dtype


def affine_combine(earlier, later):
    """Compose two affine maps h -> a*h + b, `earlier` applied first.

    The operator of the recurrence, in `jax.lax.associative_scan`'s convention
    fn(earlier, later); associative but not commutative.
    """
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def prepare(a, b, *, axis, reverse, h0, return_a_prod,
            algorithm) -> tuple[Array, Array, Array, int, bool, bool]:
    """linear_scan's arguments checked (errors name the argument) and normalised: a, b and h0
    as arrays of the promoted dtype, a and b broadcast, h0 defaulted to zeros, axis >= 0.
    Returns (a, b, h0, axis, reverse, return_a_prod)."""
    check_array("a", a)
    check_array("b", b)
    dtype = result_dtype(a=a, b=b)
    try:
        shape = np.broadcast_shapes(np.shape(a), np.shape(b))
    except ValueError:
        raise ValueError(f"a and b must have broadcast-compatible shapes, got a{tuple(np.shape(a))} "
                         f"and b{tuple(np.shape(b))}") from None
    if len(shape) == 0:
        raise ValueError("a and b must have at least one dimension (the scanned axis)")
    axis = normalize_axis(axis, len(shape))
    reverse = check_bool("reverse", reverse)
    return_a_prod = check_bool("return_a_prod", return_a_prod)
    if algorithm not in primitives.ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not one of {primitives.ALGORITHMS}")
    state_shape = shape[:axis] + shape[axis + 1:]
    if h0 is None:
        h0 = jnp.zeros(state_shape, dtype)
    else:
        check_array("h0", h0)
        dtype = result_dtype(a=a, b=b, h0=h0)
        try:
            if np.broadcast_shapes(np.shape(h0), state_shape) != state_shape:
                raise ValueError
        except ValueError:
            raise ValueError(f"h0 must have shape {state_shape} (the result's shape without axis "
                             f"{axis}), got {tuple(np.shape(h0))}") from None
        h0 = jnp.broadcast_to(jnp.asarray(h0, dtype), state_shape)
    a = jnp.broadcast_to(jnp.asarray(a, dtype), shape)
    b = jnp.broadcast_to(jnp.asarray(b, dtype), shape)
    return a, b, h0, axis, reverse, return_a_prod


@overload
def linear_scan(a: ArrayInput, b: ArrayInput, *, axis: int = 0, reverse: bool = False,
                h0: ArrayInput | None = None, return_a_prod: Literal[False] = False,
                algorithm: primitives.Algorithm = "auto") -> Array: ...
@overload
def linear_scan(a: ArrayInput, b: ArrayInput, *, axis: int = 0, reverse: bool = False,
                h0: ArrayInput | None = None, return_a_prod: Literal[True],
                algorithm: primitives.Algorithm = "auto") -> tuple[Array, Array]: ...


def linear_scan(a: ArrayInput, b: ArrayInput, *, axis: int = 0, reverse: bool = False,
                h0: ArrayInput | None = None, return_a_prod: bool = False,
                algorithm: primitives.Algorithm = "auto") -> Array | tuple[Array, Array]:
    """h[t] = a[t] * h[t-1] + b[t] along `axis` (h[t+1] with reverse=True), h[-1] = h0.

    a and b broadcast against each other; h0 (default zeros) has the shape of
    the result with `axis` removed. Returns h, or (h, a_prod) with
    return_a_prod=True, where a_prod is the running product of `a` in scan
    order. For h0 = 0 the pair (a_prod, h) equals
    ``jax.lax.associative_scan(affine_combine, (a, b), axis=axis, reverse=reverse)``.

    dtypes: float32, float64, bfloat16, float16 (accumulated in float32) and
    complex64. `algorithm` picks the CUDA kernel (see primitives.ALGORITHMS);
    other platforms ignore it.
    """
    a, b, h0, axis, reverse, return_a_prod = prepare(a, b, axis=axis, reverse=reverse, h0=h0,
                                                     return_a_prod=return_a_prod, algorithm=algorithm)
    outs = primitives.bind(a, b, h0, axis=axis, reverse=reverse,
                           return_a_prod=return_a_prod, algorithm=algorithm)
    return tuple(outs) if return_a_prod else outs[0]
