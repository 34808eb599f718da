"""The ``triton`` backend's host path without a GPU, for ``bench_launch.py --cpu``.

It stubs exactly the parts that need a GPU, and nothing else:

* the compiled binary: ``Variant._load`` returns a stand-in ``CompiledKernel`` whose
  launcher is Triton's real ``CudaLauncher`` Python wrapper with its C ``launch`` replaced by
  a no-op, so every Python step of a launch still runs;
* CUDA streams and events: a fake stream (handle 0) stands in for torch's current stream,
  and ``torch.cuda.Event`` records and synchronizes nothing;
* the backend: ``HostOnlyTriton`` is the Triton backend with CPU tensors allowed (its
  ``device_kind`` is None); it launches through the Triton backend's own code.

Every check (kinds, dtypes, ranks, grids, moves, ``MovedError``, borrows, ``AliasError``)
runs as in production. No kernel runs, so results cannot be checked here: the CPU tests
check the same path end to end on the interpreter, and the GPU run checks every variant.
"""
from __future__ import annotations

import torch

import safetile as st
from safetile import backends
from safetile.backends.triton.compile import Variant
from safetile.device import streams


class HostOnlyTriton(backends.Triton):
    """The Triton backend's launch path on CPU tensors (the binary is a stand-in)."""

    device_kind = None


def _c_launch_stub(*args):
    """Stands in for the C ``launch`` of Triton's generated launcher module."""
    return None


class _FakeCompiled:
    """The parts of ``triton.compiler.CompiledKernel`` the launcher touches."""

    def __init__(self):
        from triton.backends.nvidia.driver import CudaLauncher
        L = object.__new__(CudaLauncher)            # the real __call__, a stub C launch
        L.num_ctas = 1
        L.launch = _c_launch_stub
        L.global_scratch_size = L.profile_scratch_size = 0
        L.global_scratch_align = L.profile_scratch_align = 1
        L.launch_cooperative_grid = False
        L.launch_pdl = False
        self.run = L
        self.function = 0
        self.packed_metadata = (4, 1, 0)

    def launch_metadata(self, grid, stream, *args):
        return None


class _FakeStream:
    cuda_stream = 0
    device = torch.device("cpu")

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass


class _FakeEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def install() -> None:
    """Make the ``triton`` backend's host path run here (for this process)."""
    stream = _FakeStream()
    Variant._load = lambda self, args, grid: _FakeCompiled()
    streams.cuda_available = lambda: True
    streams.current = lambda: stream
    torch.cuda.current_stream = lambda device=None: stream
    torch.cuda.Event = _FakeEvent
    backends._global = HostOnlyTriton("triton")
    assert backends.current().device_kind is None
    st.zeros((1,))                                   # allocation still works on the CPU
