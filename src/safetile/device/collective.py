"""Collectives over ``torch.distributed`` as ``DeviceOp``s: ``st.all_reduce``, ``st.all_gather``.

A collective is an operation like a kernel launch: building it checks its buffers and moves
them in, running it enqueues the communication, and it hands them back (the same handles)
once the work is ordered before later use; their storage borrows end when it completes.

What is checked, on each rank, before anything is enqueued (a refusal moves nothing and
carries the given buffers as ``error.recovered``):

* every buffer is a live handle: one moved into another op that has not yet handed it back
  (unrun or running) is refused with ``MovedError``;
* no buffer overlaps storage held by an operation in flight on this rank (a written buffer
  no held extent, a read buffer no held write), through any view: ``AliasError``;
* within one collective, the written buffer overlaps no read buffer (``AliasError``);
* shapes, dtypes and devices agree with each other and with the process group's backend
  (``ArgumentError`` / ``CollectiveError``).

What rests on every rank, and is not checked: that all ranks of the group issue the same
collectives in the same order with buffers of the same shape and dtype. Ownership is per
process: rank 0 cannot see rank 1's borrows, so a rank that skips or reorders a collective
is not refused here; it deadlocks or mismatches, and the process group's timeout turns that
into a ``CollectiveError`` instead of a hang (set ``timeout=`` in ``init_process_group``).

Collectives are not recordable into a graph (``op.graph()``, ``st.graph_scope()``): a graph
replays kernel launches and plans its borrows from their parameters, and a collective has
none. Recording one raises ``GraphCaptureError`` and hands its buffers back.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..errors import ArgumentError, CollectiveError, GraphCaptureError, MovedError, SafetileError
from ..tensor import LOCK, Partition, Shared, Tensor, borrows
from ..tensor.ownership import LIVE, finalize, restore_all_locked
from ..tensor.tensor import within_storage
from .execution import UNKNOWN, RunContext, note_built
from .op import ABANDONED, DeviceOp
from .unrun import building_site, warn_unrun

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
               "product": dist.ReduceOp.PRODUCT}

_HINT = "it comes back when the collective is synchronized (op.sync() or await op)"


class CollectiveOp(DeviceOp):
    """One collective on this rank; holds its moved buffers until it has run."""

    # Private: the checks hold for exactly these buffers and this call.
    __slots__ = ("_name", "_args", "_hold", "_call", "_single", "_reads", "_writes", "site",
                 "_released", "_consumed")

    def __init__(self, name: str, values: tuple, hold, call, single: bool, reads, writes):
        self._name, self._args, self._hold, self._call, self._single = \
            name, values, hold, call, single
        self._reads, self._writes = reads, writes        # (name, torch tensor) pairs
        self._released = False
        self._consumed = False
        self.site = building_site(3)
        note_built(self)

    def __repr__(self) -> str:
        return f"<CollectiveOp {self._name}>"

    def _output(self):
        return self._args[0] if self._single else self._args

    def _hand_back(self) -> None:
        if self._released:
            return
        with LOCK:
            try:
                self._released = True
                for v in self._args:
                    v._restore_locked()
            except BaseException as e:            # a Shared clone collected with this op,
                self._released = True             # or an interrupt between two restores
                restore_all_locked(self._args)
                if not isinstance(e, MovedError):
                    raise

    def _release(self) -> None:
        self._hold.release()
        self._hand_back()

    def _run(self, ctx: RunContext):
        self._take()
        if ctx.recording is not None:
            self._release()                       # refused: the buffers come back now
            err = GraphCaptureError(
                f"{self._name} cannot be recorded into a graph: graphs replay kernel launches "
                f"only; run the collective outside the graph scope, between replays")
            err.recovered = self._output()
            raise err
        hold = self._hold
        if hold.checked_in is not None and hold.checked_in is not ctx:
            try:                                  # built in another execution's callback
                hold = self._hold = borrows.borrow_again(hold, ctx, lambda exempt: (
                    borrows.acquire(self._name, self._reads, self._writes, exempt)))
            except BaseException as e:
                self._hand_back()
                e.recovered = self._output()
                raise
        hold.owner = ctx
        # Owed through the lists' own appends: an interrupt lands at a Python function's
        # entry, and one landing before ctx owes these would keep the buffers for good.
        ctx._finish.append(hold.release)
        ctx._settle.append(self._hand_back)
        ctx.last = UNKNOWN                        # not a kernel: later PDL launches go in order
        try:
            for name, t in (*self._reads, *self._writes):   # a storage shrunk since the build
                within_storage(t, f"run {self._name} on '{name}'")
            self._call()
        except SafetileError as e:
            e.recovered = self._output()
            raise
        except (RuntimeError, ValueError) as e:   # gloo/NCCL: a peer left, or timed out
            rank = _this_rank()
            why = ("A peer may have exited or be issuing a different sequence of collectives; "
                   "every rank must issue the same collectives in the same order") if rank else (
                "The process group was destroyed before the collective ran: sync every "
                "collective before torch.distributed.destroy_process_group()")
            err = CollectiveError(f"{self._name} failed on {rank or 'this rank'}: {e}. {why}")
            err.recovered = self._output()
            raise err from e
        return self._output()

    def _abandon(self) -> None:
        if self._claim(ABANDONED):
            self._release()

    def _values(self):
        return self._output()

    def _host_bound(self) -> bool:
        # gloo blocks the calling thread until the peers answer; NCCL only enqueues.
        return self._args[-1]._torch.device.type != "cuda"

    def __del__(self):
        if not getattr(self, "_consumed", True):
            self._consumed = True
            finalize(self._drop_unrun)

    def _drop_unrun(self) -> None:
        self._release()
        warn_unrun(self._name, self.site)


def _this_rank() -> str | None:
    """This process's global rank, as an error names it; None once the process group is gone."""
    try:
        return f"rank {dist.get_rank()} of {dist.get_world_size()}"
    except (RuntimeError, ValueError):
        return None


