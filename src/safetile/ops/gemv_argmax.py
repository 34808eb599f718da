"""Greedy decode's last step: the final RMSNorm, the lm_head gemv and the argmax of the logits,
in two kernels.

1. ``rmsnorm_gemv_argmax``: ``ops.rmsnorm_gemv``'s kernel (the norm recomputed by every
   program, Qwen3's rounding points) whose epilogue, besides storing its ``BN`` logits, stores
   their maximum and its global index: each program owns one logits tile and one entry of
   each of the two partial vectors (the partitions share one grid).
2. ``ops.argmax``'s second stage reduces the partials to the token id, on the device.

Ties go to the lowest index at both stages (blocks are in index order and ``sl.argmax``
picks the first maximum), as ``torch.argmax``; the maximum is taken over the logits as
stored (rounded to their dtype), so the token is ``argmax(logits)`` exactly. This replaces
``ops.rmsnorm`` + ``ops.gemv`` + ``ops.argmax``'s first stage: the logits are not read back.
"""
from __future__ import annotations

import functools

import safetile as st
import safetile.lang as sl

from ..dtypes import DType
from ..errors import ArgumentError
from ..tensor import alloc
from . import host
from .argmax import ArgmaxWorkspace, argmax_final_kernel
from .fused_gemv import (check_norm_width, check_weight, configured, normed_block,
                         rms_scale, vector)
from .gemv import IN_DTYPES, OUT_DTYPES, GemvConfig, choose_config


@functools.lru_cache(maxsize=None)
def rmsnorm_gemv_argmax_kernel(BK: int, HEAD: int):
    """logits = W @ rmsnorm(x) and each program's (max, argmax); K blocks of ``BK``."""
    @st.kernel
    def rmsnorm_gemv_argmax(x: st.In[IN_DTYPES, 1], norm_w: st.In[IN_DTYPES, 1],
                            w: st.In[IN_DTYPES, 2], logits: st.Out[OUT_DTYPES, 1],
                            values: st.Out[st.f32, 1], indices: st.Out[st.i32 | st.i64, 1],
                            eps: float, K_BLOCKS: st.Const[int], K_POW2: st.Const[int]):
        """logits[rows] = W[rows] @ (rmsnorm(x) * norm_w); values[i], indices[i] = the max of
        those logits and its index (rows past the vocabulary excluded)."""
        i = logits.index[0]
        if HEAD == 2:
            w0 = w.load((i, 0), (logits.shape[0], BK))
            w1 = w.load((i, 1), (logits.shape[0], BK))
        xs = x.load((0,), (K_POW2,))
        r = rms_scale(xs, x.shape[0], eps)
        acc = sl.zeros((logits.shape[0], BK), st.f32)
        if HEAD == 2:
            acc += w0.astype(st.f32) * normed_block(x.load((0,), (BK,)),
                                                    norm_w.load((0,), (BK,)), r)[None, :]
            acc += w1.astype(st.f32) * normed_block(x.load((1,), (BK,)),
                                                    norm_w.load((1,), (BK,)), r)[None, :]
        for k in range(HEAD, K_BLOCKS):
            wt = w.load((i, k), (logits.shape[0], BK)).astype(st.f32)
            acc += wt * normed_block(x.load((k,), (BK,)), norm_w.load((k,), (BK,)), r)[None, :]
        row = sl.sum(acc, 1).astype(xs.dtype)                 # the logits as stored
        logits.store(row)
        first = i * logits.shape[0]
        valid = first + sl.arange(logits.shape[0]) < w.shape[0]
        v = sl.where(valid, row.astype(st.f32), float("-inf"))
        values.store(sl.max(v, 0))
        indices.store(sl.argmax(v, 0) + first)

    return rmsnorm_gemv_argmax


