"""Per-op launch cost of safetile DeviceOps on the GPU, against raw Triton and torch eager.

Variants (a tiny safe kernel: z = x + y on 1024 fp32 elements, one tile program):
  sync_each      each op synced on its own            x, y, z = add(x, y, z).sync()
  then_chain     a chain of 1000 ops built with then  (build + one sync) / 1000
  await_1000     1000 independent ops awaited concurrently in one event loop (gather of
                 coroutines that each ``await op``: asyncio makes a Task per coroutine)
  submit_1000    the same ops as ``st.submit(op)`` futures, gathered directly (no Tasks)
  graph_replay   replay of a graph of 1000 recorded ops, per op
and, in the same process, raw Triton ``kernel[grid](...)`` and torch eager ``torch.add(out=)``,
each synced individually and back-to-back (1000 launches, one sync). Host-side parts of the
safetile path are timed separately (launch construction + hand-back; the bare launcher).
Every variant's result is checked against torch before timing. Writes results/launch.json.
"""
from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import harness  # noqa: E402
import safetile as st  # noqa: E402
import safetile.lang as sl  # noqa: E402
from safetile.device.op import RunContext  # noqa: E402

N = 1024
CHAIN = 1000
REPEATS = 7


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@triton.jit
def raw_add(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


def median_us(fn, per: int, repeats: int = REPEATS) -> float:
    return harness.median_us(fn, per, repeats)


def then_chain(state: dict) -> None:
    """A chain of CHAIN adds built with ``then`` on ``state``'s x, y, z, and one sync."""
    op = add(state["x"], state["y"], state["z"])
    for _ in range(CHAIN - 1):
        op = op.then(add)
    x, y, z = op.sync()
    state.update(x=x, y=y, z=z)


def construct(state: dict, iters: int = 1000) -> None:
    """``iters`` adds on ``state``'s x, y, z built and handed back, nothing enqueued."""
    x, y, z = state["x"], state["y"], state["z"]
    for _ in range(iters):
        op = add(x, y, z)
        op._take()
        op._release()


def check_ends(name: str, triples: list, want) -> None:
    """Check the first and last of many (x, y, z) results against ``want``; z stays usable."""
    for i in (0, len(triples) - 1):
        x, y, z = triples[i]
        zt = z.unpartition()
        harness.check_close(name, zt.to_torch(), want, 0)
        triples[i] = (x, y, zt.partition((N,)))


def main() -> int:
    torch.manual_seed(0)
    xt, yt = torch.randn(N, device="cuda"), torch.randn(N, device="cuda")
    want = xt + yt
    rows, results = [], {}

    def record(name, us, note=""):
        results[name] = {"us_per_op": us, "note": note}
        rows.append({"variant": name, "us_per_op": us, "note": note})

    # ---- safetile: each op synced on its own --------------------------------------------
    state = {"x": st.from_torch(xt.clone()), "y": st.from_torch(yt.clone()),
             "z": st.empty((N,), device="cuda").partition((N,))}

    def sync_each(iters=1000):
        x, y, z = state["x"], state["y"], state["z"]
        for _ in range(iters):
            x, y, z = add(x, y, z).sync()
        state.update(x=x, y=y, z=z)

    sync_each(1)
    zt = state["z"].unpartition()
    harness.check_close("sync_each", zt.to_torch(), want, 0)
    state["z"] = zt.partition((N,))
    record("safetile sync_each", median_us(sync_each, 1000), "x,y,z = add(x,y,z).sync()")

    # ---- safetile: a chain of 1000 ops built with then ----------------------------------
    then_chain(state)
    zt = state["z"].unpartition()
    harness.check_close("then_chain", zt.to_torch(), want, 0)
    state["z"] = zt.partition((N,))
    record("safetile then_chain", median_us(lambda: then_chain(state), CHAIN),
           "build + sync of 1000 thens")

    # ---- safetile: 1000 independent ops awaited concurrently ----------------------------
    triples = [(st.from_torch(xt.clone()), st.from_torch(yt.clone()),
                st.empty((N,), device="cuda").partition((N,))) for _ in range(CHAIN)]

    async def gather_all():
        async def one(i):
            triples[i] = await add(*triples[i])
        await asyncio.gather(*(one(i) for i in range(CHAIN)))

    def await_1000():
        asyncio.run(gather_all())

    await_1000()
    check_ends("await_1000", triples, want)
    record("safetile await_1000", median_us(await_1000, CHAIN),
           "asyncio.gather of 1000 coroutines, each `await op` (a Task per op; incl. loop start)")

    async def gather_futures():
        futs = [st.submit(add(*t)) for t in triples]
        triples[:] = await asyncio.gather(*futs)

    def submit_1000():
        asyncio.run(gather_futures())

    submit_1000()
    check_ends("submit_1000", triples, want)
    record("safetile submit_1000", median_us(submit_1000, CHAIN),
           "asyncio.gather of 1000 st.submit(op) futures (no Task per op; incl. loop start)")

    # ---- safetile: graph replay of 1000 recorded ops ------------------------------------
    x, y, z = state["x"], state["y"], state["z"]
    with st.graph_scope() as scope:
        for _ in range(CHAIN):
            x, y, z = scope.record(add(x, y, z))
    g = scope.graph

    def replay():
        g.launch().sync()

    replay()
    zt = z.unpartition()
    harness.check_close("graph_replay", zt.to_torch(), want, 0)
    record("safetile graph_replay", median_us(replay, CHAIN), "g.launch().sync() of 1000")
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(REPEATS):
        ev0.record()
        g._cuda.replay()
        ev1.record()
        ev1.synchronize()
        gpu.append(ev0.elapsed_time(ev1) * 1e3 / CHAIN)
    record("graph_replay gpu time", statistics.median(gpu), "CUDA events around replay()")
    state["z"] = zt.partition((N,))

    # ---- host-side parts of the safetile path -------------------------------------------
    record("host: launch() + hand-back", median_us(lambda: construct(state), 1000),
           "checks, borrows, moves, KernelOp; nothing enqueued")
    op = add(state["x"], state["y"], state["z"])
    ctx = RunContext(torch.cuda.current_stream())

    def bare(iters=1000):
        for _ in range(iters):
            op._execute(ctx.handle)
        torch.cuda.synchronize()

    record("host: bare launcher back-to-back", median_us(bare, 1000),
           "KernelOp._execute: variant + args + binary launch")
    op.sync()

    # ---- raw Triton and torch eager -----------------------------------------------------
    zr = torch.empty(N, device="cuda")

    def triton_each(iters=1000):
        for _ in range(iters):
            raw_add[(1,)](xt, yt, zr, N, BLOCK=N)
            torch.cuda.synchronize()

    def triton_b2b(iters=1000):
        for _ in range(iters):
            raw_add[(1,)](xt, yt, zr, N, BLOCK=N)
        torch.cuda.synchronize()

    def torch_each(iters=1000):
        for _ in range(iters):
            torch.add(xt, yt, out=zr)
            torch.cuda.synchronize()

    def torch_b2b(iters=1000):
        for _ in range(iters):
            torch.add(xt, yt, out=zr)
        torch.cuda.synchronize()

    for name, fn in [("triton kernel[grid] sync_each", triton_each),
                     ("triton kernel[grid] back_to_back", triton_b2b),
                     ("torch.add sync_each", torch_each), ("torch.add back_to_back", torch_b2b)]:
        zr.zero_()
        fn(1)
        harness.check_close(name, zr, want, 0)
        record(name, median_us(fn, 1000))

    if "--profile" in sys.argv:           # where the host time goes, per variant
        import cProfile
        import io
        import os
        import pstats
        report = io.StringIO()
        for name, fn in [("sync_each", sync_each), ("then_chain", lambda: then_chain(state)),
                         ("await_1000", await_1000), ("bare launcher", bare)]:
            prof = cProfile.Profile()
            if fn is bare:
                op = add(state["x"], state["y"], state["z"])
                prof.runcall(fn)
                op.sync()
            else:
                prof.runcall(fn)
            report.write(f"==== {name}\n")
            pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(14)
        out = Path(os.environ.get("OUT") or harness.RESULTS)
        (out / "launch_profile.txt").write_text(report.getvalue())

    targets = {"safetile sync_each": 12.0, "safetile then_chain": 5.0,
               "safetile await_1000": 5.0, "safetile submit_1000": 5.0,
               "safetile graph_replay": 1.0}
    for name, t in targets.items():
        results[name]["target_us"] = t
        results[name]["meets_target"] = results[name]["us_per_op"] <= t
    path = harness.write_results("launch", {"n": N, "chain": CHAIN, "repeats": REPEATS,
                                            "results": results})
    print(f"wrote {path}")
    harness.print_table(rows, ["variant", "us_per_op", "note"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
