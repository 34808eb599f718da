"""Allocation and interop: ``st.zeros / ones / full / empty / arange / randn``,
``st.from_torch / from_numpy / from_dlpack``, the default device, and the graph-capture
allocation guard.

Graph-capture guard: a CUDA graph replays fixed addresses, so nothing may allocate while a
graph scope records. The device layer wraps its scopes in :func:`forbid_allocation`; while
one is active, every allocating function called by the thread and asyncio task that entered
it raises :class:`~safetile.errors.GraphCaptureError`. Other threads and tasks (also those
started inside the block) allocate freely (``scoped.py``). The guard nests.

Ownership and torch references: ``from_torch(t)`` / ``from_dlpack(x)`` wrap memory without
copying. The returned Tensor owns that memory *as far as safetile can see*: if the caller
keeps its own torch (or DLPack-producer) reference and reads or writes through it while an
operation is in flight, safetile cannot notice: such access is outside the guarantee. The
same holds for aliases handed out by ``Tensor.__dlpack__``. Everything done through
safetile handles (including zero-copy views) is checked.
"""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
import operator
import os

import torch

from .. import dtypes as _dtypes
from ..errors import ArgumentError, GraphCaptureError
from .ownership import Handle
from .scoped import Scoped
from .tensor import Tensor
from .tensor import _shape_tuple as _any_shape


def _shape_tuple(shape) -> tuple:
    """An allocation's shape: ints, none negative."""
    dims = _any_shape(shape)
    if any(d < 0 for d in dims):
        raise ArgumentError(f"shape {dims} has a negative dimension")
    return dims

__all__ = ["default_device", "zeros", "ones", "full", "empty", "arange", "randn",
           "from_torch", "from_numpy", "from_dlpack", "forbid_allocation",
           "allocation_forbidden"]


# ---------------------------------------------------------------------------------------
# devices and dtypes
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def default_device() -> torch.device:
    """The device used when ``device=None``: ``$SAFETILE_DEVICE`` if set (e.g. ``cpu``,
    ``cuda:1``), else CUDA when available, else CPU. Cached; ``default_device.cache_clear()``
    re-reads the environment."""
    env = os.environ.get("SAFETILE_DEVICE", "").strip()
    if env:
        return torch.device(env)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _cuda_present() -> bool:
    return torch.cuda.is_available()


def _device(device) -> torch.device:
    """The device to allocate on; a CUDA device only where there is one (torch itself fails
    with an assertion there)."""
    if device is None:
        dev = default_device()
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as e:
            raise ArgumentError(f"device {device!r} is not a device: {e}") from None
    unset = " (or unset SAFETILE_DEVICE)" if device is None else ""
    if dev.type == "cuda" and not _cuda_present():
        raise ArgumentError(f"device {str(dev)!r}: no CUDA device is available on this "
                            f"machine; use device='cpu'{unset}")
    if dev.type not in ("cpu", "cuda", "meta") and not _present(dev.type):
        # torch asserts (a bare AssertionError) when it allocates on a backend it lacks; the
        # meta device is left to Tensor._wrap, which says why it cannot hold a tensor.
        raise ArgumentError(f"device {str(dev)!r}: no {dev.type!r} device is available on "
                            f"this machine; use device='cpu'{unset}")
    return dev


@functools.lru_cache(maxsize=None)
def _present(kind: str) -> bool:
    """Whether torch has a device of type ``kind`` here (``torch.<kind>.is_available()``)."""
    try:
        return bool(getattr(torch, kind).is_available())
    except Exception:                       # no such module, or it cannot tell: none here
        return False


@contextlib.contextmanager
def _typed(what: str):
    """torch's errors for bad arguments (an unrepresentable fill value, a zero step, a string
    array) become ``ArgumentError``s naming the call; running out of memory stays what it is."""
    try:
        yield
    except ArgumentError:
        raise
    except torch.OutOfMemoryError:
        raise
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:
        raise ArgumentError(f"{what}: {e}") from None


