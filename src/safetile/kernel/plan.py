"""Launch plans: what one launch's checks concluded, reused while it provably still applies.

A launch (``kernel/launch.py``) checks every argument (kind, dtype, rank, device, layout),
that the ``Out`` grids agree and that no output overlaps another argument of the call; then,
every time, it checks each handle's ownership state, checks the storage borrows against the
operations in flight and moves the handles. A ``LaunchPlan`` remembers the conclusions of the
first part, and what the launcher derives from them (the generated kernel's arguments, the
binary), for the exact arguments of one launch. A later launch reuses a plan only when

* the same handle objects are passed at the same positions (held through weak references:
  a plan never keeps a handle or its memory alive). A handle's torch tensor, tile shape and
  program order never change for the handle's life, so the handle decides them;
* each torch tensor still has the data pointer, shape, strides and dtype the plan saw (the
  handle's own torch view: a storage resized through a torch alias the user kept moves its
  data pointer; the layout is compared too, as it costs little), and its
  storage still reaches the plan's last byte: a storage shrunk through a torch alias is
  reallocated, and the allocator may hand the new, smaller block the old address, so the
  pointer alone cannot tell (the launch would write past the block's end);
* every scalar is the same value of the same type as it was passed (``-0.0`` and ``0.0``
  differ; NaN never matches), so the plan's values as the kernel takes them (an int passed
  for a float parameter becomes a float) apply. Only plain scalars (int, float, bool, a
  dtype) are compared so: a plan whose launch was passed another kind (a numpy scalar, an
  int subclass) is not cached, as its ``==`` is not ours to trust;
* the backend and the kernel's options are the same objects.

Anything else (another handle, e.g. the Partition made by a new ``partition()`` call) makes
a new plan through the full checks. Plans live in the kernel's ``LaunchCache``
(``kernel/cache.py``).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch

from ..dtypes import DType
from ..tensor.borrows import by_device
from ..tensor.overlap import Extent

# Scalar types whose ``==`` a plan may trust to tell one launch's value from another's.
PLAIN_SCALARS = frozenset({int, float, bool, DType, torch.dtype})


@dataclass(slots=True)
class BoundArg:
    """One argument matched to its parameter (``kernel/launch.py`` checks it)."""

    name: str
    spec: object            # ParamSpec
    value: object           # the handle, or the scalar as the kernel takes it
    torch: object = None    # the underlying torch tensor for tensor kinds
    tile: tuple = None      # Out: tile shape
    order: object = None    # Out: ProgramOrder
    given: object = None    # a scalar as passed, if not ``value``

    @property
    def passed(self):
        """The argument as the caller passed it."""
        return self.value if self.given is None else self.given


class LaunchPlan:
    """The checked facts of one launch's arguments, and caches derived from them.

    ``tensors``: per tensor argument ``(position, handle ref, torch ref, data_ptr, shape,
    strides, dtype, end)``, ``end`` the address past its last byte (0 for an empty tensor);
    ``scalars``: ``(position, value as passed)``; ``converted``: ``(position, value as the
    kernel takes it)`` for the scalars passed otherwise (the op holds and hands back those);
    ``cacheable``: every scalar was passed as a plain value; ``moves``: ``(position, "moved
    into" text)`` per handle, at its first position (a Shared handle passed for several
    ``In`` parameters is moved in, and handed back, once); ``params``: ``(name, spec, tile,
    order, is_tensor)`` per parameter, to rebuild ``BoundArg`` lists; ``extents``: the
    borrows' byte extents (checked against each other); ``gpu``: what the backend derives
    once per plan (``backends/triton/launch.py``: the variant, binary and packed arguments).
    """

    __slots__ = ("choice", "opts", "n", "tensors", "scalars", "moves", "params", "grid",
                 "extents", "groups", "holder", "gpu", "converted", "cacheable", "__weakref__")

    def __init__(self, kernel, bound, grid, choice, extents, holder, where):
        self.choice = choice
        self.opts = kernel.opts
        self.n = len(bound)
        tensors, scalars, moves, params, converted = [], [], [], [], []
        moved: set = set()
        for i, b in enumerate(bound):
            t = b.torch
            params.append((b.name, b.spec, b.tile, b.order, t is not None))
            if t is None:
                scalars.append((i, b.passed))
                if b.given is not None:
                    converted.append((i, b.value))
            else:
                end = Extent(t).hi if t.numel() else 0
                tensors.append((i, weakref.ref(b.value, self._forget), weakref.ref(t),
                                t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, end))
                if id(b.value) not in moved:
                    moved.add(id(b.value))
                    moves.append((i, where[b.name]))
        self.tensors, self.scalars = tuple(tensors), tuple(scalars)
        self.converted = tuple(converted)
        self.cacheable = all(type(v) in PLAIN_SCALARS for _, v in scalars)
        self.moves, self.params = tuple(moves), tuple(params)
        self.grid = grid
        self.extents = extents
        self.groups = by_device(extents)
        self.holder = holder
        self.gpu = None

    def _forget(self, _ref) -> None:
        """A handle of this plan is gone, so the plan never matches again: drop what the
        backend derived, which may hold the handle's memory (tensor descriptors)."""
        self.gpu = None

    def bound(self, values: tuple) -> list:
        """The arguments ``values`` (this plan's own) as ``BoundArg``s."""
        return [BoundArg(name, spec, v, v._torch if is_tensor else None, tile, order)
                for (name, spec, tile, order, is_tensor), v in zip(self.params, values)]

    def values(self, args: tuple) -> tuple:
        """What a launch with ``args`` (matched) holds and hands back: the arguments, each
        scalar as the kernel takes it."""
        values = list(args)
        for i, v in self.converted:
            values[i] = v
        return tuple(values)

    def matches(self, args: tuple) -> bool:
        """Whether this plan provably applies to ``args`` (see the module docstring)."""
        if len(args) != self.n:
            return False
        for i, href, tref, ptr, shape, stride, dtype, end in self.tensors:
            if href() is not args[i]:
                return False
            t = tref()                    # alive: the handle (alive, just compared) holds it
            if t.data_ptr() != ptr or t.shape != shape or t.stride() != stride or \
                    t.dtype is not dtype:
                return False
            if end:                       # (the full checks say what is wrong)
                s = t.untyped_storage()
                if s.data_ptr() + s.nbytes() < end:
                    return False
        for i, v in self.scalars:
            a = args[i]
            if a is not v and (type(a) is not type(v) or a != v or (
                    type(v) is float and math.copysign(1.0, a) != math.copysign(1.0, v))):
                return False
        return True
