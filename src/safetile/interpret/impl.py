"""The CPU executor's implementation of every ``safetile.lang`` operation."""
from __future__ import annotations

import torch

from .tile import HALF, Tile, as_tensor, binary, raw, unary_math
from .views import tile_shape


def _t(x, like=None) -> torch.Tensor:
    return as_tensor(x, like)


def matmul(a, b):
    ta, tb = _t(a), _t(b)
    if ta.dtype.is_floating_point:
        return Tile(ta.float() @ tb.float())
    return Tile((ta.to(torch.int64) @ tb.to(torch.int64)).to(torch.int32))


def _ignoring_nan(fn, v: torch.Tensor, axis: int, neutral: float) -> torch.Tensor:
    """``fn`` (amax/amin) along ``axis`` with NaN elements skipped, NaN only if all are NaN:
    what Triton's reductions (maxnum/minnum combine) give."""
    if not v.is_floating_point():
        return fn(v, axis)
    nan = torch.isnan(v)
    r = fn(torch.where(nan, torch.tensor(neutral, dtype=v.dtype), v), axis)
    return torch.where(nan.all(axis), torch.tensor(float("nan"), dtype=v.dtype), r)


def _reduce(t: torch.Tensor, axis, fn):
    if axis is None:
        return fn(t.reshape(-1), 0)
    return fn(t, axis)


class Implementation:
    """sl.* for one program of the CPU executor (``program`` and ``num_programs`` for bid)."""

    def __init__(self, program: int, grid: tuple):
        self.program = program
        self.grid = grid

    # element-wise
    def where(self, cond, a, b):
        c = _t(cond).bool()
        ta, tb = raw(a), raw(b)
        if isinstance(ta, torch.Tensor) or isinstance(tb, torch.Tensor):
            dtype = torch.result_type(ta, tb)
        else:
            dtype = torch.result_type(_t(ta), _t(tb))
        return Tile(torch.where(c, _t(ta, c).to(dtype), _t(tb, c).to(dtype)))

    def exp(self, x): return unary_math(torch.exp, x)
    def exp2(self, x): return unary_math(torch.exp2, x)
    def log(self, x): return unary_math(torch.log, x)
    def log2(self, x): return unary_math(torch.log2, x)
    def sqrt(self, x): return unary_math(torch.sqrt, x)
    def rsqrt(self, x): return unary_math(torch.rsqrt, x)
    def sin(self, x): return unary_math(torch.sin, x)
    def cos(self, x): return unary_math(torch.cos, x)
    def tanh(self, x): return unary_math(torch.tanh, x)
    def sigmoid(self, x): return unary_math(torch.sigmoid, x)

    def abs(self, x):
        return Tile(_t(x).abs())

    # NaN: Triton's defaults (maxnum/minnum) let the other operand win, so these do too.
    def maximum(self, a, b):
        return binary(torch.fmax, Tile(_t(a)), Tile(_t(b)))

    def minimum(self, a, b):
        return binary(torch.fmin, Tile(_t(a)), Tile(_t(b)))

    # reductions
    def sum(self, t, axis=None):
        x = _t(t)
        if x.dtype in HALF:
            return Tile(_reduce(x.float(), axis, torch.sum).to(x.dtype))
        if x.dtype in (torch.int8, torch.bool):
            return Tile(_reduce(x.to(torch.int32), axis, torch.sum).to(torch.int32))
        return Tile(_reduce(x, axis, torch.sum).to(x.dtype))

    def max(self, t, axis=None):
        return Tile(_reduce(_t(t), axis, lambda v, a: _ignoring_nan(torch.amax, v, a, float("-inf"))))

    def min(self, t, axis=None):
        return Tile(_reduce(_t(t), axis, lambda v, a: _ignoring_nan(torch.amin, v, a, float("inf"))))

    def argmax(self, t, axis):
        return Tile(torch.argmax(_t(t), axis).to(torch.int32))

    def argmin(self, t, axis):
        return Tile(torch.argmin(_t(t), axis).to(torch.int32))

    # matrix products
    def mma(self, a, b, acc):
        tacc = _t(acc)
        return Tile((tacc.float() + matmul(a, b).t.float()).to(tacc.dtype))

    def matmul(self, a, b):
        return matmul(a, b)

    # shape
    def reshape(self, t, shape):
        return Tile(_t(t).reshape(tuple(int(s) for s in shape)))

    def broadcast_to(self, t, shape):
        return Tile(_t(t).broadcast_to(tuple(int(s) for s in shape)))

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
        return Tile(torch.full(shape, raw(value), dtype=dtype.torch))

    def zeros(self, shape, dtype):
        shape = tile_shape(shape, len(tuple(shape)), "sl.zeros shape")
        return Tile(torch.zeros(shape, dtype=dtype.torch))

    def bid(self, axis):
        return _unravel(self.program, self.grid)[axis]

    def num_blocks(self, axis):
        return self.grid[axis]

    def cdiv(self, a, b):
        a, b = raw(a), raw(b)
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return Tile(-torch.div(-_t(a), _t(b), rounding_mode="floor"))
        return -(-a // b)

    # unsafe pointer operations
    def load_ptr(self, p, offsets, mask=None, other=0):
        return p.load(self.program, offsets, mask, other)

    def store_ptr(self, p, offsets, value, mask=None):
        p.store(self.program, offsets, value, mask)

    def atomic_add(self, p, offsets, value, mask=None):
        return p.atomic_add(self.program, offsets, value, mask)


def _unravel(p: int, grid: tuple) -> tuple:
    """Program ids along each launch axis (axis 0 fastest, as CUDA orders a grid)."""
    out = []
    for g in grid:
        out.append(p % g)
        p //= g
    return tuple(out)
