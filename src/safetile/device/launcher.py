"""The lean GPU launch path: cached variants and binaries, and a precomputed C launch.

Triton's ``kernel[grid](*args)`` costs about 18 us of host time per launch (binding,
specialization, cache-key hashing, option parsing). A ``KernelOp`` launch instead:

1. finds its ``Variant`` through a per-kernel dict keyed by cheap per-argument facts (dtype,
   rank, tile, order, TMA fitness, constant values), instead of building a ``VariantKey``;
2. builds the generated kernel's argument list from a plan precomputed per variant;
3. finds the compiled binary by a *specialization key*: exactly the facts Triton specializes
   a compiled kernel on (pointer 16-byte alignment; for ints: equal to 1, divisible by 16,
   fits in 32 bits). A binary is therefore never used for arguments it was not compiled for;
   a new key goes once through ``JITFunction.warmup`` (compile or fetch, no launch);
4. keeps steps 1-3 in the op's ``LaunchPlan`` (``kernel/plan.py``) as a ``DirectLaunch``: the
   C ``launch`` of Triton's launcher module and every argument after the stream, so a launch
   whose plan is cached (the same handles again: ``then`` chains, loops, replays of a
   pattern) is one call into C.

Profiling hooks (``triton.knobs.runtime.launch_enter_hook``) are honoured: when one is set,
the launch goes through the launcher's general entry with launch metadata and the tensors
themselves as arguments; so do kernels that need per-launch work (tensor descriptors,
global or profile scratch memory).
"""
from __future__ import annotations

import threading

from ..kernel.launch import _variant, canonical_const

_lock = threading.Lock()

# launch-plan opcodes (what one argument of the generated kernel is)
_PTR, _SHAPE, _STRIDE, _TILE, _DESC, _CONST, _SCALAR = range(7)
_OPCODE = {"ptr": _PTR, "shape": _SHAPE, "stride": _STRIDE, "tile": _TILE, "desc": _DESC,
           "const": _CONST}


def _int_spec(v: int) -> int:
    """What Triton specializes an int argument on (see ``native_specialize_impl``)."""
    if v == 1:
        return 1                                          # becomes a constexpr
    wide = 0 if -2**31 <= v < 2**31 else 4
    return wide + (2 if v % 16 == 0 else 3)


def _fast_variant_key(bound) -> tuple:
    """Cheap facts that determine the ``VariantKey`` (kernel options aside)."""
    key = []
    for b in bound:
        t = b.torch
        if t is None:
            key.append(canonical_const(b.value) if b.spec.kind == "Const" else None)
        elif b.tile is not None:                          # Out (TMA store fitness too)
            key.append((t.dtype, t.dim(), b.tile, b.order, t.dim() >= 2 and _tma_ok(t)))
        elif b.spec.kind == "In" and t.dim() >= 2:        # TMA fitness depends on layout
            key.append((t.dtype, t.dim(), _tma_ok(t)))
        else:
            key.append((t.dtype, t.dim()))
    return tuple(key)


def _tma_ok(t) -> bool:
    from ..kernel.launch import _tma_ok as ok
    return ok(t)


def variant_for(kernel, bound):
    """The ``Variant`` for these bound arguments (the same one ``kernel.launch._variant``
    returns), through a per-kernel cache keyed on cheap facts."""
    fast = kernel.__dict__.get("_st_fast")
    if fast is None or fast[0] is not kernel.opts:        # options() copies get their own
        fast = kernel.__dict__["_st_fast"] = (kernel.opts, {})
    key = _fast_variant_key(bound)
    v = fast[1].get(key)
    if v is None:
        v = fast[1][key] = _variant(kernel, bound)
    return v


class VariantLauncher:
    """Launches one ``Variant``: an argument plan and the binaries per specialization."""

    def __init__(self, variant, bound):
        self.variant = variant
        names = [b.name for b in bound]
        plan = []
        for entry in variant.generated.layout:
            what, name = entry[0], entry[1]
            extra = entry[2] if len(entry) > 2 else None
            plan.append((_OPCODE.get(what, _SCALAR), names.index(name), extra))
        self.plan = tuple(plan)
        self.binaries: dict = {}
        self.options = variant.options()

    def args(self, bound) -> tuple[list, tuple]:
        """The generated kernel's arguments and their specialization key."""
        args, spec = [], []
        for op, i, extra in self.plan:
            b = bound[i]
            if op == _PTR:
                t = b.torch
                args.append(t)
                spec.append(t.data_ptr() & 15 == 0)
            elif op == _SHAPE:
                v = b.torch.shape[extra]
                args.append(v)
                spec.append(_int_spec(v))
            elif op == _STRIDE:
                v = b.torch.stride(extra)
                args.append(v)
                spec.append(_int_spec(v))
            elif op == _TILE:
                args.append(b.tile[extra])
            elif op == _DESC:
                from triton.tools.tensor_descriptor import TensorDescriptor
                t = b.torch
                args.append(TensorDescriptor(t, list(t.shape), list(t.stride()), list(extra)))
            elif op == _CONST:
                from ..codegen.compile import _tl_value
                args.append(_tl_value(b.value))
            else:
                v = b.value
                args.append(v)
                if type(v) is int:
                    spec.append(_int_spec(v))
        return args, tuple(spec)

    def binary(self, spec, args, grid):
        """The compiled (and loaded) binary for the specialization key ``spec``."""
        compiled = self.binaries.get(spec)
        if compiled is None:
            with _lock:
                compiled = self.binaries.get(spec)
                if compiled is None:
                    compiled = self.binaries[spec] = _compile(self.variant, args, grid,
                                                              self.options)
        return compiled

    def launch(self, bound, grid, stream: int) -> None:
        """Launch through Triton's ``CudaLauncher`` (the general entry: hooks, scratch)."""
        args, spec = self.args(bound)
        _launch_general(self.binary(spec, args, grid), grid, stream, args)


