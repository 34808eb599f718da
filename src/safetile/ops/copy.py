"""Copies and scalar offsets of small device tensors of any dtype: ``copy`` and ``add_scalar``.

A captured decode step keeps its counters (the position, the sampler's step) on the device
and advances them itself. A safe op never writes what it reads, so a counter advances in two
launches through a scratch buffer: ``add_scalar(cursor, 1, out=scratch)`` then
``copy(scratch, out=cursor)``. ``copy`` also loads new host values into a buffer a graph has
baked in (copy from a fresh tensor into the recorded one). Each program owns one tile of the
output; integer and float tensors alike.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host

DTYPES = st.floats | st.i32 | st.i64


@st.kernel
def add_scalar_kernel(x: st.In[DTYPES], z: st.Out[DTYPES], value: int):
    """z = x + value, in x's dtype (``value`` 0 copies)."""
    z.store(sl.load_like(x, z) + value)


@st.kernel
def add_scalar_float_kernel(x: st.In[st.floats], z: st.Out[st.floats], value: float):
    """z = x + value for float tensors and a float offset, rounded once to z's dtype."""
    z.store(sl.load_like(x, z).astype(st.f32) + value)


_INT = host.Configured(add_scalar_kernel)
_FLOAT = host.Configured(add_scalar_float_kernel)


def add_scalar(x, value, out=None, *, block: int = host.BLOCK):
    """``x + value`` element-wise for an int or float tensor ``x`` (same dtype out).

    ``value``: an int (any ``x``) or a float (float ``x`` only). Returns a ``DeviceOp``
    whose output is the result (``out`` when given; it must not overlap ``x``)."""
    host.check_value("ops.add_scalar: x", x)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"ops.add_scalar: value must be an int or a float, got "
                            f"{type(value).__name__}")
    is_float = x.dtype in (st.f32, st.f16, st.bf16)
    if isinstance(value, float) and not is_float:
        raise ArgumentError(f"ops.add_scalar: a float value cannot be added to {x.dtype!r} "
                            f"without converting; pass an int")
    z = host.output("ops.add_scalar: out", out, x.shape, x.dtype, x.device)
    (xv,), zv = host.elementwise_views("ops.add_scalar", [x], z)
    tile = host.elementwise_tile(tuple(zv.shape), min(block, host.next_pow2(max(1, z.numel))))
    warps = host.warps_for(tile[0] if len(tile) == 1 else tile[0] * tile[1])
    if isinstance(value, float):
        op = _FLOAT(warps)(xv, zv.partition(tile), value)
    else:
        op = _INT(warps)(xv, zv.partition(tile), int(value))
    return host.returning(op, z)


def copy(x, out):
    """Copy ``x`` into ``out`` (same shape and dtype, no overlap): ``add_scalar(x, 0, out)``.

    Returns a ``DeviceOp`` whose output is ``out``."""
    if out is None:
        raise ArgumentError("ops.copy: out is required (a copy into a new tensor is "
                            "x.to_torch() on the host, or add_scalar(x, 0))")
    return add_scalar(x, 0, out)
