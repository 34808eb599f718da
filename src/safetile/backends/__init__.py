"""The backends, peers behind one small interface: ``triton`` (GPU) and ``interpret`` (CPU).

A launch (``kernel/``) holds the backend in force when it was made and calls only what
``Backend`` declares: ``execute`` runs one checked launch, ``prepare`` loads its binary
before a graph capture, ``device_kind`` is the tensor device it runs on and ``host_bound``
whether the work runs on the host (so an execution's completion needs no device events).
Nothing outside this folder asks which backend it has.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ArgumentError
from ..tensor.tensor import as_index
from .interpret import executor as _interpret
from .triton import launch as _triton

BACKENDS = ("triton", "interpret")


@dataclass(frozen=True)
class Backend:
    """A backend and its settings (compared by value: plans made under an equal one apply)."""

    name: str
    seed: int = 0          # program-order shuffle seed of the CPU executor

    device_kind: ClassVar[str | None] = None
    host_bound: ClassVar[bool] = False

    def execute(self, op, stream: int) -> None:
        """Run the checked launch ``op`` (a ``KernelOp``) on the raw stream handle ``stream``."""
        raise NotImplementedError

    def prepare(self, op) -> None:
        """Make ``op`` ready to launch without launching it (before a graph capture)."""


class Triton(Backend):
    """Generated Triton kernels on CUDA tensors."""

    device_kind = "cuda"

    def execute(self, op, stream: int) -> None:
        _triton.launch(op, stream)

    def prepare(self, op) -> None:
        _triton.prepare(op)


class Interpret(Backend):
    """The checking CPU executor (seeded shuffled program order, bounds and races)."""

    host_bound = True

    def execute(self, op, stream: int) -> None:
        _interpret.run(op.kernel, op._bound, op.grid, self.seed)


_KINDS = {"triton": Triton, "interpret": Interpret}


def choose(name: str, seed: int = 0) -> Backend:
    """The backend called ``name`` (``ArgumentError`` naming the choices otherwise)."""
    kind = _KINDS.get(name)
    if kind is None:
        raise ArgumentError(f"unknown backend {name!r}; choose one of {BACKENDS}")
    seed = as_index(seed, "the backend's seed (the CPU executor's program order)")
    return kind(name, seed)


def _default() -> Backend:
    name = os.environ.get("SAFETILE_BACKEND") or ("triton" if torch.cuda.is_available() else "interpret")
    if name not in BACKENDS:
        raise ArgumentError(f"SAFETILE_BACKEND={name!r}; choose one of {BACKENDS}")
    return choose(name)


_global: Backend | None = None       # set_backend's choice; the default until then
# The innermost `with st.backend(...)` in force. A context variable, not a thread-local, so
# that work handed to another thread with its context (an awaited op on the CPU) keeps it.
_scoped: contextvars.ContextVar = contextvars.ContextVar("safetile_backend", default=None)


def current() -> Backend:
    """The backend in force in this context."""
    global _global
    choice = _scoped.get()
    if choice is not None:
        return choice
    if _global is None:
        _global = _default()
    return _global


def set_backend(name: str, seed: int = 0) -> None:
    """Choose the process-wide default backend: "triton" or "interpret"."""
    global _global
    _global = choose(name, seed)


@contextlib.contextmanager
def backend(name: str, seed: int = 0):
    """Use backend ``name`` inside the block (``seed`` shuffles the CPU executor's order)."""
    token = _scoped.set(choose(name, seed))
    try:
        yield
    finally:
        _scoped.reset(token)
