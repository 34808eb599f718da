"""Parameter views of the CPU executor, with bounds and write-set checks.

Every store records which program wrote each element (``writer``, -1 for none). A second
program writing the element, or reading it, is a race: ``RaceError`` names the kernel, both
programs and the element. Raw-pointer views also remember readers, so a read followed by
another program's write is caught whatever order the shuffled programs run in.
"""
from __future__ import annotations

import math

import torch

from ... import dtypes as _d
from ...errors import ArgumentError, LaunchError, OutOfBoundsError, RaceError
from ...lang.semantics import MAX_TILE_ELEMENTS, representable
from . import arith
from .tile import Tile, as_tensor, scalar

NONE, MANY = -1, -2


def _coord(flat: int, shape: tuple) -> tuple:
    out = []
    for s in reversed(shape):
        out.append(flat % s)
        flat //= s
    return tuple(reversed(out))


def _ints(index, rank: int, what: str) -> tuple:
    if not isinstance(index, (tuple, list)):
        index = (index,)
    if len(index) != rank:
        raise ArgumentError(f"{what} needs {rank} entries, got {len(index)}")
    return tuple(int(i) for i in index)


def tile_shape(shape, rank: int, what: str) -> tuple:
    """``shape`` as compile-time ints, each a positive power of two, at most 2**20 elements
    in all: the GPU builds every tile from ``tl.arange`` with a compile-time size, so the CPU
    executor refuses what the GPU cannot compile (a runtime value, such as ``x.shape[0]``,
    is not a tile size)."""
    if not isinstance(shape, (tuple, list)):
        shape = (shape,)
    if any(isinstance(d, Tile) or isinstance(d, bool) or not isinstance(d, int) for d in shape):
        raise ArgumentError(f"{what} {tuple(shape)}: tile sizes must be compile-time ints "
                            f"(literals, Const parameters, z.shape)")
    dims = _ints(shape, rank, what)
    if any(d < 1 or d & (d - 1) for d in dims):
        raise ArgumentError(f"{what} {dims}: tile sizes must be powers of two (the GPU builds "
                            f"tiles from tl.arange); pad to the next power of two and mask")
    n = 1
    for d in dims:
        n *= d
    if n > MAX_TILE_ELEMENTS:
        raise ArgumentError(f"{what} {dims} has {n} elements, over Triton's limit of "
                            f"{MAX_TILE_ELEMENTS} per tile")
    return dims


class Launch:
    """Shared state of one interpreted launch: names programs in messages."""

    def __init__(self, kernel_name: str, describe_program):
        self.kernel = kernel_name
        self.describe = describe_program     # program id -> "program 3 (tile (0, 3))"
        self.program = 0


class InView:
    """A read-only input: tile-grid loads with padding, scalar loads."""

    def __init__(self, name: str, t: torch.Tensor):
        self.name, self._t = name, t
        self._shape = tuple(t.shape)
        self.shape = tuple(scalar(n, _d.int32) for n in self._shape)   # runtime int32 values

    def load(self, index, shape, padding=0):
        r = self._t.dim()
        shape = tile_shape(shape, r, f"load of '{self.name}': shape")
        index = _ints(index, r, f"load of '{self.name}': index")
        return Tile(_read_box(self._t, [i * s for i, s in zip(index, shape)], shape, padding))

    def load_at(self, offset, shape, padding=0):
        """The box of ``shape`` starting at element ``offset`` (any ints, negative too)."""
        r = self._t.dim()
        shape = tile_shape(shape, r, f"load_at of '{self.name}': shape")
        offset = _ints(offset, r, f"load_at of '{self.name}': offset")
        return Tile(_read_box(self._t, list(offset), shape, padding))

    def prefetch(self, index, shape):
        """An L2 prefetch hint: on the CPU nothing to do. The index and shape are checked as a
        load's are; a box partly or wholly outside the tensor is legal (the GPU masks those
        lanes off, as a load reads them as padding)."""
        r = self._t.dim()
        shape = _ints(shape, r, f"prefetch of '{self.name}': shape")
        _ints(index, r, f"prefetch of '{self.name}': index")
        if any(s <= 0 for s in shape):
            raise ArgumentError(f"prefetch of '{self.name}': shape {shape} must be positive")
        return None

    def load_scalar(self, index, padding=0):
        e = _ints(index, self._t.dim(), f"load_scalar of '{self.name}': index")
        if all(0 <= i < n for i, n in zip(e, self._shape)):
            return Tile(self._t[e].clone())
        return Tile(_pad((), padding, self._t.dtype))


