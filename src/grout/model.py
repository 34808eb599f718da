"""The Qwen3 forward pass as sequences of safetile ops: the decode step and prefill.

A forward pass is a list of *steps*, each a function that builds one lazy op (``() ->
st.DeviceOp``) or a :class:`TorchStep`. Steps are built one at a time, just before they run
or are recorded: an op registers its borrows when it is built, so the next op, which reads
what this one writes, can only be built once this one has been handed its place in the
stream (see runner.py, which records the decode step into one graph and runs prefill as one
chained execution).

:func:`decode_layer` is the unfused per-layer decode sequence (14 kernels),
:func:`decode_layer_fused` the fused one (7 kernels): both compute the same values at the
same rounding points, so ``fused=False`` is the reference and the fallback. Decode works on
1-D vectors in preallocated buffers (:class:`DecodeBuffers`); the token and the position
live on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

import safetile as st
from safetile import ops

from .config import Qwen3Config
from .kv_cache import KVCache
from .weights import Arena, Layer, Linear, Weights


@dataclass
class TorchStep:
    """Work torch enqueues between two safetile ops (the ``gemm="cublas"`` comparison path).

    Runs on the execution's stream after the ops before it; it reaches safetile tensors only
    through :func:`torch_view`. It cannot be recorded into a safetile graph."""

    run: Callable[[], None]


Step = Callable[[], st.DeviceOp] | TorchStep


def torch_view(t: st.Tensor) -> torch.Tensor:
    """A torch alias of ``t`` through DLPack. The export is checked: it raises while an
    operation of another execution uses the bytes; ops of the running execution are ordered
    before the torch work on the same stream."""
    return torch.from_dlpack(t)


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# Decode steps of models up to this hidden size let each kernel's successor be scheduled as
# soon as its programs start (gemvs and the attention prologue; benchmarks/TUNING.md, "early
# triggers"): their kernels are short, so the successor's launch latency is a large share.
EARLY_TRIGGER_MAX_HIDDEN = 4096


class SafetileGemm:
    """Projections on safetile's gemv (decode) and matmul (prefill).

    On the CPU executor, which runs programs one after another, the tiles are as large as
    possible (few programs); on the GPU the ops' own tuned configs apply, with
    ``trigger_early`` set on the gemvs when asked."""

    name = "safetile"

    def __init__(self, device: torch.device, trigger_early: bool = False):
        self.cpu = device.type == "cpu"
        self.trigger_early = trigger_early and not self.cpu

    def _gemv_config(self, n: int, k: int, swiglu: bool = False):
        if not self.cpu:
            return replace(ops.GemvConfig.for_shape(n, k, swiglu),
                           trigger_early=self.trigger_early)
        bk = min(_pow2(k), 1024)
        return ops.GemvConfig(min(_pow2(n), max(4, (1 << 20) // bk)), bk, 4, 1, tma=False,
                              head=0)

    def _matmul_config(self, m: int, n: int, k: int):
        if not self.cpu:
            return None
        return ops.MatmulConfig(max(16, min(128, _pow2(m))), min(512, _pow2(n)),
                                min(128, _pow2(k)), 4, 2)

    def vec(self, lin: Linear, x: st.Tensor, out: st.Tensor) -> Step:
        """``out = W @ x`` for one token."""
        n, k = lin.w.shape
        cfg = self._gemv_config(n, k)
        return lambda: ops.gemv(lin.w, x, out=out, config=cfg)

    def mat(self, x: st.Tensor, lin: Linear, out: st.Tensor) -> Step:
        """``out = x @ W.T`` for a block of tokens."""
        (m, k), n = x.shape, lin.w.shape[0]
        cfg = self._matmul_config(m, n, k)
        return lambda: ops.linear(x, lin.w, out=out, config=cfg)

    def config(self, lin: Linear):
        """The gemv config of ``lin``."""
        return self._gemv_config(*lin.w.shape)

    def norm_vec(self, x: st.Tensor, norm: st.Shared, eps: float, lin: Linear,
                 out: st.Tensor) -> Step:
        """``out = W @ rmsnorm(x)``: the norm folded into the gemv."""
        cfg = self.config(lin)
        return lambda: ops.rmsnorm_gemv(x, norm, lin.w, eps, out=out, config=cfg)

    def vec_add(self, lin: Linear, x: st.Tensor, residual: st.Tensor, out: st.Tensor) -> Step:
        """``out = W @ x + residual``: the residual add in the gemv's epilogue."""
        cfg = self.config(lin)
        return lambda: ops.gemv_add(lin.w, x, residual, out=out, config=cfg)

    def silu_vec_add(self, lin: Linear, gate_up: st.Tensor, residual: st.Tensor,
                     out: st.Tensor) -> Step:
        """``out = W @ silu_mul(gate, up) + residual``: SwiGLU in the gemv's prologue."""
        cfg = self._gemv_config(*lin.w.shape, swiglu=True)
        return lambda: ops.silu_mul_gemv_add(lin.w, gate_up, residual, out=out, config=cfg)


