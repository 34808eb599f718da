"""Per-token log-probabilities: the chosen token's and the k most likely, from one step's logits.

Log-probabilities are those of the model's own distribution, ``log_softmax(logits)`` in fp32,
before temperature, top-k or top-p reshape it for sampling (the convention of the OpenAI API
and of vLLM). They are computed where the logits are (on the GPU for a GPU engine) and only
k + 1 numbers cross to the host.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .errors import RequestError
from .sampler import integer

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's log-probability and the ``k`` most likely tokens, best first."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def check_top_logprobs(k) -> int | None:
    """``k`` as a plain int (a numpy integer too, as the sampling parameters take), or None (no
    logprobs); ``RequestError`` unless it is an int in [0, MAX_TOP_LOGPROBS]."""
    if k is None:
        return None
    n = integer(k)
    if n is None or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise RequestError(f"logprobs must be None or an int in [0, {MAX_TOP_LOGPROBS}], "
                           f"got {k!r}")
    return n


def check_vocabulary(k: int | None, vocab: int, name: str = "logprobs") -> None:
    """``RequestError`` naming ``name`` when ``k`` alternatives outnumber the ``vocab`` tokens."""
    # Refused, as vLLM refuses a count past its maximum, rather than quietly cut to vocab.
    if k is not None and k > vocab:
        raise RequestError(f"{name} is {k}, more than the model's vocabulary of {vocab} tokens: "
                           f"ask for at most {vocab}")


def step_logprobs(runner: Any, token_id: int, k: int | None) -> TokenLogprobs | None:
    """The logprobs of the token the runner's last step (or prefill) sampled; None if k is.

    The step leaves its logits in the decode buffers, where the next step overwrites them,
    so this runs right after the step, before the token is fed back.
    """
    if k is None:
        return None
    return from_logits(runner.buf.logits.to_torch(), token_id, k)


def from_logits(logits: torch.Tensor, token_id: int, k: int) -> TokenLogprobs:
    """Log-probabilities of one decode step; ``logits`` is the (vocab,) row that chose the
    token, ``k`` (checked by :func:`check_top_logprobs`) how many alternatives to report."""
    row = torch.log_softmax(logits.reshape(-1).float(), dim=-1)
    if k:
        top_values, top_ids = torch.topk(row, k)
        values = torch.cat([row[token_id].reshape(1), top_values]).tolist()
        ids = top_ids.tolist()
    else:
        values, ids = [row[token_id].item()], []
    return TokenLogprobs(token_id, values[0], tuple(ids), tuple(values[1:]))