def _pad(shape, padding, dtype: torch.dtype) -> torch.Tensor:
    """A box of ``padding`` (a compile-time number, converted as the language converts it)."""
    d = _d.from_torch(dtype)
    arith.rule(representable, padding, d, "padding of")
    return torch.broadcast_to(arith.to(padding, d), tuple(shape)).clone()


def _read_box(t: torch.Tensor, start, shape, padding) -> torch.Tensor:
    """Elements ``start + [0, shape)`` of ``t``; outside ``t`` they read ``padding``."""
    out = _pad(shape, padding, t.dtype)
    src, dst = _clip(start, shape, t.shape)
    if src is not None:
        out[dst] = t[src]
    return out


def _clip(start, shape, bounds):
    """Slices of the in-bounds part: (into the tensor, into the box), or (None, None)."""
    src, dst = [], []
    for s, n, b in zip(start, shape, bounds):
        lo, hi = max(s, 0), min(s + n, b)
        if lo >= hi:
            return None, None
        src.append(slice(lo, hi))
        dst.append(slice(lo - s, hi - s))
    return tuple(src), tuple(dst)


class OutView:
    """The owned tile of an Out partition for the current program."""

    def __init__(self, name: str, t: torch.Tensor, tile_shape: tuple, launch: Launch):
        self.name, self._t, self.shape, self.launch = name, t, tuple(tile_shape), launch
        self.writer = torch.full(tuple(t.shape), NONE, dtype=torch.int32, device=t.device)
        self.coords = None           # current tile coordinates; None outside tiles() when persistent
        self.tiles_of = None         # set by the executor: program's list of tiles
        self.group = None            # all Out views of the launch (moved together by tiles())

    @property
    def index(self) -> tuple:
        """The owned tile's coordinates, as int32 scalars (runtime values, as on the GPU)."""
        if self.coords is None:
            self._start()
        return tuple(scalar(i, _d.int32) for i in self.coords)

    def _start(self):
        if self.coords is None:
            raise LaunchError(f"kernel '{self.launch.kernel}': Out '{self.name}' is a persistent "
                               f"partition; reach its tiles with `for t in {self.name}.tiles():`")
        return [i * s for i, s in zip(self.coords, self.shape)]

    def load(self):
        return Tile(self._checked_read(self._start(), self.shape))

    def store(self, value):
        self._checked_write(self._start(), self.shape, value, slab=None)

    def partition(self, sub_shape):
        return SubView(self, tile_shape(sub_shape, len(self.shape),
                                        f"partition of '{self.name}': sub-tile shape"))

    def tiles(self):
        persistent = self.coords is None
        for coords in self.tiles_of:
            for v in self.group:
                v.coords = coords
            yield self
        if persistent:                   # as on the GPU: no owned tile after the loop
            for v in self.group:
                v.coords = None

    # -- checked access ----------------------------------------------------------------------
    def _checked_read(self, start, shape):
        src, dst = _clip(start, shape, self._t.shape)
        if src is not None:
            self._race(self.writer[src], "reads", start=[s.start for s in src])
        return _read_box(self._t, start, shape, 0)

    def _checked_write(self, start, shape, value, slab):
        v = arith.store_value(value.t if isinstance(value, Tile) else value,
                              _d.from_torch(self._t.dtype))
        try:
            v = torch.broadcast_to(v, shape)
        except RuntimeError:
            raise ArgumentError(f"kernel '{self.launch.kernel}': store of a tile of shape "
                             f"{tuple(v.shape)} into '{self.name}' region of shape {shape}") from None
        bounds = list(self._t.shape)
        if slab is not None:                    # a sub-tile never leaves the owned slab
            bounds = [min(b, h) for b, h in zip(bounds, slab)]
        src, dst = _clip(start, shape, bounds)
        if src is None:
            return
        self._race(self.writer[src], "writes", start=[s.start for s in src])
        self.writer[src] = self.launch.program
        self._t[src] = v[dst]

    def _race(self, w: torch.Tensor, verb: str, start):
        p = self.launch.program
        bad = (w != NONE) & (w != p)
        if bool(bad.any()):
            local = [int(i) for i in bad.nonzero()[0]]
            q = int(w[tuple(local)])
            coord = tuple(s + i for s, i in zip(start, local))
            also = " also" if verb == "writes" else ""
            raise RaceError(f"kernel '{self.launch.kernel}': {self.launch.describe(p)} {verb} "
                            f"element {coord} of '{self.name}', which "
                            f"{self.launch.describe(q)}{also} writes")


