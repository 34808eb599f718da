"""Graphs: record ops once, replay their launches many times.

``op.graph()`` and ``with st.graph_scope() as s: s.record(op1); s.record(op2)`` *record*:
the ops run their host side (``then`` / ``map`` callbacks run once, now) but each kernel
launch is appended to the recording instead of executing, and every op's values are handed
back at the end of its record, so borrows end between records (a write in one record and a
read of the same tensor in the next is fine). Nothing may allocate while recording
(``GraphCaptureError``): a replay reuses the recorded addresses.

When the scope closes, the recording becomes a ``Graph``:

* on the GPU (``triton`` backend) every recorded launch is compiled and loaded first (so no
  compilation happens during capture), then captured into a ``torch.cuda.CUDAGraph`` on a
  side stream; ``g.launch()`` replays it on the execution's stream;
* on the CPU executor the graph *is* the recorded list, re-executed in order on replay.

``g.launch()`` is a ``DeviceOp`` (sync, await, chain with ``then``). While a replay is in
flight the graph borrows the bytes its launches touch (each tensor's span; a byte any
launch writes as written, the others as read), so host access and other launches are
checked as for any op. A value
shared while the scope records (``x.share()`` of a recorded op's result, read by a later
record) is the graph's own: each replay rewrites it, in recorded order, before the launches
that read it; a value shared after recording still keeps every replay from writing it.
Recording ``g.launch()`` inlines ``g``'s launches, checked against the borrows in force as
recording them one by one would be.

``g.update(op)`` re-records from a new op of the same structure (same kernels, variants and
grids, in the same order) and re-captures: every argument baked into the graph (tensor
addresses, scalars) is refreshed from the new op, and ``g.output`` becomes its output.
Re-capturing (not copying into the captured buffers) keeps the new op's own tensors the
ones that are written, so its handles remain the ones that hold the results. It is refused
while a replay is in flight (``GraphCaptureError``): that replay borrows and writes the
recorded buffers and hands back the recorded output.
"""
from __future__ import annotations

import contextlib
import threading

import torch

from ..errors import CopyError, GraphCaptureError, UnsafeError
from ..tensor import borrows, replayed
from ..tensor.alloc import forbid_allocation
from ..tensor.ownership import NoCopies, finalize
from ..tensor.overlap import Extent, past_storage
from ..tensor.spans import covering_views
from .execution import RunContext, abandon_all, attach_recovered
from .op import ABANDONED, REPLAYED_BY, DeviceOp, MissingName, fail_in_sequence
from .scope import GraphScope
from .unrun import building_site, warn_unrun
from .unsafe_block import in_unsafe_block


@contextlib.contextmanager
def graph_scope(reason: str = "st.graph_scope()"):
    """Record several ops into one graph: ``with st.graph_scope() as s: s.record(op)``.

    ``s.record(op)`` records the op without running it and hands its values back at once,
    so the next record can take them (``a, b, zp = s.record(add(a, b, z.partition(...)))``).
    Nothing may allocate inside the block (``st.zeros``, ``st.empty``, ops that allocate
    their results raise ``GraphCaptureError``): a replay reuses the recorded addresses, so
    allocate buffers before the block and partition them inside it. ``op.sync()`` and
    ``await op`` inside the block raise ``GraphCaptureError`` too.

    After the block, ``s.graph`` is the ``Graph`` (its output: the tuple of each record's
    output, as the records ended) and ``s.launch()`` replays it: a ``DeviceOp`` to sync,
    await or chain."""
    scope = GraphScope(reason)
    try:
        with forbid_allocation(reason), borrows.collect_shared(scope._shared_holds, scope.count):
            yield scope
    except BaseException:
        # A scope whose block failed makes no graph, and a later record() into it (from a
        # handler, or a kept reference) must not pass for part of one.
        scope._closed = (": its `with` block raised, so it made no graph; record into a "
                         "new st.graph_scope()")
        replayed.forget_replayed(scope)
        raise
    try:
        scope._close("; record inside the `with` block")
        try:
            scope.graph = Graph(scope._records, tuple(scope.outputs),
                                shared_holds=scope._shared_holds)
        except BaseException:
            scope._closed = ": its graph could not be made (the error raised as its block ended)"
            raise
    finally:
        replayed.forget_replayed(scope)             # the graph, if made, speaks for it now


