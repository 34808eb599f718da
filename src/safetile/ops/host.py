"""Host-side plumbing shared by the library ops: argument checks, layouts, outputs, options.

Every op follows one convention (see ``safetile.ops``): it checks its arguments, allocates the
outputs it was not given, partitions *views* of the outputs (so the caller's own handles stay
valid and come back usable after the op), and returns a lazy ``DeviceOp`` whose output is the
op's result tensors. Nothing here launches work.
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
import numbers

import torch

from ..errors import AliasError, ArgumentError, GraphCaptureError
from ..device.op import given_argument
from ..device.reserve import ReservingOp
from ..dtypes import DType, dtype_members, int32
from ..lang.semantics import MAX_TILE_ELEMENTS
from ..tensor import Shared, Tensor, overlaps
from ..tensor import alloc
from ..tensor.overlap import self_overlapping

# Elements of one program's tile for memory-bound kernels: large enough to amortize the
# per-program prologue, small enough to keep many programs in flight on every SM.
BLOCK = 4096


def pdl_available() -> bool:
    """Whether the current GPU has programmatic dependent launch (Hopper or later): the
    default of the ops' ``pdl`` options."""
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def warps_for(elements: int) -> int:
    """num_warps for a program that streams ``elements`` values: about 16 per thread."""
    w = elements // (16 * 32)
    return max(4, min(16, next_pow2(w)))


def check_int(name: str, v, lo: int | None = None, hi: int | None = None) -> int:
    """``v`` as an int in ``[lo, hi]`` (numpy ints too; never a bool, whose truth value
    would pass for 0 or 1)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ArgumentError(f"{name} must be an int, got {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        bounds = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
        raise ArgumentError(f"{name} must be an int {bounds}, got {v}")
    return v


def check_pow2(name: str, v, lo: int = 1, hi: int = MAX_TILE_ELEMENTS) -> int:
    """``v`` as a power of two in ``[lo, hi]``: a tile size (the GPU builds tiles from
    ``tl.arange``, whose lengths are powers of two)."""
    n = int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else None
    if n is None or not lo <= n <= hi or n & (n - 1):     # the int used is the int checked
        raise ArgumentError(f"{name} must be a power of two in [{lo}, {hi}], got {v!r}")
    return n


def check_warps(name: str, v) -> int:
    """``v`` as a launch's ``num_warps``: a power of two up to 32, as ``Kernel.options`` takes."""
    return check_pow2(name, v, 1, 32)


def check_stages(name: str, v) -> int:
    """``v`` as a launch's ``num_stages``: an int in [1, 64], as ``Kernel.options`` takes."""
    return check_int(name, v, 1, 64)


def check_counts(name: str, num_warps, num_stages) -> tuple:
    """An op's ``num_warps`` and ``num_stages`` (``None``: the op's default) as plain ints
    (numpy ints too), named after the op: ``Kernel.options`` takes plain ints only."""
    return (check_warps(f"{name}: num_warps", num_warps),
            None if num_stages is None else check_stages(f"{name}: num_stages", num_stages))


def check_device_int(name: str, v) -> None:
    """``v``, a count an op reads on the device (a position, a length), must be an int32
    Tensor or Shared of shape (1,)."""
    check_value(name, v)
    if v.dtype is not int32 or tuple(v.shape) != (1,):
        raise ArgumentError(f"{name} must be an int32 tensor of shape (1,), got {v.dtype!r} "
                            f"{tuple(v.shape)}")


def check_tiles(name: str, **tiles) -> None:
    """Each of ``tiles`` (a name -> the tile's sides) must hold at most ``MAX_TILE_ELEMENTS``
    elements: a config is refused when it is made, not by the launch of a kernel whose body
    loads such a tile (for a product of two launches, after the first has written)."""
    for tile, sides in tiles.items():
        if math.prod(sides) > MAX_TILE_ELEMENTS:
            raise ArgumentError(f"{name}: the {' x '.join(map(str, sides))} {tile} tile has "
                                f"{math.prod(sides)} elements, over the {MAX_TILE_ELEMENTS} one "
                                f"tile may hold; use smaller tile sides")


