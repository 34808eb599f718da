"""``GraphScope``: what ``st.graph_scope()`` yields, recording ops for one graph.

Threads may share a scope: one record at a time holds the scope's turn (its lock) and
appends launches, and a record's launches are the scope's only if the scope is still open
when the record ends. A record gives up the turn while one of its ``then`` / ``map``
callbacks runs (it appends nothing then): the callback may wait for another thread that
records into the same scope, which would otherwise wait for the turn forever. That thread's
launches then fall between the record's own, in the order they were recorded; the borrows
of the unfinished record keep it from touching what the record uses. A record that fails
drops its own launches wherever they lie, and the launch kept after a dropped stretch goes
in plain order (what it was recorded after is gone).

Closing the scope (its ``with`` block ending) while a record runs on another thread makes no
graph: the graph would hold part of that record's launches, or none, while the record
reported success. The close raises ``GraphCaptureError`` at once (waiting could never end if
the record waits on the closing thread), and the record fails, handing its values back.
"""
from __future__ import annotations

import bisect
import threading

from ..errors import CopyError, GraphCaptureError
from ..tensor import borrows, replayed
from ..tensor.alloc import forbid_allocation
from ..tensor.ownership import NoCopies
from .execution import RunContext, abandon_and_finish, attach_recovered, executing, refused
from .op import DeviceOp


class GraphScope(NoCopies):
    """Records ops for one graph; ``scope.graph`` is the ``Graph`` once the scope closes."""

    def _refuse_copy(self, how: str):
        raise CopyError(f"{self!r} cannot be {how}: a copy would record launches outside "
                        f"the scope's own bookkeeping; record through the scope itself")

    def __init__(self, reason: str):
        self.reason = reason
        self._records: list = []         # KernelOps, in launch order
        self.outputs: list = []          # one output per record() call, as they ended
        self.graph = None                # the Graph, once the block has ended
        self._closed = None              # why records are refused now, once the scope closed
        self._shared_holds: list = []    # (read borrow, launches before it) per value shared
        self._lock = threading.Lock()    # the turn: held by the record() appending launches
        self._turns: list = []           # the records running (changed under _lock)

    def __repr__(self) -> str:
        return f"<{self.reason} of {len(self._records)} recorded launches>"

    @property
    def records(self) -> tuple:
        """The launches recorded so far, in launch order."""
        return tuple(self._records)

    @property
    def recording(self) -> bool:
        """Whether the scope may still become a graph (it has not closed)."""
        return self._closed is None

    def count(self) -> int:
        """Launches recorded so far."""
        return len(self._records)

    def record(self, op: DeviceOp):
        """Record ``op`` and return its output (its values are handed back now)."""
        if not isinstance(op, DeviceOp):
            err = GraphCaptureError(f"record() takes a DeviceOp, got {type(op).__name__}")
            attach_recovered(err, op)
            raise err
        if self._closed is not None:
            self._refuse_closed(op)
        # The scope's guards apply to the code a record runs (its callbacks), whichever
        # thread or task calls record(): they are entered for that caller too.
        try:
            with executing(f"a record into {self.reason}"), forbid_allocation(self.reason), \
                    borrows.collect_shared(self._shared_holds, self.count):
                turn = _Turn(self)
                try:
                    turn.take()
                    if self._closed is not None:  # closed while this one waited
                        self._refuse_closed(op)
                    self._turns.append(turn)
                    try:
                        out = self._record(op, turn)
                    finally:
                        self._turns.remove(turn)
                finally:
                    if turn.held:                 # (no call between the test and the release)
                        turn.held = False
                        self._lock.release()
        except BaseException as e:
            # Refused before it started (an interrupt, a re-entrant record), the op keeps
            # its values: the error names them, as a refused sync's does.
            refused(e, op)
            raise
        self.outputs.append(out)
        return out

    def _record(self, op: DeviceOp, turn: "_Turn"):
        """Record ``op`` holding ``turn``; its output, once its values are handed back."""
        ctx = RunContext(None, recording=self._records)
        ctx.turn = turn
        out, noted = None, False
        try:
            with borrows.owned_by(ctx):
                out = op._run(ctx)
            # (noted first: a close that fails meanwhile forgets it, or this record does)
            replayed.note_recorded(self, [a for r in turn.launches() for a in r._accesses()])
            noted = True
            if self._closed is not None:
                replayed.forget_replayed(self)    # the scope makes no graph now
                err = GraphCaptureError(
                    f"{self.reason} closed on another thread while this record ran, so "
                    f"it made no graph; the op was not recorded and its values are "
                    f"handed back (e.recovered). End the scope's block only once the "
                    f"threads recording into it are done")
                attach_recovered(err, out)
                raise err
            # Until the graph is made, the scope keeps what its launches touch from torch
            # (noted above, before the launches' borrows end: no moment leaves them free).
            # Finished inside the try: a record cut short here (an interrupt) is a failed
            # one, whose launches' borrows the handler below still ends.
            ctx.finish()
        except BaseException as e:
            if out is not None:
                attach_recovered(e, out)
            # The launches a failed record appended are dropped: its values come back to
            # the caller, so no replay may write them (and a value it shared follows no
            # launch of it). Dropping needs the turn, which an interrupt as a callback
            # ended (at take()'s entry) left given up.
            while not turn.held:
                try:
                    turn.take()
                except BaseException:             # (taken by then, unless at its entry)
                    pass
            try:
                turn.failed = True
                self._drop(turn)
                if noted and self._closed is None:    # what is kept from torch: the launches
                    replayed.note_replayed(self, [a for r in self._records  # left
                                                  for a in r._accesses()])
            finally:
                while True:                       # again if interrupted as it is entered
                    try:
                        abandon_and_finish(op, ctx)
                        break
                    except KeyboardInterrupt:
                        continue
            raise
        return out

    def _drop(self, turn: "_Turn") -> None:
        """Drop the launches of ``turn``'s failed record, wherever they lie among others'."""
        records = self._records
        gone = sorted(i for start, end in turn.stretches() for i in range(start, end))
        if not gone:
            return
        dropped = set(gone)
        for i in gone:
            if i + 1 < len(records) and i + 1 not in dropped:
                records[i + 1]._follows_unknown()   # recorded after a launch now gone
        records[:] = [r for i, r in enumerate(records) if i not in dropped]

        def shifted(n: int) -> int:               # a position counted before the drop
            return n - bisect.bisect_left(gone, n)
        self._shared_holds[:] = [(h, shifted(n)) for h, n in self._shared_holds]
        for other in self._turns:
            if other is not turn:                 # (each waits outside its stretches now)
                other.done = [(shifted(a), shifted(b)) for a, b in other.done]

    def _refuse_closed(self, op) -> None:
        # The op will never be recorded: its values come back with the error.
        err = GraphCaptureError(f"{self.reason} is closed{self._closed}; the op was not "
                                f"recorded and its values are handed back (e.recovered)")
        op._abandon()
        attach_recovered(err, op._values())
        raise err

    def _close(self, why: str) -> None:
        """Refuse records from now on (``why`` ends the refusal's "is closed" sentence);
        ``GraphCaptureError`` if a record is running on another thread (see the module)."""
        self._closed = why
        if self._lock.acquire(blocking=False):    # none appends now, and none can start
            running = bool(self._turns)           # (one may be inside a callback)
            self._lock.release()
            if not running:
                return
        self._closed = (": it closed while a record into it ran on another thread, so it "
                        "made no graph; record into a new st.graph_scope()")
        raise GraphCaptureError(
            f"{self.reason} ended while a record into it was running on another thread: its "
            f"graph would have held part of that record, so it made no graph (that record "
            f"fails and hands its values back). End the block only once the threads "
            f"recording into the scope are done (join them inside it)")

    def launch(self) -> DeviceOp:
        """Replay the scope's graph (after the block): ``self.graph.launch()``."""
        if self.graph is None:
            if self._closed is not None:
                raise GraphCaptureError(f"{self.reason} is closed{self._closed}")
            raise GraphCaptureError(f"{self.reason} is still recording; launch after the block")
        return self.graph.launch()