class CublasGemm:
    """Projections on torch.matmul (cuBLAS on the GPU): a comparison path, eager only."""

    name = "cublas"

    def vec(self, lin: Linear, x: st.Tensor, out: st.Tensor) -> Step:
        return TorchStep(lambda: torch.mv(lin.t, torch_view(x).reshape(-1),
                                          out=torch_view(out).reshape(-1)))

    def mat(self, x: st.Tensor, lin: Linear, out: st.Tensor) -> Step:
        return TorchStep(lambda: torch.matmul(torch_view(x), lin.t.T, out=torch_view(out)))


class DecodeBuffers:
    """Every tensor one decode step reads or writes, allocated once for the engine.

    ``cursor`` = [position, sampler step] (int32, on the device); the step advances it
    through ``cursor_next``. ``token`` holds the token being fed in, and after the step, the
    one sampled. The residual stream alternates between ``resid[0]`` and ``resid[1]``
    (safe ops never write what they read)."""

    def __init__(self, cfg: Qwen3Config, cache: KVCache, dtype, device: torch.device,
                 max_chunk: int = 1):
        h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        q, kv, hq, hkv = cfg.q_size, cfg.kv_size, cfg.num_attention_heads, cfg.num_key_value_heads
        # One zeroed storage for all of them (see weights.Arena); 8 bytes an element bounds
        # every dtype used here.
        shapes = [(h,)] * 5 + [(q + 2 * kv,), (q,), (kv,), (q,), (kv,), (q,), (2 * i,), (i,),
                               (cfg.vocab_size,), (1,), (2,), (2,), (4,), (2,), (max_chunk,)]
        arena = Arena(Arena.size(shapes, 8), device, zero=True)

        def empty(*shape, dt=dtype):
            return st.from_torch(arena.take(shape, dt.torch))

        self.token = empty(1, dt=st.i32)
        # the tokens of a chunk of steps replayed between two host reads (runner.py)
        self.history = empty(max_chunk, dt=st.i32)
        self.cursor = empty(2, dt=st.i32)
        self.cursor_next = empty(2, dt=st.i32)
        self.pos, self.counter = self.cursor.slice(0, 0, 1), self.cursor.slice(0, 1, 2)
        self.resid = (empty(h), empty(h))
        self.h = empty(h)
        self.qkv = empty(q + 2 * kv)
        self.q = self.qkv.slice(0, 0, q).view(hq, d)
        self.k = self.qkv.slice(0, q, q + kv).view(hkv, d)
        self.v = self.qkv.slice(0, q + kv, q + 2 * kv).view(hkv, d)
        self.qn, self.kn = empty(hq, d), empty(hkv, d)
        self.qr, self.kr = empty(1, hq, d), empty(1, hkv, d)
        self.attn = empty(hq, d)
        self.o, self.mlp = empty(h), empty(h)
        self.gate_up = empty(2 * i)
        self.gate, self.up = self.gate_up.slice(0, 0, i), self.gate_up.slice(0, i, 2 * i)
        self.act = empty(i)
        self.logits = empty(cfg.vocab_size)
        self.attn_ws = ops.DecodeWorkspace.for_cache(self.qn, cache.k[0])
        # The CPU executor runs programs one by one: few, large blocks there.
        cpu = {"block": 16384} if device.type == "cpu" else {}
        self.argmax_ws = ops.argmax_workspace(cfg.vocab_size, st.i32, device, **cpu)
        self.sampler_ws = ops.sampler_workspace(cfg.vocab_size, st.i32, device, **cpu)
        self.params = empty(4, dt=st.f32)
        self.key = empty(2, dt=st.i64)
        self.inv_freq = ops.inv_freq_table(d, cfg.rope_theta, device)
        self.head_ws = None

    def fuse_head(self, lm_head: Linear, gemm: "SafetileGemm") -> None:
        """Allocate the partial (max, index) pairs of the fused lm_head + argmax."""
        self.head_ws = ops.gemv_argmax_workspace(lm_head.w, st.i32, gemm.config(lm_head))