def _torch_dtype(dtype, default: _dtypes.DType = _dtypes.float32) -> torch.dtype:
    """A safetile DType or torch dtype (or None for ``default``) -> torch dtype."""
    if dtype is None:
        return default.torch
    if isinstance(dtype, _dtypes.DType):
        return dtype.torch
    if isinstance(dtype, torch.dtype):
        return _dtypes.from_torch(dtype).torch          # TypeError if unsupported
    raise ArgumentError(f"dtype must be a safetile dtype (st.float32, ...) or a torch dtype, "
                    f"got {dtype!r}")


# ---------------------------------------------------------------------------------------
# the graph-capture guard
# ---------------------------------------------------------------------------------------

#: The reasons of the active :func:`forbid_allocation` blocks. The device layer reads
#: ``FORBIDDING.var.get()`` on every execution: an empty tuple outside every block.
FORBIDDING = Scoped("safetile.forbid_allocation")


def forbid_allocation(reason: str):
    """While active (for the thread and task that entered it), safetile allocation functions
    raise ``GraphCaptureError``. ``reason`` names the scope, e.g. ``"st.graph_scope()"``."""
    return FORBIDDING.entered(reason)


def allocation_forbidden() -> str | None:
    """The reason of the innermost :func:`forbid_allocation` block this thread and task are
    in, or None."""
    return FORBIDDING.current()


def _guard(fn: str) -> None:
    reason = allocation_forbidden()
    if reason is not None:
        raise GraphCaptureError(
            f"st.{fn}() allocates inside {reason}; replay must not depend on allocation "
            f"addresses: allocate buffers before the scope and partition them inside it")


# ---------------------------------------------------------------------------------------
# allocation
# ---------------------------------------------------------------------------------------

def empty(shape, dtype=_dtypes.float32, device=None) -> Tensor:
    """An uninitialized Tensor (contents are arbitrary)."""
    _guard("empty")
    with _typed("st.empty"):
        return Tensor._wrap(torch.empty(_shape_tuple(shape), dtype=_torch_dtype(dtype),
                                        device=_device(device)))


def zeros(shape, dtype=_dtypes.float32, device=None) -> Tensor:
    """A Tensor of zeros (``dtype`` defaults to ``st.float32``)."""
    _guard("zeros")
    with _typed("st.zeros"):
        return Tensor._wrap(torch.zeros(_shape_tuple(shape), dtype=_torch_dtype(dtype),
                                        device=_device(device)))


def ones(shape, dtype=_dtypes.float32, device=None) -> Tensor:
    """A Tensor of ones (``dtype`` defaults to ``st.float32``)."""
    _guard("ones")
    with _typed("st.ones"):
        return Tensor._wrap(torch.ones(_shape_tuple(shape), dtype=_torch_dtype(dtype),
                                       device=_device(device)))


def full(shape, value, dtype=_dtypes.float32, device=None) -> Tensor:
    """A Tensor filled with ``value`` (``dtype`` defaults to ``st.float32``)."""
    _guard("full")
    tdt = _torch_dtype(dtype)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        raise ArgumentError(f"st.full: {value!r} is complex; safetile has no complex dtype")
    integer = not tdt.is_floating_point and tdt is not torch.bool
    if integer and not isinstance(value, (bool, int)) and not _integral(value):
        raise ArgumentError(f"st.full: {value!r} is not a value of the integer dtype "
                            f"{dtype}; round it first, or use a float dtype")
    if integer and isinstance(value, numbers.Real) and not isinstance(value, bool):
        info = torch.iinfo(tdt)
        if not info.min <= value <= info.max:
            raise ArgumentError(f"st.full: {value!r} is out of {dtype}'s range "
                                f"[{info.min}, {info.max}]")
    with _typed("st.full"):
        if type(value) is int and not -2**63 <= value < 2**63 and tdt.is_floating_point:
            value = float(value)        # torch takes no int past int64: its nearest float
        return Tensor._wrap(torch.full(_shape_tuple(shape), value, dtype=tdt,
                                       device=_device(device)))


def _integral(value) -> bool:
    """Whether a number of another type (numpy's or torch's float) holds an integer; what is
    not a number at all is left to torch's own message."""
    try:
        return float(value).is_integer()
    except (TypeError, ValueError, RuntimeError):
        return True


