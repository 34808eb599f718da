"""Qwen3 batch-1 decode steps assembled from ``safetile.ops``, unfused and fused, for timing.

A step is what grout's captured decode graph runs for one token: the embedding of the
current token, every layer (attention over the cache up to the device position, MLP), the
final norm, lm_head and a greedy argmax. Each layer has its own weights and KV cache, so a
replayed step streams every weight from HBM as decode does. Two assemblies:

- ``unfused``: today's ops, 14 kernels a layer: add_rmsnorm, qkv gemv, rmsnorm of q and of
  k, rope of q and of k, kv_append, decode attention (split, merge), o gemv, add_rmsnorm,
  gate_up gemv, silu_mul, down gemv; then add_rmsnorm, lm_head gemv, argmax (2 kernels).
- ``fused``: 7 kernels a layer: rmsnorm_gemv (qkv), qk_norm_rope_kv_append, decode attention
  (split, merge; its reads after the PDL wait, so that its launch overlaps the append),
  gemv_add (o), rmsnorm_gemv (gate_up), silu_mul_gemv_add (down); then rmsnorm_gemv_argmax
  (2 kernels). The residual stream alternates between two buffers.

Random weights (std 0.02, norm weights 1 + 0.1 N(0, 1)) and random caches: never zeros.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import safetile as st
from safetile import ops
from safetile.ops.gemv import choose_config

VOCAB = 151936
EPS = 1e-6
THETA = 1e6


@dataclass(frozen=True)
class Shape:
    """One Qwen3 size: the dimensions a decode step depends on."""

    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    inter: int
    layers: int
    vocab: int = VOCAB

    @property
    def qkv_rows(self) -> int:
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim

    def layer_bytes(self) -> int:
        """bf16 weight bytes of one layer (projections and norms)."""
        h, q = self.hidden, self.q_heads * self.head_dim
        return 2 * (self.qkv_rows * h + h * q + 2 * self.inter * h + h * self.inter
                    + 2 * h + 2 * self.head_dim)

    def step_bytes(self, context: int) -> int:
        """Bytes a step must read: every layer, the cache up to ``context``, lm_head once."""
        kv = 2 * self.kv_heads * context * self.head_dim * 2
        return self.layers * (self.layer_bytes() + kv) + self.vocab * self.hidden * 2


MODELS = {
    "qwen3-4b": Shape(2560, 32, 8, 128, 9728, 36),
    "qwen3-32b": Shape(5120, 64, 8, 128, 25600, 64),
    # CPU-sized, for checking the assembly on the CPU executor
    "tiny": Shape(128, 4, 2, 32, 192, 2, vocab=1000),
}


def random_tensor(shape, device, scale=0.02, offset=0.0, dtype=torch.bfloat16):
    t = torch.randn(shape, device=device, dtype=torch.float32).mul_(scale).add_(offset)
    return st.from_torch(t.to(dtype))


class Layer:
    """One layer's weights (Shared: read by every replay) and its KV cache."""

    def __init__(self, s: Shape, max_seq: int, device):
        h, q = s.hidden, s.q_heads * s.head_dim
        self.ln1 = random_tensor((h,), device, 0.1, 1.0).share()
        self.wqkv = random_tensor((s.qkv_rows, h), device).share()
        self.q_norm = random_tensor((s.head_dim,), device, 0.1, 1.0).share()
        self.k_norm = random_tensor((s.head_dim,), device, 0.1, 1.0).share()
        self.wo = random_tensor((h, q), device).share()
        self.ln2 = random_tensor((h,), device, 0.1, 1.0).share()
        self.wgu = random_tensor((2 * s.inter, h), device).share()
        self.wd = random_tensor((h, s.inter), device).share()
        self.k_cache = random_tensor((s.kv_heads, max_seq, s.head_dim), device, 1.0)
        self.v_cache = random_tensor((s.kv_heads, max_seq, s.head_dim), device, 1.0)


