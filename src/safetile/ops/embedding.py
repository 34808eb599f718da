"""Embedding lookup: rows of a (vocab, dim) table gathered at device-resident token ids.

Each program owns one (1, BLOCK) piece of one output row; it reads its token id from the ids
tensor on the device (so a captured decode graph follows the sampled token) and loads that row
of the table. Reads at data-dependent rows are safe: inputs are read-only. An id outside
``[0, vocab)`` reads as a row of zeros (the load is masked), where torch would raise.
"""
from __future__ import annotations

import safetile as st

from ..errors import ArgumentError
from . import host


@st.kernel
def embedding_kernel(ids: st.In[st.i32 | st.i64, 1], table: st.In[st.floats, 2],
                     z: st.Out[st.floats, 2]):
    """z[t, :] = table[ids[t], :]."""
    t, j = z.index
    token = ids.load_scalar((t,))
    z.store(table.load((token, j), z.shape))


_EMBEDDING = host.Configured(embedding_kernel)


@host.naming_overlaps("out")
def embedding(ids, table, out=None, *, pdl: bool | None = None, trigger_early: bool = False):
    """The rows of ``table`` (vocab, dim) at ``ids`` (int32 or int64, shape (tokens,)).

    ``pdl`` (default: on Hopper and later): programmatic dependent launch, every load after
    the wait; ``trigger_early`` (with ``pdl``): the next kernel may be scheduled as soon as
    this one's programs start. Returns a ``DeviceOp`` whose output is the (tokens, dim)
    tensor in the table's dtype (``out`` when given)."""
    host.check_value("ops.embedding: ids", ids)
    host.check_value("ops.embedding: table", table)
    if ids.ndim != 1:
        raise ArgumentError(f"ops.embedding: ids must be 1-D (tokens,), got shape {ids.shape}")
    if table.ndim != 2:
        raise ArgumentError(f"ops.embedding: table must be 2-D (vocab, dim), got shape "
                         f"{table.shape}")
    host.check_dtype("ops.embedding: ids", ids, st.i32 | st.i64)
    host.check_dtype("ops.embedding: table", table, st.floats)
    if ids.device != table.device:
        raise ArgumentError(f"ops.embedding: ids on {ids.device}, table on {table.device}")
    pdl, trigger_early = host.pdl_flags("ops.embedding", pdl, trigger_early)
    shape = (ids.shape[0], table.shape[1])
    z = host.output("ops.embedding: out", out, shape, table.dtype, table.device)
    tile = (1, min(host.next_pow2(shape[1]), host.BLOCK))
    op = _EMBEDDING(host.warps_for(tile[1]), pdl, trigger_early)(
        *host.inputs(ids, table), host.owned_view(z, shape).partition(tile))
    return host.returning(op, z)