def _group_size(what: str, group) -> int:
    if type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ArgumentError(f"{what}: this rank is not a member of the group "
                            f"(torch.distributed.new_group gives non-members a placeholder); "
                            f"call the collective on the group's ranks only")
    if group is not None and not isinstance(group, getattr(dist, "ProcessGroup", ())):
        raise ArgumentError(f"{what}: group={group!r:.80} is not a process group; pass None "
                            f"(the default group) or one torch.distributed.new_group made")
    if not dist.is_available() or not dist.is_initialized():
        raise CollectiveError(f"{what} needs a torch.distributed process group: call "
                              f"torch.distributed.init_process_group(...) first (gloo on the "
                              f"CPU, nccl on CUDA), or start the processes with torchrun")
    return dist.get_world_size(group)


def _buffer(what: str, name: str, v, kinds=(Tensor,)) -> torch.Tensor:
    """The torch tensor of a buffer argument, checked (nothing moved yet)."""
    if isinstance(v, Partition):
        raise ArgumentError(f"{what}: '{name}' is a Partition; a collective reads and writes "
                            f"the whole buffer on every rank, not tiles: pass the Tensor "
                            f"(p.unpartition())")
    if not isinstance(v, kinds):
        want = " or ".join(f"st.{k.__name__}" for k in kinds)
        raise ArgumentError(f"{what}: '{name}' expects {want}, got {type(v).__name__}")
    v._check(f"pass it to {what}")
    t = v._torch
    within_storage(t, f"pass '{name}' to {what}")    # the peers would read or write past it
    if not t.is_contiguous():
        raise ArgumentError(f"{what}: '{name}' has strides {t.stride()}; collectives send a "
                            f"contiguous buffer: make it contiguous first")
    return t