class Step:
    """A model's weights, caches and every buffer one decode step uses (allocated once)."""

    def __init__(self, s: Shape, max_seq: int, context: int, device=None, layers=None):
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.shape, self.context = s, context
        self.layers = [Layer(s, max_seq, device) for _ in range(layers or s.layers)]
        h, q, d = s.hidden, s.q_heads * s.head_dim, s.head_dim
        self.embed = random_tensor((s.vocab, h), device, 1.0).share()
        self.final_norm = random_tensor((h,), device, 0.1, 1.0).share()
        self.lm_head = random_tensor((s.vocab, h), device).share()
        self.inv_freq = ops.inv_freq_table(d, THETA, device).share()
        # the token just appended sits at position context - 1
        # (the torch alias sets the position between replays, while nothing is in flight)
        self.pos_t = torch.tensor([context - 1], dtype=torch.int32, device=device)
        self.pos = st.from_torch(self.pos_t)
        self.token = st.from_torch(torch.tensor([1234 % s.vocab], dtype=torch.int64,
                                                device=device))
        # every buffer starts random: a stage timed alone reads finite, non-zero inputs
        e = lambda *shape: random_tensor(shape, device, 1.0)  # noqa: E731
        self.h = [e(1, h), e(1, h), e(1, h)]
        self.normed, self.qkv, self.o, self.down = e(h), e(s.qkv_rows), e(h), e(h)
        self.qn, self.kn = e(s.q_heads, d), e(s.kv_heads, d)
        self.q, self.k, self.attn = e(s.q_heads, d), e(s.kv_heads, d), e(s.q_heads, d)
        self.gu, self.act = e(2 * s.inter), e(s.inter)
        self.logits = e(s.vocab)
        self.next_token = st.empty((1,), dtype=st.i64, device=device)
        self.ws = ops.DecodeWorkspace.for_cache(self.q, self.layers[0].k_cache)
        self.argmax_ws = ops.argmax_workspace(s.vocab, st.i64, device)
        self.head_ws = ops.gemv_argmax_workspace(self.lm_head, st.i64)

    def set_context(self, context: int) -> None:
        """Attend ``context`` positions at the next replay (the token at ``context - 1``)."""
        self.context = context
        self.pos_t.fill_(context - 1)


# -- one stage of a layer, each way (``rec`` records an op into the graph scope) ------------

def qkv_unfused(rec, st_, L, x, first: bool, prev=None):
    """The input norm and the qkv gemv; ``x`` the residual (1, hidden), ``prev`` the
    previous layer's down output (added here when not ``first``). Returns the residual."""
    if first:
        rec(ops.rmsnorm(x.view(-1), L.ln1, out=st_.normed))
        resid = x
    else:
        resid = st_.h[2] if x is not st_.h[2] else st_.h[0]
        rec(ops.add_rmsnorm(prev.view(-1), x.view(-1), L.ln1, out=st_.normed,
                            residual_out=resid.view(-1)))
    rec(ops.gemv(L.wqkv, st_.normed, st_.qkv))
    return resid


def attention_prologue_unfused(rec, st_, L):
    s = st_.shape
    rows = st_.qkv.view(s.q_heads + 2 * s.kv_heads, s.head_dim)
    rec(ops.rmsnorm(rows.slice(0, 0, s.q_heads), L.q_norm, EPS, out=st_.qn))
    rec(ops.rmsnorm(rows.slice(0, s.q_heads, s.q_heads + s.kv_heads), L.k_norm, EPS,
                    out=st_.kn))
    rec(ops.rope(st_.qn.view(1, s.q_heads, s.head_dim), st_.pos, st_.inv_freq,
                 out=st_.q.view(1, s.q_heads, s.head_dim)))
    rec(ops.rope(st_.kn.view(1, s.kv_heads, s.head_dim), st_.pos, st_.inv_freq,
                 out=st_.k.view(1, s.kv_heads, s.head_dim)))
    rec(ops.kv_append(st_.k, rows.slice(0, s.q_heads + s.kv_heads, s.q_heads + 2 * s.kv_heads),
                      st_.pos, L.k_cache, L.v_cache))


def attention_prologue_fused(rec, st_, L):
    rec(ops.qk_norm_rope_kv_append(st_.qkv, L.q_norm, L.k_norm, st_.pos, st_.inv_freq,
                                   L.k_cache, L.v_cache, EPS, q_out=st_.q))


def attention(rec, st_, L, early: bool = True):
    """Decode attention; ``early=False``: its reads after the PDL wait, so the launch after
    the cache append keeps programmatic launch (``ops.decode_attention``)."""
    rec(ops.decode_attention(st_.q, L.k_cache, L.v_cache, st_.pos, st_.attn, st_.ws,
                             length_offset=1, early=early))


def mlp_unfused(rec, st_, L, resid):
    """o gemv, add_rmsnorm, gate_up gemv, silu_mul, down gemv; returns the new residual
    (the down output is added by the next layer's add_rmsnorm)."""
    s = st_.shape
    rec(ops.gemv(L.wo, st_.attn.view(-1), st_.o))
    mid = st_.h[1] if resid is not st_.h[1] else st_.h[0]
    rec(ops.add_rmsnorm(st_.o, resid.view(-1), L.ln2, out=st_.normed,
                        residual_out=mid.view(-1)))
    rec(ops.gemv(L.wgu, st_.normed, st_.gu))
    rec(ops.silu_mul(st_.gu.slice(0, 0, s.inter), st_.gu.slice(0, s.inter, 2 * s.inter),
                     out=st_.act))
    rec(ops.gemv(L.wd, st_.act, st_.down))
    return mid


