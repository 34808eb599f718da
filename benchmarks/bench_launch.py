"""Per-op host cost of safetile DeviceOps, against raw Triton and torch eager, in one process.

Scenarios (a tiny safe kernel: z = x + y on 1024 fp32 elements, one tile program):
  sync_each      each op synced on its own            x, y, z = add(x, y, z).sync()
  then_chain     a chain of 1000 ops built with then  (build + one sync) / 1000
  in_flight      1000 independent ops built (their borrows all held), then each synced
  await_1000     1000 independent ops awaited concurrently in one event loop (gather of
                 coroutines that each ``await op``: asyncio makes a Task per coroutine)
  submit_1000    the same ops as ``st.submit(op)`` futures, gathered directly (no Tasks)
  graph_replay   replay of a graph of 1000 recorded ops, per op (GPU only)
  with_shared    sync_each while 400 ``Shared`` values of assorted sizes hold read borrows
                 (as a model's weights do), measured alternately with sync_each without
                 them (``SHARED_ROUNDS`` rounds; the host's speed drifts by tens of percent
                 over a run): its ``ratio_to_sync_each`` is the median of the rounds' ratios
  construct      launch + hand-back, nothing enqueued; bare: ``op._execute`` alone
and the peers: raw Triton ``kernel[grid](...)`` and ``torch.add(out=)``, each synced on its
own and back to back. Every GPU variant's result is checked against torch before timing.

Flags:
  --cpu        the ``triton`` backend's host path on this machine, without a GPU
               (``host_only.py``: a stand-in binary, nothing launched); peer: torch.add on
               CPU tensors. Writes results/launch_cpu.json.
  --breakdown  where a GPU launch's time goes, part by part (``launch_parts.py``)
  --profile    cProfile of each scenario: the functions and source files a cached launch
               enters, and the top entries by own time
Writes results/launch.json (GPU) with ratios to torch.add, and a plot.
"""
from __future__ import annotations

import asyncio
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import harness  # noqa: E402
import safetile as st  # noqa: E402
import safetile.lang as sl  # noqa: E402

N = 1024
CHAIN = 1000
REPEATS = 7
SRC = str(Path(__file__).resolve().parent.parent / "src" / "safetile")


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def scenarios(device: str, sync) -> tuple[dict, dict]:
    """The safetile scenarios on ``device`` (name -> (fn, ops per call)) and their state."""
    def fresh():
        return (st.randn((N,), device=device), st.randn((N,), device=device),
                st.empty((N,), device=device).partition((N,)))
    state = {"v": fresh()}
    triples = [fresh() for _ in range(CHAIN)]

    def sync_each(iters=CHAIN):
        x, y, z = state["v"]
        for _ in range(iters):
            x, y, z = add(x, y, z).sync()
        state["v"] = (x, y, z)

    def then_chain():
        op = add(*state["v"])
        for _ in range(CHAIN - 1):
            op = op.then(add)
        state["v"] = op.sync()

    def in_flight():
        ops = [add(*t) for t in triples]
        for i, op in enumerate(ops):
            triples[i] = op.sync()

    loop = asyncio.new_event_loop()

    async def gather_tasks():
        async def one(i):
            triples[i] = await add(*triples[i])
        await asyncio.gather(*(one(i) for i in range(CHAIN)))

    async def gather_futures():
        futs = [st.submit(add(*t)) for t in triples]
        triples[:] = await asyncio.gather(*futs)

    def weights():
        return [st.randn((1 << (8 + i % 12),), device=device).share() for i in range(400)]

    def construct(iters=CHAIN):
        x, y, z = state["v"]
        for _ in range(iters):
            op = add(x, y, z)
            op._take()
            op._release()

    def bare(iters=CHAIN):
        op = add(*state["v"])
        for _ in range(iters):
            op._execute(0 if device == "cpu" else torch.cuda.current_stream().cuda_stream)
        sync()
        state["v"] = op.sync()

    return {"sync_each": (sync_each, CHAIN), "then_chain": (then_chain, CHAIN),
            "in_flight": (in_flight, CHAIN),
            "await_1000": (lambda: loop.run_until_complete(gather_tasks()), CHAIN),
            "submit_1000": (lambda: loop.run_until_complete(gather_futures()), CHAIN),
            "construct": (construct, CHAIN), "bare": (bare, CHAIN)}, \
        {"state": state, "triples": triples, "weights": weights}


