"""associative_scan: a drop-in for `jax.lax.associative_scan` that runs the affine combine fast.

When `fn` composes affine maps -- ``fn((a1, b1), (a2, b2)) == (a2 * a1, a2 * b1 + b2)``,
in whatever way the user wrote it -- the scan is the linear recurrence that
`linear_scan` computes in one pass, so we call ``linear_scan(..., return_a_prod=True)``
and hand back exactly the pytree `lax.associative_scan` would (same structure, leaf
order, shapes and dtypes). Any other `fn` goes to `jax.lax.associative_scan` unchanged.

Recognition (once per fn and element avals, cached):

1. `fn` is traced with `jax.make_jaxpr` on abstract elements shaped like the inputs
   with the scanned axis set to length 2 (never L, so tracing costs the same for any
   L; not 1, because at length 1 jnp elides indexing such as ``x[:1]`` that is not the
   identity at the lengths `lax` really calls `fn` with).
2. The jaxpr is interpreted symbolically: every value is a polynomial with
   coefficients +-1 in the four input leaves (earlier leaf 0/1, later leaf 0/1), together
   with a map from its dimensions to the dimensions of the full broadcast shape, which
   proves that element i of the value only ever depends on element i of the inputs.
   Only elementwise arithmetic (mul, add, add_any, sub, neg), value-preserving dtype
   conversions, copies, the shape ops that do not move data between elements (reshape
   and squeeze that add or drop size-1 dims, broadcast_in_dim) and nested calls (jit,
   closed_call, remat, custom_jvp_call, custom_vjp_call -- their primal body) are
   understood; constants must be all-0 or all-1. Anything else (dot_general,
   reductions, rev, slicing, gather, transpose, select, max, div, exp, other
   constants, ...) means "not affine" and the call falls back to lax. Like terms are
   never merged (no x - x, no x + x): so beyond commuting operands, only * 1, + 0
   and pairs of negations are accepted, which change no floating-point result.
3. The two output polynomials are compared with the affine combine's, for both
   orders of the leaves in `elems`: (a, b) or (b, a). Commuting the operands of each
   * and + is therefore allowed; the result must also keep each leaf's shape, dtype
   and dimension map.

lax calls ``fn(earlier, later)``; with reverse=True it reverses, scans and reverses
back, which is ``linear_scan(reverse=True)``.
"""
from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import Callable

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

from ._checks import SUPPORTED_DTYPES, normalize_axis
from .linear_scan import linear_scan

__all__ = ["associative_scan"]

_TRACE_LEN = 2          # length of the scanned axis in the abstract elements we trace
_MAX_DEGREE = 2         # the affine combine is quadratic; anything higher is rejected
_MAX_TERMS = 16
_SUPPORTED = tuple(np.dtype(d) for d in SUPPORTED_DTYPES)


def associative_scan(fn: Callable, elems, reverse: bool = False, axis: int = 0):
    """Drop-in for ``jax.lax.associative_scan(fn, elems, reverse=reverse, axis=axis)``.

    If `fn` is the affine combine (see `jax_selscan.affine_combine`, or the same
    function written by hand, possibly under `jax.vmap`) and `elems` is a pair of
    arrays (in either order), the scan runs as `linear_scan`: the leaf that plays
    the role of ``a`` becomes its running product, the other one ``h``. Results equal
    lax's up to floating-point rounding (16-bit inputs are accumulated in float32).
    Every other call is forwarded to `jax.lax.associative_scan` unchanged.
    """
    plan = _fast_plan(fn, elems, axis)
    if plan is None:
        return lax.associative_scan(fn, elems, reverse=reverse, axis=axis)
    leaves, tree, ia, ib, axis = plan
    a, b = leaves[ia], leaves[ib]
    h, p = linear_scan(a, b, axis=axis, reverse=bool(reverse), return_a_prod=True)
    a_dtype, b_dtype = jax.typeof(a).dtype, jax.typeof(b).dtype
    if jnp.issubdtype(p.dtype, jnp.complexfloating) and not jnp.issubdtype(a_dtype, jnp.complexfloating):
        p = jnp.real(p)   # a real `a` promoted to complex: the imaginary part is exactly 0
    p = p.astype(a_dtype)
    for d, (sa, sp) in enumerate(zip(np.shape(a), p.shape)):
        if sa != sp:      # `a` was broadcast against `b` along d: keep one copy
            p = lax.slice_in_dim(p, 0, 1, axis=d)
    out = [None, None]
    out[ia], out[ib] = p, h.astype(b_dtype)
    return jax.tree_util.tree_unflatten(tree, out)


