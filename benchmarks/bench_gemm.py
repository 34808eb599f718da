"""bf16 GEMM on the GPU: safe ops vs the unsafe twin vs cuBLAS (M = 1: bench_gemv.py).

The twin (ops.unsafe_matmul) runs each product's config exactly as the safe op does and
differs only in writing C through a raw pointer with plain stores; the safe op writes its
owned tiles with TMA stores, so each row also times the safe op with plain stores
(``plain_store_over_unsafe``: the cost of safety alone; ``safe_over_plain_store``: what the
store instruction is worth).

Shapes: 8192^3, and the Qwen3-4B / Qwen3-32B projections (qkv, o, gate_up, down, lm_head;
``y = x @ W^T`` with ``W`` of shape (N, K)) at M in {16, 128, 2048, 8192}; M = 1 (``ops.gemv``)
is benchmarks/bench_gemv.py. Every variant is checked against cuBLAS before it is timed.
Each variant is timed as
the replay of a CUDA graph holding its launches (so host launch cost is out of every figure,
cuBLAS's included), median of repeated runs with L2 flushed between them.

    python benchmarks/bench_gemm.py            # the table -> benchmarks/results/gemm.json
    python benchmarks/bench_gemm.py --tune     # candidate configs -> results/archive/gemm_tune.json
    python benchmarks/bench_gemm.py --sweep    # many configs per weak shape -> archive/gemm_sweep
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import replace

import torch

from harness import (check_close, graph_replay, print_table, start_gpu, time_ms,  # noqa: E402
                     write_results)

import safetile as st  # noqa: E402
from safetile import ops  # noqa: E402
from safetile.ops.matmul import MatmulConfig, choose_config, workspace_shape  # noqa: E402
from safetile.ops.unsafe_matmul import matmul_unsafe  # noqa: E402

COPY_TBS = 4.26
from bench_gemv import MODELS  # noqa: E402  (the Qwen3 projections, shared)
MS = (16, 128, 2048, 8192)
SKIP = {("32B", "lm_head", 8192)}          # 12.7 PFLOP per product: keeps the run short
# do_bench warm-up and repetition (ms); the sweep shortens them to time more configs.
TIMING = dict(warmup_ms=25, rep_ms=100)
REPEATS = 3


def plain_stores(cfg):
    """``cfg`` with plain masked stores instead of the TMA store of each owned tile (head
    and tail alike): the safe kernel with the twin's store instruction, so that a safe/unsafe
    gap can be told apart from the choice of store instruction."""
    tail = cfg.tail and replace(cfg.tail, tma_store=False)
    return replace(cfg, tma_store=False, tail=tail)




def op_replay(make_op):
    """Replay of the graph a safetile op records (st's own capture: op.graph())."""
    g = make_op().graph()
    cuda = getattr(g, "_cuda", None)
    if cuda is not None:
        return cuda.replay
    return lambda: g.launch().sync()


class Case:
    """One product y = x @ W^T (x (M, K), W (N, K)) with its buffers and reference."""

    def __init__(self, m, n, k, seed=0):
        self.m, self.n, self.k = m, n, k
        self.x = st.randn((m, k), dtype=st.bf16, seed=seed).share()
        self.w = st.randn((n, k), dtype=st.bf16, seed=seed + 1).share()
        self.xt, self.wt = self.x.to_torch(), self.w.to_torch()
        self.ref = torch.nn.functional.linear(self.xt, self.wt)
        self.out = st.empty((m, n), dtype=st.bf16)

    def run_safe(self, cfg):
        ws = st.empty(workspace_shape(self.m, self.n, cfg), dtype=st.f32) \
            if cfg.split_k > 1 else None
        make = lambda: ops.linear(self.x, self.w, self.out, config=cfg, workspace=ws)  # noqa
        make().sync()
        check_close(f"safe {self.m}x{self.n}x{self.k} {cfg}", self.out.to_torch(), self.ref, 1e-2)
        return time_ms(op_replay(make), **TIMING)

    def run_unsafe(self, cfg):
        """The unsafe twin with the same config (split-K, row split and pdl included)."""
        ws = st.empty(workspace_shape(self.m, self.n, cfg), dtype=st.f32) \
            if cfg.split_k > 1 else None
        make = lambda: matmul_unsafe(self.x, self.w, self.out, weight=True,  # noqa: E731
                                     config=cfg, workspace=ws)
        with st.unsafe():
            make().sync()
            check_close(f"unsafe {self.m}x{self.n}x{self.k}", self.out.to_torch(), self.ref, 1e-2)
            return time_ms(op_replay(make), **TIMING)

    def run_cublas(self):
        y = torch.empty_like(self.ref)
        return time_ms(graph_replay(lambda: torch.nn.functional.linear(self.xt, self.wt, out=y)),
                       **TIMING)

    def tflops(self, ms):
        return 2 * self.m * self.n * self.k / ms / 1e9


def tune(deadline):
    rows = []

    def out_of_time():
        return time.time() > deadline

    mm = {
        (8192, 8192, 8192): [MatmulConfig(128, 256, 64, 8, 3), MatmulConfig(128, 256, 64, 8, 4),
                             MatmulConfig(128, 256, 64, 8, 3, flatten=True),
                             MatmulConfig(128, 256, 64, 8, 3, warp_specialize=True),
                             MatmulConfig(128, 256, 64, 8, 3, group_size=16),
                             MatmulConfig(256, 128, 64, 8, 3), MatmulConfig(128, 128, 64, 8, 4)],
        (2048, 6144, 2560): [MatmulConfig(128, 256, 64, 8, 3), MatmulConfig(128, 128, 64, 8, 4),
                             MatmulConfig(128, 128, 64, 4, 4), MatmulConfig(128, 256, 64, 8, 4)],
        (128, 19456, 2560): [MatmulConfig(128, 128, 64, 8, 4), MatmulConfig(64, 128, 64, 4, 5),
                             MatmulConfig(64, 256, 64, 4, 4), MatmulConfig(128, 256, 64, 8, 3),
                             MatmulConfig(128, 64, 64, 4, 5)],
        (128, 2560, 4096): [choose_config(128, 2560, 4096), MatmulConfig(128, 128, 64, 8, 4),
                            MatmulConfig(64, 128, 64, 4, 5, split_k=3),
                            MatmulConfig(64, 64, 64, 4, 6, split_k=2),
                            MatmulConfig(128, 64, 64, 4, 5, split_k=2)],
        (16, 2560, 9728): [choose_config(16, 2560, 9728), MatmulConfig(64, 128, 64, 4, 5),
                           MatmulConfig(64, 64, 64, 4, 6, split_k=4),
                           MatmulConfig(64, 128, 128, 4, 4, split_k=6),
                           MatmulConfig(64, 256, 64, 4, 4, split_k=12)],
        (16, 19456, 2560): [choose_config(16, 19456, 2560), MatmulConfig(64, 64, 64, 4, 6),
                            MatmulConfig(64, 128, 64, 4, 5, split_k=2),
                            MatmulConfig(64, 64, 128, 4, 4)],
    }
    for (m, n, k), cfgs in mm.items():
        if out_of_time():
            break
        case = Case(m, n, k)
        cub = case.run_cublas()
        for cfg in cfgs:
            if out_of_time():
                break
            try:
                ms = case.run_safe(cfg)
                rows.append(dict(kind="matmul", shape=f"{m}x{n}x{k}", cfg=str(cfg), ms=ms,
                                 tflops=case.tflops(ms), ratio=cub / ms))
            except Exception as e:
                rows.append(dict(kind="matmul", shape=f"{m}x{n}x{k}", cfg=str(cfg),
                                 error=repr(e)[:300]))
            print(rows[-1], flush=True)
        del case
    write_results("archive/gemm_tune", {"rows": rows})


def bench(deadline):
    rows = []
    shapes = [("square", "8192^3", 8192, 8192, 8192)]
    for m in MS:
        for model, projs in MODELS.items():
            for name, (n, k) in projs.items():
                if (model, name, m) not in SKIP:
                    shapes.append((model, name, m, n, k))
    from gemm_sweep import prewarm
    jobs = []
    for model, name, m, n, k in shapes:
        cfg = choose_config(m, n, k)
        jobs += [("safe", m, n, k, cfg), ("unsafe", m, n, k, cfg),
                 ("safe", m, n, k, plain_stores(cfg))]
    prewarm(jobs, time.time() + 0.3 * (deadline - time.time()))
    for model, name, m, n, k in shapes:
        if time.time() > deadline:
            print(f"deadline: skipped {model} {name} M={m} and later", flush=True)
            continue
        row = dict(model=model, proj=name, M=m, N=n, K=k)
        try:
            case = Case(m, n, k)
            cfg = choose_config(m, n, k)
            # The square product is timed REPEATS times in turn (safe, twin, safe with
            # plain stores, cuBLAS) and each variant's median kept: a single pass of one
            # variant after another moved its safe/unsafe ratio by 6% run to run.
            times = {"cub": [], "safe": [], "unsafe": [], "plain": []}
            for _ in range(REPEATS if model == "square" else 1):
                times["cub"].append(case.run_cublas())
                times["safe"].append(case.run_safe(cfg))
                times["unsafe"].append(case.run_unsafe(cfg))
                times["plain"].append(case.run_safe(plain_stores(cfg)))
            cub, safe, unsafe, plain = (statistics.median(times[v])
                                        for v in ("cub", "safe", "unsafe", "plain"))
            row.update(variant="matmul", safe_ms=safe, unsafe_ms=unsafe, cublas_ms=cub,
                       safe_plain_store_ms=plain,
                       safe_tflops=case.tflops(safe), unsafe_tflops=case.tflops(unsafe),
                       cublas_tflops=case.tflops(cub), ratio=cub / safe,
                       safe_over_unsafe=unsafe / safe,
                       plain_store_over_unsafe=unsafe / plain,
                       safe_over_plain_store=plain / safe, config=str(cfg))
            if model == "square":
                row["repeats_ms"] = times
            del case
        except Exception as e:
            row["error"] = repr(e)[:300]
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
               if k != "config"}, flush=True)
        torch.cuda.empty_cache()
    mm = [r for r in rows if r.get("variant") == "matmul" and "ratio" in r]
    llm = [r for r in mm if r["model"] != "square"]
    summary = dict(
        square_ratio=next((r["ratio"] for r in mm if r["model"] == "square"), None),
        llm_geomean_ratio=math.exp(sum(math.log(r["ratio"]) for r in llm) / len(llm)) if llm else None,
        llm_geomean_safe_over_unsafe=math.exp(sum(math.log(r["safe_over_unsafe"]) for r in llm)
                                              / len(llm)) if llm else None,
        square_safe_over_unsafe=next((r["safe_over_unsafe"] for r in mm
                                      if r["model"] == "square"), None),
        square_plain_store_over_unsafe=next((r["plain_store_over_unsafe"] for r in mm
                                             if r["model"] == "square"), None),
        llm_geomean_plain_store_over_unsafe=math.exp(
            sum(math.log(r["plain_store_over_unsafe"]) for r in llm) / len(llm)) if llm else None,
    )
    write_results("gemm", {"summary": summary, "rows": rows,
                           "method": "CUDA-graph replay, do_bench median, L2 flushed"})
    plot(rows)
    print_table([{**r, "what": f"{r['model']} {r['proj']}"} for r in rows],
                ["what", "M", "N", "K", "ratio", "safe_tflops", "cublas_tflops",
                 "safe_over_unsafe", "plain_store_over_unsafe", "error"])
    print("summary:", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()})


