"""The CPU executor: runs a kernel's programs one by one, in a seeded shuffled order.

The kernel's checked body (``body.py``) runs as Python with views for parameters and torch
tiles for values, so every program sees exactly the semantics the code generator targets, plus checks the GPU
cannot make: bounds of raw-pointer and sub-tile accesses, and the write sets of all programs.
"""
from __future__ import annotations

import random

from ... import dtypes as _d
from ...lang.diagnostics import locate
from ...lang.ops import reset_implementation, use_implementation
from .body import executable
from .impl import Implementation
from .tile import scalar
from .views import InView, Launch, OutView, PtrView


def run(kernel, bound, grid: tuple, seed: int) -> None:
    """Execute ``kernel`` over ``grid`` with the bound arguments (see kernel.launch)."""
    outs = [b for b in bound if b.spec.kind == "Out"]
    order = outs[0].order if outs else None

    def describe(p: int) -> str:
        if order is None:
            return f"program {p}"
        tiles = order.tiles_of_program(p)
        if len(tiles) == 1:
            return f"program {p} (tile {tiles[0]})"
        return f"program {p} (tiles {tiles[0]}, ...)"

    launch = Launch(kernel.name, describe)
    args, out_views = [], []
    for b in bound:
        kind = b.spec.kind
        if kind == "In":
            args.append(InView(b.name, b.torch))
        elif kind == "Out":
            v = OutView(b.name, b.torch, b.tile, launch)
            out_views.append(v)
            args.append(v)
        elif kind == "Ptr":
            args.append(PtrView(b.name, b.torch, launch))
        elif kind == "int":
            args.append(scalar(b.value, _d.int32))         # runtime int32, as on the GPU
        elif kind == "float":
            args.append(scalar(b.value, _d.float32))       # rounded to fp32, as on the GPU
        else:
            args.append(b.value)
    for v in out_views:
        v.group = out_views

    n = 1
    for g in grid:
        n *= g
    programs = list(range(n))
    random.Random(seed).shuffle(programs)
    persistent = order is not None and order.persistent is not None
    body = executable(kernel)
    for p in programs:
        launch.program = p
        if order is not None:
            tiles = order.tiles_of_program(p)
            for v in out_views:
                v.tiles_of = tiles
                v.coords = None if persistent else tiles[0]
        tile = None if order is None or persistent else (tiles[0], order.grid)
        token = use_implementation(Implementation(p, grid, tile))
        try:
            body(*args)
        except Exception as e:                    # name the kernel's line, say what to do
            error = locate(e, kernel.name, describe(p))
            if error is e:
                raise
            raise error from e
        finally:
            reset_implementation(token)
