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
  g  the driver's floor: the plan's binary launched through ctypes with a parameter array
     built once (cuLaunchKernel, cuLaunchKernelEx with and without the PDL attribute, with
     and without releasing the GIL), and a ctypes call of a C function that does nothing
"""
from __future__ import annotations

import asyncio
import ctypes
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
    d = op._plan.gpu or (op._prepare() or op._plan.gpu)
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
    targs, _ = pack.pack(d.variant.packing, op._plan.bound(state["v"]))
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
    driver_floor(d, [t._torch for t in state["v"]], row)
    return {"rows": rows, "sync_calls_per_op": calls}


_C_TYPES = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16,
            "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u1": ctypes.c_uint8,
            "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
            "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "fp64": ctypes.c_double}


# DirectLaunch.tail: function, cooperative, pdl, two hooks, packed metadata and three more
# launcher fields, then the kernel's own arguments.
LAUNCHER_FIELDS = 9


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def driver_floor(d, tensors: list, row) -> None:
    """Group g: the plan's binary launched through the driver from ctypes, with its kernel
    parameter array built once (the launch a compiled fast path would make), checked first."""
    compiled = d.compiled
    sig = list(compiled.src.signature.values())
    values = d.tail[LAUNCHER_FIELDS:]
    slots = [_C_TYPES["u64" if ty.startswith("*") else ty](v)
             for ty, v in zip(sig, values) if ty != "constexpr"]
    slots += [ctypes.c_uint64(0), ctypes.c_uint64(0)]          # global and profile scratch
    params = (ctypes.c_void_p * len(slots))(*[ctypes.addressof(s) for s in slots])
    warps, ctas, shared = compiled.packed_metadata
    gx, gy, gz = d.grid
    h = torch.cuda.current_stream().cuda_stream
    launches, keep = {}, []
    for name, lib in (("releases the GIL", ctypes.CDLL("libcuda.so.1")),
                      ("holds the GIL", ctypes.PyDLL("libcuda.so.1"))):
        f = lib.cuLaunchKernel
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        launches[f"cuLaunchKernel, {name}"] = (lambda f=f: f(compiled.function, gx, gy, gz,
                                                            32 * warps, 1, 1, shared, h,
                                                            params, None))
        fx = lib.cuLaunchKernelEx
        fx.restype = ctypes.c_int
        fx.argtypes = [ctypes.c_void_p] * 4
        for pdl in (False, True):
            attr = (_LaunchAttribute * 1)()
            attr[0].id, attr[0].value[0] = 6, 1      # PROGRAMMATIC_STREAM_SERIALIZATION = 1
            cfg = _LaunchConfig((gx * ctas, gy, gz), (32 * warps, 1, 1), shared, h, attr,
                                1 if pdl else 0)
            keep.append((attr, cfg))
            ref = ctypes.byref(cfg)
            launches[f"cuLaunchKernelEx{' + PDL' if pdl else ''}, {name}"] = \
                (lambda fx=fx, ref=ref: fx(ref, compiled.function, params, None))
    x, y, z = tensors
    for name, launch in launches.items():
        z.fill_(-1.0)
        rc = launch()
        torch.cuda.synchronize()
        if rc != 0 or not torch.equal(z, x + y):
            raise AssertionError(f"driver floor: {name} returned {rc} or a wrong sum")

        def loop(n, launch=launch):
            for _ in range(n):
                launch()
        row("g", name, timed(loop))
    nothing = ctypes.CDLL(None).getpid
    row("g", "ctypes call of getpid (the ctypes floor)", timed(lambda n: [nothing()
                                                                          for _ in range(n)]))
