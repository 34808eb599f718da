"""The CPU executor's implementation of every ``safetile.lang`` operation."""
from __future__ import annotations

import torch

from ... import dtypes as _d
from . import arith
from .tile import Tile, as_tensor, raw, scalar, unary_math
from .views import tile_shape


def _t(x, like=None) -> torch.Tensor:
    return as_tensor(x, like)


def _runtime(x, what: str) -> torch.Tensor:
    t = raw(x)
    if not isinstance(t, torch.Tensor):
        from ...errors import ArgumentError
        raise ArgumentError(f"{what} of the compile-time value {t!r}: it needs a runtime "
                            f"value (a tile or a scalar)")
    return t


class Implementation:
    """sl.* for one program of the CPU executor: ``program`` of the launch ``grid``; ``tile``:
    ``(coordinates, grid)`` of its tile when the launch is over an Out grid (not persistent)."""

    def __init__(self, program: int, grid: tuple, tile: tuple | None = None):
        self.program = program
        self.grid = grid
        self.tile = tile

    # element-wise
    def where(self, cond, a, b):
        return Tile(arith.where(raw(cond), raw(a), raw(b)))

    def exp(self, x): return unary_math(torch.exp, x, "exp")
    def exp2(self, x): return unary_math(torch.exp2, x, "exp2")
    def log(self, x): return unary_math(torch.log, x, "log")
    def log2(self, x): return unary_math(torch.log2, x, "log2")
    def sqrt(self, x): return unary_math(torch.sqrt, x, "sqrt")
    def rsqrt(self, x): return unary_math(torch.rsqrt, x, "rsqrt")
    def sin(self, x): return unary_math(torch.sin, x, "sin")
    def cos(self, x): return unary_math(torch.cos, x, "cos")
    def tanh(self, x): return unary_math(torch.tanh, x, "tanh")
    def sigmoid(self, x): return unary_math(torch.sigmoid, x, "sigmoid")

    def abs(self, x):
        return Tile(arith.absolute(_runtime(x, "sl.abs")))

    # NaN: Triton's defaults (maxnum/minnum) let the other operand win, so these do too.
    def maximum(self, a, b):
        return Tile(arith.binary("max", raw(a), raw(b)))

    def minimum(self, a, b):
        return Tile(arith.binary("min", raw(a), raw(b)))

    # reductions
    def sum(self, t, axis=None):
        return Tile(arith.reduce("sum", _runtime(t, "sl.sum"), _axis(axis)))

    def max(self, t, axis=None):
        return Tile(arith.reduce("max", _runtime(t, "sl.max"), _axis(axis)))

    def min(self, t, axis=None):
        return Tile(arith.reduce("min", _runtime(t, "sl.min"), _axis(axis)))

    def argmax(self, t, axis):
        return Tile(arith.reduce("argmax", _runtime(t, "sl.argmax"), _axis(axis)))

    def argmin(self, t, axis):
        return Tile(arith.reduce("argmin", _runtime(t, "sl.argmin"), _axis(axis)))

    # matrix products
    def mma(self, a, b, acc):
        return Tile(arith.matmul(_t(a), _t(b), _t(acc)))

    def matmul(self, a, b):
        return Tile(arith.matmul(_t(a), _t(b), None))

    # shape
    def reshape(self, t, shape):
        return Tile(_t(t).reshape(tile_shape(shape, _rank(shape), "sl.reshape shape")))

    def broadcast_to(self, t, shape):
        return Tile(_t(t).broadcast_to(tile_shape(shape, _rank(shape),
                                                  "sl.broadcast_to shape")))

    def permute(self, t, dims):
        return Tile(_t(t).permute(*dims))

    def transpose(self, t):
        return Tile(_t(t)).T

    # construction and geometry
    def arange(self, n):
        (n,) = tile_shape((n,), 1, "sl.arange")
        return Tile(torch.arange(n, dtype=torch.int32))

    def full(self, shape, value, dtype):
        shape = tile_shape(shape, len(tuple(shape)), "sl.full shape")
        return Tile(arith.fill(shape, raw(value), dtype))

    def zeros(self, shape, dtype):
        shape = tile_shape(shape, len(tuple(shape)), "sl.zeros shape")
        return Tile(torch.zeros(shape, dtype=dtype.torch))

    # A launch has three axes, as on the GPU: past the grid's own, one program each.
    def bid(self, axis):
        coords = self.tile[0] if self.tile is not None else _unravel(self.program, self.grid)
        return scalar(coords[axis] if axis < len(coords) else 0, _d.int32)

    def num_blocks(self, axis):
        grid = self.tile[1] if self.tile is not None else self.grid
        return scalar(grid[axis] if axis < len(grid) else 1, _d.int32)

    def cdiv(self, a, b):
        a, b = raw(a), raw(b)
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return _cdiv(a, b)
        return -(-a // b)

    # unsafe pointer operations
    def load_ptr(self, p, offsets, mask=None, other=0):
        return p.load(self.program, offsets, mask, other)

    def store_ptr(self, p, offsets, value, mask=None):
        p.store(self.program, offsets, value, mask)

    def atomic_add(self, p, offsets, value, mask=None):
        return p.atomic_add(self.program, offsets, value, mask)


def _rank(shape) -> int:
    """The rank of a shape: one axis for a bare int (Triton's reshape and broadcast_to take
    one)."""
    return len(shape) if isinstance(shape, (tuple, list)) else 1


def _axis(axis):
    return None if axis is None else int(axis)


def _cdiv(a, b) -> Tile:
    """The ceiling of a / b: floor(a / b), plus one where b does not divide a."""
    q = arith.binary("//", a, b)
    r = arith.binary("%", a, b)
    return Tile(torch.where(r != 0, q + 1, q).to(q.dtype))


def _unravel(p: int, grid: tuple) -> tuple:
    """Program ids along each launch axis (axis 0 fastest, as CUDA orders a grid)."""
    out = []
    for g in grid:
        out.append(p % g)
        p //= g
    return tuple(out)