SHARED_ROUNDS = 3


def with_shared(fns: dict, st_state: dict) -> dict:
    """sync_each with and without 400 Shared values held, alternating: the figure with them,
    and the median ratio of the two over the rounds."""
    sync_each = fns["sync_each"][0]
    without, with_, ratios = [], [], []
    for _ in range(SHARED_ROUNDS):
        without.append(median_us(sync_each, CHAIN))
        held = st_state["weights"]()
        sync_each()
        with_.append(median_us(sync_each, CHAIN))
        del held
        ratios.append(with_[-1] / without[-1])
    return {"us_per_op": statistics.median(with_), "note": "400 Shared values held",
            "ratio_to_sync_each": statistics.median(ratios),
            "rounds": [{"without": a, "with": b} for a, b in zip(without, with_)]}


def torch_peers(device: str, sync) -> dict:
    xt, yt, zt = (torch.randn(N, device=device) for _ in range(3))

    def each():
        for _ in range(CHAIN):
            torch.add(xt, yt, out=zt)
            sync()

    def b2b():
        for _ in range(CHAIN):
            torch.add(xt, yt, out=zt)
        sync()
    return {"torch.add sync_each": (each, CHAIN), "torch.add back_to_back": (b2b, CHAIN)}


def check(name: str, values, want) -> None:
    x, y, z = values
    harness.check_close(name, z._torch, want(x._torch, y._torch), 0)


def profile(fns: dict) -> dict:
    """Per scenario: calls and source files of src/safetile entered per op, top entries."""
    import cProfile
    import pstats
    out = {}
    for name, (fn, per) in fns.items():
        fn()
        prof = cProfile.Profile()
        prof.runcall(fn)
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())            # primitive calls
        ours = {k[0] for k in stats.stats if k[0].startswith(SRC)}
        top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:12]
        out[name] = {"calls_per_op": round(calls / per, 1),
                     "safetile_files": sorted(f[len(SRC) + 1:] for f in ours),
                     "top_own_time": [f"{Path(k[0]).name}:{k[1]}({k[2]}) {v[1] / per:.1f}/op"
                                      for k, v in top]}
        print(f"{name}: {out[name]['calls_per_op']} calls/op, {len(ours)} safetile files")
        for line in out[name]["top_own_time"]:
            print("    " + line)
    return out


def run_cpu() -> int:
    import host_only
    host_only.install()
    fns, st_state = scenarios("cpu", lambda: None)
    rows, results = [], {}
    peers = torch_peers("cpu", lambda: None)
    for name, (fn, per) in {**{f"safetile {k}": v for k, v in fns.items()}, **peers}.items():
        results[name] = {"us_per_op": median_us(fn, per)}
        rows.append({"variant": name, "us_per_op": results[name]["us_per_op"]})
    results["safetile with_shared"] = shared = with_shared(fns, st_state)
    rows.append({"variant": "safetile with_shared", "us_per_op": shared["us_per_op"]})
    payload = {"mode": "cpu host path (no kernel runs)", "n": N, "chain": CHAIN,
               "repeats": REPEATS, "results": results}
    if "--profile" in sys.argv:
        payload["profile"] = profile({k: fns[k] for k in ("sync_each", "then_chain",
                                                          "construct")})
    path = harness.write_results("launch_cpu", payload)
    plot(results, "launch_cpu")
    harness.print_table(rows, ["variant", "us_per_op"])
    print(f"wrote {path}")
    return 0


def median_us(fn, per: int) -> float:
    return harness.median_us(fn, per, REPEATS)


