"""RMS normalization over the last dimension, and its fusion with a residual add.

Qwen3 (as Hugging Face transformers computes it): in fp32, ``x * rsqrt(mean(x^2) + eps)``,
rounded to x's dtype, then multiplied by ``weight`` and rounded again. Each program owns
``(ROWS, BLOCK)`` of the output: ``BLOCK`` is the row length rounded up to a power of two, so a
program holds whole rows and the mean needs no second pass; short rows (e.g. the 128-wide
per-head q/k norms) put several rows in one program.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host

# Longest row one program normalizes (elements); Qwen3's widest hidden size is 5120.
MAX_ROW = 32768


@st.function
def _rmsnorm_rows(raw, w, n, eps):
    """Rows of ``raw`` (true length ``n``; padding is 0) normalized as Qwen3 does, times ``w``."""
    xf = raw.astype(st.f32)
    r = sl.rsqrt(sl.sum(xf * xf, 1) / n + eps)
    normed = (xf * r[:, None]).astype(raw.dtype)          # HF rounds before the weight
    return normed.astype(st.f32) * w.astype(st.f32)[None, :]


@st.kernel
def rmsnorm_kernel(x: st.In[st.floats, 2], w: st.In[st.floats, 1], z: st.Out[st.floats, 2],
                   eps: float):
    """z = (x * rsqrt(mean(x^2) + eps)).astype(x.dtype) * w, per row."""
    raw = x.load(z.index, z.shape)
    z.store(_rmsnorm_rows(raw, w.load((0,), (z.shape[1],)), x.shape[1], eps))


@st.kernel
def add_rmsnorm_kernel(x: st.In[st.floats, 2], residual: st.In[st.floats, 2],
                       w: st.In[st.floats, 1], total: st.Out[st.floats, 2],
                       z: st.Out[st.floats, 2], eps: float):
    """total = x + residual (rounded to x's dtype); z = rmsnorm(total) * w."""
    raw = x.load(z.index, z.shape) + residual.load(z.index, z.shape)
    total.store(raw)
    z.store(_rmsnorm_rows(raw, w.load((0,), (z.shape[1],)), x.shape[1], eps))


_RMSNORM = host.Configured(rmsnorm_kernel)
_ADD_RMSNORM = host.Configured(add_rmsnorm_kernel)


def row_tile(rows: int, dim: int, name: str = "ops.rmsnorm") -> tuple:
    """(ROWS, BLOCK) for rows of ``dim`` elements: whole rows, about 4096 elements a program."""
    if dim > MAX_ROW:
        raise ArgumentError(f"{name}: rows longer than {MAX_ROW} elements are not supported "
                            f"(one program normalizes a whole row), got {dim}")
    block = host.next_pow2(dim)
    return (max(1, min(host.next_pow2(rows), host.BLOCK // block)), block)


def _check(name: str, x, weight, eps) -> float:
    """Check x, weight (x's dtype: nothing converts implicitly) and eps; returns eps."""
    host.check_value(f"ops.{name}: x", x)
    host.check_value(f"ops.{name}: weight", weight)
    if x.ndim == 0:
        raise ArgumentError(f"ops.{name}: x must have at least one dimension, got a 0-d tensor")
    if weight.ndim != 1 or weight.shape[0] != x.shape[-1]:
        raise ArgumentError(f"ops.{name}: weight must have shape ({x.shape[-1]},), got "
                         f"{tuple(weight.shape)}")
    host.same_dtype(f"ops.{name}", x, weight)
    host.check_dtype(f"ops.{name}: x", x, st.floats)
    return host.check_eps(f"ops.{name}", eps)


@host.naming_overlaps("out")
def rmsnorm(x, weight, eps: float = 1e-6, out=None):
    """Qwen3's RMSNorm of ``x`` over its last dimension, in fp32, output in x's dtype.

    ``x``: (..., dim) (a Shared ``x`` must be 2-D); ``weight``: (dim,) in x's dtype;
    ``eps``: a finite number >= 0. Returns a ``DeviceOp`` whose output is the normalized
    tensor (``out`` when given)."""
    eps = _check("rmsnorm", x, weight, eps)
    z = host.output("ops.rmsnorm: out", out, x.shape, x.dtype, x.device)
    xv = host.as_rows("ops.rmsnorm: x", x)
    zv = host.owned_view(z, xv.shape, "ops.rmsnorm: out")
    tile = row_tile(*xv.shape)
    op = _RMSNORM(host.warps_for(tile[0] * tile[1]))(*host.inputs(xv, weight),
                                                     zv.partition(tile), eps)
    return host.returning(op, z)


@host.naming_overlaps("out", "residual_out")
def add_rmsnorm(x, residual, weight, eps: float = 1e-6, out=None, residual_out=None):
    """The residual sum ``x + residual`` and its RMSNorm, in one pass.

    Returns a ``DeviceOp`` whose output is ``(residual_out, out)``: the sum (rounded to the
    dtype, the next layer's residual) and the normalized sum. The outputs cannot alias the
    inputs (safe ops never write what they read): alternate two residual buffers."""
    eps = _check("add_rmsnorm", x, weight, eps)
    host.check_value("ops.add_rmsnorm: residual", residual)
    dtype = host.same_dtype("ops.add_rmsnorm", x, residual)
    if tuple(residual.shape) != tuple(x.shape):
        raise ArgumentError(f"ops.add_rmsnorm: residual has shape {tuple(residual.shape)}, "
                         f"expected {tuple(x.shape)}")
    z = host.output("ops.add_rmsnorm: out", out, x.shape, dtype, x.device)
    s = host.output("ops.add_rmsnorm: residual_out", residual_out, x.shape, dtype, x.device)
    xv = host.as_rows("ops.add_rmsnorm: x", x)
    rv = host.as_rows("ops.add_rmsnorm: residual", residual)
    tile = row_tile(*xv.shape, "ops.add_rmsnorm")
    op = _ADD_RMSNORM(host.warps_for(tile[0] * tile[1]))(
        *host.inputs(xv, rv, weight),
        host.owned_view(s, xv.shape, "ops.add_rmsnorm: residual_out").partition(tile),
        host.owned_view(z, xv.shape, "ops.add_rmsnorm: out").partition(tile), eps)
    return host.returning(op, (s, z))
