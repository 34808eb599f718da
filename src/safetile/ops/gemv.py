"""Matrix-vector product ``y = W x`` for batch-1 decode: bandwidth-bound, fp32 accumulation.

``W`` is an ``(N, K)`` weight (nn.Linear layout), ``x`` a ``(K,)`` vector. Each program owns
``BN`` consecutive outputs and streams its ``BN`` rows of ``W`` in ``(BN, BK)`` blocks (wide,
coalesced loads; tensor-descriptor loads where the layout allows), multiplying by the matching
slice of ``x`` into a ``(BN, BK)`` fp32 accumulator that is reduced across ``K`` once at the
end. The work is all in streaming ``W`` once: the time floor is ``N * K * 2`` bytes over
the memory bandwidth, so the config keeps enough programs resident on every SM (small ``BN``
for small ``N``) and enough bytes in flight per program (``BK`` and pipeline stages).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host

IN_DTYPES = st.bf16 | st.f16 | st.f32
OUT_DTYPES = st.bf16 | st.f16 | st.f32


@dataclass(frozen=True)
class GemvConfig:
    """Rows per program ``bn``, K block ``bk``, warps, and the K loop's pipeline depth;
    ``pdl``: programmatic dependent launch (scheduled during the previous kernel's tail,
    waiting for it on the device; see ``Kernel.options``); ``prefetch``: how many of the
    program's first ``(bn, bk)`` blocks of ``W`` it prefetches into L2 before that wait, so
    its weight stream starts while the previous kernel still runs (with ``pdl`` off they are
    only issued at the program's start)."""

    bn: int
    bk: int
    num_warps: int
    num_stages: int
    tma: bool = True
    pdl: bool = False
    prefetch: int = 0


def _pdl_default() -> bool:
    """Programmatic dependent launch needs Hopper or later (``griddepcontrol``)."""
    import torch
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def choose_config(n: int, k: int, sms: int = 132, pdl: bool | None = None) -> GemvConfig:
    """Rows per program so that the launch has several programs per SM: with every program
    resident at once, the HBM stream is shared evenly and no wave is left half empty.
    (512-wide K blocks through a 4-deep cp.async pipeline measured best on the H200, with
    4-row programs for N = 2560 and 8-16 rows for larger N; 6 stages, 1024-wide blocks and
    2-row programs were slower everywhere, results/gemv_sweep1.json.)

    ``pdl`` (default: on Hopper and later) launches with programmatic dependent launch: in a
    graph of back-to-back gemvs (results/gemv.json, H200, 2026-11-30) it took 0.1-0.6 us off
    each, the most on the shortest (o: 8.09 -> 7.49 us).

    ``prefetch`` stays 0: prefetching the first 2 W blocks into L2 before the pdl wait took
    -0.2 (qkv) to +1.0 us (down) per gemv in that stream, and the whole slab +2.4 to +11 us
    (results/gemv_prefetch.json, H200, 2026-11-30): the early bytes compete with the previous
    gemv's own stream rather than filling an idle gap."""
    bn = 16
    while bn > 4 and n // bn < 3 * sms:
        bn //= 2
    return GemvConfig(bn, 512, 4, 4, tma=False, pdl=_pdl_default() if pdl is None else pdl)


@functools.lru_cache(maxsize=None)
def _kernel(BK: int, PREFETCH: int = 0):
    """The gemv kernel for K block ``BK`` that prefetches its first ``PREFETCH`` blocks of
    ``W`` (compile-time constants of the body)."""

    @st.kernel
    def gemv_rows(w: st.In[IN_DTYPES, 2], x: st.In[IN_DTYPES, 1], y: st.Out[OUT_DTYPES, 1]):
        """y[i*BN : (i+1)*BN] = W[rows] @ x, accumulated in fp32."""
        i = y.index[0]
        # W is an In: nothing this launch can observe depends on when it reaches L2, so
        # these hints go before the programmatic-launch wait (blocks past K are masked off).
        for p in range(PREFETCH):
            w.prefetch((i, p), (y.shape[0], BK))
        acc = sl.zeros((y.shape[0], BK), st.f32)
        for k in range(sl.cdiv(w.shape[1], BK)):
            wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
            xt = x.load((k,), (BK,)).astype(st.f32)
            acc += wt * xt[None, :]
        y.store(sl.sum(acc, 1))

    return gemv_rows


def gemv(w, x, out=None, *, out_dtype=None, config: GemvConfig | None = None) -> st.DeviceOp:
    """``W @ x`` for a weight ``w`` ``(N, K)`` and a vector ``x`` ``(K,)`` (or ``(1, K)``).

    Returns a ``DeviceOp`` whose output is ``y`` of shape ``(N,)`` (``(1, N)`` for a row
    ``x``), in ``out_dtype`` (default: ``w``'s dtype); ``out`` writes a preallocated result.
    """
    host.check_value("ops.gemv: w", w)
    host.check_value("ops.gemv: x", x)
    if w.ndim != 2:
        raise ArgumentError(f"ops.gemv: w must be an (N, K) matrix, got shape {w.shape}")
    n, k = w.shape
    row = x.ndim == 2
    if tuple(x.shape) not in ((k,), (1, k)):
        raise ArgumentError(f"ops.gemv: x must have shape ({k},) or (1, {k}) for w {w.shape}, got "
                         f"{x.shape}")
    host.same_dtype("ops.gemv", w, x)
    if row:
        if not hasattr(x, "view"):
            raise ArgumentError("ops.gemv: a Shared x must be 1-D (K,)")
        x = x.view(k)
    out_dtype = out_dtype or (out.dtype if out is not None else w.dtype)
    y = host.output("ops.gemv: out", out, (1, n) if row else (n,), out_dtype, w.device)
    cfg = config or choose_config(n, k)
    kern = _kernel(cfg.bk, cfg.prefetch).options(num_warps=cfg.num_warps, loop_stages=cfg.num_stages,
                                   tma=cfg.tma, pdl=cfg.pdl)
    return host.returning(kern(w, x, y.view(n).partition((cfg.bn,))), y)