def check_number(name: str, v, lo: float | None = None, above: float | None = None) -> float:
    """``v`` as a finite float (a Python or numpy number, never a bool), ``>= lo`` or
    ``> above`` when given."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not _finite(v):
        raise ArgumentError(f"{name} must be a finite number, got {v!r}")
    if (lo is not None and v < lo) or (above is not None and v <= above):
        raise ArgumentError(f"{name} must be {f'>= {lo}' if lo is not None else f'> {above}'},"
                            f" got {v!r}")
    return float(v)


def _finite(v: numbers.Real) -> bool:
    """Whether ``v`` is a finite float; an int past float's range is not (``math.isfinite``
    raises OverflowError for it)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def check_eps(name: str, eps) -> float:
    """An RMSNorm's ``eps``: a finite number >= 0 (added to the mean square under a rsqrt)."""
    return check_number(f"{name}: eps", eps, lo=0.0)


def check_flag(name: str, v, none: bool = False):
    """``v`` as a bool option (``None`` too where ``none``: the option's default). A truthy
    string such as ``"no"`` is refused rather than read as True."""
    if isinstance(v, bool) or (none and v is None):
        return v
    raise ArgumentError(f"{name} must be True or False{' (or None)' if none else ''}, "
                        f"got {v!r}")


def pdl_flags(name: str, pdl, trigger_early) -> tuple[bool, bool]:
    """The ``pdl`` and ``trigger_early`` options of ``name``, checked bools: ``pdl=None`` is
    on where the GPU has programmatic dependent launch, ``trigger_early=None`` as ``pdl``."""
    pdl = check_flag(f"{name}: pdl", pdl, none=True)
    pdl = pdl_available() if pdl is None else pdl
    trigger_early = check_flag(f"{name}: trigger_early", trigger_early, none=True)
    return pdl, pdl if trigger_early is None else trigger_early


def check_value(name: str, v) -> None:
    """``v`` must be a safetile Tensor or Shared (a torch tensor is wrapped by st.from_torch)."""
    if not isinstance(v, (Tensor, Shared)):
        raise ArgumentError(f"{name}: expected an st.Tensor or st.Shared, got "
                            f"{given_argument(v, 'input')}")


def check_dtype(name: str, v, allowed,
                remedy: str = "convert it first (nothing is converted implicitly)") -> DType:
    """``v``'s dtype if one of ``allowed`` (a dtype or a set), else an error naming ``name``."""
    members = dtype_members(allowed)
    if v.dtype not in members:
        names = [repr(d) for d in members]
        one_of = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise ArgumentError(f"{name} must be {one_of}, got {v.dtype!r}; {remedy}")
    return v.dtype


def check_target(name: str, v) -> None:
    """``v``, which an op writes, must be a Tensor (a Shared handle is read-only) whose
    elements are each their own memory: checked as the op is built, so an op of several
    launches refuses it before its first launch."""
    if not isinstance(v, Tensor):
        raise ArgumentError(f"{name}: expected an st.Tensor, got {given_argument(v, 'tensor')}")
    if v._is_live() and self_overlapping(v._torch):
        raise ArgumentError(f"{name}: its elements overlap in memory (stride {v._torch.stride()}"
                            f", as torch's expand makes): an op writes every element once; "
                            f"pass a tensor with its own storage")


def check_workspace(name: str, ws, fields) -> None:
    """Each buffer ``fields`` of the workspace ``ws``, which an op writes, must be a Tensor
    (a workspace is a plain dataclass a caller may fill with anything)."""
    for field in fields:
        check_target(f"{name}: workspace.{field}", getattr(ws, field, None))


