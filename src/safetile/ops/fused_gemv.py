"""Decode's gemvs with their neighbours fused in: the RMSNorm before, the residual add after,
SwiGLU's ``silu(gate) * up`` before the down projection.

Each is ``ops.gemv``'s kernel (same tiling, K loop, pipelining, early weight loads under
programmatic dependent launch; see ``gemv.py``) with a prologue or an epilogue, so a decode
layer runs four kernels where the unfused chain runs nine:

- ``rmsnorm_gemv``: ``W @ rmsnorm(x)``. Every program recomputes the norm's scale from the
  whole of ``x`` (a few KB, read from L2, next to its ``BN * K * 2`` bytes of weights), then
  normalizes each K block of ``x`` as it multiplies it, with Hugging Face Qwen3's rounding
  points (normalized value rounded to x's dtype, times the weight, rounded again): the
  vector it multiplies is exactly what ``ops.rmsnorm`` stores.
- ``gemv_add``: ``W @ x + residual``: the product rounded to the output dtype, then added and
  rounded again, as ``ops.gemv`` followed by ``ops.add``.
- ``silu_mul_gemv_add``: ``W @ silu_mul(gate, up) + residual``, ``gate_up`` the gate/up
  projection's output (gate first): each K block of the activation is computed as
  ``ops.silu_mul`` computes it (fp32, rounded once) from the two halves, read as (1, BK)
  blocks of a (2, K) view, or, for K >= ``FLAT_MIN_K``, as 1-D blocks of the (2K,) vector
  (the form that streams each size faster; benchmarks/TUNING.md, "Decode-step fusion").

The W blocks loaded before the PDL wait are the same as ``ops.gemv``'s; everything the
previous kernel may write (``x``, ``gate_up``, ``residual``) is read after it.
"""
from __future__ import annotations

import functools

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from . import host
from .gemv import IN_DTYPES, OUT_DTYPES, GemvConfig, choose_config

# From this K up, silu_mul_gemv_add reads gate_up as 1-D blocks of the (2K,) vector; below,
# as (1, BK) blocks of a (2, K) view: the rows form streams Qwen3-4B's down projection
# (K 9728) faster, the flat form Qwen3-32B's (K 25600) (TUNING.md, "Decode-step fusion").
FLAT_MIN_K = 16384


@st.function
def normed_block(xt, nw, r):
    """One K block of Qwen3's RMSNorm (scale ``r``, weight block ``nw``), as fp32."""
    xn = (xt.astype(st.f32) * r).astype(xt.dtype)          # HF rounds before the weight
    return (xn.astype(st.f32) * nw.astype(st.f32)).astype(xt.dtype).astype(st.f32)


@st.function
def rms_scale(xt, n, eps):
    """``rsqrt(mean(x^2) + eps)`` of a vector tile ``xt`` holding ``n`` values (padding 0)."""
    xf = xt.astype(st.f32)
    return sl.rsqrt(sl.sum(xf * xf, 0) / n + eps)


@st.function
def silu_mul_block(g, u):
    """``silu(g) * u`` in fp32, rounded once to g's dtype (as ``ops.silu_mul``), as fp32."""
    gf = g.astype(st.f32)
    return (gf * sl.sigmoid(gf) * u.astype(st.f32)).astype(g.dtype).astype(st.f32)


@st.function
def plus_residual(acc, rt):
    """The gemv rows ``sum(acc, 1)`` rounded to the residual's dtype, plus the residual."""
    return sl.sum(acc, 1).astype(rt.dtype).astype(st.f32) + rt.astype(st.f32)


@functools.lru_cache(maxsize=None)
def rmsnorm_gemv_kernel(BK: int, HEAD: int):
    """y = W @ rmsnorm(x) with K blocks of ``BK``; the first ``HEAD`` (0 or 2) loaded ahead."""
    @st.kernel
    def rmsnorm_gemv(x: st.In[IN_DTYPES, 1], norm_w: st.In[IN_DTYPES, 1],
                     w: st.In[IN_DTYPES, 2], y: st.Out[OUT_DTYPES, 1], eps: float,
                     K_BLOCKS: st.Const[int], K_POW2: st.Const[int]):
        """y[rows] = W[rows] @ (rmsnorm(x) * norm_w), ``K_POW2`` >= K a power of two."""
        i = y.index[0]
        if HEAD == 2:
            w0 = w.load((i, 0), (y.shape[0], BK))
            w1 = w.load((i, 1), (y.shape[0], BK))
        r = rms_scale(x.load((0,), (K_POW2,)), x.shape[0], eps)
        acc = sl.zeros((y.shape[0], BK), st.f32)
        if HEAD == 2:
            acc += w0.astype(st.f32) * normed_block(x.load((0,), (BK,)),
                                                    norm_w.load((0,), (BK,)), r)[None, :]
            acc += w1.astype(st.f32) * normed_block(x.load((1,), (BK,)),
                                                    norm_w.load((1,), (BK,)), r)[None, :]
        for k in range(HEAD, K_BLOCKS):
            wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
            acc += wt * normed_block(x.load((k,), (BK,)), norm_w.load((k,), (BK,)), r)[None, :]
        y.store(sl.sum(acc, 1))

    return rmsnorm_gemv


