"""The bytes many accesses touch, as a few byte views: what a graph replay borrows.

Each accessed tensor covers the span from its first to its last byte. Written spans are
united (touching ones too), read spans likewise, and the written bytes are taken out of the
read ones: a byte some access writes is borrowed as written, a byte only read is borrowed
as read, and no byte outside the accesses' spans is borrowed. So a model's weights, packed
back to back in one storage, are one read view, however many tensors they are, and a buffer
written beside them does not make them written.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .overlap import Extent

__all__ = ["covering_views"]


def covering_views(accesses: Iterable[tuple[str, torch.Tensor, bool]]) -> tuple[list, list]:
    """``(reads, writes)``: ``(name, uint8 view)`` pairs covering the ``(name, tensor,
    write)`` accesses, no two overlapping; a piece is named after an access it covers."""
    spans: dict = {True: [], False: []}
    for name, t, write in accesses:
        if t.numel():
            x = Extent(t)
            spans[write].append((t.device, x.lo, x.hi, name, t.untyped_storage()))
    writes = _union(spans[True])
    reads = _without(_union(spans[False]), writes)
    return _views(reads), _views(writes)


def _union(spans: list) -> list:
    """``spans`` sorted and merged where they overlap or touch on one device."""
    merged: list = []
    for dev, lo, hi, name, storage in sorted(spans, key=lambda x: (str(x[0]), x[1])):
        last = merged[-1] if merged else None
        if last is not None and last[0] == dev and lo <= last[2]:
            merged[-1] = (dev, last[1], max(hi, last[2]), last[3], last[4] + [storage])
        else:
            merged.append((dev, lo, hi, name, [storage]))
    return merged


def _without(spans: list, cut: list) -> list:
    """The parts of the disjoint ``spans`` outside every span of ``cut``."""
    out = []
    for dev, lo, hi, name, storages in spans:
        for cdev, clo, chi, _, _ in cut:
            if cdev != dev or chi <= lo or clo >= hi:
                continue
            if clo > lo:
                out.append((dev, lo, clo, name, storages))
            lo = max(lo, chi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((dev, lo, hi, name, storages))
    return out


def _views(spans: list) -> list:
    """Byte views of ``spans``, each span cut into consecutive pieces that lie inside one
    storage (DLPack may give one memory several storages, none holding the whole span)."""
    views = []
    for dev, lo, hi, name, storages in spans:
        while lo < hi:
            s = max((x for x in storages if x.data_ptr() <= lo < x.data_ptr() + x.nbytes()),
                    key=lambda x: x.data_ptr() + x.nbytes())
            end = min(hi, s.data_ptr() + s.nbytes())
            view = torch.empty(0, dtype=torch.uint8, device=dev)
            views.append((name, view.set_(s, lo - s.data_ptr(), (end - lo,))))
            lo = end
    return views