def run_gpu() -> int:
    import triton
    import triton.language as tl

    @triton.jit
    def raw_add(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m),
                 mask=m)

    torch.manual_seed(0)
    sync = torch.cuda.synchronize
    fns, st_state = scenarios("cuda", sync)
    state, triples = st_state["state"], st_state["triples"]
    results, rows = {}, []

    def record(name, us, note=""):
        results[name] = {"us_per_op": us, "note": note}
        rows.append({"variant": name, "us_per_op": us, "note": note})

    for name, (fn, per) in fns.items():
        fn()
        check(name, state["v"] if name in ("sync_each", "then_chain", "construct", "bare")
              else triples[-1], torch.add)
        record(f"safetile {name}", median_us(fn, per))
    shared = with_shared(fns, st_state)
    check("with_shared", state["v"], torch.add)
    record("safetile with_shared", shared["us_per_op"],
           f"400 Shared values held: {shared['ratio_to_sync_each']:.3f}x sync_each, alternating")
    results["safetile with_shared"].update(shared)

    x, y, z = state["v"]
    with st.graph_scope() as scope:
        for _ in range(CHAIN):
            x, y, z = scope.record(add(x, y, z))
    g = scope.graph
    g.launch().sync()
    harness.check_close("graph_replay", z._torch, x._torch + y._torch, 0)
    record("safetile graph_replay", median_us(lambda: g.launch().sync(), CHAIN),
           "g.launch().sync() of 1000")
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(REPEATS):
        ev0.record()
        g._cuda.replay()
        ev1.record()
        ev1.synchronize()
        gpu.append(ev0.elapsed_time(ev1) * 1e3 / CHAIN)
    record("graph_replay gpu time", statistics.median(gpu), "CUDA events around replay()")

    xt, yt, zr = (torch.randn(N, device="cuda") for _ in range(3))

    def triton_each():
        for _ in range(CHAIN):
            raw_add[(1,)](xt, yt, zr, N, BLOCK=N)
            sync()

    def triton_b2b():
        for _ in range(CHAIN):
            raw_add[(1,)](xt, yt, zr, N, BLOCK=N)
        sync()
    peers = {"triton kernel[grid] sync_each": (triton_each, CHAIN),
             "triton kernel[grid] back_to_back": (triton_b2b, CHAIN)}
    for name, (fn, per) in {**peers, **torch_peers("cuda", sync)}.items():
        record(name, median_us(fn, per))

    # The targets of the launch path, as ratios to torch.add in this very process.
    eager, b2b = results["torch.add sync_each"]["us_per_op"], \
        results["torch.add back_to_back"]["us_per_op"]
    targets = {"safetile sync_each": (eager, 0.8), "safetile then_chain": (b2b, 1.0),
               "safetile submit_1000": (b2b, 1.5), "safetile await_1000": (b2b, 2.0)}
    for name, (peer, ratio) in targets.items():
        r = results[name]
        r["ratio_to_torch"] = r["us_per_op"] / peer
        r["target_ratio"] = ratio
        r["meets_target"] = r["ratio_to_torch"] <= ratio
    results["safetile graph_replay"]["meets_target"] = \
        results["safetile graph_replay"]["us_per_op"] <= 1.0
    payload = {"n": N, "chain": CHAIN, "repeats": REPEATS, "results": results}
    if "--breakdown" in sys.argv:
        import launch_parts
        payload["breakdown"] = launch_parts.breakdown(add, state, triples)
    if "--profile" in sys.argv:
        payload["profile"] = profile({k: fns[k] for k in ("sync_each", "then_chain",
                                                          "submit_1000", "bare")})
    path = harness.write_results("launch", payload)
    plot(results)
    harness.print_table(rows, ["variant", "us_per_op", "note"])
    print(f"wrote {path}")
    return 0


def plot(results: dict, name: str = "launch") -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [n for n in results if n != "graph_replay gpu time"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(names, [results[n]["us_per_op"] for n in names])
    ax.set_xlabel("µs per op (host, median)")
    ax.invert_yaxis()
    fig.tight_layout()
    harness.save_figure(fig, harness.RESULTS / f"{name}.png")


if __name__ == "__main__":
    if "--cpu" in sys.argv:
        sys.exit(run_cpu())
    if not harness.start_gpu("bench_launch"):
        sys.exit(0)
    sys.exit(run_gpu())
