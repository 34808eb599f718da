"""Per-token log-probabilities: the chosen token's and the k most likely, from one step's logits.

Log-probabilities are those of the model's own distribution, ``log_softmax(logits)`` in fp32,
before temperature, top-k or top-p reshape it for sampling (the convention of the OpenAI API
and of vLLM). They are computed where the logits are (on the GPU for a GPU engine) and only
k + 1 numbers cross to the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``k`` most likely tokens, best first."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def from_logits(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprobs:
    """Log-probabilities of one decode step; ``logits`` is the (vocab,) row that chose the token.

    Args:
        k: how many alternatives to report (0 to MAX_TOP_LOGPROBS).
    """
    if not 0 <= k <= MAX_TOP_LOGPROBS:
        raise ValueError(f"k must be in [0, {MAX_TOP_LOGPROBS}], got {k}")
    row = torch.log_softmax(logits.reshape(-1).float(), dim=-1)
    if k:
        top_values, top_ids = torch.topk(row, k)
        values = torch.cat([row[token_id].reshape(1), top_values]).tolist()
        ids = top_ids.tolist()
    else:
        values, ids = [row[token_id].item()], []
    return TokenLogprobs(token_id, values[0], tuple(ids), tuple(values[1:]))


@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """The byte-level BPE alphabet: every byte value has one printable stand-in character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def token_bytes(hf_tokenizer: Any, token_id: int) -> bytes:
    """The raw bytes one token stands for (a byte-level token may be part of a character)."""
    piece = hf_tokenizer.id_to_token(token_id)
    if piece is None:
        return b""
    table = _byte_of_char()
    if all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    return piece.encode()          # an added token such as <|im_end|>: its text as written