class SubView:
    """``z.partition(sub_shape)``: sub-tiles inside the owned slab of ``z``."""

    def __init__(self, out: OutView, sub_shape: tuple):
        self.out, self.shape = out, sub_shape

    def _start(self, sub_index):
        j = _ints(sub_index, len(self.shape), f"sub-tile index of '{self.out.name}'")
        grid = [math.ceil(t / s) for t, s in zip(self.out.shape, self.shape)]
        if not all(0 <= a < g for a, g in zip(j, grid)):
            raise OutOfBoundsError(
                f"kernel '{self.out.launch.kernel}', {self.out.launch.describe(self.out.launch.program)}: "
                f"sub-tile index {j} of '{self.out.name}' is outside the owned slab's sub-grid "
                f"{tuple(grid)} (tile {self.out.shape}, sub-tile {self.shape}); on the GPU such "
                f"a store is masked off")
        base = self.out._start()
        return [b + a * s for b, a, s in zip(base, j, self.shape)], base

    def store(self, value, sub_index):
        start, base = self._start(sub_index)
        slab_end = [b + t for b, t in zip(base, self.out.shape)]
        self.out._checked_write(start, self.shape, value, slab_end)

    def load(self, sub_index):
        start, base = self._start(sub_index)
        hi = [b + t for b, t in zip(base, self.out.shape)]
        shape = [min(s, h - st) for s, h, st in zip(self.shape, hi, start)]
        box = self.out._checked_read(start, shape)
        return Tile(_read_box(box, [0] * len(shape), self.shape, 0))


_VERBS = {"writer": "writes", "reader": "reads", "atomic": "atomically updates"}
_PLURAL = {"writer": "write", "reader": "read", "atomic": "atomically update"}


def _mark(table: torch.Tensor, active: torch.Tensor, program: int) -> None:
    """Record that ``program`` accessed elements ``active`` (MANY once several programs did)."""
    r = table[active]
    table[active] = torch.where(r == NONE, program, torch.where(r == program, r, MANY)).to(torch.int32)