def arange(start=None, stop=None, step=None, dtype=None, device=None, *, shape=None) -> Tensor:
    """``[start, stop)`` in steps of ``step`` (default 1): ``arange(n)`` (or, as the other
    allocators take a shape, ``arange((n,))`` and ``arange(shape=(n,))``) is ``0 .. n-1``.
    The count or shape may be followed positionally by a dtype and a device, in the other
    allocators' order: ``arange((n,), st.f32, "cuda")``. A shape of several axes is filled
    with ``0, 1, 2, ...`` in row-major order.

    ``dtype`` defaults to ``st.int64`` when all arguments are ints, else ``st.float32``.
    """
    _guard("arange")
    if (shape is None) == (start is None):
        raise ArgumentError("st.arange takes a count or a shape: arange(n), arange((n,)) or "
                            "arange(shape=(n,))" + (", not both" if shape is not None else ""))
    if shape is not None:
        if stop is not None:
            raise ArgumentError("st.arange(shape=...) counts from 0: give start and stop "
                                "instead of a shape")
        start = shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)
    if isinstance(stop, (_dtypes.DType, torch.dtype)) and dtype is None:
        if step is not None and device is not None:
            raise ArgumentError(f"st.arange: the device is given twice ({step!r} after the "
                                f"dtype and device={device!r})")
        stop, dtype, step, device = None, stop, None, step if device is None else device
    if step is None:
        step = 1
    shape_out = None
    if isinstance(start, (tuple, list, torch.Size)) and stop is None:
        shape_out = _shape_tuple(start)
        if not shape_out:
            raise ArgumentError("st.arange needs at least one axis: arange((n,)) or "
                                "arange((m, n)), whose values count in row-major order")
        if len(shape_out) > 1 and step != 1:
            raise ArgumentError(f"st.arange{shape_out} fills its shape with 0, 1, 2, ...: it "
                                f"takes no step (got {step!r})")
        start = math.prod(shape_out)
        if len(shape_out) == 1:       # (n,) is a count: a step takes every step-th of it
            shape_out = None
    start, stop, step = (None if v is None else _arange_number(v, name)
                         for name, v in (("start", start), ("stop", stop), ("step", step)))
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        all_int = all(isinstance(v, int) for v in (start, stop, step))
        dtype = _dtypes.int64 if all_int else _dtypes.float32
    tdt = _torch_dtype(dtype)
    with _typed("st.arange"):
        if tdt.is_floating_point or tdt == torch.bool:
            values = torch.arange(start, stop, step, dtype=tdt, device=_device(device))
            return Tensor._wrap(values if shape_out is None else values.reshape(shape_out))
        if not all(isinstance(v, int) for v in (start, stop, step)):
            raise ArgumentError(f"st.arange({start}, {stop}, {step}): an integer dtype takes "
                                f"integer bounds and step; use a float dtype")
        # built in int64, then checked to fit: torch would wrap an int8 range past 127
        values = torch.arange(start, stop, step, dtype=torch.int64, device=_device(device))
        info = torch.iinfo(tdt)
        if values.numel() and (int(values.min()) < info.min or int(values.max()) > info.max):
            raise ArgumentError(f"st.arange({start}, {stop}, {step}) reaches values outside "
                                f"{_dtypes.from_torch(tdt)!r}'s range [{info.min}, {info.max}]; "
                                f"choose a wider dtype")
        values = values.to(tdt)
        return Tensor._wrap(values if shape_out is None else values.reshape(shape_out))



def _arange_number(v, name: str):
    """An arange bound as a Python int or float (numpy scalars too, never a bool)."""
    if not isinstance(v, bool):
        try:
            return operator.index(v)
        except TypeError:
            if isinstance(v, numbers.Real):
                return float(v)
    raise ArgumentError(f"st.arange: {name} must be an int or a float, got "
                        f"{type(v).__name__} {v!r}")


def randn(shape, dtype=_dtypes.float32, device=None, seed: int | None = None) -> Tensor:
    """Standard-normal samples (``dtype`` defaults to ``st.float32``, a float type).

    With ``seed`` the values are reproducible on a given device (a private generator is
    used; torch's global RNG is left untouched).
    """
    _guard("randn")
    tdt = _torch_dtype(dtype)
    if not tdt.is_floating_point:
        raise ArgumentError(f"randn needs a floating dtype, got {_dtypes.from_torch(tdt)!r}")
    dev = _device(device)
    gen = None
    if seed is not None:
        with _typed("st.randn"):
            gen = torch.Generator(device=dev)
            gen.manual_seed(seed)
    with _typed("st.randn"):
        return Tensor._wrap(torch.randn(_shape_tuple(shape), dtype=tdt, device=dev,
                                        generator=gen))