def _record(ops, reason: str, single: bool = False) -> GraphScope:
    """Record ``ops`` into a fresh scope (not yet captured). If one fails, the ops after it
    are never recorded: every value comes back, as ``e.recovered`` (the one op's values if
    ``single``, else one entry per op)."""
    scope = GraphScope(reason)
    try:
        with forbid_allocation(reason), borrows.collect_shared(scope._shared_holds, scope.count):
            for i, op in enumerate(ops):
                try:
                    scope.record(op)
                except BaseException as e:
                    if single:
                        attach_recovered(e, op._values() if isinstance(op, DeviceOp) else op)
                    else:
                        fail_in_sequence(e, scope.outputs, op, ops[i + 1:])
                    raise
    except BaseException:
        replayed.forget_replayed(scope)           # no graph will replay its launches
        raise
    finally:
        scope._closed = "; record inside the `with` block"
    return scope     # the caller makes the graph, then forgets the scope (replayed.py)


def record_graph(op: DeviceOp) -> "Graph":
    """``op.graph()``: a graph of one op whose output is that op's output."""
    scope = _record((op,), "op.graph()", single=True)
    try:
        return Graph(scope._records, scope.outputs[0], single=True,
                     shared_holds=scope._shared_holds)
    finally:
        replayed.forget_replayed(scope)           # the graph, if made, speaks for it now



def _structure(records) -> tuple:
    """What a replacement recording must match for ``Graph.update``."""
    return tuple(r.structure() for r in records)


def _difference(recorded, new) -> str:
    """What first differs between two recordings, for the ``Graph.update`` error."""
    if len(recorded) != len(new):
        return (f"the graph records {len(recorded)} launch(es) {[r.name for r in recorded]}, "
                f"the new ops {len(new)} {[r.name for r in new]}")
    for i, (a, b) in enumerate(zip(recorded, new)):
        tail = a.structure_difference(b)
        if tail:
            return f"launch {i} ({a.label}){tail}"
    return "the recordings differ"


def _rewrites(held: tuple, launches) -> bool:
    """Whether ``launches`` (their accesses) write the bytes of a shared value's borrow
    (``held``: its tensors, read once: the value's last handle may be collected meanwhile
    and its release empty them; a released borrow then exempts nothing)."""
    return bool(held) and any(written and borrows.overlaps(t, held[0])
                              for launch in launches for _, t, written in launch)


def _layout(t: torch.Tensor) -> tuple:
    return t.data_ptr(), tuple(t.shape), t.stride(), t.dtype


def _storage_ends(spans) -> tuple:
    """``(storage, address, end)`` per storage the ``spans`` lie in: its address and the end
    of the last byte they reach (the graph keeps the spans, so the storages live as long)."""
    ends: dict = {}
    for t in spans:
        if t.numel():
            storage = t.untyped_storage()
            ptr, end = storage.data_ptr(), Extent(t).hi
            if ptr not in ends or ends[ptr][2] < end:
                ends[ptr] = (storage, ptr, end)
    return tuple(ends.values())


def _describe(layout: tuple) -> str:
    ptr, shape, stride, dtype = layout
    return f"address {ptr:#x}, shape {shape}, strides {stride}, {dtype}"


