"""The memory graphs may replay: kept from torch (``Tensor.into_torch``) while they live.

A replay borrows the bytes its launches touch only while it runs (``Graph``), but the memory
must stay safetile's for as long as a graph may replay it: handed to torch, it could be
read or written there while a later replay writes or reads it. So every live graph lists the
extents its launches touch, and an open graph scope the extents its recorded launches touch
(the graph it makes will replay them; a scope that closes without a graph replays nothing).
"""
from __future__ import annotations

import weakref

import torch

from ..errors import BorrowError
from .overlap import Extent, _overlap, label
from .ownership import LOCK

__all__ = ["note_replayed", "note_recorded", "forget_replayed", "check_not_replayed",
           "check_no_recorded_write"]

_REPLAYED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_replayed(graph, accesses) -> None:
    """Record (or replace) what ``graph``'s replays touch: ``(name, tensor, written)``; for
    an open graph scope, what all its recorded launches touch."""
    entry = tuple(Extent(t, name, written) for name, t, written in accesses)
    with LOCK:
        _REPLAYED[graph] = entry


def note_recorded(scope, accesses) -> None:
    """Add to what the open graph scope ``scope`` keeps from torch: the ``(name, tensor,
    written)`` accesses of the launches it has just recorded, reads too (every replay of the
    graph it makes reads them again)."""
    new = tuple(Extent(t, name, written) for name, t, written in accesses)
    with LOCK:
        _REPLAYED[scope] = _REPLAYED.get(scope, ()) + new


def forget_replayed(owner) -> None:
    """``owner`` (a graph scope that closed) replays nothing of its own any more."""
    with LOCK:
        _REPLAYED.pop(owner, None)


def check_not_replayed(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if a live graph's replays read or write ``t``'s bytes, or
    an open graph scope recorded a launch that reads or writes them."""
    if not _REPLAYED:
        return
    x = Extent(t)
    with LOCK:
        for graph, entry in list(_REPLAYED.items()):
            for e in entry:
                if _overlap(x, e):
                    verb = "write" if e.write else "read"
                    if getattr(graph, "recording", False):
                        raise BorrowError(
                            f"cannot {what}: {graph!r} recorded a launch that {verb}s this "
                            f"memory ({label(e.name, e.write)}), and the graph's replays will "
                            f"{verb} it; hand it to torch before recording, or once the graph "
                            f"is dropped")
                    raise BorrowError(f"cannot {what}: {graph!r} replays launches that {verb} "
                                      f"this memory ({label(e.name, e.write)}); drop the "
                                      f"graph first (del g)")


def check_no_recorded_write(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if an open graph scope recorded a launch that writes ``t``'s
    bytes: the launch runs only when the graph is replayed, so a host read now would see
    the bytes before it as if they were its result."""
    if not _REPLAYED:
        return
    x = Extent(t)
    with LOCK:
        for graph, entry in list(_REPLAYED.items()):
            if not getattr(graph, "recording", False):
                continue
            for e in entry:
                if e.write and _overlap(x, e):
                    raise BorrowError(
                        f"cannot {what}: {graph!r} recorded a launch that writes this memory "
                        f"({label(e.name, True)}), which runs only when the graph is "
                        f"replayed: read it after a replay (scope.launch().sync()), once the "
                        f"scope has closed")
