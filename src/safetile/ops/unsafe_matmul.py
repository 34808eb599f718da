"""The unsafe twin of ``ops.matmul``: the same launches, but C is written through a raw pointer.

It exists only to measure what safety costs (benchmarks/bench_gemm.py). The twin runs the
safe op's :class:`~safetile.ops.matmul.MatmulConfig` through the same host code
(:func:`~safetile.ops.matmul.build_product`): the same tile shapes, grouped order,
persistent program count, warps, stages, loop hints and programmatic dependent launch, the
same head/tail row split, and for split-K the same workspace and the same safe reduction
kernel. Only the store differs: each program computes its tile coordinates (the grouped walk
the safe kernel's ``tiles()`` loop compiles to) and the element offsets of C (or of the
partials) itself and writes them with a free-index ``sl.store_ptr``, so nothing but this
code's care keeps two programs off one element. The inputs are read exactly as the safe
kernels read them (shared ``In`` loads, tensor-descriptor loads where eligible): reads cannot
race, so making them raw too would measure a different load path, not the price of safety.
Launching it needs ``with st.unsafe():`` at the call site. No library op uses it.
"""
from __future__ import annotations

import functools

import safetile as st
import safetile.lang as sl

from .matmul import IN_DTYPES, MatmulConfig, _cdiv, _configured, build_product


@st.function
def grouped_tile(t, gm, gn, group):
    """Tile (i, j) of sequence position t in the grouped order of a (gm, gn) tile grid: the
    walk a grouped partition's ``tiles()`` loop compiles to (``ProgramOrder.tile_coords``)."""
    width = group * gn
    first = (t // width) * group
    size = min(gm - first, group)
    return first + (t % width) % size, (t % width) // size


@functools.lru_cache(maxsize=None)
def _kernels(BM: int, BN: int, BK: int, GROUP: int, TRANS_B: bool):
    """The twins of ``matmul_tiles`` and ``matmul_partial`` for one tile shape, group size
    and B layout (compile-time closure values, as the safe kernels' tile shape is)."""

    @st.kernel(unsafe=True)
    def matmul_tiles_raw(a: st.In[IN_DTYPES, 2], b: st.In[IN_DTYPES, 2], c: st.Ptr[st.floats],
                         m: int, n: int, r0: int):
        """c (m x n, row-major, raw) = a[r0 * BM:] @ b: the safe kernel's tile walk, by hand."""
        gm = sl.cdiv(m, BM)
        gn = sl.cdiv(n, BN)
        for t in range(sl.bid(0), gm * gn, sl.num_blocks(0)):
            i, j = grouped_tile(t, gm, gn, GROUP)
            acc = sl.zeros((BM, BN), st.f32)
            for k in range(sl.cdiv(a.shape[1], BK)):
                if TRANS_B:
                    bt = b.load((j, k), (BN, BK)).T
                else:
                    bt = b.load((k, j), (BK, BN))
                acc = sl.mma(a.load((i + r0, k), (BM, BK)), bt, acc)
            rows = i * BM + sl.arange(BM)
            cols = j * BN + sl.arange(BN)
            mask = (rows[:, None] < m) & (cols[None, :] < n)
            sl.store_ptr(c, rows[:, None] * n + cols[None, :], acc, mask=mask)

    @st.kernel(unsafe=True)
    def matmul_partial_raw(a: st.In[IN_DTYPES, 2], b: st.In[IN_DTYPES, 2], p: st.Ptr[st.f32],
                           rows_p: int, n: int, kb: int):
        """Split-K partials into the raw workspace p (rows_p x n): tile (s * gm + i, j) holds
        a[i] @ b[:, j] over K-steps [s * kb, (s + 1) * kb), as ``matmul_partial`` does."""
        gs = sl.cdiv(rows_p, BM)
        gn = sl.cdiv(n, BN)
        gm = sl.cdiv(a.shape[0], BM)
        for t in range(sl.bid(0), gs * gn, sl.num_blocks(0)):
            si, j = grouped_tile(t, gs, gn, GROUP)
            s = si // gm
            i = si - s * gm
            acc = sl.zeros((BM, BN), st.f32)
            for k in range(s * kb, min(s * kb + kb, sl.cdiv(a.shape[1], BK))):
                if TRANS_B:
                    bt = b.load((j, k), (BN, BK)).T
                else:
                    bt = b.load((k, j), (BK, BN))
                acc = sl.mma(a.load((i, k), (BM, BK)), bt, acc)
            rows = si * BM + sl.arange(BM)
            cols = j * BN + sl.arange(BN)
            mask = (rows[:, None] < rows_p) & (cols[None, :] < n)
            sl.store_ptr(p, rows[:, None] * n + cols[None, :], acc, mask=mask)

    return matmul_tiles_raw, matmul_partial_raw


class RawStores:
    """The twin's writer for :func:`build_product`: raw views of C / the workspace, stored
    at offsets the kernel computes. The program count is the safe partition's
    (``min(persistent, tiles)``), given as an explicit grid since no partition sets it."""

    name = "ops.matmul_unsafe"

    def _launch(self, which, cfg, weight, sms, a, b, view, last):
        rows, n = view.shape
        programs = min(sms, _cdiv(rows, cfg.bm) * _cdiv(n, cfg.bn))
        kern = _kernels(cfg.bm, cfg.bn, cfg.bk, cfg.group_size, weight)[which]
        return _configured(kern, cfg).options(grid=(programs,))(a, b, view, rows, n, last)

    def tiles(self, cfg, weight, sms, a, b, rows, r0):
        return self._launch(0, cfg, weight, sms, a, b, rows, r0)

    def partials(self, cfg, weight, sms, a, b, ws, kb):
        return self._launch(1, cfg, weight, sms, a, b, ws, kb)

    def written(self, handle):
        return handle


RAW = RawStores()


def matmul_unsafe(a, b, out=None, *, weight: bool = False, out_dtype=None,
                  config: MatmulConfig | None = None, workspace=None) -> st.DeviceOp:
    """``a @ b`` (``a @ b.T`` when ``weight``) through the unsafe twin, with the safe op's
    config (``config`` or :func:`~safetile.ops.matmul.choose_config`) and the same
    arguments as :func:`~safetile.ops.matmul.matmul`.

    Call it inside ``with st.unsafe():``. Returns a ``DeviceOp`` whose output is the result
    tensor. ``tma_store`` in the config has no effect here: the twin's stores are raw.
    """
    return build_product(a, b, out, weight, out_dtype, config, workspace, RAW)
