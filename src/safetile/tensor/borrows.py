"""Storage borrows held by in-flight operations, and the storage-overlap test.

"A storage region may be mutably partitioned or shared, never both at once." Handles alone
cannot enforce this: zero-copy views (``t.slice``, ``t.reshape``, two ``st.from_torch`` of
one torch storage) are separate handles over the same bytes. So the launcher, before
anything runs, calls :func:`acquire` with the torch tensors it reads and writes; the hold
lives until the operation is synchronized (``Hold.release()``).

Rules checked by :func:`acquire` (``AliasError``, nothing registered on failure):

* within one call, a write overlaps no other write and no read;
* against holds already registered: a new write overlaps no existing hold, a new read
  overlaps no existing *write* (any number of in-flight reads may share storage).

:func:`check_host_read` / :func:`check_host_write` protect host access (``to_torch``,
``numpy``, DLPack export, ``Shared.try_unwrap``) against in-flight writers (``BorrowError``).

Overlap is decided on byte ranges, device by device (:func:`overlaps`). The common case,
disjoint byte extents, costs a few integer comparisons.

Cost with many operations in flight: each device's registry is a set of holds, scanned
directly while only a few are in flight; beyond :data:`SMALL` holds it also keeps an address
index (a hierarchical grid, :class:`_Index`), so that checking a new launch against
thousands of in-flight holds looks only at the extents near its own bytes.

A launch that repeats an earlier launch's arguments exactly (``kernel/plan.py``) reuses the
:class:`Extent` tuple :func:`prepare` made then (the within-call checks depend only on the
extents, which it re-verifies) and calls :func:`register` directly.
"""
from __future__ import annotations

from typing import Sequence

import weakref

import torch

from ..errors import AliasError, BorrowError
from .ownership import LOCK

__all__ = ["acquire", "prepare", "register", "by_device", "Extent", "Hold", "check_host_read",
           "check_host_write", "overlaps", "active_holds", "EXACT_LIMIT"]

#: Above this many elements (either tensor) the exact element-set check is skipped and
#: overlapping extents are conservatively reported as overlapping.
EXACT_LIMIT = 1 << 22


# ---------------------------------------------------------------------------------------
# the overlap test
# ---------------------------------------------------------------------------------------

class Extent:
    """The bytes ``[lo, hi)`` one argument touches, and what the exact check needs.

    Immutable, and holding only a weak reference to its tensor (``tref``), so that a launch
    plan may keep extents across launches without keeping memory alive. While an operation
    holds an extent, the operation keeps the tensor alive.
    """

    __slots__ = ("tref", "device", "lo", "hi", "dense", "name", "write")

    def __init__(self, t: torch.Tensor, name: str = "", write: bool = False):
        self.tref = weakref.ref(t)
        self.device = t.device
        self.name = name
        self.write = write
        n = t.numel()
        if n == 0:
            # Empty tensors touch no bytes: lo == hi makes every interval test fail.
            self.lo = self.hi = 0
            self.dense = True
            return
        isz = t.element_size()
        self.lo = lo = t.data_ptr()
        if t.is_contiguous():                  # the common case: one C call decides
            self.hi = lo + n * isz
            self.dense = True
            return
        span = 1
        for size, stride in zip(t.shape, t.stride()):
            span += (size - 1) * stride        # torch strides are never negative
        self.hi = lo + span * isz
        # Dense: the elements cover every byte of [lo, hi). span == numel alone is not
        # enough (stride-0 dims can repeat elements), hence the per-dim check.
        self.dense = span == n and _is_dense(t)

    @property
    def t(self) -> torch.Tensor:
        """The tensor (alive while an operation holds this extent, or its handle lives)."""
        return self.tref()


def _is_dense(t: torch.Tensor) -> bool:
    """True if ``t``'s elements are non-overlapping and fill their extent (any dim order)."""
    if t.is_contiguous():
        return True
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _element_offsets(t: torch.Tensor) -> torch.Tensor:
    """Element offsets (relative to ``t.data_ptr()``, in elements) of every element of ``t``,
    as a flat CPU int64 tensor. Built by broadcasting ``arange(size) * stride`` per dim,
    which equals ``as_strided(arange(span), sizes, strides)`` without allocating ``span``."""
    off = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        off = off.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return off.reshape(-1)