@functools.lru_cache(maxsize=None)
def gemv_add_kernel(BK: int, HEAD: int):
    """y = W @ x + residual with K blocks of ``BK``; the first ``HEAD`` loaded ahead."""
    @st.kernel
    def gemv_add(w: st.In[IN_DTYPES, 2], x: st.In[IN_DTYPES, 1],
                 residual: st.In[OUT_DTYPES, 1], y: st.Out[OUT_DTYPES, 1],
                 K_BLOCKS: st.Const[int]):
        """y[rows] = round(W[rows] @ x) + residual[rows]."""
        i = y.index[0]
        if HEAD == 2:
            w0 = w.load((i, 0), (y.shape[0], BK))
            w1 = w.load((i, 1), (y.shape[0], BK))
        acc = sl.zeros((y.shape[0], BK), st.f32)
        if HEAD == 2:
            acc += w0.astype(st.f32) * x.load((0,), (BK,)).astype(st.f32)[None, :]
            acc += w1.astype(st.f32) * x.load((1,), (BK,)).astype(st.f32)[None, :]
        for k in range(HEAD, K_BLOCKS):
            wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
            acc += wt * x.load((k,), (BK,)).astype(st.f32)[None, :]
        y.store(plus_residual(acc, residual.load((i,), (y.shape[0],))))

    return gemv_add


@functools.lru_cache(maxsize=None)
def silu_mul_gemv_add_kernel(BK: int, HEAD: int, FLAT: bool = False):
    """y = W @ silu_mul(gate, up) + residual with K blocks of ``BK``; ``HEAD`` ahead.
    ``FLAT``: gate_up is read as one (2K,) vector in 1-D blocks, else as (2, K) rows in
    (1, BK) blocks (``FLAT_MIN_K`` says when each is used)."""
    if FLAT:
        @st.kernel
        def silu_mul_gemv_add_flat(w: st.In[IN_DTYPES, 2], gate_up: st.In[IN_DTYPES, 1],
                                   residual: st.In[OUT_DTYPES, 1], y: st.Out[OUT_DTYPES, 1],
                                   K_BLOCKS: st.Const[int]):
            """y[rows] = round(W[rows] @ silu_mul(gate_up[:K], gate_up[K:])) + residual[rows];
            gate blocks past K read as 0."""
            i = y.index[0]
            if HEAD == 2:
                w0 = w.load((i, 0), (y.shape[0], BK))
                w1 = w.load((i, 1), (y.shape[0], BK))
            K = w.shape[1]
            acc = sl.zeros((y.shape[0], BK), st.f32)
            if HEAD == 2:
                g0 = sl.where(sl.arange(BK) < K, gate_up.load_at((0,), (BK,)), 0.0)
                g1 = sl.where(BK + sl.arange(BK) < K, gate_up.load_at((BK,), (BK,)), 0.0)
                acc += w0.astype(st.f32) * silu_mul_block(
                    g0, gate_up.load_at((K,), (BK,)))[None, :]
                acc += w1.astype(st.f32) * silu_mul_block(
                    g1, gate_up.load_at((K + BK,), (BK,)))[None, :]
            for k in range(HEAD, K_BLOCKS):
                wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
                valid = k * BK + sl.arange(BK) < K
                g = sl.where(valid, gate_up.load_at((k * BK,), (BK,)), 0.0)
                acc += wt * silu_mul_block(g, gate_up.load_at((K + k * BK,), (BK,)))[None, :]
            y.store(plus_residual(acc, residual.load((i,), (y.shape[0],))))

        return silu_mul_gemv_add_flat

    @st.kernel
    def silu_mul_gemv_add(w: st.In[IN_DTYPES, 2], gate_up: st.In[IN_DTYPES, 2],
                          residual: st.In[OUT_DTYPES, 1], y: st.Out[OUT_DTYPES, 1],
                          K_BLOCKS: st.Const[int]):
        """y[rows] = round(W[rows] @ silu_mul(gate_up[0], gate_up[1])) + residual[rows]."""
        i = y.index[0]
        if HEAD == 2:
            w0 = w.load((i, 0), (y.shape[0], BK))
            w1 = w.load((i, 1), (y.shape[0], BK))
        acc = sl.zeros((y.shape[0], BK), st.f32)
        if HEAD == 2:
            acc += w0.astype(st.f32) * silu_mul_block(gate_up.load((0, 0), (1, BK)),
                                                      gate_up.load((1, 0), (1, BK)))
            acc += w1.astype(st.f32) * silu_mul_block(gate_up.load((0, 1), (1, BK)),
                                                      gate_up.load((1, 1), (1, BK)))
        for k in range(HEAD, K_BLOCKS):
            wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
            acc += wt * silu_mul_block(gate_up.load((0, k), (1, BK)),
                                       gate_up.load((1, k), (1, BK)))
        y.store(plus_residual(acc, residual.load((i,), (y.shape[0],))))

    return silu_mul_gemv_add


