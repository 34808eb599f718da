"""bf16 gemv (M = 1, batch-1 decode) on the GPU: ``ops.gemv`` vs cuBLAS (``F.linear``).

Decode runs one gemv per projection and layer, back to back, each over its own weights, so
the figure that matters is a gemv *in such a stream*: a CUDA graph of R >= 16 gemvs over R
distinct weight copies (>= 240 MB in all, four times the L2), replayed back to back
(``harness.time_ms_steady``), time per gemv. Also recorded per shape: the same graph under
``do_bench`` (256 MB of dirty L2 lines flushed before each replay, so the first gemvs pay
their write-back) and a single gemv's graph (mostly launch floor for the small ones).
Bandwidth is reported as a fraction of the 4.26 TB/s copy ceiling (../shared/FACTS.md).
Every variant is checked against cuBLAS before it is timed.

    python benchmarks/bench_gemv.py            # Qwen3-4B/32B shapes -> results/gemv.json
    python benchmarks/bench_gemv.py --sweep    # configurations per 4B shape -> gemv_steady.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

import torch

from harness import (check_close, graph_replay, print_table, start_gpu, time_ms,  # noqa: E402
                     time_ms_steady, write_results)

import safetile as st  # noqa: E402
from safetile import ops  # noqa: E402
from safetile.ops.gemv import choose_config  # noqa: E402

COPY_TBS = 4.26
MODELS = {
    "4B": {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560),
           "down": (2560, 9728), "lm_head": (151936, 2560)},
    "32B": {"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (51200, 5120),
            "down": (5120, 25600), "lm_head": (151936, 5120)},
}


def check(n: int, k: int, cfg) -> None:
    """A correctness check of one configuration against cuBLAS (fresh random inputs)."""
    w = st.randn((n, k), dtype=st.bf16, seed=5).share()
    x = st.randn((k,), dtype=st.bf16, seed=6).share()
    ref = torch.nn.functional.linear(x.to_torch(), w.to_torch())
    y = ops.gemv(w, x, config=cfg).sync()
    check_close(f"gemv {n}x{k} {cfg}", y.to_torch(), ref, 1e-2)


class Stream:
    """R distinct weight copies of one shape, and their gemvs captured back to back."""

    def __init__(self, n: int, k: int):
        self.n, self.k = n, k
        self.nbytes = n * k * 2
        # at least 16 per graph, so that the boundary between two replays (no programmatic
        # launch across graphs) weighs little, as in a decode step's graph of hundreds of
        # kernels; and >= 240 MB in all, so that no copy is an L2 hit
        self.r = min(32, max(16, -(-240 * 2**20 // self.nbytes)))
        self.ws = [st.randn((n, k), dtype=st.bf16, seed=10 + i).share() for i in range(self.r)]
        self.x = st.randn((k,), dtype=st.bf16, seed=4).share()
        self.ys = [st.empty((n,), dtype=st.bf16) for _ in range(self.r)]
        wts, xt = [w.to_torch() for w in self.ws], self.x.to_torch()[None]
        yts = [torch.empty((1, n), dtype=torch.bfloat16, device="cuda") for _ in range(self.r)]
        self.cublas = graph_replay(lambda: [torch.nn.functional.linear(xt, wt, out=yt)
                                            for wt, yt in zip(wts, yts)])

    def safe(self, cfg=None):
        """The replay of the safe gemvs' graph (checked against cuBLAS first)."""
        check(self.n, self.k, cfg)
        with st.graph_scope() as scope:
            for w, y in zip(self.ws, self.ys):
                scope.record(ops.gemv(w, self.x, y, config=cfg))
        scope.graph.launch().sync()
        want = torch.nn.functional.linear(self.x.to_torch(), self.ws[-1].to_torch())
        check_close("gemv stream", self.ys[-1].to_torch(), want, 1e-2)
        graph = scope.graph

        def replay():                   # keeps the graph (and what it records) alive
            graph._cuda.replay()
        return replay

    def per_gemv_us(self, replay, steady=True) -> float:
        t = time_ms_steady(replay) if steady else time_ms(replay)
        return t / self.r * 1e3


