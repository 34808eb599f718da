"""``KernelOp``: one launch of a kernel, holding its moved arguments until it is settled."""
from __future__ import annotations

from .op import DeviceOp, RunContext


class KernelOp(DeviceOp):
    """A launched (but not yet executed) kernel; its output is every argument, in order.

    Built by ``kernel(...)`` (``kernel/launch.py``) with the arguments already checked, moved
    in and their storage borrowed (``hold``). Running it enqueues the kernel and defers the
    hand-back (``_release``) to the execution's settle step. Inside a graph recording it
    appends itself to the recording instead of executing; a graph replays it through
    ``_execute``, which launches without touching ownership.
    """

    __slots__ = ("kernel", "bound", "grid", "backend", "hold", "_released", "_consumed")

    def __init__(self, kernel, bound, grid, backend, hold):
        self.kernel, self.bound, self.grid, self.backend, self.hold = kernel, bound, grid, backend, hold
        self._released = False
        self._consumed = False

    def __repr__(self) -> str:
        return f"<KernelOp {self.kernel.name} grid={self.grid} backend={self.backend.name}>"

    def _values(self) -> tuple:
        return tuple([b.value for b in self.bound])

    def _release(self) -> None:
        """Hand every argument back (idempotent)."""
        if self._released:
            return
        self._released = True
        for b in self.bound:
            if b.torch is not None:
                b.value._restore()
        self.hold.release()

    def _execute(self, stream: int = 0) -> None:
        """Launch on the raw CUDA stream handle ``stream`` (or run on the CPU executor)."""
        if self.backend.name == "interpret":
            from ..interpret.executor import run
            run(self.kernel, self.bound, self.grid, self.backend.seed)
        else:
            from .launcher import launch
            launch(self.kernel, self.bound, self.grid, stream)

    def _prepare(self) -> None:
        """Compile and load the binary without launching (before a graph capture)."""
        if self.backend.name != "interpret":
            from .launcher import prepare
            prepare(self.kernel, self.bound, self.grid)

    def _run(self, ctx: RunContext) -> tuple:
        self._take()
        ctx.defer(self._release)
        if ctx.recording is not None:
            ctx.recording.append(self)
            return self._values()
        try:
            self._execute(ctx.handle)
        except BaseException as e:
            e.recovered = self._values()          # the arguments are not lost: see e.recovered
            raise
        return self._values()

    def _abandon(self) -> None:
        if not self._consumed:
            self._consumed = True
            self._release()

    def __del__(self):
        # An op dropped without running (built, then never synced or awaited) hands its
        # arguments back, so that neither the handles nor the storage borrows leak.
        if not getattr(self, "_consumed", True):
            self._consumed = True
            self._release()

    def _host_bound(self) -> bool:
        return self.backend.name == "interpret"
