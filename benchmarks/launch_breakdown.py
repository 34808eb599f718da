"""Where the per-op time of a safetile launch goes on the GPU host: each part timed alone,
in one process, on the tiny safe add of bench_launch.py (1024 fp32, one tile program).

Each row is the median over REPEATS of (1000 iterations, then one device synchronize) / 1000,
in µs. The questions (a..f) it answers:

  a  the C ``launch`` alone with a prepared tuple, back-to-back; Triton's own
     ``CompiledKernel.run`` (CudaLauncher.__call__) with the same arguments
  b  the C launch given int pointers vs the tensors (data_ptr + cuPointerGetAttribute)
  c  launch() + hand-back with no stream context; the same interleaved with the C launch;
     with the C launch stubbed out (the Python floor on this host); the C launch interleaved
     with a pure spin of the same length (separates "the GPU/driver is idle between
     launches" from "Python evicts the driver's code and data from the caches")
  d  stream lookups, stream context entry, event creation and record, synchronize, query
  e  Python GC (gc.disable during the loop) and allocation churn (gc counts per op)
  f  CUDA synchronizing calls per op in sync()/then/await (counted by wrapping torch's)

Runs in well under a minute. Usage: ``PYTHONPATH=src python benchmarks/launch_breakdown.py``.
"""
from __future__ import annotations

import asyncio
import datetime
import gc
import statistics
import sys
import threading
import time

import torch

import safetile as st
import safetile.lang as sl
from safetile.device import streams

N = 1024
ITERS = 1000
REPEATS = 7


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def timed(fn, iters: int = ITERS, repeats: int = REPEATS) -> float:
    """Median µs per iteration of fn(iters) followed by a device synchronize."""
    fn(10)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(iters)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    return statistics.median(samples)