def check_out(name: str, out, shape: tuple, dtype: DType, device) -> None:
    """A caller-provided output must be a Tensor of exactly the result's shape and dtype."""
    check_target(name, out)
    if tuple(out.shape) != tuple(shape) or out.dtype is not dtype:
        raise ArgumentError(f"{name}: expected shape {tuple(shape)} and dtype {dtype!r}, got "
                         f"shape {tuple(out.shape)} and dtype {out.dtype!r}")
    if out.device != device:
        raise ArgumentError(f"{name}: on {out.device}, but the inputs are on {device}")


def not_given(name: str) -> None:
    """Before an op allocates ``name`` (``"ops.argmax: workspace"``), which it was not given:
    inside a graph scope, a GraphCaptureError naming it (st.empty's own names no argument)."""
    reason = alloc.allocation_forbidden()
    if reason is not None:
        raise GraphCaptureError(f"{name} was not given: the op allocates it, and nothing "
                                f"allocates inside {reason} (replay must not depend on "
                                f"allocation addresses); allocate it before and pass it")


def output(name: str, out, shape: tuple, dtype: DType, device) -> Tensor:
    """``out`` checked, or a new tensor (which raises GraphCaptureError inside a graph scope)."""
    if out is None:
        not_given(name)
        return alloc.empty(tuple(shape), dtype=dtype, device=device)
    check_out(name, out, shape, dtype, device)
    return out


def check_out_dtype(name: str, dtype, allowed) -> DType:
    """``dtype`` (an ``st`` dtype) must be one of ``allowed`` (a dtype set)."""
    if not isinstance(dtype, DType) or dtype not in allowed:
        raise ArgumentError(f"{name} must be one of {allowed} (a safetile dtype, e.g. "
                            f"st.float32), got {dtype!r}")
    return dtype


def check_fields(config, checks: dict) -> None:
    """Check and normalize the fields of a frozen config dataclass: ``checks`` maps a field
    name to ``(check, *args)``, a check of this module (numpy ints become ints)."""
    for field, (check, *args) in checks.items():
        value = check(f"{type(config).__name__}: {field}", getattr(config, field), *args)
        object.__setattr__(config, field, value)


def config(name: str, given, cls, choose):
    """``given`` if it is a ``cls``, ``choose()`` when it is None; else ArgumentError."""
    if given is None:
        return choose()
    if not isinstance(given, cls):
        raise ArgumentError(f"{name}: config must be an ops.{cls.__name__} (or None for the "
                            f"default), got {type(given).__name__} {given!r}")
    return given


def filled(values, dtype: DType, device) -> Tensor:
    """A new 1-D tensor holding ``values`` (a torch tensor or a list), allocated as ``st.empty``
    allocates: refused inside a graph scope, a bad device an ArgumentError."""
    t = alloc.empty((len(values),), dtype=dtype, device=device)
    t._torch.copy_(torch.as_tensor(values, dtype=t._torch.dtype))
    return t


def same_dtype(what: str, *values) -> DType:
    """The common dtype of ``values``; nothing converts implicitly."""
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1:
        raise ArgumentError(f"{what}: inputs have different dtypes {sorted(map(repr, dtypes))}; "
                        f"convert explicitly first")
    return next(iter(dtypes))


def owned_view(out: Tensor, shape: tuple, name: str = "") -> Tensor:
    """A fresh view of ``out`` with ``shape``, to be partitioned (consumed) by an op launch;
    ``name`` (``"ops.x: out"``) names the output when its strides cannot take that shape."""
    try:
        return out.view(tuple(shape))
    except ValueError:
        raise ArgumentError(f"{name or 'out'}: an output of shape {tuple(out.shape)} with "
                            f"strides {out.stride()} cannot be viewed as {tuple(shape)} "
                            f"without copying (the op writes it through that view); pass a "
                            f"contiguous tensor") from None


def borrow(v):
    """What an op passes to its kernel for input ``v``: a fresh view of a Tensor (so the
    caller's handle is never consumed and one tensor may feed several inputs), or the Shared
    handle itself (held while the op is in flight, usable again after)."""
    return v.view(v.shape) if isinstance(v, Tensor) else v


