"""bf16 gemv (M = 1, batch-1 decode) on the GPU: ``ops.gemv`` vs cuBLAS (``F.linear``).

Decode runs one gemv per projection and layer, back to back, each over its own weights, so
the figure that matters is a gemv *in such a stream*: a CUDA graph of R >= 16 gemvs over R
distinct weight copies (>= 240 MB in all, four times the L2), replayed back to back
(``harness.time_ms_steady``), time per gemv. Also recorded per shape: the same graph under
``do_bench`` (256 MB of dirty L2 lines flushed before each replay, so the first gemvs pay
their write-back) and a single gemv's graph (mostly launch floor for the small ones).
Bandwidth is reported as a fraction of the 4.26 TB/s copy ceiling (../shared/FACTS.md).

Peers, in the same graphs: cuBLAS (``F.linear``) and ``triton_gemv``, a plain ``@triton.jit``
gemv written here with the safe kernel's tiling, pipeline depth, programmatic launch and
early weight loads (where the safe kernel's launcher checks that early loads read nothing
the previous kernel writes, the plain kernel simply trusts its author). Every variant is
checked against cuBLAS before it is timed.

    python benchmarks/bench_gemv.py            # Qwen3-4B/32B shapes -> results/gemv.json
    python benchmarks/bench_gemv.py --sweep    # configs per 4B shape -> archive/gemv_steady.json
    python benchmarks/bench_gemv.py --plot-only   # redraw results/gemv.png from gemv.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from harness import (RESULTS, check_close, graph_replay, print_table, start_gpu,  # noqa: E402
                     time_ms, time_ms_steady, write_results)

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


@triton.jit
def _triton_block(w_rows, rmask, kb, K: tl.constexpr, BK: tl.constexpr):
    c = kb * BK + tl.arange(0, BK)
    return tl.load(w_rows + c[None, :], mask=rmask & (c[None, :] < K), other=0.0)


@triton.jit
def triton_gemv(w_ptr, x_ptr, y_ptr, N, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                HEAD: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
                EARLY: tl.constexpr, TRIGGER: tl.constexpr):
    """y = W x for BN rows per program: the first HEAD (0 or 2) blocks of W ahead of the
    pipelined loop over the rest (before the PDL wait if EARLY; the next grid signalled at
    the start if TRIGGER, else after the wait)."""
    if TRIGGER:
        gdc_launch_dependents()
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.arange(0, BK)
    w_rows = w_ptr + rows[:, None].to(tl.int64) * K
    rmask = rows[:, None] < N
    if HEAD > 0:
        if EARLY:
            w0 = _triton_block(w_rows, rmask, 0, K, BK)
            w1 = _triton_block(w_rows, rmask, 1, K, BK)
    if PDL:
        gdc_wait()
        if not TRIGGER:
            gdc_launch_dependents()
    acc = tl.zeros((BN, BK), tl.float32)
    if HEAD > 0:
        if not EARLY:
            w0 = _triton_block(w_rows, rmask, 0, K, BK)
            w1 = _triton_block(w_rows, rmask, 1, K, BK)
        acc += w0.to(tl.float32) * tl.load(x_ptr + cols, mask=cols < K).to(tl.float32)[None, :]
        acc += w1.to(tl.float32) * tl.load(x_ptr + BK + cols,
                                           mask=BK + cols < K).to(tl.float32)[None, :]
    for kb in tl.range(HEAD, tl.cdiv(K, BK), num_stages=STAGES):
        wt = _triton_block(w_rows, rmask, kb, K, BK)
        c = kb * BK + cols
        xt = tl.load(x_ptr + c, mask=c < K, other=0.0)
        acc += wt.to(tl.float32) * xt.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rows < N)


def launch_triton_gemv(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, cfg) -> None:
    """The plain-Triton peer with ``cfg``'s tiling (``w`` (N, K), ``x`` (K,), ``y`` (N,))."""
    n, k = w.shape
    pdl = cfg.pdl
    triton_gemv[(triton.cdiv(n, cfg.bn),)](
        w, x, y, n, K=k, BN=cfg.bn, BK=cfg.bk, HEAD=cfg.head, STAGES=cfg.num_stages, PDL=pdl,
        EARLY=pdl and cfg.early, TRIGGER=pdl and cfg.trigger_early, num_warps=cfg.num_warps,
        launch_pdl=pdl)


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

    def triton(self, cfg=None):
        """The replay of the plain-Triton gemvs' graph (checked against cuBLAS first)."""
        cfg = cfg or choose_config(self.n, self.k)
        wts, xt = [w.to_torch() for w in self.ws], self.x.to_torch()
        yts = [torch.empty((self.n,), dtype=torch.bfloat16, device="cuda") for _ in self.ws]

        def chain():
            for wt, yt in zip(wts, yts):
                launch_triton_gemv(wt, xt, yt, cfg)
        replay = graph_replay(chain)
        replay()
        for wt, yt in ((wts[0], yts[0]), (wts[-1], yts[-1])):
            check_close(f"triton gemv {self.n}x{self.k} {cfg}", yt,
                        torch.nn.functional.linear(xt, wt), 1e-2)
        return replay

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
                safe, plain = s.safe(), s.triton()
                # steady figures (the headline) three times in turn, median of each
                runs = [(s.per_gemv_us(safe), s.per_gemv_us(s.cublas), s.per_gemv_us(plain))
                        for _ in range(3)]
                us = statistics.median(r[0] for r in runs)
                cub = statistics.median(r[1] for r in runs)
                tri = statistics.median(r[2] for r in runs)
                y = st.empty((n,), dtype=st.bf16)
                g = ops.gemv(s.ws[0], s.x, y).graph()
                single = time_ms(g._cuda.replay) * 1e3
                row.update(stream_layers=s.r, safe_us=us, cublas_us=cub,
                           frac_copy=s.nbytes / us / 1e6 / COPY_TBS,
                           cublas_frac_copy=s.nbytes / cub / 1e6 / COPY_TBS, ratio=cub / us,
                           triton_us=tri, triton_frac_copy=s.nbytes / tri / 1e6 / COPY_TBS,
                           safe_vs_triton=tri / us,
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
    """The default and its neighbours: the other head (0: every block in the pipelined
    loop), the head after the wait, without pdl, signalling the next kernel early, half and
    double the rows per program, one and two stages more or less."""
    base = choose_config(n, k)
    cfgs = [base, replace(base, head=2 - base.head), replace(base, early=False),
            replace(base, pdl=False), replace(base, trigger_early=True),
            replace(base, bn=base.bn // 2), replace(base, bn=base.bn * 2)]
    cfgs += [replace(base, num_stages=base.num_stages + d) for d in (-2, -1, 1, 2)
             if base.num_stages + d >= 2]
    return cfgs


def sweep(deadline, shapes) -> list[dict]:
    """Every configuration of ``sweep_configs`` on the Qwen3-4B ``shapes``, the
    safe kernel and its plain-Triton peer, timed three times in turn (median)."""
    rows = []
    for name, (n, k) in MODELS["4B"].items():
        if name not in shapes or time.time() > deadline:
            continue
        s = Stream(n, k)
        replays = []
        for cfg in sweep_configs(n, k):
            replays += [(cfg, "safe", s.safe(cfg)), (cfg, "triton", s.triton(cfg))]
        times = {i: [] for i in range(len(replays))}
        for _ in range(3):
            for i, (_, _, replay) in enumerate(replays):
                times[i].append(s.per_gemv_us(replay))
        for i, (cfg, variant, _) in enumerate(replays):
            us = statistics.median(times[i])
            rows.append(dict(proj=name, N=n, K=k, variant=variant, cfg=str(cfg),
                             default=i < 2, us=us, samples=times[i],
                             frac_copy=s.nbytes / us / 1e6 / COPY_TBS))
            print(rows[-1], flush=True)
        del s, replays
        torch.cuda.empty_cache()
    return rows


def plot(rows: list[dict], path) -> bool:
    """Bars of the fraction of copy bandwidth per shape: safe, plain Triton, cuBLAS (False
    when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in rows if "frac_copy" in r]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(11, 4))
    bars = ((-0.27, "frac_copy", "safetile"), (0, "triton_frac_copy", "plain Triton"),
            (0.27, "cublas_frac_copy", "cuBLAS"))
    for dx, key, label in bars:
        ax.bar([x + dx for x in xs], [100 * r[key] for r in rows], 0.27, label=label)
    ax.axhline(85, color="gray", ls=":", label="85% target (Qwen3-4B)")
    ax.set_xticks(list(xs), [f"{r['model']}\n{r['proj']}" for r in rows])
    ax.set_ylabel("% of copy bandwidth (4.26 TB/s)")
    ax.set_title("bf16 gemv (M=1) in chains of 16 over distinct weights, H200")
    ax.set_ylim(0, 130)
    ax.legend(loc="upper left", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    if os.environ.get("OUT"):
        fig.savefig(os.path.join(os.environ["OUT"], path.name), dpi=110)
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--sweep", action="store_true", help="configurations -> "
                   "results/archive/gemv_steady.json")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--name", default="archive/gemv_steady", help="the sweep's results file name")
    p.add_argument("--plot-only", action="store_true", help="redraw gemv.png from gemv.json")
    p.add_argument("--shapes", default="qkv,o,gate_up,down",
                   help="Qwen3-4B projections to sweep (default: %(default)s)")
    args = p.parse_args()
    if args.plot_only:
        rows = json.loads((RESULTS / "gemv.json").read_text())["rows"]
        return 0 if plot(rows, RESULTS / "gemv.png") else 1
    if not start_gpu("bench_gemv"):
        return 1
    deadline = time.time() + args.budget_s
    method = ("graph of R >= 16 back-to-back gemvs over R distinct weights (>= 240 MB), replayed "
              "back to back (harness.time_ms_steady), median per gemv; flushed_*: the same "
              "graph under do_bench (dirty-L2 flush before each replay)")
    if args.sweep:
        rows = sweep(deadline, args.shapes.split(","))
        write_results(args.name, {"rows": rows, "method": method})
        print_table([{**r, "cfg": r["cfg"][len("GemvConfig("):-1]} for r in rows],
                    ["proj", "variant", "cfg", "us", "frac_copy"])
        return 0
    rows = table(deadline)
    four_b = [r for r in rows if r["model"] == "4B" and "frac_copy" in r]
    summary = {"min_frac_copy_4B": min((r["frac_copy"] for r in four_b), default=None),
               "target_frac_copy": 0.85}
    write_results("gemv", {"rows": rows, "summary": summary, "method": method})
    plot(rows, RESULTS / "gemv.png")
    print_table(rows, ["model", "proj", "safe_us", "cublas_us", "triton_us", "frac_copy",
                       "cublas_frac_copy", "triton_frac_copy",
                       "flushed_frac_copy", "single_graph_us", "error"])
    print("summary:", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
