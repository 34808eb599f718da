"""Storage borrows held by in-flight operations (the overlap test itself is in overlap.py).

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

Overlap is decided on byte ranges, device by device (``overlap.overlaps``). The common
case, disjoint byte extents, costs a few integer comparisons.

Each device's holds live in a :class:`~safetile.tensor.registry.Registry` (registry.py),
which stays fast with thousands of operations in flight.

A launch that repeats an earlier launch's arguments exactly (``kernel/plan.py``) reuses the
:class:`Extent` tuple :func:`prepare` made then (the within-call checks depend only on the
extents, which it re-verifies) and calls :func:`register` directly.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Sequence

import torch

from ..errors import AliasError, BorrowError
from .ownership import LOCK, QUEUED_FINALIZERS, WALK, refuse_inside_walk, run_finalizers, walk
from .overlap import EXACT_LIMIT, overlaps  # noqa: F401  (re-exported)
from .overlap import Extent, _overlap, describe_overlap, label
from .registry import Registry
from .scoped import Scoped

__all__ = ["acquire", "prepare", "register", "hold_shared", "collect_shared", "by_device",
           "Extent", "Hold", "check_host_read",
           "check_host_write", "overlaps", "active_holds", "EXACT_LIMIT"]

# ---------------------------------------------------------------------------------------
# owners and registries
# ---------------------------------------------------------------------------------------

# The execution running on this thread (the device layer's RunContext), or None. Holds of
# operations that have run in one execution (``Hold.owner``) are ordered by that execution's
# stream before whatever it does next, so they never conflict with its later launches, nor
# with host access from its callbacks; they still conflict with everything else until the
# execution finishes. The hold of an operation built in a callback but not yet run is no
# execution's: its work is enqueued after the callback returns, so what the callback does
# meanwhile (share, read, export the bytes) is not ordered before it.
_owner = threading.local()


def current_owner():
    """The execution running on this thread, or None (see ``owned_by``)."""
    return getattr(_owner, "ctx", None)


@contextlib.contextmanager
def _set_while(local: threading.local, attr: str, value):
    """Set a thread-local attribute while the block runs (the outer value comes back)."""
    outer = getattr(local, attr, None)
    setattr(local, attr, value)
    try:
        yield
    finally:
        setattr(local, attr, outer)


def owned_by(ctx):
    """Mark ``ctx`` as the execution running on this thread while the block runs."""
    return _set_while(_owner, "ctx", ctx)


# device -> registry of the holds in flight there (kept once made). Guarded by LOCK.
_REGISTRIES: dict[torch.device, Registry] = {}


class Hold:
    """The borrows one in-flight operation holds; :meth:`release` ends them (idempotent).

    ``tensors`` keeps the held tensors alive (extents refer to them weakly; an operation that
    keeps its tensors alive itself passes none and hands them over if it is collected first);
    ``owner`` is the execution the operation runs in (set when it runs), whose later launches
    and host access it never blocks; ``checked_in`` the execution whose own holds were set
    aside when these borrows were checked (the one running on the registering thread): an
    operation that runs in another execution must have them checked again."""

    __slots__ = ("holder", "owner", "checked_in", "_regs", "_released", "tensors", "remedy",
                 "__weakref__")

    #: What a message tells the user to do about a conflict with an operation's hold.
    SYNC = "synchronize that operation first (op.sync() or await op)"

    def __init__(self, holder: str, tensors=(), checked_in=None):
        self.holder = holder                  # "in-flight kernel 'add'", "Shared value ..."
        self.owner = None
        self.checked_in = checked_in
        self.tensors = tensors
        self.remedy = Hold.SYNC
        self._regs: list = []                 # the registries this hold is in
        self._released = False

    @property
    def released(self) -> bool:
        """True once :meth:`release` has run."""
        return self._released

    def release(self) -> None:
        """Remove this hold's borrows from the registry (inside a walk of the registries, once
        that walk ends). Calling it again does nothing."""
        if WALK.depth and LOCK._is_owned():     # WALK.here() inline: every op releases one
            # Called by code a collection ran inside a walk (a user's finalizer syncing an
            # op): removing holds under the walk could make it skip one that conflicts. The
            # borrow ends once the walk does (ownership.run_finalizers).
            QUEUED_FINALIZERS.append(self.release)
            return
        with LOCK:                                # a walk (ownership.Walk), written out
            WALK.depth += 1
            try:
                if self._released:
                    return
                # Released only once out of every registry, each dropped from _regs once
                # out of it: a release cut short by an interrupt runs again, resuming here.
                regs = self._regs
                while regs:
                    regs[-1].remove(self)
                    regs.pop()
                self._released = True
                self.tensors = ()
            finally:
                WALK.depth -= 1
                if QUEUED_FINALIZERS and not WALK.depth:
                    run_finalizers()

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


def register(holder: str, extents: tuple, tensors=(), groups=None, exempt=frozenset(),
             lasting: bool = False) -> Hold:
    """Check ``extents`` (from :func:`prepare`) against the holds in flight and register
    them: a write may overlap no held extent, a read no held write (``AliasError``, and
    nothing is registered). ``tensors`` are kept alive by the hold; ``groups`` is
    ``by_device(extents)`` when the caller has it; holds in ``exempt`` are not checked
    against; ``lasting`` marks the read borrow of a Shared value (``Registry.add``). The
    caller need not hold ``LOCK``. Inside a walk of the registries (a finalizer a collection
    ran mid-check): ``ExecutionError`` (``refuse_inside_walk``)."""
    if WALK.depth:                            # (the message is built only when it may raise)
        refuse_inside_walk(f"borrow memory for {holder}")
    owner = getattr(_owner, "ctx", None)
    hold = Hold(f"in-flight {holder}", tensors, owner)     # no owner until its op runs
    if groups is None:
        groups = by_device(extents)
    with LOCK:                                # a walk (ownership.Walk), written out
        WALK.depth += 1
        try:
            for device, mine in groups:
                reg = _REGISTRIES.get(device)
                if reg is None:
                    reg = _REGISTRIES[device] = Registry()   # kept: devices are few
                if not reg.holds:
                    continue
                for x in mine:
                    found = reg.conflict_except(x, owner, exempt) if exempt else \
                        reg.conflict(x, owner)
                    if found is not None:
                        _raise_external(holder, x, found[0], found[1])
            _file(hold, groups, lasting)
        except BaseException:
            if hold._regs:                    # filing cut short by an interrupt: undo it
                hold.release()                # (queued: it runs as the walk ends, below)
            raise
        finally:
            WALK.depth -= 1
            if QUEUED_FINALIZERS and not WALK.depth:
                run_finalizers()
    return hold


def _file(hold: Hold, groups: tuple, lasting: bool = False) -> None:
    """Add ``hold``'s extents (``by_device`` groups) to the registries (``LOCK`` held)."""
    for device, mine in groups:
        reg = _REGISTRIES.get(device)
        if reg is None:
            reg = _REGISTRIES[device] = Registry()
        hold._regs.append(reg)                # first: a release undoes a partial add
        reg.add(hold, mine, lasting)


