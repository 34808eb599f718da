"""A request's sampling parameters, checked, and their device form.

The sampling itself runs on the device inside the decode graph (``safetile.ops.sample``, or
``ops.argmax`` for temperature 0); this module validates what a request asks for and turns
it into the small tensors the graph reads: ``[temperature, top_k, top_p, 0]`` and the seed's
two 32-bit words. Without a seed a fresh one is drawn, so only seeded requests repeat.
"""
from __future__ import annotations

import numbers
import secrets
from dataclasses import dataclass

import safetile as st
from safetile import ops

from .config import finite
from .errors import RequestError

SEED_MIN, SEED_END = -2 ** 63, 2 ** 64


def _number(name: str, v) -> float:
    """``v`` as a float: a Python or numpy real number (as safetile's ops take it), finite,
    never a bool."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not finite(v):
        raise RequestError(f"{name} must be a finite number, got {v!r:.60}")
    return float(v)


def integer(v):
    """``v`` as an int if it is a Python or numpy integer (never a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        return None
    return int(v)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token: greedy at temperature 0, else a seeded draw under top-k and
    top-p (0 and 1 turn them off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        t = _number("temperature", self.temperature)
        if t < 0:
            raise RequestError(f"temperature must be >= 0 (0 is greedy), got {t}")
        k = integer(self.top_k)
        if k is None or k < 0:
            raise RequestError(f"top_k must be an int >= 0 (0 turns it off), got {self.top_k!r}")
        p = _number("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1] (1 turns it off), got {p}")
        seed = None if self.seed is None else integer(self.seed)
        if self.seed is not None and seed is None:
            raise RequestError(f"seed must be an int or None, got {self.seed!r}")
        if seed is not None and not SEED_MIN <= seed < SEED_END:
            # the sampler keys on 64 bits: 2**64 + s would draw exactly what s draws
            raise RequestError(f"seed must be in [-2**63, 2**64) (64 bits, as torch.manual_seed "
                               f"takes), got an int of {seed.bit_length()} bits")
        for name, value in (("temperature", t), ("top_k", k), ("top_p", p), ("seed", seed)):
            object.__setattr__(self, name, value)      # plain Python numbers from here on

    @property
    def greedy(self) -> bool:
        """Temperature 0, or top-k 1: the argmax whatever the seed."""
        return self.temperature == 0.0 or self.top_k == 1

    def tensors(self, device) -> tuple[st.Tensor, st.Tensor]:
        """The (params, key) tensors ``ops.sample`` reads, on ``device``."""
        seed = secrets.randbits(64) if self.seed is None else self.seed
        return (ops.sampling_params(self.temperature, self.top_k, self.top_p, device=device),
                ops.sampling_key(seed, device=device))