# --- deciding whether the fast path applies ---------------------------------------------

def _fast_plan(fn, elems, axis):
    """(leaves, tree, index of a, index of b, axis) if the fast path applies, else None.

    Returns None (so lax runs, and raises its own errors) for anything unusual; only a
    bad `axis` is reported here, with a message naming it.
    """
    if not callable(fn):
        return None
    leaves, tree = jax.tree_util.tree_flatten(elems)
    if not leaves or not all(hasattr(x, "shape") and hasattr(x, "dtype") for x in leaves):
        return None
    ndim = np.ndim(leaves[0])
    if ndim == 0:
        return None
    try:
        axis = normalize_axis(axis, ndim)
    except (TypeError, ValueError) as e:
        raise type(e)(f"associative_scan: {e}") from None
    if len(leaves) != 2:
        return None
    try:
        avals = [jax.typeof(x) for x in leaves]
    except TypeError:
        return None
    shapes = [tuple(av.shape) for av in avals]
    if any(len(s) != ndim for s in shapes) or any(s[axis] != shapes[0][axis] for s in shapes):
        return None       # lax raises (different lengths) or broadcasts oddly (ranks)
    if not all(isinstance(d, (int, np.integer)) for s in shapes for d in s):
        return None       # symbolic shapes
    if shapes[0][axis] < 2:
        return None       # lax returns elems untouched
    if any(av.dtype not in _SUPPORTED for av in avals):
        return None
    try:
        promoted = np.dtype(jnp.result_type(*avals))
    except Exception:
        return None
    if promoted not in _SUPPORTED:
        return None
    trace_avals = tuple(
        jax.ShapeDtypeStruct(s[:axis] + (_TRACE_LEN,) + s[axis + 1:], av.dtype,
                             weak_type=getattr(av, "weak_type", False))
        for s, av in zip(shapes, avals))
    key = (tree, axis, tuple((t.shape, t.dtype, t.weak_type) for t in trace_avals))
    match = _cached(fn, key, lambda: _recognise(fn, tree, trace_avals))
    if match is None:
        return None
    ia, ib = match
    return leaves, tree, ia, ib, axis


# --- the cache: one recognition per (fn, element avals) ----------------------------------

_lock = threading.Lock()
_weak_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_strong_cache: "collections.OrderedDict" = collections.OrderedDict()   # hashable, not weak-referenceable
_STRONG_MAX = 256


def _cached(fn, key, compute):
    table = None
    try:
        with _lock:
            table = _weak_cache.get(fn)
            if table is None:
                table = _weak_cache[fn] = {}
    except TypeError:      # not weak-referenceable (builtins) or not hashable
        try:
            hash(fn)
        except TypeError:
            return compute()
        key = (fn, key)
        with _lock:
            if key in _strong_cache:
                _strong_cache.move_to_end(key)
                return _strong_cache[key]
        result = compute()
        with _lock:
            _strong_cache[key] = result
            while len(_strong_cache) > _STRONG_MAX:
                _strong_cache.popitem(last=False)
        return result
    with _lock:
        if key in table:
            return table[key]
    result = compute()
    with _lock:
        table[key] = result
    return result


# --- symbolic interpretation ----------------------------------------------------------------

class _Reject(Exception):
    """fn does something we do not prove to be the affine combine."""


_WILD = "*"   # a dimension of a constant: equal along it, so it matches any dimension


def _recognise(fn, tree, trace_avals):
    """(ia, ib) -- which leaf of elems is `a` and which `b` -- or None."""
    x = jax.tree_util.tree_unflatten(tree, list(trace_avals))
    try:
        closed = jax.make_jaxpr(fn)(x, x)
    except Exception:     # lax will call fn itself and raise what it raises
        return None
    jaxpr = closed.jaxpr
    if len(jaxpr.invars) != 4 or len(jaxpr.outvars) != 2:
        return None
    shapes = [tuple(t.shape) for t in trace_avals]
    full = tuple(int(d) for d in np.broadcast_shapes(*shapes))
    syms = list(trace_avals) * 2   # input ids: a1, b1, a2, b2 in leaf order
    interp = _Interpreter(full, frozenset(i for i, t in enumerate(syms) if np.dtype(t.dtype).kind == "c"))
    ins = []
    for sym, t in enumerate(syms):
        dmap = tuple(d if n > 1 else None for d, n in enumerate(t.shape))
        interp.varying.append(frozenset(d for d in dmap if d is not None))
        ins.append(_Val({(sym,): 1}, dmap, tuple(t.shape), np.dtype(t.dtype)))
    try:
        outs = interp.run(jaxpr, closed.consts, ins)
    except _Reject:
        return None
    for out, inp in zip(outs, ins):
        if out.shape != inp.shape or out.dtype != inp.dtype or out.dmap != inp.dmap:
            return None
    for ia, ib in ((0, 1), (1, 0)):
        a1, b1, a2, b2 = ia, ib, 2 + ia, 2 + ib
        want = {ia: {_mono(a1, a2): 1}, ib: {_mono(a2, b1): 1, _mono(b2): 1}}
        if outs[ia].poly == want[ia] and outs[ib].poly == want[ib]:
            return ia, ib
    return None