class _Turn:
    """A record's hold on its scope's turn, given up while a callback of the record runs."""

    __slots__ = ("scope", "done", "start", "failed", "held")

    def __init__(self, scope: GraphScope):
        """The turn of a record about to take it (``take()``)."""
        self.scope = scope
        self.done: list = []             # [start, end) of the record's earlier stretches
        self.start = 0                   # where its current stretch of launches begins
        self.failed = False              # its launches were dropped: what it ran is not recorded
        self.held = False                # whether it holds ``scope._lock``

    def take(self) -> None:
        """Take the turn (again); an interrupt while waiting is raised once it is taken."""
        interrupted = None
        while True:
            try:
                self.scope._lock.acquire()
                self.held = True                  # (no call since the lock was taken)
                break
            except BaseException as e:            # (KeyboardInterrupt): the record must
                interrupted = interrupted or e    # hold the turn to drop its launches
        self.start = len(self.scope._records)
        if interrupted is not None:
            raise interrupted

    def stretches(self) -> list:
        """[start, end) of each stretch of the record's launches (while it holds the turn)."""
        return self.done + [(self.start, len(self.scope._records))]

    def launches(self) -> list:
        """The record's launches so far, in order (while it holds the turn)."""
        records = self.scope._records
        return [r for start, end in self.stretches() for r in records[start:end]]

    def run(self, f, args):
        """``f(*args)``, a callback of the record, run without the turn."""
        self.done = self.stretches()
        self.held = False
        self.scope._lock.release()
        try:
            return f(*args)
        finally:
            self.take()
