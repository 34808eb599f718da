"""Backend selection: ``triton`` (GPU) or ``interpret`` (the CPU executor)."""
from __future__ import annotations

import contextlib
import os
import threading
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
_local = threading.local()


def current() -> BackendChoice:
    """The backend in force on this thread."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
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
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(BackendChoice(name, seed))
    try:
        yield
    finally:
        stack.pop()