class Graph(NoCopies):
    """Recorded launches replayed by ``launch()``; ``output`` is the recorded output.

    Not copyable: the memory a graph replays is kept from torch while *this* object lives
    (``replayed.py``), so a copy could replay it after the bytes were handed to torch."""

    def _refuse_copy(self, how: str):
        raise CopyError(f"{self!r} cannot be {how}: a copy would replay memory that is "
                        f"handed to torch once this graph is dropped; keep a reference to the "
                        f"graph itself, or record another one")

    sync, run, replay, result = (MissingName(REPLAYED_BY) for _ in range(4))

    def __init__(self, records: list, output, single: bool = False, shared_holds=()):
        self.output = output
        self._single = single
        # Replays begun and not yet finished (their executions still borrow the recorded
        # storages and will hand back `output`): `update` is refused while there are any.
        # The lock makes the count and update's swap of the recorded state one step, so a
        # replay reads either the old state throughout or the new one.
        self._lock = threading.Lock()
        self._in_flight = 0
        self._set(records, shared_holds)
        self._note_replayed()

    @property
    def records(self) -> tuple:
        """The recorded launches, in launch order (what a replay runs)."""
        return self._records

    def __repr__(self) -> str:
        return f"<Graph of {len(self._records)} launches on {self.backend}>"

    def _set(self, records: list, shared_holds) -> None:
        names = {r.backend_name for r in records}
        if len(names) > 1:
            raise GraphCaptureError(f"a graph cannot mix backends (recorded {sorted(names)}); "
                                    f"record ops of one backend")
        self._records = tuple(records)
        self._unsafe = any(getattr(r, "needs_unsafe", False) for r in records)
        # (name, tensor, written) of each argument, per launch: read once from the records.
        per_launch = [r._accesses() for r in self._records]
        self._touched = [a for launch in per_launch for a in launch]
        # A value shared after a recorded launch wrote its bytes is the graph's own: a replay
        # may rewrite it (borrows.collect_shared); every other shared value's borrow applies.
        # A value taken back while recording (try_unwrap) left no borrow to exempt.
        self._own_shared = frozenset(
            hold for hold, before in shared_holds
            if _rewrites(hold.tensors, per_launch[:before]))
        self.backend = names.pop() if names else "none"
        # A graph of host-run launches (the CPU executor) replays them; others are captured.
        self.host_bound = not self._records or self._records[0]._host_bound()
        # The plan's spans never overlap one another, so their extents are checked and
        # made once here; each replay only registers them against the holds in force.
        reads, writes = self._borrow_plan()
        self._extents = borrows.prepare(repr(self), reads, writes)
        self._extent_groups = borrows.by_device(self._extents)
        self._borrowed = tuple(t for _, t in writes + reads)
        # A host replay runs the records on their handles' torch tensors as they are then,
        # where a CUDA graph replays the recorded addresses: so it first checks that each
        # tensor still has the recorded address, shape, strides and dtype.
        self._layouts = tuple((r.label, name, t, _layout(t))
                              for r, launch in zip(self._records, per_launch)
                              for name, t, _ in launch) if self.host_bound else ()
        # A CUDA graph replays the recorded addresses: each span it borrows must still lie
        # at its address, within its storage (a storage resized through a torch alias moves,
        # or frees the bytes past its new end).
        self._storages = () if self.host_bound else _storage_ends(self._borrowed)
        self._cuda = None
        if not self.host_bound:
            self._capture()

    def _note_replayed(self) -> None:
        """Keep the memory the replays touch from being handed to torch while this lives."""
        replayed.note_replayed(self, self._touched)

    def _borrow_plan(self):
        """(read, write) byte views of what the launches touch (``spans.covering_views``)."""
        return covering_views(self._touched)

    def _capture(self) -> None:
        for r in self._records:
            r._prepare()                          # compile and load outside the capture
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=side, capture_error_mode="thread_local"):
            handle = side.cuda_stream
            for r in self._records:
                r._execute(handle)
        torch.cuda.current_stream().wait_stream(side)
        self._cuda = graph

    def check_layouts(self) -> None:
        """Raise ``GraphCaptureError`` if a tensor of a host replay was changed through a
        torch alias since it was recorded (its memory is no longer what the graph borrows),
        its storage shrunk included: the allocator may give the smaller block the old
        address, which the layout alone does not tell; or if memory a CUDA graph replays was
        moved or freed by a storage resize."""
        for label, name, t, recorded in self._layouts:
            if _layout(t) != recorded:
                raise GraphCaptureError(
                    f"{self!r}: the tensor passed to {label} as '{name}' was moved (its storage "
                    f"resized through a torch alias) since it was recorded "
                    f"({_describe(recorded)} then, "
                    f"{_describe(_layout(t))} now); record the graph again")
            if past_storage(t):
                raise GraphCaptureError(
                    f"{self!r}: the tensor passed to {label} as '{name}' reaches past the end "
                    f"of its storage, which was shrunk through a torch alias since it was "
                    f"recorded; record the graph again with tensors made anew")
        for storage, ptr, end in self._storages:
            if storage.data_ptr() != ptr or ptr + storage.nbytes() < end:
                raise GraphCaptureError(
                    f"{self!r}: memory it replays (bytes [{ptr:#x}, {end:#x})) was moved or "
                    f"freed since it was recorded: its storage was resized through a torch "
                    f"alias; record the graph again")

    def inline(self, ctx: RunContext) -> tuple:
        """``(records, output)`` of one state of this graph (an update swaps both at once),
        its launches checked, as recording them directly would, against the borrows in force
        (``AliasError``, with the output as ``e.recovered``), and borrowed until the record
        ``ctx`` finishes, as a recorded launch is. In particular a value shared earlier in the
        recording keeps them from writing its bytes: only launches recorded before its share
        may rewrite it (it is not this graph's own, and its replays' exemption does not carry
        over)."""
        with self._lock:
            records, output = self._records, self.output
        for i, r in enumerate(records):
            try:
                hold = r.borrow(f"{r.label} (launch {i} of the inlined {self!r})")
            except BaseException as e:
                attach_recovered(e, output, replace=True)
                raise
            hold.owner = ctx                      # ordered with the rest of the record
            ctx._finish.append(hold.release)
        return records, output

    def _replay(self, ctx: RunContext) -> None:
        if self._cuda is not None:
            self._cuda.replay()                   # on torch's current stream: ctx.stream
        else:
            for r in self._records:
                r._execute(ctx.handle)

    def launch(self) -> DeviceOp:
        """A ``DeviceOp`` that replays the graph; its output is ``self.output``. A graph of
        ``unsafe=True`` kernels is replayed only inside ``with st.unsafe():``, as they launch."""
        if self._unsafe and not in_unsafe_block():
            raise UnsafeError(f"{self!r} replays unsafe=True kernels: replay it inside "
                              f"`with st.unsafe():` to mark the call site")
        op = GraphLaunchOp(self)
        op.site = building_site()        # named by the warning if the op is dropped unrun
        return op

    def update(self, *ops) -> None:
        """Re-record from ``ops`` (one per original record) and re-capture; see the module
        docstring. Raises ``GraphCaptureError`` if the structure differs."""
        expected = 1 if self._single else len(self.output)
        if len(ops) != expected:
            err = GraphCaptureError(
                f"graph.update() takes {expected} op(s), one per op {self!r} was recorded "
                f"from, got {len(ops)}; the graph is unchanged and the ops' values are handed "
                f"back (e.recovered)")
            abandon_all([op for op in ops if isinstance(op, DeviceOp)])
            attach_recovered(err, tuple(op._values() if isinstance(op, DeviceOp) else op
                                        for op in ops))
            raise err
        scope = _record(ops, "graph.update()", single=self._single)
        outs = tuple(scope.outputs)
        output = outs[0] if self._single else outs
        try:
            if _structure(scope._records) != _structure(self._records):
                raise GraphCaptureError(
                    f"graph.update() needs ops with the structure of the recorded ones (same "
                    f"kernels, argument dtypes and shapes, grids, in order): "
                    f"{_difference(self._records, scope._records)}; the graph is unchanged and "
                    f"the new ops' values are handed back (e.recovered)")
            self._refuse_in_flight()
            # Made aside and swapped in whole: a failure (a capture that fails) leaves this
            # graph as it was.
            new = Graph(scope._records, output, self._single, scope._shared_holds).__dict__
            del new["_lock"], new["_in_flight"]
            with self._lock:
                self._refuse_in_flight()
                self.__dict__.update(new)
                self._note_replayed()
        except BaseException as e:
            attach_recovered(e, output, replace=True)
            raise
        finally:
            replayed.forget_replayed(scope)       # this graph, updated or not, speaks for it

    def _refuse_in_flight(self) -> None:
        if self._in_flight:
            raise GraphCaptureError(
                f"graph.update() while {self._in_flight} replay(s) of {self!r} are in flight: "
                f"they borrow the recorded buffers and hand back the recorded output; "
                f"synchronize them first (op.sync() or await); the graph is unchanged and "
                f"the new ops' values are handed back (e.recovered)")

    def _replay_done(self) -> None:
        with self._lock:
            self._in_flight -= 1


