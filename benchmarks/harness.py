"""Shared benchmark harness: environment facts, timing, correctness gates, JSON results.

Every benchmark runs all its variants in one process, checks each one against a reference
before timing it, times with CUDA events (median of repeated runs after warm-up), and writes
one JSON file under ``benchmarks/results/`` (and, when ``$OUT`` is set, a copy there).
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def env_info() -> dict:
    """GPU, library versions and date, recorded with every result."""
    import triton
    import safetile
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "safetile": safetile.__version__,
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count,
                    gpu_memory_gib=round(p.total_memory / 2**30, 1))
    else:
        info["gpu"] = None
    return info


def time_ms(fn, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in milliseconds, measured with CUDA events."""
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


_CLEAN = []


def time_ms_clean(fn, reps: int = 60, warmup: int = 5) -> float:
    """Median time of ``fn()`` in milliseconds with the L2 emptied of dirty lines first.

    ``time_ms`` (Triton's do_bench) flushes L2 by zeroing 256 MB, which leaves L2 full of
    dirty lines: the timed kernel's reads then evict them, so about an L2's worth of
    write-back (~50 MB) is added to its traffic, which turns a 34 MB read-only stream into
    roughly a copy. A decode step reads weights and caches that the previous kernels left
    clean, so this variant flushes by *reading* 256 MB (a sum) before each timed run."""
    if not _CLEAN:
        buf = torch.ones(64 * 2**20, dtype=torch.int32, device="cuda")
        _CLEAN.append(buf)
    buf = _CLEAN[0]
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        buf.sum()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_ms_steady(replay, reps: int = 20, trials: int = 9) -> float:
    """Median time in milliseconds of one ``replay()`` when replays run back to back.

    This is a decode loop's situation: each step's graph follows the previous one on the
    stream, so the launch of one replay hides behind the one before, and L2 holds only what
    the previous step read (clean lines), not the 256 MB of dirty lines ``time_ms``'s flush
    leaves. ``replay`` should stream more than L2 holds, so nothing is an L2 hit from one
    replay to the next."""
    replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / reps)
    return statistics.median(samples)


def graph_replay(fn):
    """Run ``fn`` once on a side stream (compiles, warms up), capture its launches into a CUDA
    graph, and return the graph's replay (host launch cost out of the figures).

    The replay keeps ``fn`` (and so the tensors it closes over) alive: the graph reads and
    writes the addresses it captured, so an output tensor freed after capture would be
    written after free."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def replay(_keep=(g, fn)):
        g.replay()
    return replay


def median_us(fn, per: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of ``fn()``'s wall time divided by the ``per`` ops it runs.

    ``fn`` must synchronize before returning; one warm-up call runs first.
    """
    import time
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) / per * 1e6)
    return statistics.median(samples)


def check_close(name: str, got: torch.Tensor, want: torch.Tensor, rel: float) -> float:
    """Relative error ``|got - want| / |want|`` in float64; raises when above ``rel`` or NaN."""
    g, w = got.double(), want.double()
    err = ((g - w).norm() / w.norm().clamp_min(1e-30)).item()
    if not err <= rel:                       # also catches NaN
        raise AssertionError(f"{name}: relative error {err:.3e} exceeds {rel:.1e}")
    return err


def start_gpu(name: str) -> bool:
    """A benchmark's start: False (after saying so) without a CUDA GPU; else select the
    triton backend and print the environment recorded with the results."""
    if not torch.cuda.is_available():
        print(f"{name} needs a CUDA GPU")
        return False
    import safetile as st
    st.set_backend("triton")
    print(env_info(), flush=True)
    return True


def write_results(name: str, payload: dict) -> Path:
    """Write ``{env, **payload}`` to benchmarks/results/<name>.json (and to $OUT under the
    file's own name); a sweep's ``name`` is ``archive/<sweep>``."""
    data = {"benchmark": name, "env": env_info(), **payload}
    text = json.dumps(data, indent=2, default=str)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, path.name).write_text(text)
    return path


def save_figure(fig, path: Path) -> None:
    """Save a matplotlib figure to ``path`` (and to $OUT under the same name)."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    if os.environ.get("OUT"):
        fig.savefig(os.path.join(os.environ["OUT"], path.name), dpi=110)


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A fixed-width table of ``rows`` (dicts) over ``columns``."""
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(columns, widths)))
