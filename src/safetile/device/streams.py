"""Stream policy: which CUDA stream an execution runs on.

Default: torch's current stream of the current device, the same stream torch work issued
by the caller uses, so safetile ops and surrounding torch ops are ordered without events.
``op.sync(stream=s)`` runs one execution on ``s``. Ordering between ops comes only from
``then`` (same stream) or from running them on one stream; ops that are not chained may run
on different streams concurrently. Their arguments cannot be shared unsafely across streams:
ownership moves into an op until it is settled, i.e. until its work is known complete.

On a machine without CUDA the stream is ``None`` and execution is synchronous.
"""
from __future__ import annotations

import contextlib

import torch

_cuda = [None]          # cached torch.cuda.is_available()


def cuda_available() -> bool:
    if _cuda[0] is None:
        _cuda[0] = torch.cuda.is_available()
    return _cuda[0]


def resolve(stream=None):
    """The stream an execution runs on: ``stream`` if given, else torch's current stream
    (None without CUDA)."""
    if stream is not None:
        return stream
    if not cuda_available():
        return None
    return torch.cuda.current_stream()


@contextlib.contextmanager
def _switch(stream):
    with torch.cuda.stream(stream):
        yield


_NULL = contextlib.nullcontext()


def using(stream):
    """A context making ``stream`` torch's current stream (so torch work in callbacks and
    graph replays go to it); free when it already is."""
    if stream is None or stream == torch.cuda.current_stream(stream.device):
        return _NULL
    return _switch(stream)


def new_stream():
    """A fresh CUDA stream (for work that should not be ordered with the current one)."""
    return torch.cuda.Stream() if cuda_available() else None