def _mono(*syms):
    return tuple(sorted(syms))


class _Val:
    """A value of the traced function as a polynomial of its inputs.

    poly: {monomial (sorted tuple of input ids): int coefficient}, zeros dropped.
    dmap: per dimension, the dimension of the full shape it runs along (int, size > 1),
    None (size 1) or _WILD (only for constants). Meaning: value[i] equals poly of the
    inputs at the full-shape index whose coordinate dmap[k] is i[k]; poly does not
    depend on the coordinates no dimension maps to.
    """
    __slots__ = ("poly", "dmap", "shape", "dtype")

    def __init__(self, poly, dmap, shape, dtype):
        self.poly, self.dmap, self.shape, self.dtype = poly, tuple(dmap), tuple(shape), dtype

    @property
    def const(self):
        return all(m == () for m in self.poly)


# Like terms are never merged: a merge (x + x, x - x, (x + y) * (x + y), ...) is either
# a cancellation or a coefficient other than +-1 that has to cancel later, and
# floating-point arithmetic does not cancel exactly. Without merges the only rewrites
# of a2 * a1 and a2 * b1 + b2 left are commuting operands, * 1, + 0, * 0 of another
# term, and pairs of negations: each gives the same floating-point result.

def _padd(p, q, sign=1):
    r = dict(p)
    for m, c in q.items():
        if m in r:
            raise _Reject("like terms merged")
        r[m] = sign * c
    return _bounded(r)


def _pmul(p, q):
    r = {}
    for (m1, c1), (m2, c2) in itertools.product(p.items(), q.items()):
        m = tuple(sorted(m1 + m2))
        if len(m) > _MAX_DEGREE:
            raise _Reject("degree")
        if m in r:
            raise _Reject("like terms merged")
        r[m] = c1 * c2
    return _bounded(r)


def _bounded(p):
    if len(p) > _MAX_TERMS:
        raise _Reject("too many terms")
    return p


# dtype conversions that keep every value exactly (so the polynomial is unchanged)
_WIDENING = {
    ("bfloat16", "float32"), ("bfloat16", "float64"), ("float16", "float32"),
    ("float16", "float64"), ("float32", "float64"),
    ("bfloat16", "complex64"), ("float16", "complex64"), ("float32", "complex64"),
    ("bfloat16", "complex128"), ("float16", "complex128"), ("float32", "complex128"),
    ("float64", "complex128"), ("complex64", "complex128"),
}

