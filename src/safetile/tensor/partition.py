"""``Partition``: a tensor split into disjoint tiles, and the program -> tile map.

A Partition is the host form of a mutable kernel output (``st.Out``): each tile program
owns exactly one tile (or, for persistent launches, a fixed set of tiles) and cannot name
any other destination. Tiles need not divide the tensor: edge tiles are masked.

The map from programs to tiles is :class:`ProgramOrder`. The CPU executor and the Triton
code generator both implement the formulas below; they are the contract.

Sequence position -> tile coordinates (``tile_coords(s)``), for ``0 <= s < num_tiles``:

``row_major`` (any rank)
    ``s`` unravelled over ``grid`` in C order (last axis fastest)::

        coords[r-1] = s % grid[r-1]; s //= grid[r-1]; ...; coords[0] = s % grid[0]

``grouped`` (rank 2 only; Triton's grouped ordering for L2 reuse)::

        num_pid_m, num_pid_n = grid
        num_pid_in_group = group_size * num_pid_n
        group_id = s // num_pid_in_group
        first_m  = group_id * group_size
        gsize    = min(num_pid_m - first_m, group_size)
        pid_m    = first_m + (s % num_pid_in_group) % gsize
        pid_n    = (s % num_pid_in_group) // gsize

    i.e. ``group_size`` consecutive tile-rows are walked column by column.

Program -> tiles (``tiles_of_program(p)``):

``persistent=None``
    ``num_programs == num_tiles``; program ``p`` owns the one tile ``tile_coords(p)``.
``persistent=P``
    ``num_programs == min(P, num_tiles)``; program ``p`` owns the tiles at sequence
    positions ``p, p + num_programs, p + 2*num_programs, ... < num_tiles``, in that order.

Both maps are bijections (every tile is owned by exactly one program, exactly once).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import dtypes as _dtypes
from ..errors import ArgumentError, IndexOutOfRangeError, PartitionError
from ..lang.semantics import MAX_DIM, MAX_PROGRAMS, MAX_TILE_ELEMENTS
from .ownership import LOCK, Handle

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from .tensor import Tensor

__all__ = ["Partition", "ProgramOrder", "ORDERS"]

ORDERS = ("row_major", "grouped")

# Tensor methods a Partition does not have (it is the tensor moved into tiles).
_TENSOR_ONLY = frozenset({"to_torch", "numpy", "into_torch", "share", "partition", "view",
                          "reshape", "slice", "stride", "is_contiguous", "numel"})


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ProgramOrder:
    """How tile programs map to tiles: ``kind`` (``"row_major"`` | ``"grouped"``),
    ``group_size`` (tile-rows per group, grouped only), ``grid`` (tiles per axis) and
    ``persistent`` (number of programs requested, or None for one program per tile).

    The formulas are in this module's docstring.
    """

    kind: str
    group_size: int
    grid: tuple[int, ...]
    persistent: int | None = None

    def __post_init__(self):
        if type(self.kind) is not str or self.kind not in ORDERS:
            raise PartitionError(f"order must be one of {ORDERS}, got {self.kind!r}")
        if self.kind == "grouped":
            if len(self.grid) != 2:
                raise PartitionError(
                    f"order='grouped' needs a rank-2 partition (it groups tile-rows of a "
                    f"matrix for L2 reuse), got a rank-{len(self.grid)} grid {self.grid}; "
                    f"use order='row_major'")
            if (isinstance(self.group_size, bool) or not isinstance(self.group_size, int)
                    or self.group_size < 1):
                raise PartitionError(
                    f"group_size must be a positive int, got {self.group_size!r}")
        if self.persistent is not None:
            p = self.persistent
            if isinstance(p, bool) or not isinstance(p, int) or p < 1:
                raise PartitionError(
                    f"persistent must be a positive int (the number of programs) or None, "
                    f"got {p!r}")

    @property
    def num_tiles(self) -> int:
        """Total number of tiles (the product of ``grid``)."""
        n = 1
        for g in self.grid:
            n *= g
        return n

    @property
    def num_programs(self) -> int:
        """Programs launched: ``num_tiles``, or ``min(persistent, num_tiles)``."""
        n = self.num_tiles
        return n if self.persistent is None else min(self.persistent, n)

    def tile_coords(self, s: int) -> tuple[int, ...]:
        """Tile coordinates at sequence position ``s`` (``0 <= s < num_tiles``)."""
        n, s = self.num_tiles, _position(s, "a sequence position")
        if not 0 <= s < n:
            raise IndexOutOfRangeError(f"sequence position {s} out of range for {n} tiles")
        if self.kind == "grouped":
            num_pid_m, num_pid_n = self.grid
            num_pid_in_group = self.group_size * num_pid_n
            group_id = s // num_pid_in_group
            first_m = group_id * self.group_size
            gsize = min(num_pid_m - first_m, self.group_size)
            r = s % num_pid_in_group
            return (first_m + r % gsize, r // gsize)
        coords = []
        for g in reversed(self.grid):
            coords.append(s % g)
            s //= g
        return tuple(reversed(coords))

    def tiles_of_program(self, p: int) -> list[tuple[int, ...]]:
        """The tiles program ``p`` owns, in the order it visits them."""
        np_, p = self.num_programs, _position(p, "a program")
        if not 0 <= p < np_:
            raise IndexOutOfRangeError(f"program {p} out of range for {np_} programs")
        if self.persistent is None:
            return [self.tile_coords(p)]
        return [self.tile_coords(s) for s in range(p, self.num_tiles, np_)]

    def mapping(self) -> list[list[tuple[int, ...]]]:
        """The whole table: ``mapping()[p]`` is ``tiles_of_program(p)``."""
        return [self.tiles_of_program(p) for p in range(self.num_programs)]


def _position(v, what: str) -> int:
    """``v`` as an int (numpy's too, never a bool), else an ``ArgumentError`` naming it."""
    i = _plain_int(v)
    if type(i) is not int:
        raise ArgumentError(f"{what} must be an int, got {type(v).__name__} {v!r}")
    return i


def _plain_int(v):
    """``v`` as a plain int if it is an integer (numpy's too, never a bool), else as it is
    (``ProgramOrder`` refuses it)."""
    if isinstance(v, bool):
        return v
    try:
        return operator.index(v)
    except TypeError:
        return v


def _validate(shape: tuple[int, ...], tile_shape, order: str, group_size: int,
              persistent: int | None) -> tuple[tuple[int, ...], ProgramOrder]:
    """Check partition arguments against a tensor shape; return ``(tile_shape, order)``.

    Raises :class:`PartitionError` with what was wrong and what would be accepted.
    """
    if not isinstance(tile_shape, bool):
        try:
            tile_shape = (operator.index(tile_shape),)  # one int (numpy's too)
        except TypeError:
            pass
    try:
        tiles = tuple(operator.index(d) for d in tile_shape)
        if any(isinstance(d, bool) for d in tile_shape):
            raise TypeError
    except TypeError:
        raise PartitionError(
            f"tile_shape must be a tuple of ints, got {tile_shape!r}") from None
    if len(tiles) != len(shape):
        raise PartitionError(
            f"tile_shape {tiles} has rank {len(tiles)} but the tensor of shape {shape} has "
            f"rank {len(shape)}: give one tile size per dimension (use 1 to keep a dim "
            f"per-element, or reshape first)")
    for i, d in enumerate(tiles):
        if d <= 0 or d & (d - 1):
            lo = 1 << max(d, 1).bit_length() - 1
            raise PartitionError(
                f"tile_shape {tiles}: dim {i} is {d}, but GPU tile sizes must be positive "
                f"powers of two (e.g. {lo} or {lo * 2}); tiles need not divide the tensor, "
                f"edge tiles are masked")
    n = 1
    for d in tiles:
        n *= d
    if n > MAX_TILE_ELEMENTS:
        raise PartitionError(
            f"tile_shape {tiles} has {n} elements, over Triton's limit of {MAX_TILE_ELEMENTS} "
            f"elements per tile; use smaller tiles")
    for i, d in enumerate(shape):
        if d > MAX_DIM:
            raise PartitionError(
                f"dimension {i} of shape {shape} is {d}, over the {MAX_DIM} elements a "
                f"kernel's int32 coordinates address exactly; split the tensor into views")
    grid = tuple(_cdiv(n, t) for n, t in zip(shape, tiles))
    # A str subclass is copied: its == (which the checks, the CPU executor and the code
    # generator each ask, "grouped"?) could answer each differently, and a map one of them
    # takes for row-major and another for grouped is no bijection.
    order = str.__str__(order) if isinstance(order, str) else order
    if order not in ORDERS:
        raise PartitionError(f"order must be one of {ORDERS}, got {order!r}")
    po = ProgramOrder(order, _plain_int(group_size), grid,
                      None if persistent is None else _plain_int(persistent))
    tiles_n = po.num_tiles
    if po.num_programs > MAX_PROGRAMS:
        raise PartitionError(
            f"tile_shape {tiles} makes {tiles_n} tiles, over the {MAX_PROGRAMS} programs one "
            f"launch may have; use larger tiles or persistent=")
    if persistent is not None and tiles_n + po.num_programs > 2**31:
        raise PartitionError(
            f"{tiles_n} tiles walked by {po.num_programs} persistent programs: a program's "
            f"tile counter would pass the int32 range; use larger tiles")
    return tiles, po


class Partition(Handle):
    """A tensor split into disjoint tiles; the host form of an ``st.Out`` argument.

    Made by ``Tensor.partition(tile_shape, ...)`` (which consumes the tensor);
    ``unpartition()`` consumes the Partition and gives the Tensor back.
    """

    __slots__ = ("_tensor", "_tile_shape", "_order")
    _COPY_HINT = "it owns its tensor: unpartition() it and partition a copy of the data"

    def __init__(self, *args, **kwargs):
        raise ArgumentError("make a Partition with tensor.partition(tile_shape)")

    @classmethod
    def _create(cls, tensor: "Tensor", tile_shape: tuple[int, ...],
                order: ProgramOrder) -> "Partition":
        self = object.__new__(cls)
        Handle.__init__(self)
        self._tensor = tensor          # moved; the launcher reads self._tensor._torch
        self._tile_shape = tile_shape
        self._order = order
        return self

    @property
    def _torch(self) -> "torch.Tensor":
        """The whole underlying torch tensor (for the launcher; no state check)."""
        return self._tensor._torch

    def _describe(self) -> str:
        t = self._tensor._torch
        return (f"Partition(shape={tuple(t.shape)}, {_dtypes.from_torch(t.dtype).name}, "
                f"tile_shape={self._tile_shape})")

    def __repr__(self) -> str:
        t = self._tensor._torch
        o = self._order
        extra = "" if o.kind == "row_major" else f", order={o.kind!r}, group_size={o.group_size}"
        if o.persistent is not None:
            extra += f", persistent={o.persistent}"
        return (f"Partition(shape={tuple(t.shape)}, dtype={_dtypes.from_torch(t.dtype)!r}, "
                f"device={t.device}, tile_shape={self._tile_shape}, grid={o.grid}{extra}"
                f"{self._state_suffix()})")

    # -- properties ------------------------------------------------------------------------
    @property
    def grid(self) -> tuple[int, ...]:
        """Tiles per axis: ``ceil(shape[i] / tile_shape[i])``."""
        self._check("read .grid")
        return self._order.grid

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """The shape of every (unmasked) tile."""
        self._check("read .tile_shape")
        return self._tile_shape

    @property
    def num_tiles(self) -> int:
        """The number of tiles."""
        self._check("read .num_tiles")
        return self._order.num_tiles

    @property
    def order(self) -> ProgramOrder:
        """The program -> tile map."""
        self._check("read .order")
        return self._order

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the whole tensor."""
        self._check("read .shape")
        return tuple(self._tensor._torch.shape)

    @property
    def dtype(self) -> _dtypes.DType:
        """Element type of the whole tensor."""
        self._check("read .dtype")
        return _dtypes.from_torch(self._tensor._torch.dtype)

    @property
    def device(self) -> "torch.device":
        """Device of the whole tensor."""
        self._check("read .device")
        return self._tensor._torch.device

    @property
    def ndim(self) -> int:
        """Rank of the tensor (and of every tile)."""
        self._check("read .ndim")
        return len(self._tile_shape)

    def tile_slices(self, coords) -> tuple[slice, ...]:
        """The index region of the tile at ``coords``, clipped to the tensor (edge tiles
        are smaller than ``tile_shape``)."""
        self._check("call .tile_slices()")
        grid = self._order.grid
        try:
            if any(isinstance(c, bool) for c in coords):
                raise TypeError
            coords = tuple(operator.index(c) for c in coords)
        except TypeError:
            raise ArgumentError(f"tile coordinates must be a tuple of ints, one per axis of the "
                                f"grid {grid}, got {coords!r}") from None
        if len(coords) != len(grid) or not all(0 <= c < g for c, g in zip(coords, grid)):
            raise IndexOutOfRangeError(f"tile {coords} out of range for grid {grid}")
        shape = self._tensor._torch.shape
        return tuple(slice(c * t, min((c + 1) * t, n))
                     for c, t, n in zip(coords, self._tile_shape, shape))

    def __getattr__(self, name: str):
        # Only reached for names a Partition lacks: say how to reach a Tensor's methods (with
        # obj=None, so Python's "Did you mean" cannot point at the private ``_torch``).
        if name in _TENSOR_ONLY:
            raise AttributeError(
                f"'Partition' object has no attribute '{name}': a Partition is a tensor split "
                f"into tiles for a kernel's st.Out; call .unpartition() first, then "
                f".{name}() on the Tensor it gives back", name=name, obj=None)
        raise AttributeError(f"'Partition' object has no attribute '{name}'", name=name, obj=self)

    # -- moves -------------------------------------------------------------------------------
    def unpartition(self) -> "Tensor":
        """Consume the Partition and give back the Tensor it was made from."""
        with LOCK:    # atomic: nobody can observe the Partition consumed and the Tensor moved
            self._move("unpartition()", hint="use the Tensor unpartition() returned")
            # The Tensor was moved only into this Partition, which is now consumed.
            self._tensor._restore()
        return self._tensor
