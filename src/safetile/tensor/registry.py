"""The holds in flight on one device, and the address indexes that keep checking them fast.

A registry is a set of holds (``borrows.Hold``) with their byte extents, in two parts:

* **Lasting read borrows** (those of ``Shared`` values, which a model holds for its weights
  for as long as it lives) sit in :class:`Disjoint`: sorted by address, so that checking a
  new write against hundreds of them costs two binary searches. An extent that overlaps one
  already there (two shared views of one storage) goes with the other holds instead.
* **The other holds** (operations in flight, host copies) are scanned directly while only a
  few are in flight; beyond :data:`SMALL` of them an address index (a hierarchical grid,
  :class:`Index`) is kept, so that checking a new launch against thousands of in-flight
  holds looks only at the extents near its own bytes. A second index holds only their
  writes: a new read can conflict only with a write, so a read never walks the held reads.

The caller (``borrows``) holds ``LOCK`` around every call.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from .overlap import Extent, _overlap

if TYPE_CHECKING:  # pragma: no cover
    from .borrows import Hold

__all__ = ["Registry", "Index", "Disjoint", "SMALL"]

#: Holds per device scanned directly; above this many in flight, an address index is kept.
SMALL = 4


class Index:
    """An address index of held extents: a hierarchical grid.

    An extent of span ``s`` belongs to level ``c = (s - 1).bit_length()`` (so ``s <= 2**c``)
    and is filed in the one bucket ``lo >> c`` of that level; it can reach at most into the
    next bucket. So every held extent overlapping ``[lo, hi)`` sits, on level ``c``, in a
    bucket from ``(lo >> c) - 1`` to ``(hi - 1) >> c``: a query probes those few buckets per
    level in use (or, when the query spans more buckets than a level has, that level's
    buckets). Adding and removing an extent costs a few dict operations.
    """

    __slots__ = ("levels",)

    def __init__(self):
        self.levels: dict[int, dict[int, list]] = {}     # c -> bucket -> [(extent, hold)]

    def add(self, extents, hold: "Hold", writes_only: bool = False) -> None:
        """File ``extents`` of ``hold`` (only the writes among them if ``writes_only``)."""
        levels = self.levels
        for e in extents:
            if writes_only and not e.write:
                continue
            c = e.level
            level = levels.get(c)
            if level is None:
                level = levels[c] = {}
            key = e.lo >> c
            bucket = level.get(key)
            if bucket is None:
                level[key] = [(e, hold)]
            else:
                bucket.append((e, hold))

    def remove(self, extents, hold: "Hold", writes_only: bool = False) -> None:
        """Take ``extents`` of ``hold`` out (as ``add`` filed them); those already out are
        skipped, so a removal cut short by an interrupt can run again."""
        levels = self.levels
        for e in extents:
            if writes_only and not e.write:
                continue
            c = e.level
            level = levels.get(c)
            key = e.lo >> c
            bucket = level.get(key) if level is not None else None
            if bucket is None:
                continue
            for i, entry in enumerate(bucket):
                if entry[0] is e and entry[1] is hold:
                    del bucket[i]
                    break
            if not bucket:
                del level[key]
                if not level:
                    del levels[c]

    def near(self, lo: int, hi: int):
        """Every held ``(extent, hold)`` whose bytes may intersect ``[lo, hi)`` (a superset:
        callers apply the interval test)."""
        for c, level in self.levels.items():
            first, last = (lo >> c) - 1, (hi - 1) >> c
            if last - first < len(level):
                for b in range(first, last + 1):
                    bucket = level.get(b)
                    if bucket is not None:
                        yield from bucket
            else:
                for bucket in level.values():
                    yield from bucket


class Disjoint:
    """Read extents no two of which share a byte, sorted by address.

    Sorted by start, pairwise disjoint extents are sorted by end too, so the extents meeting
    ``[lo, hi)`` are one run: from the first that ends after ``lo`` to the last that starts
    before ``hi``, found by two binary searches."""

    __slots__ = ("starts", "ends", "entries")

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.entries: list[tuple] = []            # (extent, hold), in address order

    def insert(self, e: Extent, hold: "Hold") -> bool:
        """File ``e``; False (and nothing filed) if it overlaps an extent already here."""
        if e.hi <= e.lo:                       # an empty extent would share a start
            return False
        k = bisect_right(self.starts, e.lo)
        if (k and self.ends[k - 1] > e.lo) or (k < len(self.starts) and self.starts[k] < e.hi):
            return False
        self.starts.insert(k, e.lo)
        self.ends.insert(k, e.hi)
        self.entries.insert(k, (e, hold))
        return True

    def remove(self, e: Extent) -> None:
        """Take out ``e`` (filed by ``insert``: no other extent here starts where it does;
        if it is out already, nothing)."""
        k = bisect_left(self.starts, e.lo)
        if k < len(self.entries) and self.entries[k][0] is e:
            del self.starts[k], self.ends[k], self.entries[k]

    def near(self, lo: int, hi: int) -> list:
        """The ``(extent, hold)`` pairs whose bytes ``[e.lo, e.hi)`` meet ``[lo, hi)``."""
        return self.entries[bisect_right(self.ends, lo):bisect_left(self.starts, hi)]


class Registry:
    """The holds in flight on one device (guarded by ``LOCK``)."""

    __slots__ = ("holds", "others", "index", "writes", "lasting", "placed")

    def __init__(self):
        self.holds: dict[Hold, tuple] = {}    # hold -> its extents on this device
        self.others: dict[Hold, tuple] = {}   # hold -> its extents not in ``lasting``
        self.index: Index | None = None      # the extents of ``others``, beyond SMALL holds
        self.writes: Index | None = None     # their write extents, alongside ``index``
        self.lasting = Disjoint()            # lasting read borrows that overlap no other
        self.placed: dict[Hold, list] = {}    # hold -> its extents in ``lasting``

    def near(self, lo: int, hi: int):
        """Held ``(extent, hold)`` pairs that may intersect ``[lo, hi)``."""
        near = self.lasting.near(lo, hi)
        if self.index is not None:
            return near + list(self.index.near(lo, hi))
        return near + [(e, h) for h, extents in self.others.items() for e in extents]

    def conflict(self, x: Extent, owner=None):
        """The first held ``(extent, hold)`` that conflicts with the new extent ``x`` (a new
        write conflicts with any held extent it overlaps, a new read only with held writes),
        or None. Holds of the execution ``owner`` (not None) are ordered with it and skipped.
        The per-launch query: the index walk and the interval test are inlined."""
        lo, hi, write = x.lo, x.hi, x.write
        if write:                               # lasting borrows are all reads
            for e, h in self.lasting.near(lo, hi):
                if (owner is None or h.owner is not owner) and _overlap(x, e):
                    return e, h
        index = self.index
        if index is None:
            for h, extents in self.others.items():
                if owner is not None and h.owner is owner:
                    continue
                for e in extents:
                    if (write or e.write) and e.lo < hi and lo < e.hi and _overlap(x, e):
                        return e, h
            return None
        if not write:
            index = self.writes
        for c, level in index.levels.items():
            first, last = (lo >> c) - 1, (hi - 1) >> c
            if last - first < len(level):
                get = level.get
                for b in range(first, last + 1):
                    bucket = get(b)
                    if bucket is not None:
                        for e, h in bucket:
                            if e.lo < hi and lo < e.hi and \
                                    (owner is None or h.owner is not owner) and _overlap(x, e):
                                return e, h
            else:
                for bucket in level.values():
                    for e, h in bucket:
                        if e.lo < hi and lo < e.hi and \
                                (owner is None or h.owner is not owner) and _overlap(x, e):
                            return e, h
        return None

    def conflict_except(self, x: Extent, owner, exempt):
        """``conflict`` that also skips the holds in ``exempt`` (graph replays, not per launch)."""
        for e, h in self.near(x.lo, x.hi):
            if (x.write or e.write) and e.lo < x.hi and x.lo < e.hi and h not in exempt and \
                    (owner is None or h.owner is not owner) and _overlap(x, e):
                return e, h
        return None

    def add(self, hold: "Hold", extents: tuple, lasting: bool = False) -> None:
        """File ``hold``'s extents; ``lasting``: a read borrow held for long (a Shared value's)."""
        # Every step is recorded before it is taken, so that ``remove`` undoes an add that an
        # interrupt cut short; a new index is used only once it is whole.
        self.holds[hold] = extents
        if lasting:
            placed, rest = [], []
            self.placed[hold] = placed
            for e in extents:
                (placed if not e.write and self.lasting.insert(e, hold) else rest).append(e)
            if not placed:
                del self.placed[hold]
            extents = tuple(rest)
            if not extents:
                return
        self.others[hold] = extents
        index = self.index
        if index is not None:
            index.add(extents, hold)
            self.writes.add(extents, hold, True)
        elif len(self.others) > SMALL:
            index, writes = Index(), Index()
            for h, held in self.others.items():
                index.add(held, h)
                writes.add(held, h, True)
            self.index, self.writes = index, writes

    def remove(self, hold: "Hold") -> None:
        """Take ``hold`` out. Each step can run again and the hold leaves ``holds`` last, so
        a removal cut short by an interrupt completes when it is called again."""
        placed = self.placed.get(hold)
        if placed is not None:
            for e in placed:
                self.lasting.remove(e)
            del self.placed[hold]
        extents = self.others.get(hold)
        if extents is not None:
            index = self.index
            if index is not None:
                if len(self.others) == 1:
                    self.index = self.writes = None
                else:
                    index.remove(extents, hold)
                    self.writes.remove(extents, hold, True)
            del self.others[hold]
        self.holds.pop(hold, None)
