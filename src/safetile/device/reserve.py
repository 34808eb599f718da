"""``ReservingOp``: an op of several launches that borrows, from when it is built, the bytes
its later launches write, and those they alone read.

A launch borrows its arguments' bytes when it is built. An op of several launches builds the
later ones only when it runs (in ``then`` callbacks), so without a reservation the bytes they
write would be free meanwhile: the host could hand them to torch (``into_torch``) or another
launch could take them, and the later launch would then write memory safetile no longer
governs. A later launch's input that the first launch does not read is free the same way:
the host could hand it to torch, or write it, before the launch reads it. The reservation is a
write borrow of the bytes the later launches write and a read borrow of those they alone
read, made with the first launch; it belongs to the execution that runs the op, whose own
later launches it never blocks, and ends when that execution finishes.
"""
from __future__ import annotations

from ..tensor import borrows
from ..tensor.ownership import finalize
from .execution import RunContext, note_built
from .op import ABANDONED, DeviceOp


class ReservingOp(DeviceOp):
    """``inner`` holding ``hold`` (a write borrow of what its later launches write, a read
    borrow of what they alone read) until the execution that runs it finishes, or until it is
    abandoned or dropped unrun; then it releases ``handles``, the ``Shared`` clones its later
    launches take in (made when it was built, so the caller may move its own meanwhile)."""

    # Private: the reservation covers exactly these launches and bytes.
    __slots__ = ("_inner", "_hold", "_holder", "_reads", "_writes", "_handles", "_consumed")

    def __init__(self, inner: DeviceOp, holder: str, writes, reads=(), handles=()):
        """Borrow ``writes`` and ``reads`` (``(name, torch tensor)`` pairs) for ``inner``
        (``AliasError`` if an operation in flight writes any of them, or holds any of
        ``writes``: ``inner``, which never runs then, hands its values back)."""
        self._inner, self._holder, self._handles = inner, holder, tuple(handles)
        self._reads, self._writes = tuple(reads), tuple(writes)
        self._consumed = True                     # nothing to release if acquire fails
        try:
            self._hold = borrows.acquire(holder, self._reads, self._writes)
        except BaseException as e:
            inner._abandon()
            self._release_handles()
            e.recovered = inner._values()
            raise
        self._consumed = False
        note_built(self)

    def __repr__(self) -> str:
        return repr(self._inner)

    def _run(self, ctx: RunContext):
        # Claimed once (atomically): only the execution that set the reservation up may run
        # the inner op, whose later launches the reservation covers in that execution.
        self._take()
        hold = self._hold
        if hold.checked_in is not None and hold.checked_in is not ctx:
            # Built in another execution's callback: its borrows were checked with that
            # execution's own work set aside, and this one is not ordered with it.
            try:
                hold = self._hold = borrows.borrow_again(hold, ctx, lambda exempt: (
                    borrows.acquire(self._holder, self._reads, self._writes, exempt)))
            except BaseException as e:
                # The op is claimed, so nothing else ends the reservation: borrow_again ends
                # it, unless an interrupt landed at its entry (releasing is idempotent).
                self._end()
                self._inner._abandon()
                e.recovered = self._inner._values()
                raise
        hold.owner = ctx
        # Owed through the list's own append (no Python function entry, where an interrupt
        # lands): one landing after the claim but before ctx owes the release would keep the
        # reservation for good (the op, claimed, never ends it).
        ctx._finish.append(hold.release)
        if self._handles:                      # once the later launches handed them back
            ctx._finish.append(lambda: ctx.defer(self._release_handles))
        return self._inner._run(ctx)

    def _release_handles(self) -> None:
        for h in self._handles:
            h.release()

    def _abandon(self) -> None:
        if self._claim(ABANDONED):
            self._end()
        self._inner._abandon()

    def _values(self):
        return self._inner._values()

    def _host_bound(self) -> bool:
        return self._inner._host_bound()

    def __del__(self):
        # Dropped unrun: the reservation ends (the inner op hands its own values back and
        # warns that it never ran).
        if not getattr(self, "_consumed", True):
            self._consumed = True
            finalize(self._end)

    def _end(self) -> None:
        """End the reservation of an op that never runs."""
        self._hold.release()
        self._release_handles()