def taken(ws, fields):
    """A copy of the workspace ``ws`` whose buffers ``fields`` (a field may hold a tuple of
    them) are fresh views: what an op of several launches builds its later launches from.
    Those are built when the op runs; from the caller's workspace they would follow a field
    reassigned, or a handle moved, since the op was built and its checks and reservation
    made, so they could touch bytes nothing borrowed."""
    mine = copy.copy(ws)
    for field in fields:
        v = getattr(ws, field)
        setattr(mine, field, tuple(borrow(t) for t in v) if isinstance(v, tuple) else borrow(v))
    return mine


def inputs(*values) -> list:
    """What an op passes to its kernel for the inputs ``values``: each :func:`borrow`-ed, so
    one Tensor may feed several inputs (a fresh view each). A Shared handle that feeds several
    is passed as itself for each: a launch moves it in once and hands it back once, so the op
    makes no other handle that could outlive it (and keep ``try_unwrap`` from succeeding)."""
    return [borrow(v) for v in values]


def check_disjoint(name: str, inputs: dict, outputs: dict) -> None:
    """Refuse (``AliasError``) an output that shares memory with an input or another output
    of one op (``None`` entries are left out). One launch refuses that itself; an op of
    several launches calls this before building the first, so that when it refuses, no
    launch of it has written anything."""
    outs = [(n, v) for n, v in outputs.items() if v is not None]
    ins = [(n, v) for n, v in inputs.items() if v is not None]
    for i, (n, o) in enumerate(outs):
        for kind, others in (("output", outs[i + 1:]), ("input", ins)):
            for m, other in others:
                # The handles' torch tensors, as the launcher reads them (no copy, no check).
                if overlaps(o._torch, other._torch):
                    raise AliasError(
                        f"{name}: the output {n} overlaps the {kind} {m}; an op never writes "
                        f"memory it reads, or writes it twice: pass separate storage (for an "
                        f"in-place update, alternate two buffers)")