def _exact_overlap(a: Extent, b: Extent) -> bool:
    ta, tb = a.t, b.t
    if ta.numel() > EXACT_LIMIT or tb.numel() > EXACT_LIMIT:
        return True                                   # too big to enumerate: conservative
    isa, isb = ta.element_size(), tb.element_size()
    base = min(a.lo, b.lo)
    if isa == isb and (a.lo - b.lo) % isa == 0:
        # Same element grid: compare element indices.
        oa = _element_offsets(ta) + (a.lo - base) // isa
        ob = _element_offsets(tb) + (b.lo - base) // isa
    else:
        # Different element sizes or misaligned: compare the byte sets.
        if ta.numel() * isa > EXACT_LIMIT or tb.numel() * isb > EXACT_LIMIT:
            return True
        oa = ((_element_offsets(ta) * isa + (a.lo - base)).unsqueeze(-1)
              + torch.arange(isa, dtype=torch.int64)).reshape(-1)
        ob = ((_element_offsets(tb) * isb + (b.lo - base)).unsqueeze(-1)
              + torch.arange(isb, dtype=torch.int64)).reshape(-1)
    if oa.numel() > ob.numel():
        oa, ob = ob, oa
    return bool(torch.isin(oa, ob).any())


def _overlap(a: Extent, b: Extent) -> bool:
    # Hot path: disjoint extents (or empty tensors) are decided by two comparisons.
    if a.lo >= b.hi or b.lo >= a.hi:
        return False
    if a.device != b.device:
        return False
    if a.dense and b.dense:
        return True
    return _exact_overlap(a, b)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two torch tensors share at least one byte of memory.

    Different devices never overlap; empty tensors never overlap. Disjoint byte extents do
    not overlap; overlapping extents of two dense tensors do. Otherwise (strided views such
    as even/odd columns) the element sets are enumerated and intersected exactly, unless a
    tensor has more than :data:`EXACT_LIMIT` elements: then the answer is a conservative True.
    """
    return _overlap(Extent(a), Extent(b))


def self_overlapping(t: torch.Tensor) -> bool:
    """Whether two different indices of ``t`` may address the same element.

    Exact for every layout whose dims, taken by increasing stride, each step past the span of
    the smaller ones: all views made by slicing, transposing or reshaping a dense tensor.
    Any other layout (stride 0 from ``expand``, interleaved strides) counts as overlapping.
    Unlike ``torch._debug_has_internal_overlap``, a strided slice of a larger buffer does not.
    """
    if t.is_contiguous() or t.numel() == 0:
        return False
    span = 0
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride <= span:
            return True
        span += stride * (size - 1)
    return False


# ---------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------

#: Holds per device scanned directly; above this many in flight, an address index is kept.
SMALL = 4


class _Index:
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

    def add(self, e: Extent, hold: "Hold") -> None:
        c = (e.hi - e.lo - 1).bit_length()
        level = self.levels.get(c)
        if level is None:
            level = self.levels[c] = {}
        bucket = level.get(e.lo >> c)
        if bucket is None:
            level[e.lo >> c] = [(e, hold)]
        else:
            bucket.append((e, hold))

    def remove(self, e: Extent, hold: "Hold") -> None:
        c = (e.hi - e.lo - 1).bit_length()
        level = self.levels[c]
        bucket = level[e.lo >> c]
        for i, entry in enumerate(bucket):
            if entry[0] is e and entry[1] is hold:
                del bucket[i]
                break
        if not bucket:
            del level[e.lo >> c]
            if not level:
                del self.levels[c]

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


class _Registry:
    """The holds in flight on one device (guarded by ``LOCK``)."""

    __slots__ = ("holds", "index")

    def __init__(self):
        self.holds: dict[Hold, tuple] = {}    # hold -> its extents on this device
        self.index: _Index | None = None      # kept while more than SMALL holds are in flight

    def near(self, lo: int, hi: int):
        """Held ``(extent, hold)`` pairs that may intersect ``[lo, hi)``."""
        if self.index is not None:
            return self.index.near(lo, hi)
        return [(e, h) for h, extents in self.holds.items() for e in extents]

    def add(self, hold: "Hold", extents: tuple) -> None:
        self.holds[hold] = extents
        index = self.index
        if index is not None:
            for e in extents:
                index.add(e, hold)
        elif len(self.holds) > SMALL:
            self.index = index = _Index()
            for h, held in self.holds.items():
                for e in held:
                    index.add(e, h)

    def remove(self, hold: "Hold") -> None:
        extents = self.holds.pop(hold)
        if self.index is not None:
            if not self.holds:
                self.index = None
            else:
                for e in extents:
                    self.index.remove(e, hold)


# device -> registry of the holds in flight there (kept once made). Guarded by LOCK.
_REGISTRIES: dict[torch.device, _Registry] = {}


def _label(name: str, write: bool) -> str:
    """Render an argument name: a bare identifier ``z`` becomes ``Out 'z'`` / ``In 'z'``;
    anything else (``"Ptr 'p'"``) is used verbatim."""
    if name.isidentifier():
        return f"{'Out' if write else 'In'} '{name}'"
    return name


def _where(a: Extent, b: Extent) -> str:
    """Describe the overlapping memory of two extents for a message."""
    try:
        sa = a.t.untyped_storage().data_ptr()
        sb = b.t.untyped_storage().data_ptr()
    except Exception:                                   # pragma: no cover - exotic tensors
        sa, sb = None, object()
    if sa == sb:
        return (f"same storage, bytes [{a.lo - sa}, {a.hi - sa}) and "
                f"[{b.lo - sb}, {b.hi - sb})")
    return f"overlapping memory, addresses [{a.lo:#x}, {a.hi:#x}) and [{b.lo:#x}, {b.hi:#x})"


class Hold:
    """The borrows one in-flight operation holds; :meth:`release` ends them (idempotent).

    ``tensors`` keeps the held tensors alive (extents refer to them weakly)."""

    __slots__ = ("holder", "_regs", "_released", "tensors", "__weakref__")

    def __init__(self, holder: str, tensors=()):
        self.holder = holder
        self.tensors = tensors
        self._regs: list = []                 # the registries this hold is in
        self._released = False

    @property
    def released(self) -> bool:
        """True once :meth:`release` has run."""
        return self._released

    def release(self) -> None:
        """Remove this hold's borrows from the registry. Calling it again does nothing."""
        with LOCK:
            if self._released:
                return
            self._released = True
            for reg in self._regs:
                reg.remove(self)
            self._regs = []
            self.tensors = ()

    def __enter__(self) -> "Hold":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        n = sum(len(r.holds.get(self, ())) for r in self._regs)
        state = "released" if self._released else f"{n} borrows"
        return f"Hold({self.holder!r}, {state})"


