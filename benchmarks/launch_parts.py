"""Where one GPU launch's host time goes, part by part: ``bench_launch.py --breakdown``.

Each row is the median over REPEATS of (1000 iterations, then one device synchronize) /
1000, in µs, on bench_launch's tiny add, in the same process as its scenarios:

  a  the C ``launch`` alone with the plan's prepared tuple; Triton's own
     ``CompiledKernel.run`` (CudaLauncher.__call__) with the same arguments
  b  the C launch given the tensors instead of int pointers (the driver validates them)
  c  launch + hand-back (nothing enqueued); with ``_execute`` on a raw handle; the same with
     the C launch stubbed out (the Python floor); the C launch while the GPU is busy
  d  stream lookups, stream context entry, event creation and record, idle synchronize
  e  the scenarios with Python's garbage collector off
  f  CUDA synchronizing calls per op in sync / then / submit (counted by wrapping torch's)
"""
from __future__ import annotations

import asyncio
import gc
import statistics
import time

import torch

import safetile as st
from safetile.backends.triton import pack
from safetile.device import streams

ITERS = 1000
REPEATS = 7


def timed(fn, iters: int = ITERS) -> float:
    """Median µs per iteration of ``fn(iters)`` followed by a device synchronize."""
    fn(10)
    torch.cuda.synchronize()
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn(iters)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def breakdown(add, state: dict, triples: list) -> dict:
    rows: dict = {}

    def row(group, name, us, note=""):
        rows[f"{group} {name}"] = {"us_per_op": us, "note": note}
        print(f"  {group:<2} {name:<52} {us:8.2f}  {note}", flush=True)

    op = add(*state["v"])
    d = op.plan.gpu or (op._prepare() or op.plan.gpu)
    state["v"] = op.sync()
    assert d.c_launch is not None, "the direct C launch path is not in use"
    h = torch.cuda.current_stream().cuda_stream
    gx, gy, gz = d.grid
    c_launch, tail = d.c_launch, d.tail

    def c_alone(n):
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail)
    a_c = timed(c_alone)
    row("a", "C launch, prepared tuple, back-to-back", a_c)
    targs, _ = pack.pack(d.variant.packing, op.plan.bound(state["v"]))
    compiled, run = d.compiled, d.compiled.run

    def triton_run(n):
        for _ in range(n):
            run(gx, gy, gz, h, compiled.function, compiled.packed_metadata, None, None, None,
                *targs)
    row("a", "Triton CompiledKernel.run (CudaLauncher.__call__)", timed(triton_run))
    tail_t = tail[:len(tail) - len(targs)] + tuple(targs)

    def c_tensors(n):
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail_t)
    row("b", "C launch, tensors instead of int pointers", timed(c_tensors))

    def construct(n):
        for _ in range(n):
            o = add(*state["v"])
            o._take()
            o._release()
    t_con = timed(construct)
    row("c", "launch + hand-back, nothing enqueued", t_con)

    def construct_launch(n):
        for _ in range(n):
            o = add(*state["v"])
            o._take()
            o._execute(h)
            o._release()
    row("c", "launch + _execute(raw handle) + hand-back", timed(construct_launch),
        f"sum of parts {t_con + a_c:.2f}")

    def stubbed(n):
        d.c_launch = lambda *a: None
        try:
            construct_launch(n)
        finally:
            d.c_launch = c_launch
    row("c", "  same, C launch stubbed out (Python floor)", timed(stubbed))

    def busy(n=500):
        samples = []
        for _ in range(REPEATS):
            torch.cuda._sleep(40_000_000)          # tens of ms of GPU time queued first
            t0 = time.perf_counter()
            construct_launch(n)
            samples.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        return statistics.median(samples)
    row("c", "launch + _execute + hand-back, GPU busy", busy())

    stream, other, dev = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.current_device()

    def probe(fn):
        def loop(n):
            for _ in range(n):
                fn()
        return loop

    def enter_other(n):
        for _ in range(n):
            with torch.cuda.stream(other):
                pass
    ev = torch.cuda.Event()
    for name, fn in [("torch.cuda.current_stream()", probe(torch.cuda.current_stream)),
                     ("streams.current() (cached objects)", probe(streams.current)),
                     ("torch._C._cuda_getCurrentStream(dev)",
                      probe(lambda: torch._C._cuda_getCurrentStream(dev))),
                     ("with torch.cuda.stream(other): pass", enter_other),
                     ("torch.cuda.Event()", probe(torch.cuda.Event)),
                     ("event.record(stream)", probe(lambda: ev.record(stream))),
                     ("stream.synchronize() (idle)", probe(stream.synchronize))]:
        row("d", name, timed(fn))

    def sync_each(n):
        v = state["v"]
        for _ in range(n):
            v = add(*v).sync()
        state["v"] = v

    def then_chain(n):
        o = add(*state["v"])
        for _ in range(n - 1):
            o = o.then(add)
        state["v"] = o.sync()

    def submit(n):
        async def main():
            futs = [st.submit(add(*t)) for t in triples[:n]]
            triples[:n] = await asyncio.gather(*futs)
        asyncio.run(main())

    for name, fn in [("sync_each", sync_each), ("then_chain", then_chain)]:
        def no_gc(n, fn=fn):
            gc.disable()
            try:
                fn(n)
            finally:
                gc.enable()
        row("e", f"{name}", timed(fn))
        row("e", f"{name}, gc disabled", timed(no_gc))

    counts: dict = {}
    patched = []

    def wrap(owner, attr, label):
        orig = getattr(owner, attr)

        def counting(*a, **k):
            counts[label] = counts.get(label, 0) + 1
            return orig(*a, **k)
        setattr(owner, attr, counting)
        patched.append((owner, attr, orig))
    for owner, attr in [(torch.cuda, "synchronize"), (torch.cuda.Stream, "synchronize"),
                        (torch.cuda.Stream, "query"), (torch.cuda.Event, "record"),
                        (torch.cuda.Event, "synchronize"), (torch.cuda.Event, "query")]:
        wrap(owner, attr, f"{getattr(owner, '__name__', owner)}.{attr}")
    calls = {}
    try:
        for name, fn in [("sync_each", sync_each), ("then_chain", then_chain),
                         ("submit", submit)]:
            counts.clear()
            fn(100)
            calls[name] = {k: v / 100 for k, v in sorted(counts.items())}
            print(f"  f  {name}: per op {calls[name] or 'none'}")
    finally:
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)
    return {"rows": rows, "sync_calls_per_op": calls}
