"""What a kernel parameter is inside the body, as declarations for ``help()`` and type checkers.

``st.In[...]``, ``st.Out[...]`` and ``st.Ptr[...]`` annotations make the parameter one of
these views. The classes are never instantiated: the CPU executor and the code generator each
supply their own implementation of the same methods. They are also the list the checker
holds kernel code to (``methods``, ``attributes``: nothing else may be called or read on a
view). Tiles (what loads and ``sl.*`` return) are typed ``Any``: their arithmetic is checked
when the kernel is defined and run.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable, Iterator, Sequence

Index = Sequence[Any]          # a tuple of ints or scalar tiles, one per axis
Shape = Sequence[int]          # a tuple of compile-time powers of two, one per axis


class InView:
    """An ``st.In`` parameter ``x``: a shared, read-only tensor."""

    shape: tuple[int, ...]
    """``x.shape[i]``: the tensor's size along axis ``i`` (a runtime value)."""

    def load(self, index: Index, shape: Shape, padding: float = 0) -> Any:
        """The tile at tile-grid ``index`` of tiles of ``shape`` (element offset ``index[i] *
        shape[i]``); elements outside the tensor read as ``padding`` (e.g. ``float("-inf")``
        before a max)."""
        raise NotImplementedError

    def load_at(self, offset: Index, shape: Shape, padding: float = 0) -> Any:
        """The box of ``shape`` starting at element ``offset`` (any ints, negative too, e.g.
        a window at a position read from the device); outside the tensor reads ``padding``."""
        raise NotImplementedError

    def load_scalar(self, index: Index, padding: float = 0) -> Any:
        """One element at element ``index`` (``padding`` outside the tensor)."""
        raise NotImplementedError

    def prefetch(self, index: Index, shape: Shape) -> None:
        """A statement: an L2 prefetch hint for the tile ``load(index, shape)`` would read. It
        delivers no value, so it cannot observe data or race; under ``pdl=True`` leading
        prefetches are issued before the wait for the previous grid."""
        raise NotImplementedError


class SubTiles:
    """``z.partition(sub_shape)``: the owned slab of ``z`` split into sub-tiles."""

    shape: tuple[int, ...]
    """The sub-tile shape."""

    def store(self, tile: Any, sub_index: Index) -> None:
        """Store ``tile`` at ``sub_index`` of the slab's sub-grid (bounds-checked against the
        owned slab, also at data-dependent indices; outside it the store is masked off on the
        GPU and raises ``OutOfBoundsError`` on the CPU executor). The tile is converted to the
        Out's element type, as ``z.store`` does."""
        raise NotImplementedError

    def load(self, sub_index: Index) -> Any:
        """Read back the sub-tile at ``sub_index`` (ordered after earlier stores)."""
        raise NotImplementedError


class OutView:
    """An ``st.Out`` parameter ``z``: this program's owned tile of a ``Partition``."""

    shape: tuple[int, ...]
    """The tile shape (compile-time)."""
    index: tuple[Any, ...]
    """This program's tile index (in tiles, one entry per axis)."""

    def load(self) -> Any:
        """Read the owned tile (ordered after earlier stores to it)."""
        raise NotImplementedError

    def store(self, tile: Any) -> None:
        """Write ``tile`` (broadcast to ``z.shape``) to the owned tile; edge tiles are masked.

        The one conversion of the kernel language happens here: the tile is converted to the
        Out's element type as ``tile.astype(dtype)`` would (an fp32 tile stored into a bf16
        Out rounds to nearest even); a float tile stored into an int Out is refused (convert
        it with ``.astype``). Write ``z.store(t.astype(st.bf16))`` to make a narrowing store
        visible in the code."""
        raise NotImplementedError

    def partition(self, sub_shape: Shape) -> SubTiles:
        """Split the owned tile into sub-tiles of ``sub_shape`` for stores inside it."""
        raise NotImplementedError

    def tiles(self) -> Iterator["OutView"]:
        """``for t in z.tiles():`` the owned tiles of a persistent partition, in order (one
        iteration otherwise); every Out of the kernel moves with it."""
        raise NotImplementedError


class PtrView:
    """An ``st.Ptr`` parameter ``p`` (``unsafe=True`` kernels only): the whole tensor as a raw
    pointer, reached with ``sl.load_ptr``, ``sl.store_ptr`` and ``sl.atomic_add``."""


def methods(view: type) -> frozenset:
    """The names of the methods ``view`` declares."""
    return frozenset(n for n, v in vars(view).items() if inspect.isfunction(v)
                     and not n.startswith("_"))


def attributes(view: type) -> frozenset:
    """The names of the attributes ``view`` declares."""
    return frozenset(vars(view).get("__annotations__", {}))


def parameter_position(fn: Callable, names: tuple) -> tuple[int, str]:
    """``(position, name)`` of the first parameter of ``fn`` named one of ``names``, its
    position counted as a call passes it (a method's ``self`` not counted)."""
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    name = next(p for p in params if p in names)
    return params.index(name), name


# What kernel code may call and read on a view: the checker holds kernel code to these sets,
# and the code generator and the CPU executor implement exactly them.
IN_METHODS, IN_ATTRS = methods(InView), attributes(InView)
OUT_METHODS, OUT_ATTRS = methods(OutView), attributes(OutView)
SUB_METHODS, SUB_ATTRS = methods(SubTiles), attributes(SubTiles)


def kind_of(node, params: dict, views: dict):
    """What ``node`` names: a parameter's kind ('In', 'Out', 'Ptr', 'Const', 'int', ...), a
    view local's ('sub', 'tile'), 'sub' for an inline ``z.partition(shape)``, or None.
    ``params`` maps names to objects with a ``kind`` (ParamSpec or the codegen's ArgSpec)."""
    if isinstance(node, ast.Name):
        if node.id in params:
            return params[node.id].kind
        if node.id in views:
            return views[node.id][0]
    elif inline_partition(node) and kind_of(node.func.value, params, views) in ("Out", "tile"):
        return "sub"
    return None


def inline_partition(node) -> bool:
    """Whether ``node`` is a call ``<view>.partition(...)`` (a sub-partition used inline)."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == "partition" and isinstance(node.func.value, ast.Name)
