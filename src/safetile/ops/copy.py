"""Copies and scalar offsets of small device tensors: ``copy`` and ``add_scalar``.

A captured decode step keeps its counters (the position, the sampler's step) on the device
and advances them itself. A safe op never writes what it reads, so a counter advances in two
launches through a scratch buffer: ``add_scalar(cursor, 1, out=scratch)`` then
``copy(scratch, out=cursor)``. ``copy`` also loads new host values into a buffer a graph has
baked in (copy from a fresh tensor into the recorded one). Each program owns one tile of the
output.

Both take float32, float16, bfloat16, int32 and int64 tensors; int8 and bool tensors are
refused (convert them first). ``copy`` copies bit for bit (-0.0 and NaN payloads too). A
float tensor's offset is added in fp32 and rounded once to its dtype (``(x.float() +
v).to(dtype)``; torch's own ``x + v`` on CPU halves may round differently); an int tensor's
offset is an int32 scalar of the kernel.
"""
from __future__ import annotations

import numbers

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host

DTYPES = st.floats | st.i32 | st.i64
INT32 = (-2**31, 2**31 - 1)


@st.kernel
def copy_kernel(x: st.In[DTYPES], z: st.Out[DTYPES]):
    """z = x, bit for bit."""
    z.store(sl.load_like(x, z))


@st.kernel
def add_scalar_kernel(x: st.In[DTYPES], z: st.Out[DTYPES], value: int):
    """z = x + value, in x's dtype (the host sends float tensors to the kernel below: an int
    scalar does not meet a bf16 tile)."""
    z.store(sl.load_like(x, z) + value)


@st.kernel
def add_scalar_float_kernel(x: st.In[st.floats], z: st.Out[st.floats], value: float):
    """z = x + value for float tensors and a float offset, rounded once to z's dtype."""
    z.store(sl.load_like(x, z).astype(st.f32) + value)


_COPY = host.Configured(copy_kernel)
_INT = host.Configured(add_scalar_kernel)
_FLOAT = host.Configured(add_scalar_float_kernel)


def _launch(name: str, configured, x, out, block: int, pdl, trigger_early, *scalar):
    """``configured``'s kernel from ``x`` into ``out`` (checked, or allocated) by tiles."""
    pdl, trigger_early = host.pdl_flags(name, pdl, trigger_early)
    host.check_value(f"{name}: x", x)
    if x.dtype not in DTYPES:
        raise ArgumentError(f"{name}: x has dtype {x.dtype!r}; this op takes float32, "
                            f"float16, bfloat16, int32 or int64 tensors (convert it first)")
    block = host.check_pow2(f"{name}: block", block)
    z = host.output(f"{name}: out", out, x.shape, x.dtype, x.device)
    (xv,), zv = host.elementwise_views(name, [x], z)
    tile = host.elementwise_tile(tuple(zv.shape), min(block, host.next_pow2(max(1, z.numel))))
    warps = host.warps_for(tile[0] if len(tile) == 1 else tile[0] * tile[1])
    op = configured(warps, pdl, trigger_early)(*host.inputs(xv), zv.partition(tile), *scalar)
    return host.returning(op, z)


@host.naming_overlaps("out")
def add_scalar(x, value, out=None, *, block: int = host.BLOCK, pdl: bool | None = None,
               trigger_early: bool = False):
    """``x + value`` element-wise (same dtype out; see the module docstring for the dtypes).

    ``value``: an int (any ``x``; for an int tensor, within int32) or a float (float ``x``
    only); numpy scalars too. ``block``: elements per program, a power of two. ``pdl``
    (default: on Hopper and later): programmatic dependent launch, every load after the
    wait; ``trigger_early`` (with ``pdl``): the next kernel may be scheduled as soon as this
    one's programs start. Returns a ``DeviceOp`` whose output is the result (``out`` when
    given; it must not overlap ``x``).
    """
    name = "ops.add_scalar"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{name}: value must be an int or a float, got "
                            f"{type(value).__name__}")
    host.check_value(f"{name}: x", x)
    if x.dtype in st.floats:
        try:
            value = float(value)
        except OverflowError:
            raise ArgumentError(f"{name}: value {value} is too large for a float (the "
                                f"kernel's scalar for a float tensor)") from None
        return _launch(name, _FLOAT, x, out, block, pdl, trigger_early, value)
    if not isinstance(value, numbers.Integral):
        raise ArgumentError(f"{name}: a float value cannot be added to {x.dtype!r} "
                            f"without converting; pass an int")
    if not INT32[0] <= value <= INT32[1]:
        raise ArgumentError(f"{name}: value {value} does not fit int32, the kernel's scalar "
                            f"for an int tensor; add it in steps within int32 (several "
                            f"add_scalar ops), or add it on the host")
    return _launch(name, _INT, x, out, block, pdl, trigger_early, int(value))


@host.naming_overlaps("out")
def copy(x, out, *, block: int = host.BLOCK, pdl: bool | None = None,
         trigger_early: bool = False):
    """Copy ``x`` into ``out`` (same shape and dtype, no overlap), bit for bit.

    ``pdl``, ``trigger_early``: as :func:`add_scalar`. Returns a ``DeviceOp`` whose output
    is ``out``."""
    if out is None:
        raise ArgumentError("ops.copy: out is required (a copy into a new tensor is "
                            "x.to_torch() on the host, or add_scalar(x, 0))")
    return _launch("ops.copy", _COPY, x, out, block, pdl, trigger_early)
