"""``l2_prefetch``: pull a weight's leading rows into the GPU's L2 cache ahead of its reader.

At batch 1 a decode step alternates between kernels that stream weights at the memory
bandwidth and short ones (the attention and its prologue) that leave the memory idle. A
prefetch launched before the short ones fills that idle time with the next projection's
weight, which that projection then reads from L2.

The kernel issues ``x.prefetch`` hints of an In view, which deliver no value, so it cannot
change any result; under programmatic dependent launch they go before the wait
(``Kernel.options``). Program ``i`` prefetches rows ``i*ROWS`` to ``(i+1)*ROWS - 1`` in
``COLS``-wide blocks (lanes outside the weight are predicated off) and writes its first row
to its element of a small ``receipt``, the Out partition that sets the grid.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..tensor import Tensor
from . import host

#: Programs the rows are spread over, at least (enough to issue from every SM of an H200).
PROGRAMS = 256
#: Elements of one prefetched block along a row.
BLOCK_COLS = 1024


@st.kernel
def l2_prefetch_kernel(w: st.In[st.floats, 2], receipt: st.Out[st.i32, 1],
                       ROWS: st.Const[int], COLS: st.Const[int], K_BLOCKS: st.Const[int]):
    """L2 prefetch of rows ``i*ROWS ..`` of ``w`` in ``K_BLOCKS`` blocks of ``COLS``, for
    program ``i``; receipt[i] = i * ROWS."""
    i = receipt.index[0]
    for k in range(K_BLOCKS):
        w.prefetch((i, k), (ROWS, COLS))
    receipt.store(sl.full((1,), i * ROWS, st.i32))


_CONFIGURED: dict = {}


def _kernel(pdl: bool, trigger_early: bool):
    key = (pdl, trigger_early)
    k = _CONFIGURED.get(key)
    if k is None:
        k = _CONFIGURED[key] = l2_prefetch_kernel.options(
            num_warps=4, pdl=pdl, trigger_early=pdl and trigger_early)
    return k


def _plan(name: str, w, rows) -> tuple[int, int, int]:
    """(rows per program, programs, block columns) for the first ``rows`` rows of ``w``."""
    host.check_value(f"{name}: w", w)
    if w.ndim != 2:
        raise ArgumentError(f"{name}: w must be a 2-D (rows, cols) weight, got shape {w.shape}")
    n = w.shape[0]
    rows = n if rows is None else rows
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= n:
        raise ArgumentError(f"{name}: rows must be an int from 1 to {n} (w's rows), got "
                            f"{rows!r}")
    per_program = host.next_pow2(-(-rows // PROGRAMS))
    return per_program, -(-rows // per_program), min(BLOCK_COLS, host.next_pow2(w.shape[1]))


def l2_prefetch_receipt(w, rows: int | None = None) -> Tensor:
    """A receipt buffer for ``l2_prefetch(w, rows, receipt=...)`` (to record it in a graph)."""
    _, programs, _ = _plan("ops.l2_prefetch_receipt", w, rows)
    return host.output("ops.l2_prefetch_receipt", None, (programs,), st.i32, w.device)


def l2_prefetch(w, rows: int | None = None, *, receipt=None, pdl: bool | None = None,
                trigger_early: bool = False):
    """Prefetch the first ``rows`` rows (default: all) of the 2-D weight ``w`` into L2.

    It changes no value, only where the next reads of ``w`` find it. Returns a ``DeviceOp``
    whose output is the receipt, ``(programs,)`` int32 holding each program's first row
    (``receipt``: a preallocated one, from :func:`l2_prefetch_receipt`). ``pdl`` (default:
    on Hopper and later) lets it be scheduled while the previous kernel drains;
    ``trigger_early`` lets the next PDL kernel be scheduled as its programs start."""
    per_program, programs, cols = _plan("ops.l2_prefetch", w, rows)
    out = host.output("ops.l2_prefetch: receipt", receipt, (programs,), st.i32, w.device)
    pdl = host.pdl_available() if pdl is None else bool(pdl)
    op = _kernel(pdl, trigger_early)(host.borrow(w), host.owned_view(out, (programs,)).partition((1,)),
                                     per_program, cols, -(-w.shape[1] // cols))
    return host.returning(op, out)
