"""The typed launcher: checks arguments, moves them into a ``KernelOp``, picks a variant.

Everything is checked before any work is submitted: argument kinds, dtypes, ranks, devices,
that all ``Out`` grids agree, layouts, and storage overlap (``AliasError``).
"""
from __future__ import annotations

import torch

from .. import backends as _backend
from ..dtypes import ALL as _ALL_DTYPES
from ..dtypes import DType, from_torch
from ..errors import ArgumentError, LaunchError, UnsafeError
from ..lang import semantics as _sem
from ..tensor import Partition, Shared, Tensor
from ..tensor import borrows
from ..tensor.hints import how_to_pass_number, type_name
from ..tensor.ownership import LIVE, LOCK, restore_all_locked
from ..tensor.overlap import past_storage, self_overlapping
from .kernel_op import KernelOp
from .plan import BoundArg, LaunchPlan
from ..device.execution import attach_recovered
from ..device.op import DeviceOp, given_argument, unrun_argument
from ..device.unsafe_block import in_unsafe_block

# The largest element offset and dimension of an In/Out tensor (lang/semantics.py: generated
# kernels compute element coordinates and offsets in int32).
MAX_OFFSET = _sem.MAX_OFFSET
MAX_DIM = _sem.MAX_DIM
CUDA_GRID = (2**31 - 1, 65535, 65535)      # the most programs per launch axis


def _is_int(x) -> bool:
    """An int argument (a bool is none)."""
    return isinstance(x, int) and not isinstance(x, bool)


