"""The lean GPU launch path: cached variants and cached Triton binaries, launched directly.

Triton's ``kernel[grid](*args)`` costs about 18 us of host time per launch (binding,
specialization, cache-key hashing, option parsing). A ``KernelOp`` launch instead:

1. finds its ``Variant`` through a per-kernel dict keyed by cheap per-argument facts (dtype,
   rank, tile, order, TMA fitness, constant values), instead of building a ``VariantKey``;
2. builds the generated kernel's argument list from a plan precomputed per variant;
3. finds the compiled binary by a *specialization key*: exactly the facts Triton specializes
   a compiled kernel on (pointer 16-byte alignment; for ints: equal to 1, divisible by 16,
   fits in 32 bits). A binary is therefore never used for arguments it was not compiled for;
   a new key goes once through ``JITFunction.warmup`` (compile or fetch, no launch);
4. calls the binary's launcher (``CompiledKernel.run``) with the stream handle of the
   execution, without launch metadata or hooks when no profiling hook is installed.

Profiling hooks (``triton.knobs.runtime.launch_enter_hook``) are honoured: when one is set,
the launch goes through the launcher's general entry with launch metadata.
"""
from __future__ import annotations

import threading

from ..kernel.launch import _variant

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
            key.append(b.value if b.spec.kind == "Const" else None)
        elif b.tile is not None:                          # Out
            key.append((t.dtype, t.dim(), b.tile, b.order))
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
        """(launch fn, extra leading args) of the compiled binary for ``spec``."""
        entry = self.binaries.get(spec)
        if entry is None:
            with _lock:
                compiled = _compile(self.variant, args, grid, self.options)
                entry = (compiled.run, (compiled.function,), compiled)
                self.binaries[spec] = entry
        return entry

    def launch(self, bound, grid, stream: int) -> None:
        args, spec = self.args(bound)
        fn, lead, compiled = self.binary(spec, args, grid)
        gx = grid[0]
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        rt = _RT[0] or _runtime()
        if _no_hook(rt.launch_enter_hook) and _no_hook(rt.launch_exit_hook):
            fn(gx, gy, gz, stream, *lead, compiled.packed_metadata, None, None, None, *args)
        else:
            meta = compiled.launch_metadata(grid, stream, *args)
            compiled.run(gx, gy, gz, stream, compiled.function, compiled.packed_metadata, meta,
                         rt.launch_enter_hook, rt.launch_exit_hook, *args)


def _compile(variant, args, grid, options):
    """Triton's ``CompiledKernel`` for these arguments, loaded (compile or fetch, no launch).
    The one place a binary is made: a CPU-only benchmark stubs it (benchmarks/host_path.py)."""
    compiled = variant.jit.warmup(*args, grid=grid, **options)
    compiled._init_handles()
    return compiled


_RT = [None]


def _runtime():
    """``triton.knobs.runtime`` (importing triton is deferred to the first GPU launch)."""
    if _RT[0] is None:
        import triton
        _RT[0] = triton.knobs.runtime
    return _RT[0]


def _no_hook(hook) -> bool:
    """Triton 3.6 keeps launch hooks in ``HookChain`` objects that are never None; an empty
    chain is no hook, and passing None spares the launcher two Python calls per launch and
    the launch-metadata dict."""
    return hook is None or (type(hook).__name__ == "HookChain" and not hook.calls)


def launcher_for(kernel, bound) -> VariantLauncher:
    v = variant_for(kernel, bound)
    L = v.__dict__.get("_st_launcher")
    if L is None:
        L = v.__dict__["_st_launcher"] = VariantLauncher(v, bound)
    return L


def launch(kernel, bound, grid, stream: int) -> None:
    """Launch ``kernel`` with ``bound`` arguments over ``grid`` on the raw stream handle."""
    launcher_for(kernel, bound).launch(bound, grid, stream)


def prepare(kernel, bound, grid) -> None:
    """Compile (or fetch) and load the binary without launching (before graph capture)."""
    L = launcher_for(kernel, bound)
    args, spec = L.args(bound)
    L.binary(spec, args, grid)