def gemv_argmax_workspace(w, dtype: DType = st.i64, config: GemvConfig | None = None,
                          device=None) -> ArgmaxWorkspace:
    """The partials :func:`rmsnorm_gemv_argmax` needs for ``w`` (vocab, K): one (max, index)
    pair per program of ``config`` (default ``gemv.choose_config``). Allocates: make it once,
    outside any graph scope."""
    n, k = check_weight("ops.gemv_argmax_workspace", w)
    if dtype not in (st.i32, st.i64):
        raise ArgumentError(f"ops.gemv_argmax_workspace: the index dtype must be st.i32 or "
                            f"st.i64, got {dtype!r}")
    cfg = host.config("ops.gemv_argmax_workspace", config, GemvConfig, lambda: choose_config(n, k))
    blocks = -(-n // cfg.bn)
    device = w.device if device is None else device
    return ArgmaxWorkspace(alloc.empty((blocks,), dtype=st.f32, device=device),
                           alloc.empty((blocks,), dtype=dtype, device=device), cfg.bn)


_FINAL = host.Configured(argmax_final_kernel)


def rmsnorm_gemv_argmax(x, norm_weight, w, eps: float = 1e-6, logits=None, token=None,
                        workspace: ArgmaxWorkspace | None = None, *, dtype: DType = st.i64,
                        config: GemvConfig | None = None) -> st.DeviceOp:
    """Greedy decode's head: ``logits = W @ rmsnorm(x)`` (``x`` (K,), ``norm_weight`` (K,),
    ``w`` (vocab, K)) and ``token = argmax(logits)``; replaces ``ops.rmsnorm`` +
    ``ops.gemv`` + ``ops.argmax``.

    Returns a ``DeviceOp`` whose output is ``(logits, token)``: logits (vocab,) in w's dtype,
    token a (1,) tensor of ``dtype`` (int32 or int64; ``token``'s dtype when given) on the
    device. Pass ``logits``, ``token`` and ``workspace`` (:func:`gemv_argmax_workspace`) to
    allocate nothing, e.g. inside a graph scope."""
    name = "ops.rmsnorm_gemv_argmax"
    n, k = check_weight(name, w)
    if n == 0:
        raise ArgumentError(f"{name}: w has no rows (an empty vocabulary has no argmax)")
    check_norm_width(name, k)
    xv = vector(f"{name}: x", x, k)
    host.check_value(f"{name}: norm_weight", norm_weight)
    if tuple(norm_weight.shape) != (k,):
        raise ArgumentError(f"{name}: norm_weight must have shape ({k},), got "
                            f"{tuple(norm_weight.shape)}")
    host.same_dtype(name, w, x, norm_weight)
    host.check_dtype(f"{name}: w", w, IN_DTYPES)
    eps = host.check_eps(name, eps)
    if token is not None:
        host.check_target(f"{name}: token", token)
        dtype = token.dtype
    if dtype not in (st.i32, st.i64):
        what = "token's dtype" if token is not None else "dtype"
        raise ArgumentError(f"{name}: {what} must be st.i32 or st.i64 (an index), got {dtype!r}")
    cfg = host.config("ops.rmsnorm_gemv_argmax", config, GemvConfig, lambda: choose_config(n, k))
    if workspace is None:
        host.not_given(f"{name}: workspace")
    ws = gemv_argmax_workspace(w, dtype, cfg) if workspace is None else workspace
    if not isinstance(ws, ArgmaxWorkspace):
        raise ArgumentError(f"{name}: workspace must be an ArgmaxWorkspace "
                            f"(ops.gemv_argmax_workspace), got {type(ws).__name__}")
    host.check_workspace(name, ws, ("values", "indices"))
    blocks = -(-n // cfg.bn)
    if ws.block != cfg.bn or tuple(ws.values.shape) != (blocks,) or \
            tuple(ws.indices.shape) != (blocks,) or ws.indices.dtype is not dtype or \
            ws.values.dtype is not st.f32:
        raise ArgumentError(f"{name}: the workspace holds values {tuple(ws.values.shape)} "
                            f"{ws.values.dtype!r} and indices {tuple(ws.indices.shape)} "
                            f"{ws.indices.dtype!r} for programs of {ws.block} rows; {n} logits "
                            f"in programs of {cfg.bn} rows need ({blocks},) st.float32 values "
                            f"and {dtype!r} indices (ops.gemv_argmax_workspace)")
    y = host.output(f"{name}: logits", logits, (n,), w.dtype, w.device)
    z = host.output(f"{name}: token", token, (1,), dtype, w.device)
    # Two launches: the second writes ``token`` only after the first has run, through views
    # taken now (host.taken).
    ws, zv = host.taken(ws, ("values", "indices")), host.owned_view(z, (1,))
    host.check_disjoint(name, dict(x=x, norm_weight=norm_weight, w=w),
                        {"logits": y, "token": z, "workspace.values": ws.values,
                         "workspace.indices": ws.indices})
    kern = configured(name, rmsnorm_gemv_argmax_kernel(cfg.bk, cfg.head), cfg)
    stage1 = kern(*host.inputs(xv, norm_weight, w),
                  host.owned_view(y, (n,), f"{name}: logits").partition((cfg.bn,)),
                  host.owned_view(ws.values, (blocks,), f"{name}: workspace.values")
                  .partition((1,)),
                  host.owned_view(ws.indices, (blocks,), f"{name}: workspace.indices")
                  .partition((1,)), eps,
                  -(-k // cfg.bk), host.next_pow2(k))
    nb = host.next_pow2(blocks)

    def stage2(*_):
        return _FINAL(min(16, host.warps_for(nb)), cfg.pdl)(
            *host.inputs(ws.values, ws.indices), zv.partition((1,)), nb)
    return host.reserving(host.returning(stage1.then(stage2), (y, z)), name, {"token": z})
