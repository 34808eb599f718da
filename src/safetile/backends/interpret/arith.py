"""The CPU executor's arithmetic: ``lang/semantics.py`` computed with torch.

The type rules come from ``lang.semantics`` (the same functions the per-variant type check
applies); this module computes the values: halves in fp32 rounded once per operation,
ints wrapping in their type, Python's floor division and remainder, saturating float-to-int
conversion, NaN-skipping extrema. Every refusal is a typed error; the type check refuses
the same constructs before a launch, so these are a second line of defence.
"""
from __future__ import annotations

import torch

from ... import dtypes as _d
from ...dtypes import DType, from_torch
from ...errors import ArgumentError, DivisionByZeroError, OutOfBoundsError
from ...lang import semantics as S

HALF = (torch.float16, torch.bfloat16)


def dtype_of(x):
    """A runtime operand's DType, or the Python number itself (a compile-time operand)."""
    return from_torch(x.dtype) if isinstance(x, torch.Tensor) else x


def rule(fn, *args):
    """Apply a semantics rule; its refusal becomes an ``ArgumentError``."""
    try:
        return fn(*args)
    except S.SemanticsError as e:
        raise ArgumentError(str(e)) from None


def to(x, d: DType) -> torch.Tensor:
    """Operand ``x`` (a tensor, or a compile-time number) as a tensor of dtype ``d``."""
    if isinstance(x, torch.Tensor):
        if x.dtype == d.torch:
            return x
        if d.torch is torch.bfloat16 and x.dtype in (torch.int32, torch.int64):
            return _int_to_bf16(x)
        return x.to(d.torch)
    if d.is_float:
        # Compile-time numbers become fp32 first, then the tile's type; zeros are +0.0.
        return torch.tensor(S.compile_time_float(x), dtype=torch.float32).to(d.torch)
    return torch.tensor(int(x), dtype=d.torch)