def attention_args(b: DecodeBuffers, short: bool) -> dict:
    """The decode attention's workspace arguments: one kernel per kv head for a ``short``
    context (ops.decode_attention with one split), else the splits of ``b.attn_ws``."""
    return dict(workspace=None, num_splits=1) if short else dict(workspace=b.attn_ws)


def decode_layer(cfg: Qwen3Config, layer: Layer, k_cache: st.Tensor, v_cache: st.Tensor,
                 b: DecodeBuffers, gemm, next_norm: st.Shared, short: bool = False) -> list:
    """One layer of the decode step, from the normed input ``b.h`` and the residual
    ``b.resid[0]`` to the next layer's normed input (``next_norm``: its input norm, or the
    final norm) and residual, again in ``b.h`` and ``b.resid[0]``; ``short``: see
    :func:`attention_args`."""
    eps, hq, hkv, d = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, \
        cfg.head_dim
    return [
        gemm.vec(layer.qkv, b.h, b.qkv),
        lambda: ops.rmsnorm(b.q, layer.q_norm, eps, out=b.qn),
        lambda: ops.rmsnorm(b.k, layer.k_norm, eps, out=b.kn),
        lambda: ops.rope(b.qn.view(1, hq, d), b.pos, b.inv_freq, out=b.qr),
        lambda: ops.rope(b.kn.view(1, hkv, d), b.pos, b.inv_freq, out=b.kr),
        lambda: ops.kv_append(b.kr.view(hkv, d), b.v, b.pos, k_cache, v_cache),
        lambda: ops.decode_attention(b.qr.view(hq, d), k_cache, v_cache, b.pos, out=b.attn,
                                     length_offset=1, **attention_args(b, short)),
        gemm.vec(layer.o, b.attn.view(hq * d), b.o),
        lambda: ops.add_rmsnorm(b.o, b.resid[0], layer.post_norm, eps, out=b.h,
                                residual_out=b.resid[1]),
        gemm.vec(layer.gate_up, b.h, b.gate_up),
        lambda: ops.silu_mul(b.gate, b.up, out=b.act),
        gemm.vec(layer.down, b.act, b.mlp),
        lambda: ops.add_rmsnorm(b.mlp, b.resid[1], next_norm, eps, out=b.h,
                                residual_out=b.resid[0]),
    ]


# Whether a short-context step runs the attention prologue and the one-split attention as
# one kernel (ops.qk_norm_rope_append_attention) where one program can own a head's cache.
# Off: the one kernel saves a boundary but serializes the append and the attention in each
# of its Hkv programs, and the step is no faster (benchmarks/TUNING.md).
FUSED_SHORT_ATTENTION = False
# Whether a short-context step attends before it appends (ops.qk_norm_rope_attention, then
# ops.kv_append), so that the attention's cache loads precede its PDL wait and overlap the
# qkv gemv. Off: the heavier attention and the separate append cost more than the round
# trip they move off the critical path, and the step is slower (benchmarks/TUNING.md).
EARLY_CACHE_ATTENTION = False