def acquire(holder: str,
            reads: Sequence[tuple[str, torch.Tensor]] = (),
            writes: Sequence[tuple[str, torch.Tensor]] = (), exempt=frozenset()) -> Hold:
    """Register the storage an operation reads and writes while it is in flight.

    ``holder`` names the operation (``"kernel 'add' (examples/01.py:12)"``); ``reads`` and
    ``writes`` are ``(name, torch_tensor)`` pairs, names as in :func:`overlap.label`. Raises
    :class:`AliasError` (and registers nothing) if a write overlaps another argument of the
    same call, or conflicts with a hold already registered (other than those in ``exempt``).
    """
    extents = prepare(holder, reads, writes)
    return register(holder, extents, tuple(t for _, t in writes) + tuple(t for _, t in reads),
                    exempt=exempt)


def borrow_again(old: Hold, ctx, register_new) -> Hold:
    """``old``'s borrows checked again for the execution ``ctx``: an operation built in
    another execution's callback was checked with that execution's own work set aside, and
    ``ctx`` is not ordered with it. ``register_new(exempt)`` registers them anew (with
    ``exempt``, so ``old`` does not conflict) before ``old`` ends, so that no other thread can
    take the bytes in between. ``old`` ends either way (``AliasError`` propagates)."""
    new = None
    try:
        with owned_by(ctx):
            new = register_new(frozenset((old,)))
    finally:
        # A release an interrupt cuts short (at its entry) runs again (it is idempotent);
        # the new borrow then ends too, as its operation fails with the interrupt.
        interrupted, ending = None, [old]
        while ending:
            try:
                ending[-1].release()
                ending.pop()
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
                if new is not None and new not in ending:
                    ending.insert(0, new)
        if interrupted is not None:
            raise interrupted
    return new


