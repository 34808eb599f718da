"""``GraphScope``: what ``st.graph_scope()`` yields, recording ops for one graph.

Threads may share a scope: one record runs at a time (its lock), and a record's launches
are the scope's only if the scope is still open when the record ends. Closing the scope (its
``with`` block ending) while a record runs on another thread makes no graph: the graph would
hold part of that record's launches, or none, while the record reported success. The close
raises ``GraphCaptureError`` at once (waiting could never end if the record waits on the
closing thread), and the record fails, handing its values back.
"""
from __future__ import annotations

import threading

from ..errors import CopyError, GraphCaptureError
from ..tensor import borrows, replayed
from ..tensor.alloc import forbid_allocation
from ..tensor.ownership import NoCopies
from .op import DeviceOp, RunContext, abandon_and_finish, attach_recovered, executing


class GraphScope(NoCopies):
    """Records ops for one graph; ``scope.graph`` is the ``Graph`` once the scope closes."""

    def _refuse_copy(self, how: str):
        raise CopyError(f"{self!r} cannot be {how}: a copy would record launches outside "
                        f"the scope's own bookkeeping; record through the scope itself")

    def __init__(self, reason: str):
        self.reason = reason
        self._records: list = []         # KernelOps, in launch order
        self.outputs: list = []          # one output per record() call
        self.graph = None                # the Graph, once the block has ended
        self._closed = None              # why records are refused now, once the scope closed
        self._shared_holds: list = []    # (read borrow, launches before it) per value shared
        self._lock = threading.Lock()    # held by the record() in progress

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
        # One record at a time (threads may share a scope): a failed record drops the launches
        # appended after its start, which must all be its own.
        with executing(f"a record into {self.reason}"), self._lock, \
                forbid_allocation(self.reason), \
                borrows.collect_shared(self._shared_holds, self.count):
            if self._closed is not None:          # closed while this one waited
                self._refuse_closed(op)
            ctx = RunContext(None, recording=self._records)
            before = len(self._records)
            try:
                with borrows.owned_by(ctx):
                    out = op._run(ctx)
                # (noted first: a close that fails meanwhile forgets it, or this record does)
                replayed.note_recorded(self, [a for r in self._records[before:]
                                              for a in r._accesses()])
                if self._closed is not None:
                    replayed.forget_replayed(self)    # the scope makes no graph now
                    err = GraphCaptureError(
                        f"{self.reason} closed on another thread while this record ran, so "
                        f"it made no graph; the op was not recorded and its values are "
                        f"handed back (e.recovered). End the scope's block only once the "
                        f"threads recording into it are done")
                    attach_recovered(err, out)
                    raise err
            except BaseException:
                # The launches a failed record appended are dropped: its values come back to
                # the caller, so no replay may write them (and a value it shared follows no
                # launch of it).
                del self._records[before:]
                self._shared_holds[:] = [(h, min(n, before)) for h, n in self._shared_holds]
                abandon_and_finish(op, ctx)
                raise
            # Until the graph is made, the scope keeps what its launches touch from torch
            # (noted above, before the launches' borrows end: no moment leaves them free).
            ctx.finish()
        self.outputs.append(out)
        return out

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
        if self._lock.acquire(blocking=False):    # no record runs, and none can start
            self._lock.release()
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