def plot(rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return
    mm = [r for r in rows if r.get("variant") == "matmul" and "ratio" in r]
    if not mm:
        return
    fig, ax = plt.subplots(figsize=(12, 4))
    labels = [f"{r['model']} {r['proj']} M={r['M']}" for r in mm]
    xs = range(len(mm))
    ax.bar([x - 0.2 for x in xs], [r["ratio"] for r in mm], 0.4, label="safe / cuBLAS")
    ax.bar([x + 0.2 for x in xs], [r["unsafe_ms"] and r["cublas_ms"] / r["unsafe_ms"] for r in mm],
           0.4, label="unsafe / cuBLAS")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xticks(list(xs), labels, rotation=90, fontsize=6)
    ax.set_ylabel("speed relative to cuBLAS")
    ax.legend()
    fig.tight_layout()
    from harness import RESULTS
    fig.savefig(RESULTS / "gemm.png", dpi=120)
    if os.environ.get("OUT"):
        fig.savefig(os.path.join(os.environ["OUT"], "gemm.png"), dpi=120)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tune", action="store_true")
    p.add_argument("--sweep", action="store_true",
                   help="many configs per weak LLM shape, best per shape -> "
                        "results/archive/gemm_sweep.json")
    p.add_argument("--budget-s", type=float, default=280.0)
    args = p.parse_args()
    if not start_gpu("bench_gemm"):
        return 1
    deadline = time.time() + args.budget_s
    if args.sweep:
        from gemm_sweep import sweep
        TIMING.update(warmup_ms=10, rep_ms=40)
        sweep(deadline, Case, write_results, print_table)
    else:
        tune(deadline) if args.tune else bench(deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