def configured(name: str, kernel, cfg: GemvConfig):
    """``kernel`` with ``cfg``'s launch options (as ``ops.gemv`` launches its kernel); ``name``
    (``"ops.gemv_add"``) names the op in errors."""
    if cfg.head not in (0, 2):
        raise ArgumentError(f"{name}: config.head must be 0 or 2 K blocks loaded ahead of the "
                            f"loop, got {cfg.head}")
    if cfg.prefetch:
        raise ArgumentError(f"{name}: config.prefetch is not supported (early weight loads "
                            f"replace it); use prefetch=0")
    early = ("w",) if cfg.pdl and cfg.early and cfg.head else ()
    return kernel.options(num_warps=cfg.num_warps, loop_stages=cfg.num_stages, tma=cfg.tma,
                          pdl=cfg.pdl, early=early, trigger_early=cfg.pdl and cfg.trigger_early)


def check_weight(name: str, w):
    """``w`` as an (N, K) weight: returns (N, K)."""
    host.check_value(f"{name}: w", w)
    if w.ndim != 2:
        raise ArgumentError(f"{name}: w must be an (N, K) matrix, got shape {tuple(w.shape)}")
    return tuple(w.shape)


def check_norm_width(name: str, k: int) -> None:
    """A fused RMSNorm holds all of x (K,) in one tile, for its mean square, in every
    program: K is at most ``MAX_TILE_ELEMENTS``, and at least 1 (the mean of no squares
    would be 0 / 0, and every product NaN)."""
    if not k:
        raise ArgumentError(f"{name}: x is empty (K = 0: w has no columns); the RMSNorm of "
                            f"no values is undefined")
    if host.next_pow2(k) > MAX_TILE_ELEMENTS:
        raise ArgumentError(f"{name}: x of {k} elements is longer than one tile holds "
                            f"({MAX_TILE_ELEMENTS}; the fused RMSNorm reads all of x in every "
                            f"program); use ops.rmsnorm, then ops.gemv")


def vector(name: str, v, k: int):
    """``v`` of shape (k,) or (1, k) as a 1-D view the kernel reads."""
    host.check_value(name, v)
    if tuple(v.shape) not in ((k,), (1, k)):
        raise ArgumentError(f"{name} must have shape ({k},) or (1, {k}), got {tuple(v.shape)}")
    if v.ndim == 1:
        return host.borrow(v)
    if not hasattr(v, "view"):
        raise ArgumentError(f"{name}: a Shared input must be 1-D ({k},)")
    return v.view(k)


def result(name: str, out, n: int, dtype, device):
    """The (n,) output (``out`` checked, else allocated) and the view the kernel partitions."""
    y = host.output(f"{name}: out", out, (n,), dtype, device)
    return y, host.owned_view(y, (n,))


