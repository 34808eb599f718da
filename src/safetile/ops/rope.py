"""Rotary position embedding, Qwen3's rotate-half convention (as Hugging Face computes it).

For ``x`` of shape (seq, heads, head_dim) and ``d = head_dim``::

    inv_freq = 1 / theta ** (arange(0, d, 2) / d)          # fp32, (d/2,)
    freqs    = positions.float()[:, None] * inv_freq        # (seq, d/2)
    cos, sin = cat(freqs, freqs).cos(), .sin()              # rounded to x's dtype
    out      = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x2, x1)

so ``out1 = x1*cos - x2*sin`` and ``out2 = x2*cos + x1*sin`` on the two halves. Positions are
read from a device tensor, never baked into the launch, so a captured graph stays valid as
the decode position advances. Each program owns a (seq, heads, head_dim) block of the output
and writes its two halves as sub-tiles of that block.
"""
from __future__ import annotations

import torch

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from . import host

# Qwen3's rope_theta.
QWEN3_THETA = 1_000_000.0


@st.kernel
def rope_kernel(x: st.In[st.floats, 3], positions: st.In[st.i32 | st.i64, 1],
                inv_freq: st.In[st.f32, 1], z: st.Out[st.floats, 3]):
    """z = x * cos + rotate_half(x) * sin at the angles positions[s] * inv_freq."""
    i, j, k = z.index
    # The two halves of head_dim are tiles 0 and 1 of a (seq, heads, head_dim / 2) grid.
    x1 = x.load((i, j, 0), (z.shape[0], z.shape[1], z.shape[2] // 2))
    x2 = x.load((i, j, 1), (z.shape[0], z.shape[1], z.shape[2] // 2))
    pos = positions.load((i,), (z.shape[0],)).astype(st.f32)
    angle = pos[:, None, None] * inv_freq.load((0,), (z.shape[2] // 2,))[None, None, :]
    c = sl.cos(angle).astype(x1.dtype)                 # HF rounds cos/sin to x's dtype
    s = sl.sin(angle).astype(x1.dtype)
    halves = z.partition((z.shape[0], z.shape[1], z.shape[2] // 2))
    halves.store(x1 * c - x2 * s, (0, 0, 0))
    halves.store(x2 * c + x1 * s, (0, 0, 1))


_ROPE = host.Configured(rope_kernel)


def inv_freq_table(head_dim: int, theta: float = QWEN3_THETA, device=None):
    """The fp32 ``inv_freq`` table, computed exactly as transformers' default rope does, for
    an even ``head_dim`` > 0 (at most ``MAX_TILE_ELEMENTS``: the rope kernels hold a whole
    head in one tile) and a finite ``theta`` > 0.

    Allocates: make it once, before any graph scope, and pass it to :func:`rope`."""
    head_dim = host.check_int("ops.inv_freq_table: head_dim", head_dim, 2, MAX_TILE_ELEMENTS)
    if head_dim % 2:
        raise ArgumentError(f"ops.inv_freq_table: head_dim must be even (rope rotates pairs), "
                            f"got {head_dim}")
    theta = host.check_number("ops.inv_freq_table: theta", theta, above=0.0)
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
    return host.filled(1.0 / (theta ** exponent), st.f32, device)


def rope_tile(seq: int, heads: int, head_dim: int) -> tuple:
    """(seq, heads, head_dim) block of about 4096 elements (all of head_dim, whole heads)."""
    bh = min(host.next_pow2(heads), max(1, host.BLOCK // head_dim))
    bs = min(host.next_pow2(seq), max(1, host.BLOCK // (bh * head_dim)))
    return (bs, bh, head_dim)


@host.naming_overlaps("out")
def rope(x, positions, inv_freq=None, *, theta: float = QWEN3_THETA, out=None):
    """Apply Qwen3's rotary embedding to ``x`` of shape (seq, heads, head_dim).

    ``positions``: int32/int64 device tensor of shape (seq,). ``inv_freq``: the table from
    :func:`inv_freq_table` (built from ``theta`` here when omitted, which allocates).
    ``head_dim`` must be a power of two (Qwen3: 128); ``x`` may be a strided view, e.g. of a
    fused qkv projection. Returns a ``DeviceOp`` whose output is the rotated tensor."""
    host.check_value("ops.rope: x", x)
    host.check_value("ops.rope: positions", positions)
    if x.ndim != 3:
        raise ArgumentError(f"ops.rope: x must be (seq, heads, head_dim), got shape {x.shape}")
    host.check_dtype("ops.rope: x", x, st.floats)
    seq, heads, d = x.shape
    if d < 2 or d & (d - 1) or d > MAX_TILE_ELEMENTS:
        raise ArgumentError(f"ops.rope: head_dim must be a power of two up to "
                            f"{MAX_TILE_ELEMENTS} (a program holds whole heads), got {d}")
    if tuple(positions.shape) != (seq,):
        raise ArgumentError(f"ops.rope: positions must have shape ({seq},), got "
                         f"{tuple(positions.shape)}")
    host.check_dtype("ops.rope: positions", positions, st.i32 | st.i64)
    theta = host.check_number("ops.rope: theta", theta, above=0.0)
    if inv_freq is None:
        host.not_given("ops.rope: inv_freq")
        inv_freq = inv_freq_table(d, theta, x.device)
    host.check_value("ops.rope: inv_freq", inv_freq)
    if tuple(inv_freq.shape) != (d // 2,):
        raise ArgumentError(f"ops.rope: inv_freq must have shape ({d // 2},), got "
                         f"{tuple(inv_freq.shape)}")
    host.check_dtype("ops.rope: inv_freq", inv_freq, st.f32)
    z = host.output("ops.rope: out", out, x.shape, x.dtype, x.device)
    tile = rope_tile(seq, heads, d)
    op = _ROPE(host.warps_for(tile[0] * tile[1] * tile[2]))(
        *host.inputs(x, positions, inv_freq),
        host.owned_view(z, z.shape).partition(tile))
    return host.returning(op, z)