def _launch_general(compiled, grid, stream: int, args, serial: bool = False) -> None:
    """What ``CompiledKernel.__getitem__(grid)(*args)`` does, on ``stream``: launch metadata
    and hooks when a hook is installed, scratch buffers allocated by ``CudaLauncher``;
    ``serial``: without programmatic dependent launch."""
    rt = _RT[0] or _runtime()
    run = compiled.run
    if serial and getattr(run, "launch_pdl", False):
        run = _serial_launcher(compiled)
    gx = grid[0]
    gy = grid[1] if len(grid) > 1 else 1
    gz = grid[2] if len(grid) > 2 else 1
    if _no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook):
        run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, None, None, None,
            *args)
    else:
        meta = compiled.launch_metadata(grid, stream, *args)
        run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, meta,
            rt.launch_enter_hook, rt.launch_exit_hook, *args)


class DirectLaunch:
    """One plan's launch, precomputed: the C ``launch`` of Triton's generated launcher module
    and the whole argument tuple after the stream.

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

    __slots__ = ("compiled", "grid", "c_launch", "tail", "serial_tail")

    def __init__(self, compiled, grid, args):
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


def _plan_launch(kernel, plan, values) -> DirectLaunch:
    """The plan's ``DirectLaunch`` (made once per plan: variant, arguments, binary)."""
    bound = _bound(plan, values)
    L = launcher_for(kernel, bound)
    args, spec = L.args(bound)
    d = plan.gpu = DirectLaunch(L.binary(spec, args, plan.grid), plan.grid, args)
    return d


def _bound(plan, values):
    from ..kernel.launch import BoundArg
    return [BoundArg(name, spec, v, v._torch if is_tensor else None, tile, order)
            for (name, spec, tile, order, is_tensor), v in zip(plan.params, values)]


def launch(kernel, plan, values, stream: int, serial: bool = False) -> None:
    """Launch ``kernel`` with the arguments ``values`` (checked into ``plan``) on the raw
    stream handle ``stream``; ``serial``: without programmatic dependent launch."""
    d = plan.gpu or _plan_launch(kernel, plan, values)
    rt = _RT[0] or _runtime()
    if d.c_launch is not None and _no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook):
        gx, gy, gz = d.grid
        d.c_launch(gx, gy, gz, stream, *(d.serial_tail if serial else d.tail))
        return
    bound = _bound(plan, values)
    L = launcher_for(kernel, bound)
    args, _ = L.args(bound)
    _launch_general(d.compiled, plan.grid, stream, args, serial)


def prepare(kernel, plan, values) -> None:
    """Compile (or fetch) and load the binary without launching (before graph capture)."""
    if plan.gpu is None:
        _plan_launch(kernel, plan, values)


def _compile(variant, args, grid, options):
    """Triton's ``CompiledKernel`` for these arguments, loaded (compile or fetch, no launch).
    The one place a binary is made: a CPU-only benchmark stubs it (benchmarks/host_path.py)."""
    compiled = variant.jit.warmup(*args, grid=grid, **options)
    compiled._init_handles()
    return compiled


# id(compiled binary) -> (the binary, a copy of its launcher without PDL)
_SERIAL: dict = {}


def _serial_launcher(compiled):
    """A copy of ``compiled``'s launcher that does not ask for programmatic dependent launch
    (``CudaLauncher`` reads its ``launch_pdl`` attribute at each call); made once per binary
    (binaries live as long as their kernel's variant cache)."""
    entry = _SERIAL.get(id(compiled))
    if entry is None or entry[0] is not compiled:
        import copy
        launcher = copy.copy(compiled.run)
        launcher.launch_pdl = False
        entry = _SERIAL[id(compiled)] = (compiled, launcher)
    return entry[1]


_RT = [None]
_HookChain = [None]


def _runtime():
    """``triton.knobs.runtime`` (importing triton is deferred to the first GPU launch)."""
    if _RT[0] is None:
        import triton
        from triton.knobs import HookChain
        _HookChain[0] = HookChain
        _RT[0] = triton.knobs.runtime
    return _RT[0]


def _no_hook(hook) -> bool:
    """Triton 3.6 keeps launch hooks in ``HookChain`` objects that are never None; an empty
    chain is no hook, and passing None spares the launcher two Python calls per launch and
    the launch-metadata dict."""
    return hook is None or (type(hook) is (_HookChain[0] or _hook_chain()) and not hook.calls)


def _hook_chain():
    _runtime()
    return _HookChain[0]


def launcher_for(kernel, bound) -> VariantLauncher:
    v = variant_for(kernel, bound)
    L = v.__dict__.get("_st_launcher")
    if L is None:
        L = v.__dict__["_st_launcher"] = VariantLauncher(v, bound)
    return L