class GraphLaunchOp(DeviceOp):
    """One replay of a ``Graph`` (``replayed``; ``graph()`` is the DeviceOp method, which
    captures this replay into a new graph)."""

    def __init__(self, graph: Graph):
        # Private and read-only from outside: Graph.launch() checked this very graph (a graph
        # of unsafe=True kernels is replayed only inside `with st.unsafe():`).
        self._graph = graph
        self.site = None

    @property
    def replayed(self) -> Graph:
        """The graph this op replays."""
        return self._graph

    def _abandon(self) -> None:
        self._claim(ABANDONED)

    def __del__(self):
        graph = getattr(self, "_graph", None)     # (None if an interrupt cut __init__ short)
        if graph is not None and not self._consumed:
            finalize(lambda: warn_unrun(f"a replay of {graph!r}", self.site))

    def __repr__(self) -> str:
        return f"<GraphLaunchOp {self._graph!r}>"

    def _values(self):
        return self._graph.output

    def _run(self, ctx: RunContext):
        self._take()
        g = self._graph
        if ctx.recording is not None:             # a replay inside a recording: inline it
            records, output = g.inline(ctx)
            ctx.recording.extend(records)
            return output
        with g._lock:
            g._in_flight += 1                     # before reading any recorded state
        try:
            g.check_layouts()
            hold = borrows.register(f"graph replay ({len(g._records)} launches)", g._extents,
                                    g._borrowed, groups=g._extent_groups,
                                    exempt=g._own_shared)
        except BaseException as e:
            g._replay_done()
            attach_recovered(e, g.output)
            raise
        hold.owner = ctx
        # Both owed at once, through the list's own extend (no Python function entry, where
        # an interrupt could land): the replay's borrows and its in-flight count end together.
        ctx._finish.extend((hold.release, g._replay_done))
        g._replay(ctx)
        if g._records:
            ctx.last = g._records[-1]
        return g.output

    def _host_bound(self) -> bool:
        return self._graph.host_bound