class PtrView:
    """A raw pointer (unsafe kernels): element offsets into a contiguous buffer."""

    def __init__(self, name: str, t: torch.Tensor, launch: Launch):
        self.name, self.launch = name, launch
        self._flat = t.view(-1)
        self._shape = tuple(t.shape)
        n = self._flat.numel()
        # per element: the program that stored, read or atomically updated it (MANY: more
        # than one). Atomic updates of one element by several programs commute; any other
        # access by two programs, one of them a store or an atomic update, is a race.
        self.writer = torch.full((n,), NONE, dtype=torch.int32)
        self.reader = torch.full((n,), NONE, dtype=torch.int32)
        self.atomic = torch.full((n,), NONE, dtype=torch.int32)

    def _lanes(self, program, offsets, mask, op):
        off = as_tensor(offsets).to(torch.int64).reshape(-1)
        m = torch.ones_like(off, dtype=torch.bool) if mask is None else \
            torch.broadcast_to(as_tensor(mask).bool(), as_tensor(offsets).shape).reshape(-1)
        active = off[m]
        bad = (active < 0) | (active >= self._flat.numel())
        if bool(bad.any()):
            o = int(active[bad][0])
            raise OutOfBoundsError(f"kernel '{self.launch.kernel}', {self.launch.describe(program)}: "
                                   f"sl.{op} at element offset {o} is outside '{self.name}' "
                                   f"({self._flat.numel()} elements, shape {self._shape})")
        return off, m, active

    def _conflict(self, program, table, active):
        owners = table[active]
        bad = (owners != NONE) & (owners != program)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            return int(active[i]), int(owners[i])
        return None

    def _check(self, program, active, verb: str, tables: tuple) -> None:
        """Raise ``RaceError`` if another program accessed an element of ``active`` in a way
        ``tables`` names (``"writer"``, ``"reader"``, ``"atomic"``)."""
        for name in tables:
            c = self._conflict(program, getattr(self, name), active)
            if c:
                off, other = c
                el = _coord(off, self._shape)
                others = f"several other programs also {_PLURAL[name]} it" if other == MANY \
                    else f"{self.launch.describe(other)} also {_VERBS[name]} it"
                raise RaceError(f"kernel '{self.launch.kernel}': {self.launch.describe(program)} "
                                f"{verb} element {el} of '{self.name}' (offset {off}); {others}")

    def load(self, program, offsets, mask, other):
        off, m, active = self._lanes(program, offsets, mask, "load_ptr")
        self._check(program, active, "reads", ("writer", "atomic"))
        _mark(self.reader, active, program)
        vals = arith.fill(off.shape, other, _d.from_torch(self._flat.dtype))
        vals[m] = self._flat[active]
        return Tile(vals.reshape(as_tensor(offsets).shape))

    def store(self, program, offsets, value, mask):
        off, m, active = self._lanes(program, offsets, mask, "store_ptr")
        self._check(program, active, "writes", ("writer", "reader", "atomic"))
        self.writer[active] = program
        v = torch.broadcast_to(as_tensor(value, self._flat), as_tensor(offsets).shape).reshape(-1)[m]
        self._flat[active] = arith.cast(v, _d.from_torch(self._flat.dtype))

    def atomic_add(self, program, offsets, value, mask):
        off, m, active = self._lanes(program, offsets, mask, "atomic_add")
        self._check(program, active, "atomically updates", ("writer", "reader"))
        v = torch.broadcast_to(as_tensor(value, self._flat), as_tensor(offsets).shape).reshape(-1)[m]
        v = arith.cast(v, _d.from_torch(self._flat.dtype))
        old = self._flat[active] + _earlier_adds(active, v)
        self._flat.index_add_(0, active, v)
        _mark(self.atomic, active, program)
        out = torch.zeros(off.shape, dtype=self._flat.dtype)
        out[m] = old
        return Tile(out.reshape(as_tensor(offsets).shape))


def _earlier_adds(offsets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """For each lane of one atomic_add, what the lanes before it add to the same element: as
    on the GPU, each lane is an atomic of its own, so lanes that share an element see each
    other's additions (applied here in lane order, one order the GPU may take)."""
    if offsets.numel() < 2:
        return torch.zeros_like(values)
    order = torch.argsort(offsets, stable=True)
    o = offsets[order]
    wide = torch.float32 if values.is_floating_point() else torch.int64
    v = values[order].to(wide)
    before = torch.cumsum(v, 0) - v                    # exclusive sum over all lanes
    starts = torch.ones_like(o, dtype=torch.bool)
    starts[1:] = o[1:] != o[:-1]
    first = torch.cummax(torch.where(starts, torch.arange(len(o)), 0), 0).values
    out = torch.empty_like(v)
    out[order] = before - before[first]                # exclusive sum within the element
    return out.to(values.dtype)
