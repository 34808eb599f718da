"""Tiles of the CPU executor: torch tensors with the GPU's arithmetic rules.

fp16 and bf16 values are computed in fp32 and rounded back after every operation, as Triton
does on the GPU (unlike Triton's own interpreter, which does integer math on bf16 bits); a
Python number meeting a half tile is first rounded to the tile's type, as Triton does.
Integer ``//`` and ``%`` of tiles truncate toward zero, as in Triton. (Plain Python ints in a
kernel body, such as loop indices and int parameters, follow Python's rules on the CPU:
negative operands of ``//``/``%`` and int32 overflow are where the two can differ.)
"""
from __future__ import annotations

import operator

import torch

from ..dtypes import DType, from_torch
from ..errors import ArgumentError

HALF = (torch.float16, torch.bfloat16)


def raw(x):
    """The torch tensor or Python scalar inside ``x``."""
    return x.t if isinstance(x, Tile) else x


def as_tensor(x, like: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(x, Tile):
        return x.t
    if isinstance(x, torch.Tensor):
        return x
    device = like.device if like is not None else "cpu"
    if isinstance(x, bool):
        return torch.tensor(x, device=device)
    if isinstance(x, int):
        return torch.tensor(x, dtype=torch.int32 if -2**31 <= x < 2**31 else torch.int64, device=device)
    return torch.tensor(x, dtype=torch.float32, device=device)


def _result_dtype(a, b) -> torch.dtype:
    return torch.result_type(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) \
        else torch.result_type(as_tensor(a), as_tensor(b))


def _up(x):
    if isinstance(x, torch.Tensor) and x.dtype in HALF:
        return x.float()
    return x


def binary(op, a, b):
    """Apply ``op`` with GPU rounding: halves computed in fp32, then rounded."""
    a, b = raw(a), raw(b)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        return Tile(as_tensor(op(a, b)))
    dtype = _result_dtype(a, b)
    if op in (operator.floordiv, operator.mod) and not dtype.is_floating_point:
        ta, tb = as_tensor(a), as_tensor(b)
        mode = torch.div(ta, tb, rounding_mode="trunc")
        r = mode if op is operator.floordiv else ta - mode * tb
        return Tile(r.to(dtype))
    if dtype in HALF:
        # Triton first converts a Python number to the tile's half type (0.1 becomes
        # bf16(0.1), 1e5 becomes fp16 inf), then computes; so does this.
        if not isinstance(a, torch.Tensor):
            a = torch.tensor(a, dtype=dtype)
        if not isinstance(b, torch.Tensor):
            b = torch.tensor(b, dtype=dtype)
    r = op(_up(a), _up(b))
    if isinstance(r, torch.Tensor) and r.dtype.is_floating_point and dtype in HALF:
        r = r.to(dtype)
    return Tile(r)


def unary_math(fn, x):
    """An element-wise math function computed in fp32 for halves."""
    t = as_tensor(x)
    if t.dtype in HALF:
        return Tile(fn(t.float()).to(t.dtype))
    if not t.dtype.is_floating_point:
        t = t.float()
    return Tile(fn(t))


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
        return Tile(self.t.to(dtype.torch))

    def __repr__(self) -> str:
        return f"Tile({self.t!r})"

    # -- scalar conversion (loop bounds, if conditions, gather indices) -------------------------
    def _scalar(self):
        if self.t.numel() != 1:
            raise ArgumentError(
                f"a tile of shape {self.shape} is used as one Python value (an `if` condition, "
                f"a loop bound, an index, float()), which only a scalar can "
                f"be: for an element-wise choice use sl.where(cond, a, b); to decide on the "
                f"whole tile reduce it first (sl.max(t, 0), sl.sum(t, 0))")
        return self.t.reshape(()).item()

    def __bool__(self):
        return bool(self._scalar())

    def __index__(self):
        if self.t.dtype.is_floating_point:
            raise TypeError("a float tile cannot be used as an index")
        return int(self._scalar())

    __int__ = __index__

    def __float__(self):
        return float(self._scalar())

    def __getitem__(self, item):
        return Tile(self.t[item])

    # -- operators -------------------------------------------------------------------------------
    def __neg__(self):
        return Tile(-self.t)

    def __pos__(self):
        return self

    def __invert__(self):
        return Tile(~self.t)

    def __abs__(self):
        return Tile(self.t.abs())

    def __matmul__(self, other):
        from .impl import matmul
        return matmul(self, other)


def _binop(op, reflected=False):
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
