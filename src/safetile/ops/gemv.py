"""Matrix-vector product ``y = W x`` for batch-1 decode: bandwidth-bound, fp32 accumulation.

``W`` is an ``(N, K)`` weight (nn.Linear layout), ``x`` a ``(K,)`` vector. Each program owns
``BN`` consecutive outputs and streams its ``BN`` rows of ``W`` in ``(BN, BK)`` blocks (wide,
coalesced loads; tensor-descriptor loads where the layout allows), multiplying by the matching
slice of ``x`` into a ``(BN, BK)`` fp32 accumulator that is reduced across ``K`` once at the
end. The work is all in streaming ``W`` once: the time floor is ``N * K * 2`` bytes over
the memory bandwidth, so the config keeps enough programs resident on every SM (small ``BN``
for small ``N``) and enough bytes in flight per program (``BK`` and pipeline stages).

Decode runs gemvs back to back, each only a few microseconds long, so the boundary between
two kernels costs a large share. With programmatic dependent launch each program loads its
first two ``W`` blocks *before* waiting for the previous kernel
(``early=("w",)``: the weights are not what that kernel writes; the launcher checks it at
each launch), so the next gemv's weight stream starts while the previous one drains. For a
long K (8 blocks or more) every block goes through the pipelined loop instead (``head=0``).
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
    only issued at the program's start); ``early``: with ``pdl``, load the ``head`` blocks
    of ``W`` before the wait (see the module docstring); ``trigger_early``: with ``pdl``,
    let the next kernel be scheduled as soon as this one's programs start (``Kernel.options``);
    ``head``: how many leading ``W`` blocks are loaded ahead of the pipelined loop (0 or 2;
    with ``pdl`` and ``early`` they are the early loads)."""

    bn: int
    bk: int
    num_warps: int
    num_stages: int
    tma: bool = True
    pdl: bool = False
    prefetch: int = 0
    early: bool = True
    trigger_early: bool = False
    head: int = 2

    def __post_init__(self):
        host.check_fields(self, dict(
            bn=(host.check_pow2,), bk=(host.check_pow2,), num_warps=(host.check_warps,),
            num_stages=(host.check_stages,), tma=(host.check_flag,), pdl=(host.check_flag,),
            prefetch=(host.check_int, 0), early=(host.check_flag,),
            trigger_early=(host.check_flag,)))
        host.check_tiles("GemvConfig", W=(self.bn, self.bk))
        if self.head not in (0, 2) or isinstance(self.head, bool):
            raise ArgumentError(f"GemvConfig: head must be 0 or 2 K blocks loaded ahead of "
                                f"the loop, got {self.head!r}")

    @classmethod
    def for_shape(cls, n: int, k: int, swiglu: bool = False) -> "GemvConfig":
        """The default config of an ``(n, k)`` weight (:func:`choose_config`)."""
        return choose_config(n, k, swiglu=swiglu)