def table(deadline) -> list[dict]:
    rows = []
    for model, projs in MODELS.items():
        for name, (n, k) in projs.items():
            row = dict(model=model, proj=name, N=n, K=k, config=str(choose_config(n, k)))
            if time.time() > deadline:
                rows.append({**row, "error": "skipped: out of time"})
                continue
            try:
                s = Stream(n, k)
                safe = s.safe()
                # steady figures (the headline) three times in turn, median of each
                runs = [(s.per_gemv_us(safe), s.per_gemv_us(s.cublas)) for _ in range(3)]
                us = statistics.median(r[0] for r in runs)
                cub = statistics.median(r[1] for r in runs)
                y = st.empty((n,), dtype=st.bf16)
                g = ops.gemv(s.ws[0], s.x, y).graph()
                single = time_ms(g._cuda.replay) * 1e3
                row.update(stream_layers=s.r, safe_us=us, cublas_us=cub,
                           frac_copy=s.nbytes / us / 1e6 / COPY_TBS,
                           cublas_frac_copy=s.nbytes / cub / 1e6 / COPY_TBS, ratio=cub / us,
                           flushed_safe_us=s.per_gemv_us(safe, steady=False),
                           flushed_cublas_us=s.per_gemv_us(s.cublas, steady=False),
                           single_graph_us=single, floor_us=s.nbytes / COPY_TBS / 1e6)
                row["flushed_frac_copy"] = s.nbytes / row["flushed_safe_us"] / 1e6 / COPY_TBS
                del s
            except Exception as e:                              # report and go on
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            rows.append(row)
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()},
                  flush=True)
            torch.cuda.empty_cache()
    return rows


def sweep_configs(n: int, k: int) -> list:
    """The default and its neighbours: without early loads, without pdl, signalling the
    next kernel at the start, half and double the rows per program, the other K block."""
    base = choose_config(n, k)
    cfgs = [base, replace(base, early=False), replace(base, pdl=False, early=False),
            replace(base, trigger_early=not base.trigger_early),
            replace(base, bn=base.bn // 2), replace(base, bn=base.bn * 2)]
    if base.bk == 512 and k % 1024 == 0:
        cfgs.append(replace(base, bk=1024, num_stages=3))
    if base.bk == 1024:
        cfgs.append(replace(base, bk=512, num_stages=4))
    return cfgs


def sweep(deadline) -> list[dict]:
    """Every configuration of ``sweep_configs`` on each Qwen3-4B shape (lm_head aside),
    timed three times in turn (median)."""
    rows = []
    for name, (n, k) in MODELS["4B"].items():
        if name == "lm_head" or time.time() > deadline:
            continue
        s = Stream(n, k)
        replays = [(cfg, s.safe(cfg)) for cfg in sweep_configs(n, k)]
        times = {i: [] for i in range(len(replays))}
        for _ in range(3):
            for i, (_, replay) in enumerate(replays):
                times[i].append(s.per_gemv_us(replay))
        for i, (cfg, _) in enumerate(replays):
            us = statistics.median(times[i])
            rows.append(dict(proj=name, N=n, K=k, cfg=str(cfg), default=i == 0, us=us,
                             samples=times[i], frac_copy=s.nbytes / us / 1e6 / COPY_TBS))
            print(rows[-1], flush=True)
        del s, replays
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="configurations -> gemv_steady.json")
    p.add_argument("--budget-s", type=float, default=240.0)
    args = p.parse_args()
    if not start_gpu("bench_gemv"):
        return 1
    deadline = time.time() + args.budget_s
    method = ("graph of R >= 16 back-to-back gemvs over R distinct weights (>= 240 MB), replayed "
              "back to back (harness.time_ms_steady), median per gemv; flushed_*: the same "
              "graph under do_bench (dirty-L2 flush before each replay)")
    if args.sweep:
        rows = sweep(deadline)
        write_results("gemv_steady", {"rows": rows, "method": method})
        print_table([{**r, "cfg": r["cfg"][len("GemvConfig("):-1]} for r in rows],
                    ["proj", "cfg", "us", "frac_copy"])
        return 0
    rows = table(deadline)
    four_b = [r for r in rows if r["model"] == "4B" and "frac_copy" in r]
    summary = {"min_frac_copy_4B": min((r["frac_copy"] for r in four_b), default=None),
               "target_frac_copy": 0.85}
    write_results("gemv", {"rows": rows, "summary": summary, "method": method})
    print_table(rows, ["model", "proj", "safe_us", "cublas_us", "frac_copy", "cublas_frac_copy",
                       "flushed_frac_copy", "single_graph_us", "error"])
    print("summary:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
