"""Backend selection: ``triton`` (GPU) or ``interpret`` (the CPU executor)."""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass

import torch

from .errors import ArgumentError

BACKENDS = ("triton", "interpret")


@dataclass(frozen=True)
class BackendChoice:
    name: str
    seed: int = 0          # program-order shuffle seed of the CPU executor


def _default() -> BackendChoice:
    name = os.environ.get("SAFETILE_BACKEND") or ("triton" if torch.cuda.is_available() else "interpret")
    if name not in BACKENDS:
        raise ArgumentError(f"SAFETILE_BACKEND={name!r}; choose one of {BACKENDS}")
    return BackendChoice(name)


_global = [None]
# The innermost `with st.backend(...)` in force. A context variable, not a thread-local, so
# that work handed to another thread with its context (an awaited op on the CPU) keeps it.
_scoped: contextvars.ContextVar = contextvars.ContextVar("safetile_backend", default=None)


def current() -> BackendChoice:
    """The backend in force in this context."""
    choice = _scoped.get()
    if choice is not None:
        return choice
    if _global[0] is None:
        _global[0] = _default()
    return _global[0]


def set_backend(name: str, seed: int = 0) -> None:
    """Choose the process-wide default backend: "triton" or "interpret"."""
    if name not in BACKENDS:
        raise ArgumentError(f"unknown backend {name!r}; choose one of {BACKENDS}")
    _global[0] = BackendChoice(name, seed)


@contextlib.contextmanager
def backend(name: str, seed: int = 0):
    """Use backend ``name`` inside the block (``seed`` shuffles the CPU executor's order)."""
    if name not in BACKENDS:
        raise ArgumentError(f"unknown backend {name!r}; choose one of {BACKENDS}")
    token = _scoped.set(BackendChoice(name, seed))
    try:
        yield
    finally:
        _scoped.reset(token)
