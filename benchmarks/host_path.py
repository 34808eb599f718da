"""Host-side cost of the safetile launch path, measured on a machine WITHOUT a GPU.

Benchmark-only harness: it makes the ``triton`` backend's host path runnable on the CPU by
stubbing exactly the parts that need a GPU, and nothing else:

* the compiled binary: ``launcher._compile`` returns a stand-in ``CompiledKernel`` whose
  launcher is Triton's real ``CudaLauncher`` Python wrapper with its C ``launch`` replaced by
  a no-op (``_c_launch_stub``), so Triton's per-launch Python still runs;
* CUDA streams and events: a ``_FakeStream`` (handle 0, ``synchronize`` a no-op) stands in
  for ``torch.cuda.current_stream()``, and ``torch.cuda.Event`` records/synchronizes nothing;
* the launch-time device check ("the triton backend runs on CUDA tensors") is told the
  tensors are fine (they are CPU tensors here).

Every other check (kinds, dtypes, ranks, grids, moves, ``MovedError``, borrow holds,
``AliasError``) runs as in production. Scenarios, per op (µs):

  construct     op = add(x, y, z); op._take(); op._release()     (launch + hand-back)
  bare          op._execute(0) on one op                          (launcher only)
  sync_each     x, y, z = add(x, y, z).sync()
  then_chain    a 1000-op ``then`` chain, build + sync
  in_flight     1000 independent ops built (1000 x 3 borrows held), then run and settled
  await_1000    asyncio.gather of 1000 coroutines awaiting one op each (a Task per op)
  submit_1000   asyncio.gather of 1000 ``st.submit(op)`` futures (no Task per op)
  (both with fake events: the work completes at once)

Usage: ``PYTHONPATH=src python benchmarks/host_path.py [--profile SCENARIO]``.
"""
from __future__ import annotations

import asyncio
import sys

import torch

import harness  # noqa: F401  (puts src/ on sys.path)
import safetile as st
from safetile.device import launcher, streams
from safetile.kernel import launch as launch_mod

from bench_launch import (CHAIN, N, add, median_us,  # the same kernel and sizes as on the GPU
                          construct, then_chain)


# ---- stubs (benchmark only) -------------------------------------------------------------
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
        self._run = L
        self.function = 0
        self.packed_metadata = (4, 1, 0)

    @property
    def run(self):
        return self._run

    def _init_handles(self):
        pass

    def launch_metadata(self, grid, stream, *args):
        return None


class _FakeStream:
    cuda_stream = 0
    device = torch.device("cpu")

    def synchronize(self):
        pass

    def wait_event(self, event):
        pass

    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__


class _FakeEvent:
    def __init__(self, *a, **k):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


_STREAM = _FakeStream()


def install_stubs() -> None:
    launcher._compile = lambda variant, args, grid, options: _FakeCompiled()
    streams._cuda[0] = True
    torch.cuda.current_stream = lambda device=None: _STREAM
    if hasattr(streams, "current"):
        streams.current = lambda: _STREAM
    torch.cuda.Event = _FakeEvent
    real_check = launch_mod.check_launch
    launch_mod.check_launch = lambda kernel, bound, device_kind: real_check(kernel, bound, None)
    st.set_backend("triton")


# ---- scenarios --------------------------------------------------------------------------
def main() -> int:
    install_stubs()
    state = {"x": st.randn((N,)), "y": st.randn((N,)), "z": st.empty((N,)).partition((N,))}

    def bare(iters=1000):
        op = add(state["x"], state["y"], state["z"])
        for _ in range(iters):
            op._execute(0)
        op.sync()

    def sync_each(iters=1000):
        x, y, z = state["x"], state["y"], state["z"]
        for _ in range(iters):
            x, y, z = add(x, y, z).sync()
        state.update(x=x, y=y, z=z)

    triples = [(st.randn((N,)), st.randn((N,)), st.empty((N,)).partition((N,)))
               for _ in range(CHAIN)]

    def in_flight():
        ops = [add(*t) for t in triples]
        for i, op in enumerate(ops):
            triples[i] = op.sync()

    async def gather_all():
        async def one(i):
            triples[i] = await add(*triples[i])
        await asyncio.gather(*(one(i) for i in range(CHAIN)))

    async def gather_futures():
        futs = [st.submit(add(*t)) for t in triples]
        triples[:] = await asyncio.gather(*futs)

    loop = asyncio.new_event_loop()

    def await_1000():
        loop.run_until_complete(gather_all())

    def submit_1000():
        loop.run_until_complete(gather_futures())

    scenarios = {"construct": (lambda: construct(state), 1000), "bare": (bare, 1000),
                 "sync_each": (sync_each, 1000), "then_chain": (lambda: then_chain(state), CHAIN),
                 "in_flight": (in_flight, CHAIN), "await_1000": (await_1000, CHAIN),
                 "submit_1000": (submit_1000, CHAIN)}
    if "--profile" in sys.argv:
        import cProfile
        import pstats
        name = sys.argv[sys.argv.index("--profile") + 1]
        fn = scenarios[name][0]
        fn()
        prof = cProfile.Profile()
        prof.runcall(fn)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    print(f"{'scenario':<12} {'us/op':>8}")
    for name, (fn, per) in scenarios.items():
        print(f"{name:<12} {median_us(fn, per):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