def prepare(holder: str,
            reads: Sequence[tuple[str, torch.Tensor]] = (),
            writes: Sequence[tuple[str, torch.Tensor]] = ()) -> tuple:
    """The extents of one operation's arguments (writes first), checked against each other:
    raises :class:`AliasError` if a write overlaps another argument of the same call.
    Empty tensors hold nothing and are left out."""
    new_w = [Extent(t, n, True) for n, t in writes]
    new_r = [Extent(t, n, False) for n, t in reads]
    for i, w in enumerate(new_w):
        for other in new_w[i + 1:]:
            if _overlap(w, other):
                _raise_internal(holder, w, other)
        for r in new_r:
            if _overlap(w, r):
                _raise_internal(holder, w, r)
    return tuple(e for e in new_w + new_r if e.hi > e.lo)


def by_device(extents: tuple) -> tuple:
    """``extents`` grouped as ``((device, extents on it), ...)`` (what :func:`register` files)."""
    groups: dict = {}
    for e in extents:
        groups.setdefault(e.device, []).append(e)
    return tuple((device, tuple(mine)) for device, mine in groups.items())


def register(holder: str, extents: tuple, tensors=(), groups=None) -> Hold:
    """Check ``extents`` (from :func:`prepare`) against the holds in flight and register
    them: a write may overlap no held extent, a read no held write (``AliasError``, and
    nothing is registered). ``tensors`` are kept alive by the hold; ``groups`` is
    ``by_device(extents)`` when the caller has it. The caller need not hold ``LOCK``."""
    hold = Hold(holder, tensors)
    if groups is None:
        groups = by_device(extents)
    with LOCK:
        for device, mine in groups:
            reg = _REGISTRIES.get(device)
            if reg is None:
                reg = _REGISTRIES[device] = _Registry()   # kept: devices are few
            if not reg.holds:
                continue
            # The interval test is inlined: this loop runs per launch and per nearby borrow.
            for x in mine:
                lo, hi = x.lo, x.hi
                if x.write:
                    for e, h in reg.near(lo, hi):
                        if e.lo < hi and lo < e.hi and _overlap(x, e):
                            _raise_external(holder, x, e, h)
                else:
                    for e, h in reg.near(lo, hi):
                        if e.write and e.lo < hi and lo < e.hi and _overlap(x, e):
                            _raise_external(holder, x, e, h)
        for device, mine in groups:
            reg = _REGISTRIES[device]
            reg.add(hold, mine)
            hold._regs.append(reg)
    return hold