_ARITH = {"mul", "add", "add_any", "sub", "neg"}
_IDENTITY = {"copy", "copy_p"}
_CALLS = {"pjit", "jit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
          "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}


# Symbols of the real and imaginary parts of a complex input s: s + _RE, s + _IM. Newer jax
# (0.12.1) writes real * complex as complex(real * real(z), real * imag(z)) rather than
# converting the real operand; the parts let that be proven the same product.
_RE, _IM = 1000, 2000   # multiples of _RE: s % _RE is the input of any symbol s


class _Interpreter:
    def __init__(self, full, complex_syms=frozenset()):
        self.full = full
        self.varying = []   # per input id: the full-shape dims along which it varies
        self.complex_syms = complex_syms   # input ids of complex dtype

    def run(self, jaxpr, consts, args):
        env = {}

        def read(v):
            if isinstance(v, jcore.Literal):
                return self.constant(v.val, v.aval)
            return env[v]

        if len(consts) != len(jaxpr.constvars) or len(args) != len(jaxpr.invars):
            raise _Reject("arity")
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = c if isinstance(c, _Val) else self.constant(c, v.aval)
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        for eqn in jaxpr.eqns:
            outs = self.eqn(eqn, [read(v) for v in eqn.invars])
            if len(outs) != len(eqn.outvars):
                raise _Reject("arity")
            for v, o in zip(eqn.outvars, outs):
                aval = v.aval
                if tuple(aval.shape) != o.shape or np.dtype(aval.dtype) != o.dtype:
                    raise _Reject("aval mismatch")
                env[v] = o
        return [read(v) for v in jaxpr.outvars]

    def constant(self, value, aval):
        if isinstance(value, jax.core.Tracer):
            raise _Reject("traced constant")
        try:
            arr = np.asarray(value)
        except Exception:
            raise _Reject("opaque constant") from None
        if arr.dtype.kind not in "biufc" and arr.dtype not in _SUPPORTED:
            raise _Reject("constant dtype")
        if arr.size == 0:
            raise _Reject("empty constant")
        if np.all(arr == 0):
            poly = {}
        elif np.all(arr == 1):
            poly = {(): 1}
        else:
            raise _Reject("constant other than 0 or 1")
        shape = tuple(aval.shape)
        return _Val(poly, [None if n == 1 else _WILD for n in shape], shape, np.dtype(aval.dtype))

    def eqn(self, eqn, ins):
        name = eqn.primitive.name
        params = eqn.params
        out_aval = eqn.outvars[0].aval if eqn.outvars else None
        if name in _ARITH:
            if params.get("out_dtype") is not None:
                raise _Reject("out_dtype")
            if any(x.dtype != np.dtype(out_aval.dtype) for x in ins):
                raise _Reject("mixed dtypes")
            if name == "neg":
                if len(ins) != 1:
                    raise _Reject("arity")
                poly = _padd({}, ins[0].poly, -1)
            else:
                if len(ins) != 2:
                    raise _Reject("arity")
                p, q = ins[0].poly, ins[1].poly
                poly = _pmul(p, q) if name == "mul" else _padd(p, q, -1 if name == "sub" else 1)
            return [self.elementwise(poly, ins, out_aval)]
        if name == "convert_element_type":
            (x,) = ins
            new = np.dtype(params["new_dtype"])
            if new != x.dtype and (x.dtype.name, new.name) not in _WIDENING:
                raise _Reject("lossy conversion")
            return [_Val(x.poly, x.dmap, x.shape, new)]
        if name in ("real", "imag"):
            (x,) = ins
            return [self.elementwise(self.part(x.poly, _RE if name == "real" else _IM), ins, out_aval)]
        if name == "complex":
            if len(ins) != 2:
                raise _Reject("arity")
            re, im = (self.unpart(x.poly, off) for x, off in zip(ins, (_RE, _IM)))
            if re != im:
                raise _Reject("complex of parts of different values")
            return [self.elementwise(re, ins, out_aval)]
        if name in _IDENTITY:
            return list(ins)
        if name == "broadcast_in_dim":
            return [self.broadcast(ins, params, out_aval)]
        if name == "reshape":
            if len(ins) != 1 or params.get("dimensions") is not None:
                raise _Reject("reshape")
            return [self.reshape(ins[0], tuple(out_aval.shape))]
        if name == "squeeze":
            (x,) = ins
            dims = {d % len(x.shape) for d in params["dimensions"]}
            if any(x.shape[d] != 1 for d in dims):
                raise _Reject("squeeze")
            keep = [d for d in range(len(x.shape)) if d not in dims]
            return [self.finish(x.poly, [x.dmap[d] for d in keep],
                                tuple(x.shape[d] for d in keep), x.dtype)]
        if name in _CALLS:
            return self.call(name, params, ins)
        raise _Reject(f"primitive {name}")

    def part(self, poly, off):
        """real (off=_RE) or imag (_IM) of poly, where every monomial is one complex input
        times real factors with a real coefficient: that input replaced by its part."""
        out = {}
        for m, c in poly.items():
            cs = [x for x in m if x in self.complex_syms]
            if len(cs) != 1:
                raise _Reject("real/imag of a value not linear in one complex input")
            rest = list(m)
            rest.remove(cs[0])
            out[_mono(*rest, cs[0] + off)] = c
        return out

    @staticmethod
    def unpart(poly, off):
        """The inverse of part: every monomial must hold exactly one part symbol, of kind off."""
        out = {}
        for m, c in poly.items():
            ps = [x for x in m if x >= _RE]
            if len(ps) != 1 or not off <= ps[0] < off + (_IM - _RE):
                raise _Reject("complex of values that are not parts of complex inputs")
            rest = list(m)
            rest.remove(ps[0])
            out[_mono(*rest, ps[0] - off)] = c
        return out

    def call(self, name, params, ins):
        sub = params.get("jaxpr", params.get("call_jaxpr", params.get("fun_jaxpr")))
        if sub is None:
            raise _Reject(f"{name} without a jaxpr")
        if isinstance(sub, jcore.ClosedJaxpr):
            jaxpr, consts = sub.jaxpr, list(sub.consts)
        elif isinstance(sub, jcore.Jaxpr):
            jaxpr, consts = sub, []
        else:
            raise _Reject(f"{name} with a {type(sub).__name__}")
        return self.run(jaxpr, consts, ins)

    def elementwise(self, poly, ins, out_aval):
        shape = tuple(out_aval.shape)
        dims = [[] for _ in shape]
        for x in ins:
            if x.shape == ():
                continue
            if len(x.shape) != len(shape):
                raise _Reject("rank")
            if x.const:
                continue
            for k, (e, n) in enumerate(zip(x.dmap, x.shape)):
                if n != 1 and n != shape[k]:
                    raise _Reject("shape")
                if isinstance(e, int):
                    dims[k].append(e)
        entries = []
        for k, es in enumerate(dims):
            if len(set(es)) > 1:
                raise _Reject("operands disagree on a dimension")
            entries.append(es[0] if es else None)
        return self.finish(poly, entries, shape, np.dtype(out_aval.dtype))

    def broadcast(self, ins, params, out_aval):
        if len(ins) != 1:
            raise _Reject("dynamic shape")
        (x,) = ins
        shape = tuple(params["shape"])
        bdims = tuple(params["broadcast_dimensions"])
        if len(bdims) != len(x.shape) or tuple(out_aval.shape) != shape:
            raise _Reject("broadcast")
        entries = [None] * len(shape)
        for k, j in enumerate(bdims):
            if x.shape[k] == shape[j]:
                entries[j] = x.dmap[k] if isinstance(x.dmap[k], int) else None
            elif x.shape[k] != 1:
                raise _Reject("broadcast")
        return self.finish(x.poly, entries, shape, x.dtype)

    def reshape(self, x, shape):
        """Only reshapes that add or drop size-1 dims: the other dims keep their order."""
        src = [k for k, n in enumerate(x.shape) if n != 1]
        dst = [k for k, n in enumerate(shape) if n != 1]
        if [x.shape[k] for k in src] != [shape[k] for k in dst]:
            raise _Reject("reshape moves data")
        entries = [None] * len(shape)
        for k, j in zip(src, dst):
            entries[j] = x.dmap[k] if isinstance(x.dmap[k], int) else None
        return self.finish(x.poly, entries, shape, x.dtype)

    def finish(self, poly, entries, shape, dtype):
        """Complete a value's dimension map and check the invariant documented on _Val.

        entries: int (a full-shape dim) or None (not known). Unknown dims of size 1
        stay None; unknown dims of size > 1 of a constant become _WILD; those of a
        non-constant value are dims it is broadcast along: it is constant along them,
        so any full-shape dim of that size that keeps the map increasing is correct.
        """
        full = self.full
        val = _Val(poly, entries, shape, dtype)
        if val.const:
            val.dmap = tuple(None if n == 1 else _WILD for n in shape)
            return val
        open_ = [k for k, (e, n) in enumerate(zip(entries, shape)) if e is None and n != 1]
        if open_:
            choices = [[e for e in range(len(full)) if full[e] == shape[k]] for k in open_]
            # prefer right-aligned (numpy) placement, then any that fits
            pref = tuple(k + len(full) - len(shape) for k in open_)
            options = itertools.chain([pref], itertools.product(*choices))
            for opt in itertools.islice(options, 4096):
                trial = list(entries)
                for k, e in zip(open_, opt):
                    trial[k] = e
                if self.valid(poly, trial, shape):
                    val.dmap = tuple(trial)
                    return val
            raise _Reject("no consistent dimension map")
        if not self.valid(poly, entries, shape):
            raise _Reject("elements mixed")
        return val

    def valid(self, poly, dmap, shape):
        full = self.full
        used = []
        for e, n in zip(dmap, shape):
            if e is None:
                if n != 1:
                    return False
            elif not (isinstance(e, int) and 0 <= e < len(full) and full[e] == n and n > 1):
                return False
            else:
                used.append(e)
        if any(u >= v for u, v in zip(used, used[1:])):
            return False
        used = set(used)
        return all(self.varying[s % _RE] <= used for m in poly for s in m)  # a part varies as its input
