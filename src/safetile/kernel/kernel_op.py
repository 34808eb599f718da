"""``KernelOp``: one launch of a kernel, holding its moved arguments until it is settled."""
from __future__ import annotations

from ..device.execution import UNKNOWN, RunContext, attach_recovered, note_built
from ..device.op import ABANDONED, DeviceOp
from ..device.unrun import warn_unrun
from ..tensor import borrows
from ..tensor.overlap import _overlap
from ..errors import MovedError
from ..tensor.ownership import LOCK, finalize, restore_all_locked


class KernelOp(DeviceOp):
    """A launched (but not yet executed) kernel; its output is every argument, in order.

    Built by ``kernel(...)`` (``kernel/launch.py``) with the arguments already checked, moved
    in and their storage borrowed (``hold``): ``values`` are the arguments in parameter order
    (what the op hands back), ``plan`` the ``LaunchPlan`` of their checked facts. Running it
    enqueues the kernel through its backend (``backend.execute``), defers the hand-back of the handles (``_hand_back``) to the
    execution's settle step and the end of its storage borrows to the execution's finish. Inside a graph recording it appends itself to the recording instead of executing;
    a graph replays it through ``_execute``, which launches without touching ownership.
    """

    # Private and read-only from outside: a launch's checks hold for exactly these arguments,
    # plan and borrows, so none of them may be swapped after the op is built.
    __slots__ = ("_kernel", "_plan", "_args", "_backend", "_hold", "_serial", "_running",
                 "_released", "_consumed", "_executed", "site")

    def __init__(self, kernel, plan, values, backend, hold):
        self._kernel, self._plan, self._args, self._backend, self._hold = \
            kernel, plan, values, backend, hold
        # Launch without programmatic launch even if the kernel is compiled for it: set by
        # _run when a launch that may still run could write what this one loads before its
        # wait. `running`: the launches that may still run when this one starts.
        self._serial = False
        self._running = ()
        self._released = False
        # Runnable only once the launcher has it (``launch`` clears this): an interrupt while
        # it is built leaves an op that hands nothing back, as the launcher does that then.
        self._consumed = True
        self._executed = False                    # ran outside a recording (_let_go)
        self.site = None                          # where it was built (kernel.__call__ sets it)
        note_built(self)

    def __repr__(self) -> str:
        return f"<KernelOp {self._kernel.name} grid={self.grid} backend={self._backend.name}>"

    @property
    def needs_unsafe(self) -> bool:
        """Whether a launch (a graph's replay of it too) needs ``with st.unsafe():``."""
        return self._kernel.unsafe

    @property
    def kernel(self):
        """The launched ``Kernel`` (with its options)."""
        return self._kernel

    @property
    def values(self) -> tuple:
        """The arguments it holds, in parameter order (empty once handed back after running)."""
        return self._args

    @property
    def backend(self):
        """The backend it runs on."""
        return self._backend

    @property
    def serial(self) -> bool:
        """Whether it launches without programmatic dependent launch (set when it runs)."""
        return self._serial

    @property
    def grid(self) -> tuple:
        """The launch grid."""
        return self._plan.grid

    @property
    def _bound(self) -> list:
        """The arguments as ``BoundArg``s (built on demand: graphs and the backends)."""
        return self._plan.bound(self._args)

    def variant(self):
        """The kernel's compiled ``Variant`` for these arguments (the Triton backend)."""
        return self._kernel._launches.variant(self._kernel, self._bound)

    def _hand_back(self) -> None:
        """Make the argument handles live again (idempotent). The storage borrows stay until
        the execution finishes (``hold.release``), so other launches still see them."""
        if self._released:
            return
        values = self._args
        with LOCK:
            try:
                self._released = True
                for i, _ in self._plan.moves:
                    values[i]._restore_locked()
            except BaseException as e:
                # A Shared clone collected with this op is released (MovedError), or an
                # interrupt landed between two restores: every other handle comes back first.
                self._released = True
                restore_all_locked([values[i] for i, _ in self._plan.moves])
                if not isinstance(e, MovedError):
                    raise
            if self._executed:
                self._let_go_locked()

    def _release(self) -> None:
        """End the borrows, then hand the arguments back (an op that never ran, or failed)."""
        self._hold.release()
        self._hand_back()

    def _execute(self, stream: int = 0) -> None:
        """Launch on the raw CUDA stream handle ``stream`` (or run on the CPU executor)."""
        self._backend.execute(self, stream)

    def _prepare(self) -> None:
        """Compile and load the binary without launching (before a graph capture)."""
        self._backend.prepare(self)

    def _run(self, ctx: RunContext) -> tuple:
        self._take()                              # an op runs once (raises if it ran)
        try:
            hold = self._hold
            if hold.checked_in is not None and hold.checked_in is not ctx:
                hold = self._borrow_again(ctx)
            hold.owner = ctx                      # ordered with the rest of this execution
            if ctx.keeps(self._plan.extents):
                hold.release()                    # the execution already borrows these bytes
            else:
                ctx._finish.append(hold.release)
            ctx._settle.append(self._hand_back)
        except BaseException as e:
            # Taken, and nothing enqueued: an interrupt before ctx owes the release would
            # leave the values moved for good (both steps are idempotent).
            self._release()
            attach_recovered(e, self._args)
            raise
        opts = self._kernel.opts
        if opts.get("pdl"):
            recording = ctx.recording
            if recording is not None:
                prev = recording[-1] if recording else None
            else:
                prev = ctx.last
            if prev is None or prev is UNKNOWN or not prev._enqueues_for(self):
                # Nothing known of what runs just before: a graph's first launch (a replay, or
                # a graph inlined into another recording, may follow anything), an
                # execution's first, one after a callback, one after a launch that put no
                # work on the stream (its own predecessor is this one's). Plain order.
                serial, running = True, ()
            else:
                running = may_still_run(prev)
                serial = len(running) > MAX_RUNNING or bool(
                    opts.get("early") and writes_early_reads(running, self))
                if serial:
                    running = ()
            self._serial = serial
            # only read back when this kernel signals early (may_still_run)
            self._running = running if opts.get("trigger_early") else ()
        ctx.last = self
        if ctx.recording is not None:
            ctx.recording.append(self)
            return self._args
        try:
            self._execute(ctx.handle)
        except BaseException as e:
            e.recovered = self._args              # the arguments are not lost: see e.recovered
            raise
        self._executed = True
        return self._args

    def _enqueues_for(self, op: "KernelOp") -> bool:
        """Whether this launch puts work on the stream that ``op`` follows it on: not with
        no programs (the launcher enqueues nothing) nor on another backend (the CPU
        executor runs it on the host)."""
        return type(self._backend) is type(op._backend) and 0 not in self._plan.grid

    def _let_go_locked(self) -> None:
        """Let go of the handed-back values (under ``LOCK``; after an executed op's hand-back, or
        when an op is collected): an op kept by the caller must not keep, say, a Shared clone
        alive, and the hold takes over the tensors it still borrows. A recorded op keeps them:
        its graph replays it."""
        hold = self._hold
        if not hold._released:
            values = self._args
            hold.tensors = tuple([values[i]._torch for i, _ in self._plan.moves])
        self._args = ()

    def _borrow_again(self, ctx):
        """This op was built inside another execution's callback, so its borrows were checked
        with that execution's own in-flight work set aside; it runs in ``ctx``, which is not
        ordered with that work: check them again (``AliasError``, values handed back)."""
        old, plan = self._hold, self._plan
        try:
            new = borrows.borrow_again(old, ctx, lambda exempt: borrows.register(
                plan.holder, plan.extents, old.tensors, plan.groups, exempt))
        except BaseException as e:
            self._hand_back()
            e.recovered = self._args
            raise
        self._hold = new
        return new

    def _abandon(self) -> None:
        # Again for an op already abandoned: an interrupt may have cut that release short.
        if self._claim(ABANDONED) or self._consumed is ABANDONED:
            self._release()

    def _values(self):
        return self._args

    def __del__(self):
        # An op dropped without running (built, then never synced or awaited) hands its
        # arguments back, so that neither the handles nor the storage borrows leak. It is
        # consumed at once: a finalizer may be queued (ownership.finalize) and the op saved
        # meanwhile by another object's finalizer; it must not run then.
        if not getattr(self, "_consumed", True):
            self._consumed = True
            finalize(self._drop_unrun)
            return
        # Its borrows may outlive it (a `then` chain drops an op once it has handed its values
        # back; they end when the execution finishes). The extents refer to the tensors
        # weakly, and while the op lived it kept them alive: the hold keeps them from now on,
        # so that the bytes stay allocated while borrowed and a strided extent's exact
        # overlap check can still read its layout.
        hold = getattr(self, "_hold", None)
        if hold is not None and not hold._released and self._args:
            finalize(self._let_go)

    def _drop_unrun(self) -> None:
        self._release()
        warn_unrun(f"kernel '{self._kernel.name}' ({self._kernel.where})", self.site)

    def _let_go(self) -> None:
        with LOCK:
            if not self._hold._released and self._args:
                self._let_go_locked()

    def _host_bound(self) -> bool:
        return self._backend.host_bound

    # -- what the runtime asks of a launch it records or names (device/graph.py,
    # device/combinators.py): it reads nothing else of a kernel ---------------------------------
    @property
    def name(self) -> str:
        """The kernel's name."""
        return self._kernel.name

    @property
    def label(self) -> str:
        """How errors name this launch: ``kernel 'name'``."""
        return f"kernel '{self._kernel.name}'"

    @property
    def backend_name(self) -> str:
        """The name of the backend it runs on."""
        return self._backend.name

    def _accesses(self):
        """``(parameter name, torch tensor, written)`` for each tensor argument."""
        return [(b.name, b.torch, b.spec.kind != "In") for b in self._bound
                if b.torch is not None]

    def _follows_unknown(self) -> None:
        """Launch in plain order: the launch it was recorded after was dropped since."""
        self._serial, self._running = True, ()

    def structure(self) -> tuple:
        """What a re-recording must match (``Graph.update``): the kernel, its options, grid
        and backend, and each argument's kind, dtype, shape and tile shape."""
        args = tuple((b.spec.kind, b.torch.dtype, tuple(b.torch.shape), b.tile)
                     if b.torch is not None else (b.spec.kind, type(b.value))
                     for b in self._bound)
        return (self._kernel.fn, self._kernel.opts, self.grid, self._backend, args)

    def structure_difference(self, new: "KernelOp") -> str:
        """The first way ``new`` differs from this launch's structure, as the tail of a
        sentence naming this launch ("" if none)."""
        if self._kernel.fn is not new._kernel.fn:
            return f" is kernel '{new._kernel.name}' in the new ops"
        if self._kernel.opts != new._kernel.opts:
            return f" has options {self._kernel.opts}, the new one {new._kernel.opts}"
        if self._backend != new._backend:
            return f" ran on {self._backend.name}, the new one on {new._backend.name}"
        for x, y in zip(self._bound, new._bound):
            if x.torch is None:
                if type(x.value) is not type(y.value):
                    return (f", argument '{x.name}': {type(x.value).__name__} recorded, "
                            f"{type(y.value).__name__} given")
                continue
            for what, u, v in (("dtype", x.torch.dtype, y.torch.dtype),
                               ("shape", tuple(x.torch.shape), tuple(y.torch.shape)),
                               ("tile shape", x.tile, y.tile)):
                if u != v:
                    return f", argument '{x.name}': {what} {u} recorded, {v} given"
        if self.grid != new.grid:
            return f" has grid {self.grid}, the new one {new.grid}"
        return ""

    def borrow(self, reason: str):
        """Register this launch's borrows against those in force (``AliasError`` on a
        conflict); returns the hold."""
        return borrows.register(reason, self._plan.extents, groups=self._plan.groups)

    def value_names(self) -> tuple:
        """(names of the values this op hands back, how to describe them)."""
        names = list(self._kernel.params)
        return names, (f"every argument of kernel '{self._kernel.name}', in parameter order, "
                       f"scalars included ({', '.join(names)})")


# More launches than this that may still run when a PDL launch starts (kernels that signal
# at their start let chains of them overlap): it goes in plain order instead, which keeps
# the check of early loads, and the references between ops, bounded.
MAX_RUNNING = 8


def may_still_run(prev: KernelOp) -> tuple:
    """The launches that may still run when a PDL launch after ``prev`` starts: ``prev``,
    and, if ``prev`` signals at its start (``trigger_early``), whatever may still have run
    when ``prev`` started. (A grid that signals after its wait has passed it in every
    program before the next grid starts, so every grid before it has completed.)"""
    if prev._kernel.opts.get("trigger_early"):
        return (prev,) + prev._running
    return (prev,)


def writes_early_reads(running: tuple, op: KernelOp) -> bool:
    """Whether any launch in ``running`` may write bytes that ``op`` loads before its
    programmatic-launch wait (its ``early`` In parameters)."""
    early = op._kernel.opts["early"]
    mine = [e for e in op._plan.extents if not e.write and e.name in early]
    return any(_overlap(w, e) for r in running for w in r._plan.extents if w.write
               for e in mine)

