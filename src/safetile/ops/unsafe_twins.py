"""The unsafe twin of ``ops.add``: raw pointers and free-index stores, identical tiling.

It exists only to measure what safety costs (benchmarks/bench_elementwise.py): program ``p``
computes the same ``BLOCK`` elements ``[p*BLOCK, (p+1)*BLOCK)`` as the safe kernel's owned
tile, but it computes its offsets itself and stores through a raw pointer, so nothing but this
code's care keeps two programs off one element. Launching it needs ``with st.unsafe():`` at
the call site. No library op uses it.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host


@st.kernel(unsafe=True)
def add_unsafe_kernel(x: st.Ptr[st.floats], y: st.Ptr[st.floats], z: st.Ptr[st.floats],
                      n: int, BLOCK: st.Const[int]):
    """z[i] = x[i] + y[i] for the BLOCK offsets this program picks itself."""
    offsets = sl.bid(0) * BLOCK + sl.arange(BLOCK)
    mask = offsets < n
    a = sl.load_ptr(x, offsets, mask=mask)
    b = sl.load_ptr(y, offsets, mask=mask)
    sl.store_ptr(z, offsets, a + b, mask=mask)


def add_unsafe(x, y, out=None, *, block: int = host.BLOCK, num_warps: int | None = None):
    """``x + y`` through :func:`add_unsafe_kernel` (contiguous tensors of one shape and dtype).

    Call it inside ``with st.unsafe():``. Returns a ``DeviceOp`` whose output is the result."""
    dtype = host.same_dtype("ops.add_unsafe", x, y)
    z = host.output("ops.add_unsafe: out", out, x.shape, dtype, x.device)
    if tuple(y.shape) != tuple(x.shape):
        raise ArgumentError(f"ops.add_unsafe: shapes {tuple(x.shape)} and {tuple(y.shape)} differ")
    n = x.numel
    grid = (max(1, -(-n // block)),)
    warps = host.warps_for(block) if num_warps is None else \
        host.check_pow2("ops.add_unsafe: num_warps", num_warps, 1, 32)
    kernel = add_unsafe_kernel.options(grid=grid, num_warps=warps)
    op = kernel(x.view(-1), y.view(-1), z.view(-1), n, block)
    return host.returning(op, z)