def acquire(holder: str,
            reads: Sequence[tuple[str, torch.Tensor]] = (),
            writes: Sequence[tuple[str, torch.Tensor]] = ()) -> Hold:
    """Register the storage an operation reads and writes while it is in flight.

    ``holder`` names the operation (``"kernel 'add' (examples/01.py:12)"``); ``reads`` and
    ``writes`` are ``(name, torch_tensor)`` pairs, names as in :func:`_label`. Raises
    :class:`AliasError` (and registers nothing) if a write overlaps another argument of the
    same call, or conflicts with a hold already registered.
    """
    extents = prepare(holder, reads, writes)
    return register(holder, extents, tuple(t for _, t in writes) + tuple(t for _, t in reads))


def _raise_internal(holder: str, w: Extent, other: Extent):
    raise AliasError(
        f"{holder}: {_label(w.name, True)} overlaps {_label(other.name, other.write)} "
        f"({_where(w, other)}); an output must not share memory with another argument of "
        f"the same launch: pass a copy or non-overlapping slices")


def _raise_external(holder: str, new: Extent, held: Extent, hold: Hold):
    raise AliasError(
        f"{holder}: {_label(new.name, new.write)} overlaps {_label(held.name, held.write)} "
        f"held by in-flight {hold.holder} ({_where(new, held)}); "
        f"synchronize that operation first (op.sync() or await op) or use separate storage")


def _conflicting(t: torch.Tensor, writes_only: bool):
    """The first held ``(extent, hold)`` overlapping ``t`` (only writes if ``writes_only``)."""
    if not any(reg.holds for reg in _REGISTRIES.values()):   # fast path: nothing in flight
        return None
    x = Extent(t)
    with LOCK:
        reg = _REGISTRIES.get(x.device)
        if reg is not None and x.hi > x.lo:
            for e, h in reg.near(x.lo, x.hi):
                if (e.write or not writes_only) and _overlap(x, e):
                    return e, h
    return None


def check_host_read(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if an in-flight operation writes memory ``t`` covers.

    ``what`` completes "cannot ...", e.g. ``"read Tensor(shape=(4,), float32) with
    to_torch()"``.
    """
    found = _conflicting(t, writes_only=True)
    if found is not None:
        e, h = found
        raise BorrowError(
            f"cannot {what}: in-flight {h.holder} is writing this memory through "
            f"{_label(e.name, True)}; synchronize that operation first (op.sync() or await op)")


def check_host_write(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if any in-flight operation reads or writes ``t``'s memory
    (used before handing out mutable access: DLPack export, ``into_torch``, unwrap)."""
    found = _conflicting(t, writes_only=False)
    if found is not None:
        e, h = found
        verb = "writing" if e.write else "reading"
        raise BorrowError(
            f"cannot {what}: in-flight {h.holder} is {verb} this memory through "
            f"{_label(e.name, e.write)}; synchronize that operation first "
            f"(op.sync() or await op)")


def active_holds() -> list[tuple[str, str, bool, torch.Tensor]]:
    """A snapshot ``(holder, name, is_write, tensor)`` of every registered borrow."""
    with LOCK:
        return [(h.holder, e.name, e.write, e.t)
                for reg in _REGISTRIES.values() for h, extents in reg.holds.items()
                for e in extents]