def record_unfused(rec, st_):
    """The whole unfused step; returns the recorded op count."""
    rec(ops.embedding(st_.token, st_.embed, out=st_.h[0]))
    x, prev = st_.h[0], None
    for i, L in enumerate(st_.layers):
        resid = qkv_unfused(rec, st_, L, x, i == 0, prev)
        attention_prologue_unfused(rec, st_, L)
        attention(rec, st_, L)
        x, prev = mlp_unfused(rec, st_, L, resid), st_.down
    out = st_.h[2] if x is not st_.h[2] else st_.h[0]
    rec(ops.add_rmsnorm(prev.view(-1), x.view(-1), st_.final_norm, out=st_.normed,
                        residual_out=out.view(-1)))
    rec(ops.gemv(st_.lm_head, st_.normed, st_.logits))
    rec(ops.argmax(st_.logits, st_.next_token, st_.argmax_ws))


def record_fused(rec, st_, attention_early: bool = False,
                 unfused: frozenset = frozenset(), pdl: bool | None = None,
                 with_attention: bool = True):
    """The whole fused step. Options (for breakdowns; the defaults are the fused step):
    ``attention_early``: the attention's reads before its PDL wait (its launch after the
    append then goes in plain order); ``unfused``: stages ("qkv", "prologue", "o",
    "gate_up", "down", "lm_head") run as the unfused ops in this step's residual layout (rmsnorm + gemv,
    gemv + add, silu_mul + gemv + add); ``pdl``: the gemvs' programmatic launch (default
    on Hopper); ``with_attention=False`` leaves the prologue and attention out (a diagnostic,
    not a decode step: o reads a stale attention output)."""
    s = st_.shape

    def cfg(w):
        return choose_config(*w.shape, pdl=pdl)
    rec(ops.embedding(st_.token, st_.embed, out=st_.h[0]))
    cur, other = st_.h[0].view(-1), st_.h[1].view(-1)
    for L in st_.layers:
        if "qkv" in unfused:
            rec(ops.rmsnorm(cur, L.ln1, EPS, out=st_.normed))
            rec(ops.gemv(L.wqkv, st_.normed, st_.qkv, config=cfg(L.wqkv)))
        else:
            rec(ops.rmsnorm_gemv(cur, L.ln1, L.wqkv, EPS, out=st_.qkv,
                                 config=cfg(L.wqkv)))
        if with_attention:
            if "prologue" in unfused:
                attention_prologue_unfused(rec, st_, L)
            else:
                attention_prologue_fused(rec, st_, L)
            attention(rec, st_, L, attention_early)
        if "o" in unfused:
            rec(ops.gemv(L.wo, st_.attn.view(-1), st_.o, config=cfg(L.wo)))
            rec(ops.add(st_.o, cur, out=other))
        else:
            rec(ops.gemv_add(L.wo, st_.attn.view(-1), cur, out=other, config=cfg(L.wo)))
        if "gate_up" in unfused:
            rec(ops.rmsnorm(other, L.ln2, EPS, out=st_.normed))
            rec(ops.gemv(L.wgu, st_.normed, st_.gu, config=cfg(L.wgu)))
        else:
            rec(ops.rmsnorm_gemv(other, L.ln2, L.wgu, EPS, out=st_.gu,
                                 config=cfg(L.wgu)))
        if "down" in unfused:
            rec(ops.silu_mul(st_.gu.slice(0, 0, s.inter), st_.gu.slice(0, s.inter, 2 * s.inter),
                             out=st_.act))
            rec(ops.gemv(L.wd, st_.act, st_.down, config=cfg(L.wd)))
            rec(ops.add(st_.down, other, out=cur))
        else:
            rec(ops.silu_mul_gemv_add(L.wd, st_.gu, other, out=cur, config=cfg(L.wd)))
    if "lm_head" in unfused:
        rec(ops.rmsnorm(cur, st_.final_norm, EPS, out=st_.normed))
        rec(ops.gemv(st_.lm_head, st_.normed, st_.logits, config=cfg(st_.lm_head)))
        rec(ops.argmax(st_.logits, st_.next_token, st_.argmax_ws))
    else:
        rec(ops.rmsnorm_gemv_argmax(cur, st_.final_norm, st_.lm_head, EPS, logits=st_.logits,
                                    token=st_.next_token, workspace=st_.head_ws,
                                    config=cfg(st_.lm_head)))


def record_gemvs_only(rec, st_):
    """Only the step's weight streams: four plain gemvs a layer and lm_head (a diagnostic
    floor of a kernel-per-gemv step, not a decode step)."""
    for L in st_.layers:
        rec(ops.gemv(L.wqkv, st_.normed, st_.qkv))
        rec(ops.gemv(L.wo, st_.attn.view(-1), st_.o))
        rec(ops.gemv(L.wgu, st_.normed, st_.gu))
        rec(ops.gemv(L.wd, st_.act, st_.down))
    rec(ops.gemv(st_.lm_head, st_.normed, st_.logits))


def record(step: Step, assembly):
    """The graph of ``assembly`` (``record_unfused`` or ``record_fused``) over ``step``."""
    with st.graph_scope() as scope:
        assembly(scope.record, step)
    return scope.graph