@host.naming_overlaps("out")
def rmsnorm_gemv(x, norm_weight, w, eps: float = 1e-6, out=None, *,
                 config: GemvConfig | None = None) -> st.DeviceOp:
    """``W @ rmsnorm(x)``: Qwen3's RMSNorm of ``x`` (K,) with ``norm_weight`` (K,), then the
    gemv with ``w`` (N, K); replaces ``ops.rmsnorm`` + ``ops.gemv`` (and computes exactly
    what that chain computes).

    Returns a ``DeviceOp`` whose output is ``y`` (N,) in w's dtype (``out`` when given);
    ``config`` as ``ops.gemv``'s (default: ``gemv.choose_config(N, K)``)."""
    n, k = check_weight("ops.rmsnorm_gemv", w)
    check_norm_width("ops.rmsnorm_gemv", k)
    xv = vector("ops.rmsnorm_gemv: x", x, k)
    host.check_value("ops.rmsnorm_gemv: norm_weight", norm_weight)
    if tuple(norm_weight.shape) != (k,):
        raise ArgumentError(f"ops.rmsnorm_gemv: norm_weight must have shape ({k},), got "
                            f"{tuple(norm_weight.shape)}")
    host.same_dtype("ops.rmsnorm_gemv", w, x, norm_weight)
    host.check_dtype("ops.rmsnorm_gemv: w", w, IN_DTYPES)
    eps = host.check_eps("ops.rmsnorm_gemv", eps)
    y, yv = result("ops.rmsnorm_gemv", out, n, w.dtype, w.device)
    cfg = host.config("ops.rmsnorm_gemv", config, GemvConfig, lambda: choose_config(n, k))
    kern = configured("ops.rmsnorm_gemv", rmsnorm_gemv_kernel(cfg.bk, cfg.head), cfg)
    op = kern(*host.inputs(xv, norm_weight, w), yv.partition((cfg.bn,)), eps,
              -(-k // cfg.bk), host.next_pow2(k))
    return host.returning(op, y)


def _residual(name: str, residual, n: int):
    host.check_value(f"{name}: residual", residual)
    if tuple(residual.shape) != (n,):
        raise ArgumentError(f"{name}: residual must have shape ({n},), got "
                            f"{tuple(residual.shape)}")
    host.check_dtype(f"{name}: residual", residual, OUT_DTYPES)
    return host.borrow(residual)


@host.naming_overlaps("out")
def gemv_add(w, x, residual, out=None, *, config: GemvConfig | None = None) -> st.DeviceOp:
    """``W @ x + residual`` for ``w`` (N, K), ``x`` (K,), ``residual`` (N,): the product
    rounded to the residual's dtype, then the sum; replaces ``ops.gemv`` + ``ops.add``.

    Returns a ``DeviceOp`` whose output is ``y`` (N,) in the residual's dtype (``out`` when
    given; it cannot be the residual: alternate two buffers)."""
    n, k = check_weight("ops.gemv_add", w)
    xv = vector("ops.gemv_add: x", x, k)
    host.same_dtype("ops.gemv_add", w, x)
    host.check_dtype("ops.gemv_add: w", w, IN_DTYPES)
    rv = _residual("ops.gemv_add", residual, n)
    y, yv = result("ops.gemv_add", out, n, residual.dtype, w.device)
    cfg = host.config("ops.gemv_add", config, GemvConfig, lambda: choose_config(n, k))
    kern = configured("ops.gemv_add", gemv_add_kernel(cfg.bk, cfg.head), cfg)
    op = kern(*host.inputs(w, xv, rv), yv.partition((cfg.bn,)), -(-k // cfg.bk))
    return host.returning(op, y)


@host.naming_overlaps("out")
def silu_mul_gemv_add(w, gate_up, residual, out=None, *,
                      config: GemvConfig | None = None) -> st.DeviceOp:
    """``W @ silu_mul(gate, up) + residual`` for ``w`` (N, K) and ``gate_up`` (2K,) (gate
    first, up second: the fused gate/up projection's output; also a contiguous (2, K));
    replaces
    ``ops.silu_mul`` + ``ops.gemv`` + ``ops.add``.

    Returns a ``DeviceOp`` whose output is ``y`` (N,) in the residual's dtype (``out`` when
    given); ``config`` defaults to ``gemv.choose_config(N, K, swiglu=True)``."""
    n, k = check_weight("ops.silu_mul_gemv_add", w)
    host.check_value("ops.silu_mul_gemv_add: gate_up", gate_up)
    if tuple(gate_up.shape) not in ((2 * k,), (2, k)):
        raise ArgumentError(f"ops.silu_mul_gemv_add: gate_up must have shape ({2 * k},) or "
                            f"(2, {k}) for w {tuple(w.shape)}, got {tuple(gate_up.shape)}")
    flat = k >= FLAT_MIN_K
    if tuple(gate_up.shape) == ((2 * k,) if flat else (2, k)):
        gu = host.borrow(gate_up)
    elif not hasattr(gate_up, "view"):
        raise ArgumentError(f"ops.silu_mul_gemv_add: a Shared gate_up must have shape "
                            f"{(2 * k,) if flat else (2, k)} for K = {k}")
    else:
        try:
            gu = gate_up.view(2 * k) if flat else gate_up.view(2, k)
        except ValueError:
            raise ArgumentError("ops.silu_mul_gemv_add: a (2, K) gate_up must be contiguous "
                                "here (it is read as one (2K,) vector)") from None
    host.same_dtype("ops.silu_mul_gemv_add", w, gate_up)
    host.check_dtype("ops.silu_mul_gemv_add: w", w, IN_DTYPES)
    rv = _residual("ops.silu_mul_gemv_add", residual, n)
    y, yv = result("ops.silu_mul_gemv_add", out, n, residual.dtype, w.device)
    cfg = host.config("ops.silu_mul_gemv_add", config, GemvConfig,
                      lambda: choose_config(n, k, swiglu=True))
    kern = configured("ops.silu_mul_gemv_add",
                      silu_mul_gemv_add_kernel(cfg.bk, cfg.head, flat), cfg)
    op = kern(*host.inputs(w, gu, rv), yv.partition((cfg.bn,)), -(-k // cfg.bk))
    return host.returning(op, y)
