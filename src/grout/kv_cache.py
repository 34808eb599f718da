"""The KV cache: one (kv heads, max_seq_len, head_dim) key and value tensor per layer.

Preallocated once for ``max_seq_len`` positions: prefill appends the prompt's keys and values
from position 0 (``ops.kv_append_many``) and each decode step appends one row at the
device-resident position (``ops.kv_append``). Rows past the current length are never read
(attention takes the length from the device), so a new request simply starts over at 0.
"""
from __future__ import annotations

import safetile as st

from .config import Qwen3Config


class KVCache:
    """Keys ``k[layer]`` and values ``v[layer]``, each (kv heads, max_seq_len, head_dim)."""

    def __init__(self, cfg: Qwen3Config, max_seq_len: int, dtype, device):
        shape = (cfg.num_key_value_heads, max_seq_len, cfg.head_dim)
        self.max_seq_len = max_seq_len
        self.k = [st.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]
        self.v = [st.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]

    def nbytes(self) -> int:
        """Bytes held by the cache."""
        t = self.k[0]
        return 2 * len(self.k) * t.numel * t.dtype.itemsize
