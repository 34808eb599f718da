"""The KV cache: one (kv heads, max_seq_len, head_dim) key and value tensor per layer.

Preallocated once for ``max_seq_len`` positions: prefill appends the prompt's keys and values
from position 0 (``ops.kv_append_many``) and each decode step appends one row at the
device-resident position (``ops.kv_append``). Rows past the current length are never read
(attention takes the length from the device), so a new request simply starts over at 0.
"""
from __future__ import annotations

import math

import torch

import safetile as st

from .config import Qwen3Config
from .errors import RequestError


class KVCache:
    """Keys ``k[layer]`` and values ``v[layer]``, each (kv heads, max_seq_len, head_dim):
    views of one (layers, 2, kv heads, max_seq_len, head_dim) tensor (one storage, so a
    recorded decode graph borrows one cache storage, not two per layer)."""

    def __init__(self, cfg: Qwen3Config, max_seq_len: int, dtype, device):
        self.max_seq_len = max_seq_len
        shape = (cfg.num_hidden_layers, 2, cfg.num_key_value_heads, max_seq_len, cfg.head_dim)
        try:
            self.all = st.zeros(shape, dtype=dtype, device=device)
        except (torch.OutOfMemoryError, st.ArgumentError) as e:   # (the shape is ours: too big)
            nbytes = math.prod(shape) * dtype.itemsize
            raise RequestError(f"the KV cache for max_seq_len={max_seq_len} positions "
                               f"({nbytes / 2**30:.1f} GiB) cannot be allocated on {device} "
                               f"({e}); pass a smaller max_seq_len") from None
        self.k = [self.all[n, 0] for n in range(cfg.num_hidden_layers)]
        self.v = [self.all[n, 1] for n in range(cfg.num_hidden_layers)]

    def nbytes(self) -> int:
        """Bytes held by the cache."""
        return self.all.numel * self.all.dtype.itemsize