def _check_device(what: str, t: torch.Tensor, group) -> None:
    backend = str(dist.get_backend(group))
    want = "cuda" if backend == "nccl" else "cpu"
    if t.device.type != want:
        raise CollectiveError(f"{what}: the process group's backend is {backend}, which "
                              f"communicates {want} memory, but the buffer is on {t.device}")


def _build(what: str, reads, writes, values: tuple, call, single: bool) -> CollectiveOp:
    """Borrow the storage and move the handles in (all or nothing) and return the op."""
    with LOCK:
        for v in values:
            if v._state is not LIVE:
                v._check(f"pass it to {what}")
        hold = borrows.acquire(what, reads, writes)
        try:
            for n, v in enumerate(values):
                v._move_locked(f"{what}, argument {n}", _HINT)
        except BaseException:
            for v in values[:n]:
                v._restore_locked()
            hold.release()
            raise
    return CollectiveOp(what, values, hold, call, single, reads, writes)


def _gather(to: torch.Tensor, tx: torch.Tensor, size: int, group) -> None:
    if to.device.type == "cuda":
        dist.all_gather_into_tensor(to, tx, group=group)
    else:                                         # gloo has no gather into one tensor
        dist.all_gather(list(to.chunk(size)), tx, group=group)


def all_reduce(buf: Tensor, op: str = "sum", group=None) -> CollectiveOp:
    """Reduce ``buf`` in place across the ranks of ``group``; the op's output is ``buf``.

    ``op``: ``"sum"``, ``"max"``, ``"min"`` or ``"product"``. ``buf`` is moved in (a write
    borrow of all its bytes) and handed back when the op has run. Checked on this rank
    before anything is enqueued: see the module docstring; every rank must call it in the
    same order with a buffer of the same shape and dtype (not checked: no rank sees
    another's buffers)."""
    what = "st.all_reduce"
    try:
        if type(op) is not str or op not in _REDUCE_OPS:
            raise ArgumentError(f"{what}: op={op!r} is not one of {sorted(_REDUCE_OPS)}")
        t = _buffer(what, "buf", buf)
        _group_size(what, group)
        _check_device(what, t, group)
        reduce_op = _REDUCE_OPS[op]
        return _build(what, [], [("buf", t)], (buf,),
                      lambda: dist.all_reduce(t, reduce_op, group=group), single=True)
    except SafetileError as e:
        e.recovered = buf
        raise


def all_gather(x, out: Tensor, group=None) -> CollectiveOp:
    """Gather every rank's ``x`` into ``out``, rank by rank along axis 0; output ``(x, out)``.

    ``x``: a ``Tensor`` or ``Shared`` (read); ``out``: a ``Tensor`` of shape
    ``(world_size * x.shape[0], *x.shape[1:])``, same dtype and device (written). Both are
    moved in and handed back when the op has run. Checked on this rank: see the module
    docstring; that every rank passes ``x`` of the same shape, in the same sequence of
    collectives, is not checked."""
    what = "st.all_gather"
    try:
        tx = _buffer(what, "x", x, (Tensor, Shared))
        to = _buffer(what, "out", out)
        size = _group_size(what, group)
        if x is out:
            raise ArgumentError(f"{what}: the same handle is passed as 'x' and 'out'")
        if tx.dim() == 0:
            raise ArgumentError(f"{what}: 'x' is 0-d; reshape it to (1,)")
        want = (size * tx.shape[0], *tx.shape[1:])
        if tuple(to.shape) != want or to.dtype != tx.dtype or to.device != tx.device:
            raise ArgumentError(
                f"{what}: 'out' must be {want} {tx.dtype} on {tx.device} for {size} ranks of x "
                f"{tuple(tx.shape)}, got {tuple(to.shape)} {to.dtype} on {to.device}")
        _check_device(what, tx, group)
        return _build(what, [("x", tx)], [("out", to)], (x, out),
                      lambda: _gather(to, tx, size, group), single=False)
    except SafetileError as e:
        e.recovered = (x, out)
        raise
