"""The Triton launch: one plan's binary and packed arguments, then one call into C.

A ``KernelOp`` (``kernel/kernel_op.py``) carries a ``LaunchPlan`` of its checked arguments.
The first launch of a plan finds the op's ``Variant`` (``op.variant()``), packs the
arguments (``pack.py``), finds the binary for their specialization key, and keeps all of it
in the plan as a ``DirectLaunch``: the C ``launch`` of Triton's launcher module and every
argument after the stream. A launch whose plan is cached (the same handles again: ``then``
chains, loops, graph records) is then one call into C.

Profiling hooks (``triton.knobs.runtime.launch_enter_hook``) are honoured: when one is set,
the launch goes through the launcher's general entry with launch metadata and the tensors
themselves as arguments; so do kernels that need per-launch work (tensor descriptors,
global or profile scratch memory).
"""
from __future__ import annotations

import copy
import functools
import weakref

from . import pack


class DirectLaunch:
    """One plan's launch, precomputed: its variant and binary, the C ``launch`` of Triton's
    generated launcher module and the whole argument tuple after the stream.

    ``CudaLauncher.__call__(gx, gy, gz, stream, function, packed_metadata, launch_metadata,
    enter_hook, exit_hook, *args)`` calls ``self.launch(gx, gy, gz, stream, function,
    launch_cooperative_grid, launch_pdl, global_scratch, profile_scratch, packed_metadata,
    launch_metadata, enter_hook, exit_hook, *args)``. With no hook installed and no scratch
    (``global_scratch_size == profile_scratch_size == 0``, so both scratch arguments are
    None) every argument but the stream is fixed for a plan, so ``tail`` is built once.
    Pointers are passed as the tensors' ``data_ptr()`` ints, which the C launcher takes as
    they are (given a tensor it would call ``data_ptr()`` and ask the driver to validate the
    address; the launch checks already proved every tensor a CUDA tensor of one device, and
    the plan re-verifies each data pointer before it is reused). ``c_launch`` is None for a
    plan that needs per-launch work (tensor descriptors, scratch): it takes the general entry.
    """

    __slots__ = ("variant", "compiled", "grid", "c_launch", "tail", "serial_tail")

    def __init__(self, variant, compiled, grid, args):
        self.variant = variant
        self.compiled = compiled
        self.grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        self.c_launch = self.tail = self.serial_tail = None
        L = compiled.run
        if (getattr(L, "global_scratch_size", 1) == 0 and getattr(L, "profile_scratch_size", 1) == 0
                and hasattr(L, "launch")
                and not any(type(a).__name__ == "TensorDescriptor" for a in args)):
            ints = tuple(a.data_ptr() if hasattr(a, "data_ptr") else a for a in args)
            self.tail = (compiled.function, L.launch_cooperative_grid, L.launch_pdl, None, None,
                         compiled.packed_metadata, None, None, None) + ints
            # the same launch without programmatic dependent launch (KernelOp.serial)
            self.serial_tail = self.tail[:2] + (False,) + self.tail[3:]
            self.c_launch = L.launch


def _direct(op) -> DirectLaunch:
    """The op's plan's ``DirectLaunch`` (made once per plan: variant, arguments, binary)."""
    plan = op._plan
    d = plan.gpu
    if d is None:
        variant = op.variant()
        args, spec = pack.pack(variant.packing, op._bound)
        d = plan.gpu = DirectLaunch(variant, variant.binary(spec, args, plan.grid), plan.grid,
                                    args)
    return d


def launch(op, stream: int) -> None:
    """Launch the checked ``op`` on the raw stream handle ``stream`` (without programmatic
    dependent launch when the op must launch in plain stream order)."""
    d = op._plan.gpu or _direct(op)
    if d.c_launch is not None and not _hooked():
        gx, gy, gz = d.grid
        d.c_launch(gx, gy, gz, stream, *(d.serial_tail if op._serial else d.tail))
        return
    args, _ = pack.pack(d.variant.packing, op._bound)
    _launch_general(d.compiled, op._plan.grid, stream, args, op._serial)


def prepare(op) -> None:
    """Compile (or fetch) and load the binary without launching (before graph capture)."""
    _direct(op)


def _launch_general(compiled, grid, stream: int, args, serial: bool = False) -> None:
    """What ``CompiledKernel.__getitem__(grid)(*args)`` does, on ``stream``: launch metadata
    and hooks when a hook is installed, scratch buffers allocated by ``CudaLauncher``;
    ``serial``: without programmatic dependent launch."""
    rt = _runtime()
    run = compiled.run
    if serial and getattr(run, "launch_pdl", False):
        run = _serial_launcher(compiled)
    gx = grid[0]
    gy = grid[1] if len(grid) > 1 else 1
    gz = grid[2] if len(grid) > 2 else 1
    if not _hooked():
        run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *args)
    else:
        meta = compiled.launch_metadata(grid, stream, *args)
        run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, meta,
            rt.launch_enter_hook, rt.launch_exit_hook, *args)


# binary -> a copy of its launcher without PDL; weak keys, so the copy goes with the binary
_SERIAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _serial_launcher(compiled):
    """A copy of ``compiled``'s launcher that does not ask for programmatic dependent launch
    (``CudaLauncher`` reads its ``launch_pdl`` attribute at each call); made once per binary
    and kept as long as the binary."""
    launcher = _SERIAL.get(compiled)
    if launcher is None:
        launcher = copy.copy(compiled.run)
        launcher.launch_pdl = False
        _SERIAL[compiled] = launcher
    return launcher


@functools.cache
def _runtime():
    """``triton.knobs.runtime`` (importing triton is deferred to the first GPU launch)."""
    import triton
    return triton.knobs.runtime


@functools.cache
def _hook_chain() -> type:
    from triton.knobs import HookChain
    return HookChain


def _hooked() -> bool:
    """Whether a launch enter or exit hook is installed. Triton 3.6 keeps launch hooks in
    ``HookChain`` objects that are never None: an empty chain is no hook, and launching
    without one spares the launcher two Python calls and the launch-metadata dict."""
    rt = _runtime()
    enter, leave, chain = rt.launch_enter_hook, rt.launch_exit_hook, _hook_chain()
    return not ((enter is None or (type(enter) is chain and not enter.calls)) and
                (leave is None or (type(leave) is chain and not leave.calls)))
