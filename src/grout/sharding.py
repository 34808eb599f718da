"""Megatron-style tensor-parallel slicing of Qwen3 weights: which rank holds which slice.

With ``n`` ranks, rank ``r`` holds:

* ``column`` weights (q/k/v, gate/up; torch layout ``(out_features, in_features)``): rows
  ``r``-th of ``n`` equal chunks of the output features, i.e. whole attention heads (q by
  query heads, k/v by key/value heads) or a slab of the MLP width. Each rank computes its
  heads (or its slab of ``silu(gate) * up``) from the full hidden state with no communication;
* ``row`` weights (o, down): the matching chunk of the *input* features, so each rank's
  product is a partial sum of the full output; one all-reduce after attention and one after
  the MLP completes it;
* ``vocab`` weights (embedding, lm_head): a contiguous chunk of vocabulary rows. An embedding
  lookup of a token outside the chunk contributes zeros (all-reduce to combine); the lm_head
  gives each rank its slice of the logits (gather them, or take a distributed argmax);
* everything else (the norms, q/k norms over ``head_dim``) is replicated.

Grouped-query attention keeps its grouping on every rank because query heads ``r * H/n ...``
use exactly the key/value heads ``r * KV/n ...`` when ``n`` divides the key/value heads.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .config import Qwen3Config
from .errors import ShardingError

COLUMN, ROW, VOCAB, REPLICATE = "column", "row", "vocab", "replicate"

_RULES = (
    ("self_attn.q_proj.weight", COLUMN), ("self_attn.k_proj.weight", COLUMN),
    ("self_attn.v_proj.weight", COLUMN), ("mlp.gate_proj.weight", COLUMN),
    ("mlp.up_proj.weight", COLUMN), ("self_attn.o_proj.weight", ROW),
    ("mlp.down_proj.weight", ROW), ("embed_tokens.weight", VOCAB), ("lm_head.weight", VOCAB),
)


def shard_shapes(cfg: Qwen3Config, ranks: int) -> Qwen3Config:
    """``cfg`` with the per-rank sizes for ``ranks`` ranks (heads, key/value heads, MLP width,
    vocabulary; hidden size and head_dim stay whole); ``ShardingError`` if one does not
    divide."""
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ShardingError(f"tensor parallelism needs a positive int number of ranks, got "
                            f"{ranks!r}")
    for what, n in (("num_attention_heads", cfg.num_attention_heads),
                    ("num_key_value_heads", cfg.num_key_value_heads),
                    ("intermediate_size", cfg.intermediate_size),
                    ("vocab_size", cfg.vocab_size)):
        if n % ranks:
            raise ShardingError(
                f"{cfg.name or 'model'}: {what} {n} is not divisible by {ranks} ranks; each "
                f"rank must hold whole heads and equal slices. Use a rank count that divides "
                f"{what} (heads {cfg.num_attention_heads}, key/value heads "
                f"{cfg.num_key_value_heads})")
    return replace(cfg, num_attention_heads=cfg.num_attention_heads // ranks,
                   num_key_value_heads=cfg.num_key_value_heads // ranks,
                   intermediate_size=cfg.intermediate_size // ranks,
                   vocab_size=cfg.vocab_size // ranks)


def rule(name: str) -> str:
    """How the checkpoint tensor ``name`` is split: ``column``, ``row``, ``vocab`` or
    ``replicate``."""
    for suffix, how in _RULES:
        if name.endswith(suffix):
            return how
    return REPLICATE


def shard(name: str, weight: torch.Tensor, cfg: Qwen3Config, rank: int,
          ranks: int) -> torch.Tensor:
    """Rank ``rank``'s slice of checkpoint tensor ``name`` (a view of ``weight``)."""
    shard_shapes(cfg, ranks)
    if not 0 <= rank < ranks:
        raise ShardingError(f"rank {rank} is outside 0..{ranks - 1}")
    how = rule(name)
    if how == REPLICATE:
        return weight
    axis = 1 if how == ROW else 0
    size = weight.shape[axis]
    if size % ranks:
        raise ShardingError(f"{name}: axis {axis} of shape {tuple(weight.shape)} is not "
                            f"divisible by {ranks} ranks")
    chunk = size // ranks
    return weight.narrow(axis, rank * chunk, chunk)


def vocab_range(cfg: Qwen3Config, rank: int, ranks: int) -> range:
    """The token ids whose embedding and logit rows rank ``rank`` holds."""
    per = shard_shapes(cfg, ranks).vocab_size
    return range(rank * per, (rank + 1) * per)
