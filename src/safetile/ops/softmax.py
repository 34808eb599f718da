"""Softmax over the rows of a 2-D tensor, computed in fp32, output in the input's dtype.

Each program owns whole rows: a (ROWS, BLOCK) tile where BLOCK is the row length rounded up to
a power of two, so no other program ever touches its rows. Two kernels share that ownership:

- rows up to ``ONE_PASS_MAX`` columns are loaded once (as examples/02_softmax.py does);
- longer rows (a vocabulary of 150k logits) are walked in ``CHUNK``-column pieces, twice: an
  online pass keeps the running max ``m`` and the sum of ``exp(x - m)`` (rescaled whenever
  ``m`` grows), and a second pass stores ``exp(x - m) / sum`` chunk by chunk as sub-tiles of
  the owned rows.

Padding columns read as -inf and contribute ``exp(-inf) = 0``.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from . import host

ONE_PASS_MAX = 8192           # columns a program holds at once
CHUNK = 4096                  # columns per step of the two-pass kernel
# A program owns whole rows: its tile is (1, a power of two >= the row length), at most one
# tile's worth of elements.
MAX_COLS = MAX_TILE_ELEMENTS


@st.kernel
def softmax_kernel(x: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    """z = softmax(x) along axis 1; each program holds its rows entirely."""
    row = x.load(z.index, z.shape, padding=float("-inf")).astype(st.f32)
    e = sl.exp(row - sl.max(row, 1)[:, None])
    z.store(e / sl.sum(e, 1)[:, None])


@st.kernel
def softmax_online_kernel(x: st.In[st.floats, 2], z: st.Out[st.floats, 2], C: st.Const[int]):
    """z = softmax(x) along axis 1 for long rows, in chunks of C columns (two passes)."""
    i = z.index[0]
    rows = z.shape[0]
    steps = sl.cdiv(x.shape[1], C)
    m = sl.full((rows,), float("-inf"), st.f32)
    total = sl.zeros((rows,), st.f32)
    for c in range(steps):
        t = x.load((i, c), (rows, C), padding=float("-inf")).astype(st.f32)
        m_new = sl.maximum(m, sl.max(t, 1))
        # While a row has seen only -inf, m and m_new are -inf: exp(m - m_new) would be NaN;
        # subtracting 0 instead keeps its total 0.
        shift = sl.where(m_new > float("-inf"), m_new, 0.0)
        total = total * sl.exp(m - shift) + sl.sum(sl.exp(t - shift[:, None]), 1)
        m = m_new
    chunks = z.partition((rows, C))
    for c in range(steps):
        t = x.load((i, c), (rows, C), padding=float("-inf")).astype(st.f32)
        chunks.store(sl.exp(t - m[:, None]) / total[:, None], (0, c))


_ONE_PASS = host.Configured(softmax_kernel)
_ONLINE = host.Configured(softmax_online_kernel)


@host.naming_overlaps("out")
def softmax(x, out=None, *, one_pass_max: int = ONE_PASS_MAX, chunk: int = CHUNK):
    """Softmax of ``x`` over its last dimension (fp32 math, output in x's dtype).

    ``x``: (..., cols) (a Shared ``x`` must be 2-D). Rows of any length up to 2^20 columns
    (``MAX_COLS``: one program owns a whole row); rows longer than 8192 use the two-pass
    chunked kernel. Returns a ``DeviceOp`` whose output is the result tensor (``out`` when
    given). ``one_pass_max`` (an int) and ``chunk`` (a power of two) choose between the
    kernels; the defaults suit the GPU."""
    host.check_value("ops.softmax: x", x)
    host.check_dtype("ops.softmax: x", x, st.floats)
    one_pass_max = host.check_int("ops.softmax: one_pass_max", one_pass_max)
    chunk = host.check_pow2("ops.softmax: chunk", chunk)
    xv = host.as_rows("ops.softmax: x", x)
    z = host.output("ops.softmax: out", out, x.shape, x.dtype, x.device)
    rows, cols = xv.shape
    if cols > MAX_COLS:
        raise ArgumentError(f"ops.softmax: rows longer than {MAX_COLS} columns are not "
                            f"supported (one program owns a whole row), got {cols}")
    zv = host.owned_view(z, xv.shape, "ops.softmax: out")
    block = host.next_pow2(cols)
    if cols <= one_pass_max:
        tile = (max(1, min(host.next_pow2(rows), host.BLOCK // block)), block)
        op = _ONE_PASS(host.warps_for(tile[0] * tile[1]))(xv, zv.partition(tile))
    else:
        op = _ONLINE(host.warps_for(chunk))(xv, zv.partition((1, block)), chunk)
    return host.returning(op, z)