def prologue_steps(cfg: Qwen3Config, layer: Layer, k_cache: st.Tensor, v_cache: st.Tensor,
                   b: DecodeBuffers, gemm: SafetileGemm) -> list:
    """q/k norm, RoPE and the K/V append from ``b.qkv``: one kernel, or for a cache longer
    than one program's slab (``ops.max_cache_positions``) the rotation and the append as two
    steps, so that the append keeps programmatic launch (inside one op they would be chained
    through a callback, after which a launch goes in plain stream order)."""
    eps, early = cfg.rms_norm_eps, gemm.trigger_early
    if k_cache.shape[1] <= ops.max_cache_positions(cfg.head_dim):
        return [lambda: ops.qk_norm_rope_kv_append(b.qkv, layer.q_norm, layer.k_norm, b.pos,
                                                   b.inv_freq, k_cache, v_cache, eps,
                                                   q_out=b.qn, trigger_early=early)]
    return [lambda: ops.qk_norm_rope(b.qkv, layer.q_norm, layer.k_norm, b.pos, b.inv_freq,
                                     cfg.num_key_value_heads, eps, q_out=b.qn, k_out=b.kn,
                                     trigger_early=early),
            lambda: ops.kv_append(b.kn, b.v, b.pos, k_cache, v_cache, trigger_early=early)]


def attention_steps(cfg: Qwen3Config, layer: Layer, k_cache: st.Tensor, v_cache: st.Tensor,
                    b: DecodeBuffers, gemm: SafetileGemm, short: bool) -> list:
    """The fused step's attention from ``b.qkv`` to ``b.attn``: q/k norm, RoPE, the K/V
    append and the attention in one kernel when ``short`` (and ``FUSED_SHORT_ATTENTION``);
    when ``short`` and ``EARLY_CACHE_ATTENTION``, the norm, RoPE and the attention in one
    kernel reading the cache before the append, then the append; else the prologue
    (:func:`prologue_steps`), then the attention (see :func:`attention_args`)."""
    eps = cfg.rms_norm_eps
    if short and FUSED_SHORT_ATTENTION and \
            ops.prologue_attention_fits(cfg.head_dim, k_cache.shape[1]):
        return [lambda: ops.qk_norm_rope_append_attention(
            b.qkv, layer.q_norm, layer.k_norm, b.pos, b.inv_freq, k_cache, v_cache, eps,
            out=b.attn, trigger_early=True)]
    if short and EARLY_CACHE_ATTENTION and ops.early_attention_fits(cfg.head_dim):
        return [
            # it signals after its wait, ending each layer's chain of early signals as the
            # attention below does; the append then writes the row it attended from registers
            lambda: ops.qk_norm_rope_attention(b.qkv, layer.q_norm, layer.k_norm, b.pos,
                                               b.inv_freq, k_cache, v_cache, eps, out=b.attn,
                                               k_out=b.kn, trigger_early=False),
            lambda: ops.kv_append(b.kn, b.v, b.pos, k_cache, v_cache,
                                  trigger_early=gemm.trigger_early)]
    return [
        *prologue_steps(cfg, layer, k_cache, v_cache, b, gemm),
        # the attention's reads after its PDL wait, so it may launch during the append; it
        # signals after its wait, which ends each layer's chain of early signals there, so
        # the chain never outgrows the launcher's bound and every launch keeps PDL
        lambda: ops.decode_attention(b.qn, k_cache, v_cache, b.pos, out=b.attn,
                                     length_offset=1, early=False, trigger_early=False,
                                     **attention_args(b, short)),
    ]


def decode_layer_fused(cfg: Qwen3Config, layer: Layer, k_cache: st.Tensor,
                       v_cache: st.Tensor, b: DecodeBuffers, gemm: SafetileGemm,
                       short: bool = False) -> list:
    """One layer of the fused decode step (7 kernels, 5 when ``short``), from the residual
    ``b.resid[0]`` (not normed: each norm is folded into the gemv that consumes it) back to
    ``b.resid[0]``: the input norm in the qkv gemv; the attention (:func:`attention_steps`);
    the residual add in the o gemv (into ``b.resid[1]``); the post-attention norm in the
    gate/up gemv; silu*mul and the residual add around the down gemv (back into
    ``b.resid[0]``). It computes what :func:`decode_layer` computes."""
    eps = cfg.rms_norm_eps
    cur, mid = b.resid
    return [
        gemm.norm_vec(cur, layer.input_norm, eps, layer.qkv, b.qkv),
        *attention_steps(cfg, layer, k_cache, v_cache, b, gemm, short),
        gemm.vec_add(layer.o, b.attn.view(cfg.q_size), cur, mid),
        gemm.norm_vec(mid, layer.post_norm, eps, layer.gate_up, b.gate_up),
        gemm.silu_vec_add(layer.down, b.gate_up, mid, cur),
    ]