# Where the read borrows of Shared values go while a graph scope records: only those the
# recording thread and task make (``scoped.py``), not another task's that runs meanwhile.
_collecting = Scoped("safetile.collect_shared")


def collect_shared(into: list, clock):
    """While the block runs, append to ``into`` ``(hold, clock())`` for the read borrow of
    every Shared value made by the thread and task that entered it. A graph scope collects
    them, with the number of launches recorded so far: a value shared after a recorded
    launch wrote its bytes is the recording's own result (a write recorded after the share
    is refused at record time), so the graph's replays may rewrite it, in recorded order,
    before the launches that read it (``Graph``)."""
    return _collecting.entered((into, clock))


def hold_shared(t: torch.Tensor, what: str) -> Hold:
    """A read borrow of ``t`` for as long as a Shared value holds it (``what`` names the
    value): while it lasts, no launch may write the storage, through any view (but the
    replays of a graph that recorded the sharing, see ``collect_shared``)."""
    hold = register(what, prepare(what, reads=[("a shared read", t)]), (t,), lasting=True)
    # The value's borrow, never an execution's (its owner stays None): even launches of the
    # execution that shared it (in a callback) may not write the bytes afterwards.
    hold.checked_in = None                        # and no operation will run it
    hold.holder = f"the shared value {what}"
    hold.remedy = "get the Tensor back with try_unwrap() (after the other handles are released)"
    collecting = _collecting.current()
    if collecting is not None:
        into, clock = collecting
        into.append((hold, clock()))
    return hold


def _raise_internal(holder: str, w: Extent, other: Extent):
    raise AliasError(
        f"{holder}: {label(w.name, True)} overlaps {label(other.name, other.write)} "
        f"({describe_overlap(w, other)}); an output must not share memory with another argument of "
        f"the same launch: pass a copy or non-overlapping slices")


def _recording(ctx) -> bool:
    """Whether the execution ``ctx`` records a graph (its launches run only when replayed)."""
    return getattr(ctx, "recording", None) is not None


def _remedy(hold: Hold, write: bool = True) -> str:
    """What to do about a conflict with ``hold`` (through a ``write`` of it or a read), met
    on this thread."""
    ctx = getattr(_owner, "ctx", None)
    if ctx is not None and hold.owner is ctx and _recording(ctx):
        if not write:
            return ("the graph being recorded reads these bytes at every replay: hand them to "
                    "torch before recording, or once the graph is dropped")
        return ("the graph being recorded writes these bytes only when it is replayed: read "
                "them after a replay (g.launch().sync()), outside the recording")
    if ctx is not None and hold.owner is None and hold.checked_in is ctx:
        # Syncing it is not possible here (execution is not re-entrant), and not needed.
        return ("that operation was built in this callback and runs only after it returns: "
                "do this in a `then` callback chained after that operation")
    return hold.remedy


def _raise_external(holder: str, new: Extent, held: Extent, hold: Hold):
    raise AliasError(
        f"{holder}: {label(new.name, new.write)} overlaps {label(held.name, held.write)} "
        f"held by {hold.holder} ({describe_overlap(new, held)}); {_remedy(hold)}, or use separate "
        f"storage")


def _conflicting(t: torch.Tensor, writes_only: bool, exempt: Hold | None = None,
                 touches_bytes: bool = True):
    """The first held ``(extent, hold)`` overlapping ``t`` (only writes if ``writes_only``),
    ``exempt`` aside. The running execution's own holds are ordered before the host's
    access, except, while it records a graph and the host touches the bytes, the writes of
    its launches (they happen only when the graph is replayed) and, for a host write (the
    bytes handed to torch), their reads too: every replay reads them again."""
    owner = getattr(_owner, "ctx", None)
    if owner is not None and t.is_cuda and not _recording(owner):
        _order_after(owner, t)
    if not any(reg.holds for reg in list(_REGISTRIES.values())):   # fast path: none in flight
        return None
    x = Extent(t)
    replayed = touches_bytes and _recording(owner)

    def scan():
        reg = _REGISTRIES.get(x.device)
        if reg is not None and x.hi > x.lo:
            for e, h in reg.near(x.lo, x.hi):
                if (e.write or not writes_only) and h is not exempt and \
                        (owner is None or h.owner is not owner or
                         (replayed and (e.write or not writes_only))) \
                        and _overlap(x, e):
                    return e, h
        return None
    return walk(scan)


