"""Element-wise ops: ``add``, ``mul`` and ``silu_mul`` (SwiGLU's ``silu(gate) * up``).

Each program owns one tile of the output and reads the tiles of the inputs at the same
position. The kernels are rank-generic: the host hands them flat 1-D views when everything is
contiguous (one long stream, the fastest layout) and 2-D (rows, columns) views otherwise, so
strided inputs such as the two halves of a fused gate/up projection need no copy.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from . import host


@st.kernel
def add_kernel(x: st.In[st.floats], y: st.In[st.floats], z: st.Out[st.floats]):
    """z = x + y (one rounding to z's type, as torch.add)."""
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@st.kernel
def mul_kernel(x: st.In[st.floats], y: st.In[st.floats], z: st.Out[st.floats]):
    """z = x * y (one rounding to z's type, as torch.mul)."""
    z.store(sl.load_like(x, z) * sl.load_like(y, z))


@st.kernel
def silu_mul_kernel(gate: st.In[st.floats], up: st.In[st.floats], z: st.Out[st.floats]):
    """z = silu(gate) * up, computed in fp32 and rounded once to z's type."""
    g = sl.load_like(gate, z).astype(st.f32)
    u = sl.load_like(up, z).astype(st.f32)
    z.store(g * sl.sigmoid(g) * u)


_ADD = host.Configured(add_kernel)
_MUL = host.Configured(mul_kernel)
_SILU_MUL = host.Configured(silu_mul_kernel)


def _binary(name: str, configured, a, b, out, block: int, num_warps: int | None,
            names: tuple = ("x", "y")):
    host.check_value(f"ops.{name}: {names[0]}", a)
    host.check_value(f"ops.{name}: {names[1]}", b)
    dtype = host.same_dtype(f"ops.{name}", a, b)
    host.check_dtype(f"ops.{name}: {names[0]}", a, st.floats)
    block = host.check_pow2(f"ops.{name}: block", block)
    z = host.output(f"ops.{name}: out", out, a.shape, dtype, a.device)
    (av, bv), zv = host.elementwise_views(f"ops.{name}", [a, b], z)
    tile = host.elementwise_tile(tuple(zv.shape), block)
    warps = host.warps_for(block) if num_warps is None else \
        host.check_pow2(f"ops.{name}: num_warps", num_warps, 1, 32)
    op = configured(warps)(*host.inputs(av, bv), zv.partition(tile))
    return host.returning(op, z)


@host.naming_overlaps("out")
def add(x, y, out=None, *, block: int = host.BLOCK, num_warps: int | None = None):
    """``x + y`` element-wise (same shape and dtype; fp32, fp16 or bf16).

    Returns a ``DeviceOp`` whose output is the result tensor (``out`` when given).
    ``block``: elements per program (a power of two); ``num_warps``: default from ``block``."""
    return _binary("add", _ADD, x, y, out, block, num_warps)


@host.naming_overlaps("out")
def mul(x, y, out=None, *, block: int = host.BLOCK, num_warps: int | None = None):
    """``x * y`` element-wise; see :func:`add` for the arguments and the result."""
    return _binary("mul", _MUL, x, y, out, block, num_warps)


@host.naming_overlaps("out")
def silu_mul(gate, up, out=None, *, block: int = host.BLOCK, num_warps: int | None = None):
    """SwiGLU's ``silu(gate) * up`` in fp32, rounded once to the inputs' dtype.

    ``gate`` and ``up`` may be strided 2-D views (e.g. the halves of a fused gate/up
    projection's output); see :func:`add` for the other arguments and the result."""
    return _binary("silu_mul", _SILU_MUL, gate, up, out, block, num_warps, ("gate", "up"))