def choose_config(n: int, k: int, *, pdl: bool | None = None,
                  swiglu: bool = False) -> GemvConfig:
    """Rows per program, K block, pipeline depth and head for an ``(n, k)`` weight (the
    measurements behind each rule: benchmarks/TUNING.md, "gemv defaults"):

    - 4 rows per program for N <= 4096 (few rows: more, shorter programs fill the GPU), else 8;
    - for N <= 4096, 1024-wide K blocks and 5 stages where 1024 divides K into fewer than 8
      blocks (a short loop needs deep, wide loads to stream); else 512-wide blocks, 4 stages;
    - head 2 (the first two blocks loaded ahead of the loop, early under PDL) for fewer than
      8 blocks, else 0: a long loop gains nothing from them and the pipelined loop streams
      better;
    - with ``swiglu`` (the down projection's ``ops.silu_mul_gemv_add``), for N <= 4096 and
      K of 8 or more 1024-wide blocks: 1024-wide blocks, 4 stages and head 2. Inside the
      decode step, right after the gate/up projection, these stream the long loop faster
      than the plain gemv's rule (measured on whole steps, TUNING.md "gemv tilings inside
      the step").

    ``pdl`` (default: on Hopper and later) launches with programmatic dependent launch and
    early weight loads, so the weight stream starts while the previous kernel drains.
    ``prefetch`` stays 0: early loads into registers already cover what an L2 prefetch of the
    first blocks would."""
    small = n <= 4096
    bn = 4 if small else 8
    if small and swiglu and k // 1024 >= 8:
        bk, stages, head = 1024, 4, 2
    else:
        bk, stages = (1024, 5) if small and k % 1024 == 0 and k // 1024 < 8 else (512, 4)
        head = 2 if -(-k // bk) < 8 else 0
    return GemvConfig(bn, bk, 4, stages, tma=False, head=head,
                      pdl=host.pdl_available() if pdl is None else pdl)


@functools.lru_cache(maxsize=None)
def _kernel(BK: int, HEAD: int = 2, PREFETCH: int = 0):
    """The gemv kernel for K block ``BK``: its first ``HEAD`` blocks of ``W`` (0 or 2) loaded
    ahead of the pipelined loop over the rest, after L2 prefetches of the first ``PREFETCH``
    blocks (compile-time constants)."""
    if HEAD not in (0, 2):
        raise ArgumentError(f"ops.gemv: head must be 0 or 2 K blocks loaded ahead of the loop, "
                            f"got {HEAD}")
    if HEAD == 0:
        @st.kernel
        def gemv_rows_pipelined(w: st.In[IN_DTYPES, 2], x: st.In[IN_DTYPES, 1],
                                y: st.Out[OUT_DTYPES, 1], K_BLOCKS: st.Const[int]):
            """y[i*BN : (i+1)*BN] = W[rows] @ x, every block of K in the pipelined loop."""
            i = y.index[0]
            for p in range(PREFETCH):
                w.prefetch((i, p), (y.shape[0], BK))
            acc = sl.zeros((y.shape[0], BK), st.f32)
            for k in range(K_BLOCKS):
                wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
                xt = x.load((k,), (BK,)).astype(st.f32)
                acc += wt * xt[None, :]
            y.store(sl.sum(acc, 1))

        return gemv_rows_pipelined

    @st.kernel
    def gemv_rows(w: st.In[IN_DTYPES, 2], x: st.In[IN_DTYPES, 1], y: st.Out[OUT_DTYPES, 1],
                  K_BLOCKS: st.Const[int]):
        """y[i*BN : (i+1)*BN] = W[rows] @ x, accumulated in fp32: two blocks ahead, then the
        rest up to ``K_BLOCKS`` (a compile-time count, so that Triton unrolls and pipelines
        the short loops of decode's gemvs as it does with a known trip count)."""
        i = y.index[0]
        # W is an In: nothing this launch can observe depends on when it reaches L2, so
        # these hints go before the programmatic-launch wait (blocks past K are masked off).
        for p in range(PREFETCH):
            w.prefetch((i, p), (y.shape[0], BK))
        # With the `early` option these two loads also precede the wait (blocks past K load
        # zeros): the weight stream starts while the previous kernel drains. Two (BN, BK)
        # tiles rather than one (BN, 2 * BK) tile: the wider one needs more registers
        # (benchmarks/TUNING.md, "Kernel defaults").
        w0 = w.load((i, 0), (y.shape[0], BK))
        w1 = w.load((i, 1), (y.shape[0], BK))
        acc = w0.astype(st.f32) * x.load((0,), (BK,)).astype(st.f32)[None, :]
        acc += w1.astype(st.f32) * x.load((1,), (BK,)).astype(st.f32)[None, :]
        for k in range(2, K_BLOCKS):
            wt = w.load((i, k), (y.shape[0], BK)).astype(st.f32)
            xt = x.load((k,), (BK,)).astype(st.f32)
            acc += wt * xt[None, :]
        y.store(sl.sum(acc, 1))

    return gemv_rows


@host.naming_overlaps("out")
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
    host.check_out_dtype("ops.gemv: w and x's dtype", host.same_dtype("ops.gemv", w, x),
                         IN_DTYPES)
    if row:
        if not hasattr(x, "view"):
            raise ArgumentError("ops.gemv: a Shared x must be 1-D (K,)")
        x = x.view(k)
    if out is not None and out_dtype is None:
        host.check_target("ops.gemv: out", out)
        out_dtype = out.dtype
    out_dtype = host.check_out_dtype("ops.gemv: out_dtype", out_dtype or w.dtype, OUT_DTYPES)
    y = host.output("ops.gemv: out", out, (1, n) if row else (n,), out_dtype, w.device)
    cfg = host.config("ops.gemv", config, GemvConfig, lambda: choose_config(n, k))
    early = ("w",) if cfg.pdl and cfg.early and cfg.head else ()
    kern = _kernel(cfg.bk, cfg.head, cfg.prefetch).options(
        num_warps=cfg.num_warps, loop_stages=cfg.num_stages, tma=cfg.tma, pdl=cfg.pdl,
        early=early, trigger_early=cfg.pdl and cfg.trigger_early)
    op = kern(*host.inputs(w, x), y.view(n).partition((cfg.bn,)), -(-k // cfg.bk))
    return host.returning(op, y)