def _is_float(x) -> bool:
    """A float argument: a float, or an int (a bool is neither)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# What each Const kind takes, in the order a value's kind is looked for in a union (a bool
# is no int, an int is a float only where the Const takes no int).
_CONST_OK = ((bool, lambda x: isinstance(x, bool)), (int, _is_int), (float, _is_float),
             (DType, lambda x: any(x is d for d in _ALL_DTYPES)))


def _fail(kernel, pname, message) -> LaunchError:
    return LaunchError(f"kernel '{kernel.name}' ({kernel.where}), parameter '{pname}': {message}")


def _scalar_fail(kernel, pname, what: str, v, want) -> LaunchError:
    """The error for ``v`` given to a scalar or Const parameter, with what to pass instead."""
    if isinstance(v, DeviceOp):
        return _fail(kernel, pname, f"{what} {unrun_argument(v, kernel.name)}")
    hint = how_to_pass_number(v, "int" if want is int else "float") \
        if want in (int, float) else ""
    return _fail(kernel, pname, f"{what} {type_name(v)} {v!r}{f'; {hint}' if hint else ''}")


def bind(kernel, args, kwargs) -> list[BoundArg]:
    """Match arguments to parameters and check each one; moves nothing."""
    params = kernel.params
    if not kwargs and len(args) == len(params):       # the launch hot path: all positional
        return [_check_arg(kernel, n, spec, v) for (n, spec), v in zip(params.items(), args)]
    names = list(params)
    if len(args) > len(names):
        raise LaunchError(f"kernel '{kernel.name}' takes {len(names)} arguments, got {len(args)}")
    values = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in kernel.params:
            raise LaunchError(f"kernel '{kernel.name}' has no parameter '{k}'")
        if k in values:
            raise LaunchError(f"kernel '{kernel.name}': parameter '{k}' given twice")
        values[k] = v
    missing = [n for n in names if n not in values]
    if missing:
        raise LaunchError(f"kernel '{kernel.name}' is missing argument(s) {missing}")
    return [_check_arg(kernel, n, kernel.params[n], values[n]) for n in names]


def _refuse_repeats(kernel, pairs) -> None:
    """A launch moves each handle in once: the same Tensor or Partition at two parameters is
    refused. A Shared handle (bound only to ``In`` parameters, which only read) may feed
    several: it is moved in once and handed back once (``LaunchPlan.moves``)."""
    seen: dict = {}
    for n, v in pairs:
        if isinstance(v, (Tensor, Partition)):
            if id(v) in seen:
                hint = (" (to read one tensor at several inputs, share it: one Shared handle "
                        "may be passed for several st.In parameters)"
                        if isinstance(v, Tensor) else "")
                raise LaunchError(f"kernel '{kernel.name}': the same handle is passed as "
                                  f"'{seen[id(v)]}' and '{n}'; a launch moves each handle in "
                                  f"once{hint}")
            seen[id(v)] = n


def _check_arg(kernel, name, spec, v) -> BoundArg:
    kind = spec.kind
    if kind in ("In", "Out", "Ptr"):
        expected = {"In": (Tensor, Shared), "Out": (Partition,), "Ptr": (Tensor,)}[kind]
        if not isinstance(v, expected):
            want = "an " + " or ".join(f"st.{t.__name__}" for t in expected)
            got = given_argument(v, {"In": "input", "Out": "output", "Ptr": "tensor"}[kind],
                                 kernel.name)
            raise _fail(kernel, name, f"{spec.describe()} expects {want}, got {got}")
        if not v._is_live():
            v._check(f"pass it to kernel '{kernel.name}'")
        t = v._torch
        dtype = from_torch(t.dtype)
        if dtype not in spec.dtypes:
            want = next(d for d in _ALL_DTYPES if d in spec.dtypes)
            raise _fail(kernel, name, f"{spec.describe()} got dtype {dtype!r}; convert it first "
                                      f"(nothing is converted implicitly), e.g. on the host: "
                                      f"st.from_torch(t.to_torch().to({want.torch}))")
        if spec.rank is not None and t.dim() != spec.rank:
            raise _fail(kernel, name, f"{spec.describe()} got rank {t.dim()} (shape "
                                      f"{tuple(t.shape)})")
        if t.dim() == 0:
            raise _fail(kernel, name, "0-d tensors are not supported; reshape to (1,)")
        if kind == "Ptr" and not t.is_contiguous():
            raise _fail(kernel, name, f"raw pointers index a contiguous buffer, got strides "
                                      f"{t.stride()}; make it contiguous first")
        if kind == "Out" and not t.is_contiguous() and self_overlapping(t):
            raise _fail(kernel, name, f"the partitioned tensor has overlapping elements (strides "
                                      f"{t.stride()}): distinct tiles would share memory")
        if kind != "Ptr" and any(n > MAX_DIM for n in t.shape):
            raise _fail(kernel, name, f"shape {tuple(t.shape)} has a dimension over {MAX_DIM}, "
                                      f"past what generated kernels address exactly in int32; "
                                      f"split the tensor into views")
        if kind != "Ptr" and sum((n - 1) * s for n, s in zip(t.shape, t.stride())) > MAX_OFFSET:
            # Generated kernels compute element offsets in 32-bit integers: past this an
            # offset would wrap around and a masked store could land outside the tensor.
            raise _fail(kernel, name, f"shape {tuple(t.shape)} with strides {t.stride()} "
                                      f"reaches element offsets past 2**31 - 1, which generated "
                                      f"kernels cannot address; split the tensor into views "
                                      f"of fewer elements")
        if past_storage(t):
            raise _fail(kernel, name, f"the tensor (shape {tuple(t.shape)}, strides "
                                      f"{t.stride()}) reaches past the end of its storage "
                                      f"({t.untyped_storage().nbytes()} bytes), which was "
                                      f"shrunk through a torch alias; make the tensor again")
        if kind == "Out":
            grid = tuple(-(-n // k) for n, k in zip(t.shape, v._tile_shape))
            if grid != v._order.grid:        # (a handle's own view keeps its shape: a guard)
                raise _fail(kernel, name, f"the partitioned tensor now has shape "
                                          f"{tuple(t.shape)} (grid {grid}) but was partitioned "
                                          f"with grid {v._order.grid}; partition it again")
            return BoundArg(name, spec, v, t, v._tile_shape, v._order)
        return BoundArg(name, spec, v, t)
    value = _scalar(kernel, name, spec, v)
    return BoundArg(name, spec, value, given=None if value is v else v)


def _scalar(kernel, name, spec, v):
    """A scalar or Const argument as the kernel takes it (checked)."""
    kind = spec.kind
    if kind in ("Const", "int", "float") and type(v).__module__ == "numpy" and \
            getattr(v, "ndim", None) == 0:
        v = v.item()                  # a numpy scalar: the Python number it holds
    if kind == "Const":
        kinds = spec.const_kinds
        if DType in kinds and isinstance(v, torch.dtype):
            try:
                v = from_torch(v)             # as allocation takes torch dtypes too
            except ArgumentError as e:
                raise _fail(kernel, name, str(e)) from None
        # The value's own kind first: in st.Const[int | float], 2 is an int and 2.0 a float.
        as_kind = next((k for k, ok in _CONST_OK if k in kinds and ok(v)), None)
        if as_kind is None:
            want = float if float in kinds else int if int in kinds else kinds[0]
            raise _scalar_fail(kernel, name, f"{spec.describe()} got", v, want)
        if as_kind is float:
            return _as_float(kernel, name, v)
        if as_kind is int:
            return int.__int__(v)
        return v
    if kind == "int":
        if not _is_int(v):
            raise _scalar_fail(kernel, name, "expects an int, got", v, int)
        # An int subclass becomes its plain value (its own methods are not consulted): the
        # range check, the variant's specialization and the launch all see that one value.
        v = int.__int__(v)
        if not -2**31 <= v < 2**31:
            raise _fail(kernel, name, f"int {v} does not fit in int32, the type of int "
                                      f"parameters inside a kernel; pass it as an "
                                      f"st.Const[int] (compile-time) or split the work")
        return v
    if kind == "float":
        if not _is_float(v):
            raise _scalar_fail(kernel, name, "expects a float, got", v, float)
        return _as_float(kernel, name, v)
    raise AssertionError(kind)


def _as_float(kernel, name, v) -> float:
    """A float argument's plain value: as for ints, a subclass's own ``__float__`` or
    ``__int__`` is not consulted, so the checks, the variant and the launch see one value."""
    if isinstance(v, float):
        return float.__float__(v)
    try:
        return float(int.__int__(v))
    except OverflowError:
        raise _fail(kernel, name, f"the int {v} does not fit in a float") from None


def check_launch(kernel, bound: list[BoundArg], device_kind: str | None):
    """Cross-argument checks: one device, agreeing Out grids, a grid to launch."""
    tensors = [b for b in bound if b.torch is not None]
    devices = {b.torch.device for b in tensors}
    if len(devices) > 1:
        listing = ", ".join(f"'{b.name}' on {b.torch.device}" for b in tensors)
        raise LaunchError(f"kernel '{kernel.name}': arguments are on different devices ({listing})")
    if device_kind == "cuda" and devices and next(iter(devices)).type != "cuda":
        raise LaunchError(f"kernel '{kernel.name}': the triton backend runs on CUDA tensors, got "
                          f"{next(iter(devices))}; allocate on the GPU or use "
                          f"st.backend('interpret')")
    outs = [b for b in bound if b.spec.kind == "Out"]
    if outs:
        first = outs[0].order
        for b in outs[1:]:
            o = b.order
            if (o.grid, o.kind, _group(o), o.persistent) != \
                    (first.grid, first.kind, _group(first), first.persistent):
                raise LaunchError(
                    f"kernel '{kernel.name}': Out grids disagree: '{outs[0].name}' has grid "
                    f"{first.grid} ({first.kind}, persistent={first.persistent}) but "
                    f"'{b.name}' has grid {o.grid} ({o.kind}, persistent={o.persistent}); all "
                    f"Outs of a launch share one grid")
        if kernel.opts.get("grid") is not None:
            raise LaunchError(f"kernel '{kernel.name}': the grid of a kernel with Out parameters "
                              f"is its Out partition; drop the grid= option")
        if first.persistent is not None and \
                not any(kind == "tile" for kind, _ in kernel._info.views.values()):
            raise LaunchError(f"kernel '{kernel.name}': Out '{outs[0].name}' is a persistent "
                              f"partition ({first.persistent} programs), but the kernel never "
                              f"iterates `for t in {outs[0].name}.tiles():`; partition without "
                              f"persistent=, or loop over the tiles")
    elif kernel.opts.get("grid") is None:
        raise LaunchError(f"kernel '{kernel.name}' has no Out parameter: give the launch grid "
                          f"with kernel.options(grid=(n,))")


def _group(o) -> int:
    """The effective group size of a program order (0 unless grouped)."""
    return min(o.group_size, o.grid[0]) if o.kind == "grouped" else 0


def launch_grid(kernel, bound) -> tuple:
    outs = [b for b in bound if b.spec.kind == "Out"]
    if outs:
        return (outs[0].order.num_programs,)
    g = kernel.opts["grid"]                 # an int or a tuple (normalized_options)
    g = (g,) if not isinstance(g, tuple) else g
    if not 1 <= len(g) <= 3 or any(type(x) is not int or x < 1
                                   for x in g):
        raise LaunchError(f"kernel '{kernel.name}': grid must be 1 to 3 positive ints, got {g}")
    if any(x > most for x, most in zip(g, CUDA_GRID)):
        raise LaunchError(f"kernel '{kernel.name}': grid {g} is over the launch limits "
                          f"{CUDA_GRID[:len(g)]} per axis")
    return g


def variant_for(kernel, args, kwargs):
    """The compiled ``Variant`` for these arguments (checked, nothing moved or run)."""
    bound = bind(kernel, args, kwargs)
    check_launch(kernel, bound, None)
    launch_grid(kernel, bound)
    return kernel._launches.variant(kernel, bound)


def compile_for_target(kernel, args, kwargs, target):
    bound = bind(kernel, args, kwargs)
    check_launch(kernel, bound, None)
    launch_grid(kernel, bound)
    return kernel._launches.variant(kernel, bound).compile_for(bound, target)


def launch(kernel, args, kwargs):
    """Check, move the arguments into a new ``KernelOp`` and return it (nothing runs yet).

    The argument checks run in full unless a cached ``LaunchPlan`` provably applies to these
    very arguments (``kernel/plan.py``); ownership (``MovedError``), the borrows against the
    operations in flight (``AliasError``) and the moves happen on every launch. A refused
    launch moves nothing, and its error carries the arguments as ``error.recovered`` (in
    parameter order), so that a value made for the call (an inline ``t.partition(...)``) is
    not lost."""
    try:
        if kernel.unsafe and not in_unsafe_block():
            raise UnsafeError(f"kernel '{kernel.name}' ({kernel.where}) is unsafe=True: launch "
                              f"it inside `with st.unsafe():` to mark the call site")
        choice = _backend.current()
        cache = kernel._launches
        plan = None if kwargs else cache.plan(args, choice)
        if plan is None:
            bound = bind(kernel, args, kwargs)
            _refuse_repeats(kernel, [(b.name, b.value) for b in bound])
            check_launch(kernel, bound, choice.device_kind)
            grid = launch_grid(kernel, bound)
            cache.type_check(kernel, bound)
            holder, where = cache.holder, cache.moved_into
            reads = [(b.name, b.torch) for b in bound if b.torch is not None and b.spec.kind == "In"]
            writes = [(b.name if b.spec.kind == "Out" else f"Ptr '{b.name}'", b.torch)
                      for b in bound if b.torch is not None and b.spec.kind != "In"]
            extents = borrows.prepare(holder, reads, writes)
            plan = LaunchPlan(kernel, bound, grid, choice, extents, holder, where)
            values = tuple([b.value for b in bound])
            if not kwargs and plan.cacheable:
                cache.remember(args, plan)
        else:
            values = plan.values(args) if plan.converted else args
        moves = plan.moves
        with LOCK:
            for i, _ in moves:
                h = values[i]
                if h._state is not LIVE:
                    h._check(f"pass it to kernel '{kernel.name}'")
            hold = borrows.register(plan.holder, plan.extents, (), plan.groups)
            n = 0
            try:
                for i, where in moves:
                    values[i]._move_locked(where)
                    n += 1
            except BaseException:             # undo the moves made so far
                for i, _ in moves[:n]:
                    values[i]._restore_locked()
                hold.release()
                raise
    except BaseException as e:
        if getattr(e, "recovered", None) is None:
            try:
                e.recovered = _given(kernel, args, kwargs)
            except AttributeError:            # exceptions without a __dict__
                pass
        raise
    try:
        op = KernelOp(kernel, plan, values, choice, hold)
    except BaseException as e:            # an interrupt as it was built: undo the moves
        _undo_moves(values, plan.moves, hold)
        attach_recovered(e, values)
        raise
    op._consumed = False                  # (a plain store: no interrupt can land before it)
    return op


def _undo_moves(values, moves, hold) -> None:
    """Hand back the moved arguments of a launch that made no op, then end its borrows."""
    with LOCK:
        restore_all_locked([values[i] for i, _ in moves])
    hold.release()


def _given(kernel, args, kwargs) -> tuple:
    """The values a call passed, in parameter order where the names allow it."""
    if not kwargs:
        return tuple(args)
    names = list(kernel.params)
    by_name = dict(zip(names, args))
    by_name.update(kwargs)
    return tuple(by_name[n] for n in names if n in by_name) + \
        tuple(v for k, v in kwargs.items() if k not in names)

