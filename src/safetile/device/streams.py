"""Stream policy: which CUDA stream an execution runs on.

Default: torch's current stream of the current device, the same stream torch work issued
by the caller uses, so safetile ops and surrounding torch ops are ordered without events.
``op.sync(stream=s)`` runs one execution on ``s``, after the work already enqueued on the
caller's current stream (an allocation's fill, torch ops that wrote an argument: ``s``
waits for it). Ordering between ops comes only from
``then`` (same stream) or from running them on one stream; ops that are not chained may run
on different streams concurrently. Their arguments cannot be shared unsafely across streams:
ownership moves into an op until it is settled, i.e. until its work is known complete.

On a machine without CUDA the stream is ``None`` and execution is synchronous.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ..errors import ArgumentError


@functools.cache
def cuda_available() -> bool:
    """Whether CUDA is present (asked once per process)."""
    return torch.cuda.is_available()


# (stream_id, device_index, device_type) -> torch.cuda.Stream: torch's current_stream()
# builds a new Python Stream object per call; the raw query below is one C call, and the
# stream objects it names are made once.
_streams: dict = {}


def current():
    """torch's current CUDA stream of the current device (cached stream objects)."""
    if not _streams:
        torch.cuda.init()                          # the raw queries below need CUDA initialized
    data = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
    s = _streams.get(data)
    if s is None:
        s = torch.cuda.current_stream()
        data = (s.stream_id, s.device_index, s.device_type)
        s = _streams.setdefault(data, s)
    return s


def resolve(stream=None):
    """The stream an execution runs on: ``stream`` if given (a ``torch.cuda.Stream``), else
    torch's current stream (None without CUDA)."""
    if stream is not None:
        # torch's own classes only: a subclass's synchronize() or cuda_stream could wait on
        # another stream than the launches go to, and an execution's borrows would end, and its
        # values come back, while its work still runs.
        if type(stream) not in (torch.cuda.Stream, torch.cuda.ExternalStream):
            what = "a subclass of torch.cuda.Stream" if isinstance(stream, torch.cuda.Stream) \
                else f"{type(stream).__name__} {stream!r}"
            raise ArgumentError(f"stream must be a torch.cuda.Stream (or ExternalStream) or None "
                                f"(torch's current stream), got {what}")
        caller = current_on(stream.device)
        if stream != caller:
            stream.wait_stream(caller)
        return stream
    if not cuda_available():
        return None
    return current()


@contextlib.contextmanager
def _switch(stream):
    with torch.cuda.stream(stream):
        yield


_NULL = contextlib.nullcontext()


def current_on(device):
    """torch's current stream on ``device``."""
    if device == torch.device("cuda", torch._C._cuda_getDevice()):
        return current()
    return torch.cuda.current_stream(device)


def using(stream):
    """A context making ``stream`` torch's current stream (so torch work in callbacks and
    graph replays go to it); free when it already is."""
    if stream is None or stream == current_on(stream.device):
        return _NULL
    return _switch(stream)
