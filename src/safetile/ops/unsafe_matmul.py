"""The unsafe twin of ``ops.matmul``: the same tiling, but C is written through a raw pointer.

It exists only to measure what safety costs (benchmarks/bench_gemm.py). Each program walks
the same persistent, grouped tile sequence as the safe kernel and computes the same
``(BM, BN)`` tile with the same K loop, but it computes the tile coordinates and the element
offsets of C itself and writes them with a free-index ``sl.store_ptr``: nothing but this
code's care keeps two programs off one element. The inputs are read exactly as the safe
kernel reads them (shared ``In`` loads, tensor-descriptor loads where eligible): reads cannot
race, so making them raw too would measure a different load path, not the price of safety.
Launching it needs ``with st.unsafe():`` at the call site. No library op uses it.
"""
from __future__ import annotations

import functools

import safetile as st
import safetile.lang as sl

from . import host
from .matmul import IN_DTYPES, MatmulConfig, _dims, choose_config, num_sms


@functools.lru_cache(maxsize=None)
def _kernel(BM: int, BN: int, BK: int, GROUP: int, TRANS_B: bool):
    """The twin for one tile shape, group size and B layout (compile-time closure values)."""

    @st.kernel(unsafe=True)
    def matmul_unsafe(a: st.In[IN_DTYPES, 2], b: st.In[IN_DTYPES, 2], c: st.Ptr[st.floats],
                      m: int, n: int):
        """c[m, n] (row-major, raw) = a @ b: the safe kernel's tile walk, written by hand."""
        gm = sl.cdiv(m, BM)
        gn = sl.cdiv(n, BN)
        for s in range(sl.bid(0), gm * gn, sl.num_blocks(0)):
            width = GROUP * gn
            first = (s // width) * GROUP
            size = min(gm - first, GROUP)
            i = first + (s % width) % size
            j = (s % width) // size
            acc = sl.zeros((BM, BN), st.f32)
            for k in range(sl.cdiv(a.shape[1], BK)):
                if TRANS_B:
                    bt = b.load((j, k), (BN, BK)).T
                else:
                    bt = b.load((k, j), (BK, BN))
                acc = sl.mma(a.load((i, k), (BM, BK)), bt, acc)
            rows = i * BM + sl.arange(BM)
            cols = j * BN + sl.arange(BN)
            mask = (rows[:, None] < m) & (cols[None, :] < n)
            sl.store_ptr(c, rows[:, None] * n + cols[None, :], acc, mask=mask)

    return matmul_unsafe


def matmul_unsafe(a, b, out=None, *, weight: bool = False, out_dtype=None,
                  config: MatmulConfig | None = None) -> st.DeviceOp:
    """``a @ b`` (``a @ b.T`` when ``weight``) through the unsafe twin, unsplit.

    Call it inside ``with st.unsafe():``. ``config`` is the safe op's config (its tile shape,
    group size and launch options; ``split_k`` is ignored). Returns a ``DeviceOp`` whose
    output is the result tensor.
    """
    m, n, k = _dims(a, b, weight)
    out_dtype = out_dtype or (out.dtype if out is not None else a.dtype)
    device = a.device
    sms = num_sms(device if device.type == "cuda" else None)
    cfg = config or choose_config(m, n, k, a.dtype, out_dtype, sms)
    c = host.output("ops.matmul_unsafe: out", out, (m, n), out_dtype, device)
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn)
    kern = _kernel(cfg.bm, cfg.bn, cfg.bk, cfg.group_size, weight).options(
        grid=(min(sms, tiles),), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        flatten=cfg.flatten, warp_specialize=cfg.warp_specialize)
    return host.returning(kern(a, b, c.view(m, n), m, n), c)