def _order_after(ctx, t: torch.Tensor) -> None:
    """The host touches ``t`` while the execution ``ctx`` runs (in a ``then`` callback), whose
    own borrows count as ordered before the access: make that true on the stream torch uses
    for it, should the callback have switched streams (``with torch.cuda.stream(other)``)."""
    stream = getattr(ctx, "stream", None)
    if stream is not None:
        current = torch.cuda.current_stream(t.device)
        if current != stream:
            current.wait_stream(stream)


def check_host_read(t: torch.Tensor, what: str) -> None:
    """Raise :class:`BorrowError` if an in-flight operation writes memory ``t`` covers.

    ``what`` completes "cannot ...", e.g. ``"read Tensor(shape=(4,), float32) with
    to_torch()"``. Inside a walk of the registries: ``ExecutionError`` (``refuse_inside_walk``).
    """
    refuse_inside_walk(what)
    _check_read(t, what)


def _check_read(t: torch.Tensor, what: str) -> None:
    found = _conflicting(t, writes_only=True)
    if found is not None:
        e, h = found
        raise BorrowError(
            f"cannot {what}: {h.holder} is writing this memory through "
            f"{label(e.name, True)}; {_remedy(h)}")


@contextlib.contextmanager
def host_read(t: torch.Tensor, what: str):
    """:func:`check_host_read`, then a read borrow of ``t``'s bytes while the block copies
    them: a launch that would write them meanwhile (from another thread) is refused with
    ``AliasError`` instead of tearing the copy. Inside a walk: ``ExecutionError``."""
    refuse_inside_walk(what)

    def borrow():
        _check_read(t, what)
        hold = Hold(f"a host copy ({what})", (t,))
        hold.remedy = "let the copy finish first"
        _file(hold, by_device(prepare(what, reads=[("the copied bytes", t)])))
        return hold
    hold = walk(borrow)
    try:
        yield
        if t.is_cuda:                      # the copy is enqueued: it must end under the borrow
            torch.cuda.current_stream(t.device).synchronize()
    finally:
        hold.release()


def check_host_write(t: torch.Tensor, what: str, exempt: Hold | None = None,
                     touches_bytes: bool = True) -> None:
    """Raise :class:`BorrowError` if any in-flight operation reads or writes ``t``'s memory
    (used before handing out mutable access: DLPack export, ``into_torch``, unwrap), the hold
    ``exempt`` aside (a Shared value's own read borrow, which ends only once this passes).
    ``touches_bytes=False``: only ownership changes hands now (unwrapping a Shared value),
    so the running execution's launches, ordered before what follows, never conflict.
    Inside a walk of the registries: ``ExecutionError`` (``refuse_inside_walk``)."""
    refuse_inside_walk(what)
    found = _conflicting(t, writes_only=False, exempt=exempt, touches_bytes=touches_bytes)
    if found is not None:
        e, h = found
        verb = "writing" if e.write else "reading"
        raise BorrowError(
            f"cannot {what}: {h.holder} is {verb} this memory through "
            f"{label(e.name, e.write)}; {_remedy(h, e.write)}")


def active_holds() -> list[tuple[str, str, bool, str]]:
    """A snapshot ``(holder, name, is_write, bytes)`` of every registered borrow; ``bytes``
    describes the extent (``"cpu [0x7f..., 0x7f...)"``). It names no tensor: a borrowed
    tensor handed out here would let its bytes be read or written while they are borrowed."""
    return walk(lambda: [(h.holder, e.name, e.write, f"{e.device} [{e.lo:#x}, {e.hi:#x})")
                         for reg in _REGISTRIES.values() for h, extents in reg.holds.items()
                         for e in extents])