def spin_us(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


rows: list[tuple[str, str, float, str]] = []


def row(group: str, name: str, us: float, note: str = "") -> None:
    rows.append((group, name, us, note))
    print(f"  {group:<2} {name:<52} {us:8.2f}  {note}", flush=True)


def main() -> int:
    torch.manual_seed(0)
    dev = torch.cuda.current_device()
    x = st.from_torch(torch.randn(N, device="cuda"))
    y = st.from_torch(torch.randn(N, device="cuda"))
    z = st.empty((N,), device="cuda").partition((N,))
    state = {"v": (x, y, z)}
    x, y, z = add(x, y, z).sync()                  # compile, load, make the plan
    op = add(x, y, z)
    plan = op.plan
    d = plan.gpu
    op.sync()
    assert d is not None and d.c_launch is not None, "the direct C launch path is not in use"
    stream = torch.cuda.current_stream()
    h = stream.cuda_stream
    gx, gy, gz = d.grid
    c_launch, tail = d.c_launch, d.tail
    print(f"{torch.cuda.get_device_name()}  {datetime.datetime.now().isoformat(timespec='seconds')}"
          f"  python {sys.version.split()[0]}  torch {torch.__version__}")
    print(f"threads: {[t.name for t in threading.enumerate()]}  gc thresholds "
          f"{gc.get_threshold()}  current stream handle {h:#x}")

    # ---- a: the C launch alone -----------------------------------------------------------
    def c_alone(n):
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail)
    a_c = timed(c_alone)
    row("a", "C launch, prepared tuple, back-to-back", a_c)

    compiled = d.compiled
    from safetile.device.launcher import _bound, launcher_for
    bound = _bound(plan, (x, y, z))
    targs, _ = launcher_for(add, bound).args(bound)
    run = compiled.run

    def triton_run(n):
        for _ in range(n):
            run(gx, gy, gz, h, compiled.function, compiled.packed_metadata, None, None, None,
                *targs)
    row("a", "Triton CompiledKernel.run (CudaLauncher.__call__)", timed(triton_run))

    # ---- b: int pointers vs tensors ------------------------------------------------------
    n_fixed = len(tail) - len(targs)
    tail_t = tail[:n_fixed] + tuple(targs)

    def c_tensors(n):
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail_t)
    row("b", "C launch, tensors instead of int pointers", timed(c_tensors))

    # ---- c: launch() + hand-back, interleaving ------------------------------------------
    def construct(n):
        a, b, c = state["v"]
        for _ in range(n):
            o = add(a, b, c)
            o._take()
            o._release()
    t_con = timed(construct)
    row("c", "launch() + hand-back, nothing enqueued", t_con)

    def construct_launch(n):
        a, b, c = state["v"]
        for _ in range(n):
            o = add(a, b, c)
            o._take()
            o._execute(h)
            o._release()
    t_cl = timed(construct_launch)
    row("c", "launch() + _execute(raw handle) + hand-back", t_cl,
        f"sum of parts {t_con + a_c:.2f}")

    def stubbed(fn):
        def run_stubbed(n):
            d.c_launch = lambda *a: None
            try:
                fn(n)
            finally:
                d.c_launch = c_launch
        return run_stubbed
    row("c", "  same, C launch stubbed out (Python floor)", timed(stubbed(construct_launch)))

    def c_spin(n):
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail)
            spin_us(t_con)
    t_cs = timed(c_spin)
    row("c", f"C launch + {t_con:.1f} us pure spin", t_cs, f"sum of parts {t_con + a_c:.2f}")

    def c_construct_other(n):             # Python work between launches, launches prepared
        a, b, c = state["v"]
        for _ in range(n):
            c_launch(gx, gy, gz, h, *tail)
            o = add(a, b, c)
            o._take()
            o._release()
    row("c", "C launch (prepared) + launch()/hand-back (Python)", timed(c_construct_other),
        f"sum of parts {t_con + a_c:.2f}")

    def busy_gpu(fn, n=500):
        """Host µs per iteration of fn(n) while the GPU is busy (a long sleep kernel queued
        first), measured before synchronizing: launches only queue, the GPU is never idle."""
        samples = []
        for _ in range(REPEATS):
            torch.cuda._sleep(40_000_000)          # tens of ms of GPU time
            t0 = time.perf_counter()
            fn(n)
            samples.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        return statistics.median(samples)
    row("c", "C launch alone, GPU busy", busy_gpu(c_alone))
    row("c", "launch() + _execute + hand-back, GPU busy", busy_gpu(construct_launch))

    xt, yt, zt = (torch.randn(N, device="cuda") for _ in range(3))

    def torch_add(n):
        for _ in range(n):
            torch.add(xt, yt, out=zt)
    t_ta = timed(torch_add)
    row("c", "torch.add back-to-back", t_ta)

    def torch_add_python(n):
        a, b, c = state["v"]
        for _ in range(n):
            torch.add(xt, yt, out=zt)
            o = add(a, b, c)
            o._take()
            o._release()
    row("c", "torch.add + launch()/hand-back (Python)", timed(torch_add_python),
        f"sum of parts {t_con + t_ta:.2f}")

    # ---- d: streams and events -----------------------------------------------------------
    other = torch.cuda.Stream()
    probes = {
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(),
        "streams.current() (cached objects)": streams.current,
        "torch._C._cuda_getCurrentStream(dev)": lambda: torch._C._cuda_getCurrentStream(dev),
        "stream.cuda_stream": lambda: stream.cuda_stream,
        "with torch.cuda.stream(other): pass": None,        # timed as a with-block below
        "torch.cuda.Event()": torch.cuda.Event,
        "stream.query() (idle)": stream.query,
        "stream.synchronize() (idle)": stream.synchronize,
        "torch.cuda.synchronize() (idle)": torch.cuda.synchronize,
    }

    for name, fn in probes.items():
        if fn is None:
            def ctx_cost(n):
                for _ in range(n):
                    with torch.cuda.stream(other):
                        pass
            row("d", name, timed(ctx_cost))
            continue

        def probe(n, fn=fn):
            for _ in range(n):
                fn()
        row("d", name, timed(probe))
    ev = torch.cuda.Event()

    def ev_record(n):
        for _ in range(n):
            ev.record(stream)
    row("d", "event.record(stream)", timed(ev_record))

    # ---- the DeviceOp paths, and e: GC ----------------------------------------------------
    def sync_each(n):
        a, b, c = state["v"]
        for _ in range(n):
            a, b, c = add(a, b, c).sync()
        state["v"] = (a, b, c)

    def then_chain(n):
        o = add(*state["v"])
        for _ in range(n - 1):
            o = o.then(add)
        state["v"] = o.sync()

    def without_gc(fn):
        def run_nogc(n):
            gc.disable()
            try:
                fn(n)
            finally:
                gc.enable()
        return run_nogc

    for name, fn in [("sync_each", sync_each), ("then_chain", then_chain)]:
        row("e", f"{name}", timed(fn))
        row("e", f"{name}, gc disabled", timed(without_gc(fn)))
        row("e", f"{name}, C launch stubbed (Python floor)", timed(stubbed(fn)))
        gc.collect()
        before = [s["collections"] for s in gc.get_stats()]
        fn(ITERS)
        after = [s["collections"] for s in gc.get_stats()]
        print(f"     {name}: gc collections per 1000 ops (gen0, gen1, gen2) = "
              f"{tuple(a - b for a, b in zip(after, before))}")

    other_stream = torch.cuda.Stream()

    def then_chain_other(n):
        o = add(*state["v"])
        for _ in range(n - 1):
            o = o.then(add)
        state["v"] = o.sync(stream=other_stream)
    row("e", "then_chain on a created (non-default) stream", timed(then_chain_other))

    triples = [(st.from_torch(torch.randn(N, device="cuda")),
                st.from_torch(torch.randn(N, device="cuda")),
                st.empty((N,), device="cuda").partition((N,))) for _ in range(ITERS)]

    def await_tasks(n):
        async def one(i):
            triples[i] = await add(*triples[i])

        async def main_():
            await asyncio.gather(*(one(i) for i in range(n)))
        asyncio.run(main_())

    def await_futures(n):
        async def main_():
            futs = [st.submit(add(*triples[i])) for i in range(n)]
            triples[:n] = await asyncio.gather(*futs)
        asyncio.run(main_())
    row("e", "1000 awaits: gather of coroutines (a Task per op)", timed(await_tasks))
    row("e", "1000 awaits: gather of st.submit futures", timed(await_futures))

    def asyncio_floor(n):
        async def main_():
            loop = asyncio.get_running_loop()
            futs = [loop.create_future() for _ in range(n)]

            async def one(f):
                return await f
            loop.call_soon(lambda: [f.set_result(None) for f in futs])
            await asyncio.gather(*(one(f) for f in futs))
        asyncio.run(main_())
    row("e", "asyncio floor: gather of coroutines on plain futures", timed(asyncio_floor))

    # ---- f: synchronizing CUDA calls per op ----------------------------------------------
    counts: dict[str, int] = {}
    patched = []

    def wrap(owner, attr, label):
        orig = getattr(owner, attr)

        def counting(*a, **k):
            counts[label] = counts.get(label, 0) + 1
            return orig(*a, **k)
        setattr(owner, attr, counting)
        patched.append((owner, attr, orig))

    wrap(torch.cuda, "synchronize", "torch.cuda.synchronize")
    wrap(torch.cuda, "current_stream", "torch.cuda.current_stream")
    wrap(torch.cuda.Stream, "synchronize", "Stream.synchronize")
    wrap(torch.cuda.Stream, "query", "Stream.query")
    wrap(torch.cuda.Event, "record", "Event.record")
    wrap(torch.cuda.Event, "synchronize", "Event.synchronize")
    wrap(torch.cuda.Event, "query", "Event.query")
    try:
        for name, fn in [("sync_each", sync_each), ("then_chain", then_chain),
                         ("await (gather of futures)", await_futures)]:
            counts.clear()
            fn(100)
            print(f"  f  {name}: per 100 ops {dict(sorted(counts.items())) or 'none'}")
    finally:
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)

    print("\nsummary (µs per op)")
    for group, name, us, note in rows:
        print(f"  {group:<2} {name:<52} {us:8.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