def fused_head(cfg: Qwen3Config, w: Weights, b: DecodeBuffers, gemm: SafetileGemm,
               greedy: bool) -> list:
    """The final norm, lm_head and the next token from ``b.resid[0]``: greedy in one fused
    gemv with a partial argmax (plus its final reduction), sampled as the normed gemv and a
    draw."""
    eps = cfg.rms_norm_eps
    if greedy:
        cfg_head = gemm.config(w.lm_head)
        return [lambda: ops.rmsnorm_gemv_argmax(b.resid[0], w.final_norm, w.lm_head.w, eps,
                                                logits=b.logits, token=b.token,
                                                workspace=b.head_ws, config=cfg_head)]
    return [gemm.norm_vec(b.resid[0], w.final_norm, eps, w.lm_head, b.logits),
            sample_step(b, greedy)]


def advance_cursor(b: DecodeBuffers) -> list:
    """[position, sampler step] += 1 (safe ops never write what they read: via a copy)."""
    return [lambda: ops.add_scalar(b.cursor, 1, out=b.cursor_next),
            lambda: ops.copy(b.cursor_next, out=b.cursor)]


def decode_step_fused(cfg: Qwen3Config, w: Weights, cache: KVCache, b: DecodeBuffers,
                      gemm: SafetileGemm, greedy: bool, short: bool = False) -> list:
    """The fused decode step: the same result as :func:`decode_step` in fewer kernels."""
    steps = [lambda: ops.embedding(b.token, w.embed, out=b.resid[0].view(1, cfg.hidden_size))]
    for n, layer in enumerate(w.layers):
        steps += decode_layer_fused(cfg, layer, cache.k[n], cache.v[n], b, gemm, short)
    return steps + fused_head(cfg, w, b, gemm, greedy) + advance_cursor(b)


def sample_step(b: DecodeBuffers, greedy: bool) -> Step:
    """The next token into ``b.token``: the argmax, or a draw under ``b.params``."""
    if greedy:
        return lambda: ops.argmax(b.logits, out=b.token, workspace=b.argmax_ws)
    return lambda: ops.sample(b.logits, b.params, b.key, b.counter, out=b.token,
                              workspace=b.sampler_ws)


def decode_step(cfg: Qwen3Config, w: Weights, cache: KVCache, b: DecodeBuffers, gemm,
                greedy: bool, short: bool = False) -> list:
    """The whole decode step: embed ``b.token`` at ``b.pos``, every layer, the lm_head,
    sample into ``b.token``, advance the cursor."""
    steps = [lambda: ops.embedding(b.token, w.embed, out=b.resid[0].view(1, cfg.hidden_size)),
             lambda: ops.rmsnorm(b.resid[0], w.layers[0].input_norm, cfg.rms_norm_eps, out=b.h)]
    for n, layer in enumerate(w.layers):
        nxt = w.layers[n + 1].input_norm if n + 1 < len(w.layers) else w.final_norm
        steps += decode_layer(cfg, layer, cache.k[n], cache.v[n], b, gemm, nxt, short)
    return steps + [gemm.vec(w.lm_head, b.h, b.logits), sample_step(b, greedy)] + \
        advance_cursor(b)


