"""Tiles of the CPU executor: torch tensors with the semantics of ``lang/semantics.py``.

A ``Tile`` is a runtime value: a tile, or a scalar (a 0-d tensor: ``int`` and ``float``
parameters, program ids, tile indices, In shapes, loop variables). Compile-time values stay
Python numbers. Operators apply the language's promotion and rounding (``arith.py``): fp16
and bf16 computed in fp32 and rounded once per operation, as Triton does on the GPU (unlike
Triton's own interpreter, which does integer math on bf16 bits); a Python number meeting a
tile takes the tile's type; ints wrap; ``//`` and ``%`` follow Python.
"""
from __future__ import annotations

import operator

import torch

from ...dtypes import DType, from_torch
from ...errors import ArgumentError
from ...lang.diagnostics import TILE_AS_VALUE_HINT
from . import arith


def raw(x):
    """The torch tensor or Python scalar inside ``x``."""
    return x.t if isinstance(x, Tile) else x


def as_tensor(x, like: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as a tensor: a compile-time number takes the type it has on its own (int32 or
    int64, fp32, bool)."""
    if isinstance(x, Tile):
        return x.t
    if isinstance(x, torch.Tensor):
        return x
    from ...lang.semantics import weak_dtype
    return arith.to(x, arith.rule(weak_dtype, x))


def scalar(value, dtype: DType) -> "Tile":
    """A runtime scalar of ``dtype`` holding ``value``."""
    return Tile(torch.tensor(value, dtype=dtype.torch))


def binary(op, a, b):
    """``a op b`` (``op`` one of the ``operator`` functions, or "max"/"min")."""
    a, b = raw(a), raw(b)
    symbol = _SYMBOL.get(op, op)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return op(a, b)                   # compile-time values: Python's arithmetic
    if symbol == "**" and isinstance(a, torch.Tensor) and type(b) is int:
        r = a                             # n factors, left to right (lang/semantics.py)
        for _ in range(b - 1):
            r = arith.binary("*", r, a)
        return Tile(r)
    return Tile(arith.binary(symbol, a, b))


def unary_math(fn, x, name: str = "math"):
    """An element-wise math function computed in fp32 for halves (ints give fp32)."""
    t = raw(x)
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"sl.{name} of the compile-time value {t!r}: compute it on the "
                            f"host (math.*), or build a tile with sl.full")
    return Tile(arith.math(fn, name, t))


_SYMBOL = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.pow: "**",
           operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.lshift: "<<",
           operator.rshift: ">>", operator.lt: "<", operator.le: "<=", operator.gt: ">",
           operator.ge: ">=", operator.eq: "==", operator.ne: "!="}


class Tile:
    """A tile value of the CPU executor."""

    __slots__ = ("t",)
    __array_priority__ = 1000

    def __init__(self, t: torch.Tensor):
        self.t = t

    # -- metadata -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.t.shape)

    @property
    def dtype(self) -> DType:
        return from_torch(self.t.dtype)

    @property
    def T(self) -> "Tile":
        if self.t.dim() != 2:
            raise ArgumentError(f"t.T needs a 2-D tile, got shape {self.shape}")
        return Tile(self.t.t())

    def astype(self, dtype: DType) -> "Tile":
        return Tile(arith.cast(self.t, dtype))

    def __repr__(self) -> str:
        return f"Tile({self.t!r})"

    # -- scalar conversion (loop bounds, if conditions, gather indices) -------------------------
    def _scalar(self):
        if self.t.numel() != 1:
            raise ArgumentError(
                f"a tile of shape {self.shape} is used as one Python value (an `if` condition, "
                f"a loop bound, an index, float()), which only a scalar can be: "
                f"{TILE_AS_VALUE_HINT}")
        return self.t.reshape(()).item()

    def __bool__(self):
        return bool(self._scalar())

    def __index__(self):
        if self.t.dtype.is_floating_point or self.t.dtype == torch.bool:
            raise ArgumentError(f"a st.{self.dtype.name} value cannot be used as an index")
        return int(self._scalar())

    __int__ = __index__

    def __float__(self):
        return float(self._scalar())

    def __getitem__(self, item):
        return Tile(self.t[item])

    # -- operators -------------------------------------------------------------------------------
    def __neg__(self):
        return Tile(arith.negate(self.t))

    def __pos__(self):
        return self

    def __invert__(self):
        return Tile(arith.invert(self.t))

    def __abs__(self):
        return Tile(arith.absolute(self.t))

    def __matmul__(self, other):
        return Tile(arith.matmul(self.t, raw(other), None))

    def __rmatmul__(self, other):
        return Tile(arith.matmul(raw(other), self.t, None))


def _binop(op, reflected=False):
    """A binary operator of tiles."""
    if reflected:
        return lambda self, other: binary(op, other, self)
    return lambda self, other: binary(op, self, other)


for _name, _op in [("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv),
                   ("mod", operator.mod), ("pow", operator.pow), ("and", operator.and_),
                   ("or", operator.or_), ("xor", operator.xor), ("lshift", operator.lshift),
                   ("rshift", operator.rshift)]:
    setattr(Tile, f"__{_name}__", _binop(_op))
    setattr(Tile, f"__r{_name}__", _binop(_op, reflected=True))

for _name, _op in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt),
                   ("ge", operator.ge), ("eq", operator.eq), ("ne", operator.ne)]:
    setattr(Tile, f"__{_name}__", _binop(_op))
Tile.__hash__ = None