# ---------------------------------------------------------------------------------------
# interop
# ---------------------------------------------------------------------------------------

def from_torch(t: torch.Tensor) -> Tensor:
    """Take ownership of a torch tensor, zero-copy (same storage, same strides).

    The caller's own reference to ``t`` (or to any torch view of its storage) still
    aliases the memory: access through it while safetile operations are in flight is
    outside safetile's guarantee. Wrapping two torch views of one storage is fine: they are
    separate handles whose overlap is checked at launch. A tensor that requires grad is
    detached (zero-copy). The handle holds a torch view of its own (``t.detach()``), so
    in-place metadata changes through ``t`` (``unsqueeze_``, ``as_strided_``, ``set_``) do
    not change the handle's shape or strides.
    """
    return Tensor._wrap(t.detach() if type(t) is torch.Tensor else t)


def from_numpy(a, device=None) -> Tensor:
    """A Tensor holding a *copy* of numpy array ``a`` on ``device`` (default device).

    Copying keeps the caller's array from aliasing safetile-owned memory.
    """
    _guard("from_numpy")
    import numpy as np
    with _typed("st.from_numpy"):
        arr = np.asarray(a)
        t = torch.from_numpy(np.array(arr, copy=True, order="C"))
    _dtypes.from_torch(t.dtype)                          # ArgumentError if unsupported
    dev = _device(device)
    return Tensor._wrap(t.to(dev) if dev.type != "cpu" else t)


def from_dlpack(x) -> Tensor:
    """Wrap any DLPack producer (numpy array, CuPy/JAX array, torch tensor) zero-copy.

    As with :func:`from_torch`, the producer's own references still alias the memory. A
    safetile Tensor gives a zero-copy view of itself (``t.view(t.shape)``: a handle whose
    bytes ``into_torch`` knows); a Shared or Partition is refused. A
    numpy-style array marked read-only (``flags.writeable``: kernels would write memory its
    owner promised not to change) and one with negative strides (torch cannot take it) are
    refused; copy them first. Other producers' read-only memory is not detected.
    """
    if isinstance(x, Tensor):
        # A view, in x's family: a handle made from x's DLPack alias would be outside it, so
        # into_torch of either would not see the other, and a launch through the other would
        # then write memory torch owns.
        x._check("wrap it with st.from_dlpack")
        return x._derive(x._torch, "wrap it with st.from_dlpack")
    if isinstance(x, Handle):
        raise ArgumentError(f"st.from_dlpack: {x._describe()} is a safetile handle, not a "
                            f"DLPack producer; pass a Tensor (its zero-copy view comes back)")
    if isinstance(x, torch.Tensor):     # shares x's storage, so a resize through x is seen
        return from_torch(x)
    flags = getattr(x, "flags", None)             # numpy's (and numpy-like) arrays
    if flags is not None and getattr(flags, "writeable", True) is False:
        raise ArgumentError("st.from_dlpack: the array is read-only (writeable=False); a kernel "
                            "could write it: pass a writable copy (st.from_numpy copies)")
    if not hasattr(x, "__dlpack__") and type(x).__name__ != "PyCapsule":
        raise ArgumentError(f"st.from_dlpack: expected a DLPack producer (an array with "
                            f"__dlpack__, or a capsule), got {type(x).__name__}; for Python "
                            f"values use st.from_torch(torch.tensor(...))")
    strides = getattr(x, "strides", None)
    if isinstance(strides, tuple) and any(type(s) is int and s < 0 for s in strides):
        raise ArgumentError(f"st.from_dlpack: the array has negative strides {strides}; "
                            f"pass a copy (st.from_numpy copies)")
    with _typed("st.from_dlpack"):
        try:
            t = torch.from_dlpack(x)
        except BufferError as e:        # numpy: a byte order or dtype DLPack cannot carry
            raise ArgumentError(f"st.from_dlpack: {e} Pass a native-order copy of a "
                                f"supported dtype (st.from_numpy copies)") from None
    return Tensor._wrap(t)