class PrefillBuffers:
    """The activations of a prefill over ``s`` tokens (allocated per prompt length).

    The projections write (s, heads, head_dim) rows; attention reads and writes them as
    (heads, s, head_dim): both are handles over one storage, made before anything runs."""

    def __init__(self, cfg: Qwen3Config, s: int, dtype, device: torch.device):
        h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads

        def empty(*shape):
            return st.empty(shape, dtype=dtype, device=device)

        def torch_buf(*shape):
            return torch.empty(shape, dtype=dtype.torch, device=device)

        self.s = s
        self.resid = (empty(s, h), empty(s, h))
        self.h = empty(s, h)
        self.q, self.k = empty(s, cfg.q_size), empty(s, cfg.kv_size)
        self.qn, self.kn = empty(s * hq, d), empty(s * hkv, d)
        qr, kr, v, o = torch_buf(s, hq, d), torch_buf(s, hkv, d), torch_buf(s, hkv, d), \
            torch_buf(s, hq, d)
        self.qr, self.qr_heads = st.from_torch(qr), st.from_torch(qr.permute(1, 0, 2))
        self.kr, self.kr_heads = st.from_torch(kr), st.from_torch(kr.permute(1, 0, 2))
        self.v, self.v_heads = st.from_torch(v.view(s, hkv * d)), st.from_torch(v.permute(1, 0, 2))
        self.o_heads, self.o = st.from_torch(o.permute(1, 0, 2)), st.from_torch(o.view(s, hq * d))
        self.attn_out, self.mlp = empty(s, h), empty(s, h)
        self.gate_up = empty(s, 2 * i)
        self.gate, self.up = self.gate_up.slice(1, 0, i), self.gate_up.slice(1, i, 2 * i)
        self.act = empty(s, i)


def prefill_layer(cfg: Qwen3Config, layer: Layer, k_cache: st.Tensor, v_cache: st.Tensor,
                  p: PrefillBuffers, positions: st.Tensor, start: st.Tensor,
                  inv_freq: st.Tensor, gemm, next_norm: st.Shared) -> list:
    """One layer over the prompt: like :func:`decode_layer`, with matmuls, flash attention
    and the whole prompt's K/V appended at ``start``."""
    eps, s = cfg.rms_norm_eps, p.s
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return [
        gemm.mat(p.h, layer.q, p.q),
        gemm.mat(p.h, layer.k, p.k),
        gemm.mat(p.h, layer.v, p.v),
        lambda: ops.rmsnorm(p.q.view(s * hq, d), layer.q_norm, eps, out=p.qn),
        lambda: ops.rmsnorm(p.k.view(s * hkv, d), layer.k_norm, eps, out=p.kn),
        lambda: ops.rope(p.qn.view(s, hq, d), positions, inv_freq, out=p.qr),
        lambda: ops.rope(p.kn.view(s, hkv, d), positions, inv_freq, out=p.kr),
        lambda: ops.kv_append_many(p.kr_heads, p.v_heads, start, k_cache, v_cache),
        lambda: ops.flash_attention(p.qr_heads, p.kr_heads, p.v_heads, out=p.o_heads),
        gemm.mat(p.o, layer.o, p.attn_out),
        lambda: ops.add_rmsnorm(p.attn_out, p.resid[0], layer.post_norm, eps, out=p.h,
                                residual_out=p.resid[1]),
        gemm.mat(p.h, layer.gate_up, p.gate_up),
        lambda: ops.silu_mul(p.gate, p.up, out=p.act),
        gemm.mat(p.act, layer.down, p.mlp),
        lambda: ops.add_rmsnorm(p.mlp, p.resid[1], next_norm, eps, out=p.h,
                                residual_out=p.resid[0]),
    ]


def prefill(cfg: Qwen3Config, w: Weights, cache: KVCache, p: PrefillBuffers, ids: st.Tensor,
            positions: st.Tensor, start: st.Tensor, inv_freq: st.Tensor, gemm) -> list:
    """Every layer over the prompt ``ids`` at ``positions`` (appending K/V from ``start``),
    ending with the final-normed states in ``p.h``."""
    steps = [lambda: ops.embedding(ids, w.embed, out=p.resid[0]),
             lambda: ops.rmsnorm(p.resid[0], w.layers[0].input_norm, cfg.rms_norm_eps, out=p.h)]
    for n, layer in enumerate(w.layers):
        nxt = w.layers[n + 1].input_norm if n + 1 < len(w.layers) else w.final_norm
        steps += prefill_layer(cfg, layer, cache.k[n], cache.v[n], p, positions, start,
                               inv_freq, gemm, nxt)
    return steps
