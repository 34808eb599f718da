"""``KernelOp``: one launch of a kernel, holding its moved arguments until it is settled."""
from __future__ import annotations

from .op import DeviceOp, RunContext


class KernelOp(DeviceOp):
    """A launched (but not yet executed) kernel; its output is every argument, in order."""

    def __init__(self, kernel, bound, grid, backend, hold):
        self.kernel, self.bound, self.grid, self.backend, self.hold = kernel, bound, grid, backend, hold
        self._released = False

    def __repr__(self) -> str:
        return f"<KernelOp {self.kernel.name} grid={self.grid} backend={self.backend.name}>"

    def _values(self) -> tuple:
        return tuple(b.value for b in self.bound)

    def _release(self) -> None:
        """Hand every argument back (idempotent)."""
        if self._released:
            return
        self._released = True
        for b in self.bound:
            if b.torch is not None:
                b.value._restore()
        self.hold.release()

    def _execute(self) -> None:
        if self.backend.name == "interpret":
            from ..interpret.executor import run
            run(self.kernel, self.bound, self.grid, self.backend.seed)
        else:
            from ..kernel.launch import _variant
            _variant(self.kernel, self.bound).launch(self.bound, self.grid)

    def _run(self, ctx: RunContext) -> tuple:
        self._take()
        ctx.defer(self._release)
        try:
            self._execute()
        except BaseException as e:
            e.recovered = self._values()          # the arguments are not lost: see e.recovered
            raise
        return self._values()