def _int_to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Ints rounded once to bf16 (to nearest, ties to even), as the GPU converts them
    (``cvt.rn.bf16.s64``): torch goes through fp32 and rounds twice above 2**24. The
    rounding is done on the int64 magnitude, so it is exact over the whole int64 range."""
    x = t.to(torch.int64)
    a = torch.where(x < 0, -x, x)                    # |x| (-2**63 wraps: set at the end)
    _, e = torch.frexp(a.to(torch.float64))          # 2**(e-1) <= a < 2**e, or one more
    e = e.to(torch.int64)                            # where fp64 rounded a up to 2**e
    e = torch.where((e > 0) & ((a >> (e - 1).clamp(min=0)) == 0), e - 1, e)
    shift = (e - 8).clamp(min=0)                     # keep bf16's 8 significant bits
    q = a >> shift
    rest, half = a - (q << shift), (torch.ones_like(shift) << shift) >> 1
    up = (rest > half) | ((rest == half) & (shift > 0) & ((q & 1) == 1))
    mag = torch.ldexp((q + up.to(torch.int64)).to(torch.float64), shift.to(torch.float64))
    out = torch.where(x == -2**63, -(2.0**63), torch.where(x < 0, -mag, mag))
    return out.to(torch.bfloat16)                    # exact: at most 8 significant bits


def _wide(t: torch.Tensor) -> torch.Tensor:
    """Ints narrower than 64 bits widened to int64 (their results then wrap back)."""
    return t.to(torch.int64) if t.dtype in (torch.int8, torch.int32) else t


# The CPU executor checks every lane of a tile, also those whose result is never stored.
_UNUSED_LANES = ("; every lane is checked, also one whose result is never stored: an edge "
                 "tile's lanes past the tensor (a load reads `padding` there, 0 by default) "
                 "or the branch sl.where does not take. Keep such lanes valid: load the divisor "
                 "with x.load(z.index, z.shape, padding=1), or divide (shift) by "
                 "sl.where(ok, b, 1)")


def _floordiv(a: torch.Tensor, b: torch.Tensor, what: str) -> torch.Tensor:
    if bool((b == 0).any()):
        raise DivisionByZeroError(f"integer {what} by zero (on the GPU, x // 0 is 0 and "
                                  f"x % 0 is x){_UNUSED_LANES}")
    wa, wb = _wide(a), _wide(b)
    if wa.dtype == torch.int64 and a.dtype == torch.int64:
        # INT64_MIN // -1 would trap: a // -1 is -a (which wraps)
        neg = wb == -1
        q = torch.div(wa, torch.where(neg, torch.ones_like(wb), wb), rounding_mode="floor")
        return torch.where(neg, -wa, q)
    return torch.div(wa, wb, rounding_mode="floor")


def binary(op: str, a, b) -> torch.Tensor:
    """``a op b`` for operands that are tensors or compile-time numbers (one at least a
    tensor); ``op`` is an operator of ``lang/semantics.py``."""
    comp, res = rule(S.binary, op, dtype_of(a), dtype_of(b))
    ta, tb = to(a, comp), to(b, comp)
    if op in S.COMPARE:
        return _COMPARE[op](ta, tb)
    if op in ("+", "-", "*"):
        if comp.is_float:
            if comp.torch in HALF:
                return _ARITH[op](ta.float(), tb.float()).to(comp.torch)
            return _ARITH[op](ta, tb)
        return _ARITH[op](_wide(ta), _wide(tb)).to(comp.torch)
    if op == "/":
        return ta / tb
    if op == "//":
        return _floordiv(ta, tb, "division").to(comp.torch)
    if op == "%":
        q = _floordiv(ta, tb, "remainder")
        return (_wide(ta) - q * _wide(tb)).to(comp.torch)
    if op in ("<<", ">>"):
        return _shift(op, ta, tb, comp)
    if op in ("&", "|", "^"):
        return _BITWISE[op](ta, tb)
    if op in ("max", "min"):
        if comp.is_float:
            return (torch.fmax if op == "max" else torch.fmin)(ta, tb)
        return (torch.maximum if op == "max" else torch.minimum)(ta, tb)
    raise ArgumentError(f"unknown operator {op!r}")


def _shift(op, ta, tb, comp):
    w = S.bits(comp)
    if comp is _d.bool_:
        raise ArgumentError("shifts take ints, got bools: convert with .astype(st.int32)")
    if bool(((tb < 0) | (tb >= w)).any()):
        bad = int(tb[(tb < 0) | (tb >= w)].reshape(-1)[0])
        raise OutOfBoundsError(f"shift by {bad} outside [0, {w}) for st.{comp.name} (on the GPU "
                               f"such a shift gives 0, or the sign fill for >>){_UNUSED_LANES}")
    wa = _wide(ta)
    r = wa << tb if op == "<<" else wa >> tb
    return r.to(comp.torch)


_ARITH = {"+": torch.add, "-": torch.sub, "*": torch.mul}
_COMPARE = {"<": torch.lt, "<=": torch.le, ">": torch.gt, ">=": torch.ge, "==": torch.eq,
            "!=": torch.ne}
_BITWISE = {"&": torch.bitwise_and, "|": torch.bitwise_or, "^": torch.bitwise_xor}


def negate(t: torch.Tensor) -> torch.Tensor:
    """``-t``: ``0 - t`` (``-(+0.0)`` is ``+0.0``, as in Triton); ints wrap."""
    rule(S.unary, "-", from_torch(t.dtype))
    if t.is_floating_point():
        return torch.zeros_like(t) - t
    return (-_wide(t)).to(t.dtype)


def invert(t: torch.Tensor) -> torch.Tensor:
    rule(S.unary, "~", from_torch(t.dtype))
    return ~t


def absolute(t: torch.Tensor) -> torch.Tensor:
    rule(S.unary, "abs", from_torch(t.dtype))
    if t.is_floating_point():
        return t.abs()
    return _wide(t).abs().to(t.dtype)


def math(fn, name: str, t: torch.Tensor) -> torch.Tensor:
    """An element-wise math function: halves in fp32 rounded back, ints give fp32; a
    subnormal argument of a function that flushes it is a zero (lang/semantics.py)."""
    d = rule(S.math_dtype, name, from_torch(t.dtype))
    x = t.float()
    if name in S.FLUSHES_SUBNORMALS:
        x = torch.where(x.abs() < 2.0**-126, x * 0.0, x)      # keeps the zero's sign
    return fn(x).to(d.torch)


def cast(t: torch.Tensor, d: DType) -> torch.Tensor:
    """``t.astype(d)``: float to int truncates and saturates (NaN gives 0); int to int wraps;
    to bool is ``!= 0``; float to float rounds to nearest even."""
    if t.dtype == d.torch:
        return t
    if t.is_floating_point() and d.torch not in (torch.bool,) and not d.is_float:
        lo, hi = S.int_range(d)
        x = t.float().trunc()
        inside = (x >= float(lo)) & (x < float(hi) + 1)
        r = torch.where(inside, x, torch.zeros_like(x)).to(torch.float64).to(torch.int64)
        r = torch.where(x >= float(hi) + 1, torch.full_like(r, hi), r)
        r = torch.where(x < float(lo), torch.full_like(r, lo), r)
        return r.to(d.torch)
    if d is _d.bool_:
        return t != 0
    return to(t, d)


def where(c, a, b) -> torch.Tensor:
    d = rule(S.where_dtype, dtype_of(a), dtype_of(b))
    cond = c if isinstance(c, torch.Tensor) else torch.tensor(bool(c))
    return torch.where(cond if cond.dtype == torch.bool else cond != 0, to(a, d), to(b, d))


def fill(shape, value, d: DType) -> torch.Tensor:
    """``sl.full``: a compile-time value (checked representable) or a runtime scalar
    converted as ``astype`` does."""
    if isinstance(value, torch.Tensor):
        return torch.broadcast_to(cast(value.reshape(()), d), tuple(shape)).clone()
    rule(S.representable, value, d, "the fill value of")
    return torch.broadcast_to(to(value, d), tuple(shape)).clone()


def store_value(value, d: DType) -> torch.Tensor:
    """A value stored into an Out of dtype ``d``."""
    if isinstance(value, torch.Tensor):
        rule(S.store_check, from_torch(value.dtype), d)
        return cast(value, d)
    rule(S.store_check, value, d)
    return to(value, d)


def reduce(name: str, t: torch.Tensor, axis) -> torch.Tensor:
    """``sl.sum / max / min / argmax / argmin`` along ``axis`` (None: all axes)."""
    d = rule(S.reduction_dtype, name, from_torch(t.dtype))
    if axis is None:
        t, axis = t.reshape(-1), 0
    if name == "sum":
        if t.dtype in HALF:
            return torch.sum(t.float(), axis).to(t.dtype)
        return torch.sum(_wide(t), axis).to(d.torch)
    if name in ("max", "min"):
        v = t.to(d.torch)
        if not v.is_floating_point():
            return (torch.amax if name == "max" else torch.amin)(v, axis)
        nan = torch.isnan(v)
        neutral = float("-inf") if name == "max" else float("inf")
        r = (torch.amax if name == "max" else torch.amin)(
            torch.where(nan, torch.tensor(neutral, dtype=v.dtype), v), axis)
        return torch.where(nan.all(axis), torch.tensor(float("nan"), dtype=v.dtype), r)
    v = t
    if v.is_floating_point():             # NaN is skipped: it never wins
        neutral = float("-inf") if name == "argmax" else float("inf")
        v = torch.where(torch.isnan(v), torch.tensor(neutral, dtype=v.dtype), v)
    return (torch.argmax if name == "argmax" else torch.argmin)(v, axis).to(torch.int32)


def matmul(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor | None) -> torch.Tensor:
    """``acc + a @ b`` (acc None: zeros): fp32 accumulation for floats, int32 for int8."""
    out = rule(S.mma_check, from_torch(a.dtype), from_torch(b.dtype),
               from_torch(acc.dtype) if acc is not None else None, a.shape[-1])
    if out.is_float:
        r = a.float() @ b.float()
        return r if acc is None else acc.float() + r
    r = a.to(torch.int64) @ b.to(torch.int64)
    return (r if acc is None else acc.to(torch.int64) + r).to(torch.int32)