def naming_overlaps(*outputs: str):
    """Decorate an op of one launch whose parameters ``outputs`` it writes (its other Tensor
    and Shared arguments are inputs): an overlap between its own arguments, which the launch
    refuses naming the kernel and the kernel's parameters, is refused naming the op and its
    own, with the refused launch's ``recovered`` arguments (one wrapper call per op; the
    names are worked out only when the launch refuses)."""
    def decorate(fn):
        signature, name = inspect.signature(fn), f"ops.{fn.__name__}"

        @functools.wraps(fn)
        def op(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except AliasError as err:
                given = {n: v for n, v in signature.bind(*args, **kwargs).arguments.items()
                         if isinstance(v, (Tensor, Shared))}
                try:
                    check_disjoint(name, {n: v for n, v in given.items() if n not in outputs},
                                   {n: v for n, v in given.items() if n in outputs})
                except AliasError as named:
                    named.recovered = getattr(err, "recovered", None)
                    raise named from err
                raise                       # an overlap with an operation in flight
        return op
    return decorate


def as_rows(name: str, v):
    """``v`` as a 2-D (rows, last dim) view: 1-D becomes one row, N-D flattens leading dims.

    Shared handles cannot be reshaped, so they must already be 2-D."""
    if v.ndim == 0:
        raise ArgumentError(f"{name} must have at least one dimension (rows of a last dim), "
                            f"got a 0-d tensor")
    if v.ndim == 2:
        return borrow(v)
    if isinstance(v, Shared):
        raise ArgumentError(f"{name}: a Shared input must be 2-D (rows, dim), got shape {v.shape}")
    if v.ndim == 1:
        return v.view(1, v.shape[0])
    try:
        return v.view(-1, v.shape[-1])
    except ArgumentError:
        raise ArgumentError(f"{name} of shape {tuple(v.shape)} with strides {v.stride()} "
                            f"cannot be viewed as rows (rows, {v.shape[-1]}) without copying; "
                            f"pass a contiguous tensor or a 2-D view") from None


def elementwise_views(name: str, inputs: list, out: Tensor) -> tuple[list, Tensor]:
    """Views of ``inputs`` and ``out`` (all of one shape) in a layout element-wise kernels tile.

    When every input and ``out`` are contiguous (or 1-D) the layout is flat 1-D, the fastest;
    else it is 2-D (rows, last dim), which also covers strided views such as the two halves
    of a fused projection, or a transposed ``out``. The output view is always a fresh view,
    so partitioning it leaves the caller's handle intact."""
    shape = tuple(out.shape)
    for i, v in enumerate(inputs):
        if tuple(v.shape) != shape:
            raise ArgumentError(f"{name}: input {i} has shape {tuple(v.shape)}, expected {shape} "
                             f"(no broadcasting)")
    if all(v.ndim <= 1 or (isinstance(v, Tensor) and v.is_contiguous())
           for v in [*inputs, out]):
        return [borrow(v) if v.ndim == 1 else v.view(-1) for v in inputs], out.view(-1)
    if len(shape) > 2 and any(isinstance(v, Shared) for v in inputs):
        raise ArgumentError(f"{name}: a Shared input of shape {shape} cannot be tiled here: "
                            f"the op tiles a flat vector or rows, and a Shared handle is never "
                            f"reshaped; pass the Tensor, or share a 1-D or 2-D view")
    views = []
    for what, v in [*((f"input {i}", v) for i, v in enumerate(inputs)), ("out", out)]:
        if v.ndim == 2:
            views.append(borrow(v) if what != "out" else owned_view(v, shape))
            continue
        try:
            views.append(v.view(-1, shape[-1]))
        except ArgumentError:
            raise ArgumentError(f"{name}: {what} of shape {shape} with strides {v.stride()} "
                                f"cannot be viewed as rows without copying; pass a contiguous "
                                f"tensor or a 2-D view") from None
    return views[:-1], views[-1]


def elementwise_tile(shape: tuple, block: int) -> tuple:
    """Tile shape of about ``block`` elements for a 1-D or 2-D element-wise layout."""
    if len(shape) == 1:
        return (block,)
    cols = min(next_pow2(shape[1]), block)
    return (max(1, block // cols), cols)


def returning(op, value):
    """``op`` with output ``value`` (a tensor or a tuple of tensors) instead of its arguments."""
    return op.map(lambda *_: value)


def reserving(op, name: str, writes: dict, reads: dict | None = None):
    """``op``, an op of several launches, borrowing from now on the bytes its later launches
    write (``writes``: name -> Tensor) and the inputs only they read (``reads``: name -> what
    :func:`later_input` gave), which those launches would borrow only when they run
    (``device/reserve.py``); ``AliasError`` if an operation in flight conflicts."""
    reads = reads or {}
    return ReservingOp(op, f"{name} (a later launch of it)",
                       [(n, t._torch) for n, t in writes.items()],
                       [(n, t._torch) for n, t in reads.items()],
                       [t for t in reads.values() if isinstance(t, Shared)])


def later_input(v):
    """What an op of several launches passes for an input only a later launch reads: a fresh
    view of a Tensor, a clone of a Shared handle (released by :func:`reserving`'s op once it
    has run), so that the caller may move its own handle before the launch is built."""
    return v.clone() if isinstance(v, Shared) else borrow(v)


class Configured:
    """Per-options copies of a kernel (``num_warps``, and the ``pdl`` and ``trigger_early``
    flags), made once (``kernel.options`` copies the kernel)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._by_options: dict = {}

    def __call__(self, num_warps: int, pdl: bool = False, trigger_early: bool = False):
        if type(num_warps) is not int:
            # Not a cache key: a list is unhashable, and 4.0 or True would find the copy made
            # for 4 or 1. kernel.options refuses it (ArgumentError naming num_warps).
            return self.kernel.options(num_warps=num_warps)
        key = (num_warps, pdl, trigger_early)
        k = self._by_options.get(key)
        if k is None:
            k = self._by_options[key] = self.kernel.options(
                num_warps=num_warps, pdl=pdl, trigger_early=pdl and trigger_early)
        return k
