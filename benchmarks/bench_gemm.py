"""bf16 GEMM and gemv on the GPU: safe ops vs the unsafe twin vs cuBLAS.

The twin (ops.unsafe_matmul) runs each product's config exactly as the safe op does and
differs only in writing C through a raw pointer with plain stores; the safe op writes its
owned tiles with TMA stores, so each row also times the safe op with plain stores
(``plain_store_over_unsafe``: the cost of safety alone; ``safe_over_plain_store``: what the
store instruction is worth).

Shapes: 8192^3, and the Qwen3-4B / Qwen3-32B projections (qkv, o, gate_up, down, lm_head;
``y = x @ W^T`` with ``W`` of shape (N, K)) at M in {16, 128, 2048, 8192}; M = 1 runs
``ops.gemv`` against ``F.linear`` and reports bandwidth as a fraction of the 4.26 TB/s copy
ceiling. Every variant is checked against cuBLAS before it is timed. Each variant is timed as
the replay of a CUDA graph holding its launches (so host launch cost is out of every figure,
cuBLAS's included), median of repeated runs with L2 flushed between them.

    python benchmarks/bench_gemm.py            # the table -> benchmarks/results/gemm.json
    python benchmarks/bench_gemm.py --tune     # time candidate configs -> results/gemm_tune.json
    python benchmarks/bench_gemm.py --sweep    # weak LLM shapes, many configs -> gemm_sweep.json
    python benchmarks/bench_gemm.py --llm-only # the table without the M = 1 gemv rows
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

from harness import (check_close, env_info, graph_replay, print_table, time_ms,  # noqa: E402
                     write_results)

import safetile as st  # noqa: E402
from safetile import ops  # noqa: E402
from safetile.ops.gemv import GemvConfig  # noqa: E402
from safetile.ops.gemv import choose_config as gemv_config  # noqa: E402
from safetile.ops.matmul import MatmulConfig, choose_config, workspace_shape  # noqa: E402
from safetile.ops.unsafe_matmul import matmul_unsafe  # noqa: E402

COPY_TBS = 4.26
MODELS = {
    "4B": {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560),
           "down": (2560, 9728), "lm_head": (151936, 2560)},
    "32B": {"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (51200, 5120),
            "down": (5120, 25600), "lm_head": (151936, 5120)},
}
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


def gemv_case(n, k, cfg=None):
    w = st.randn((n, k), dtype=st.bf16, seed=3).share()
    x = st.randn((k,), dtype=st.bf16, seed=4).share()
    wt, xt = w.to_torch(), x.to_torch()
    ref = torch.nn.functional.linear(xt, wt)
    y = st.empty((n,), dtype=st.bf16)
    make = lambda: ops.gemv(w, x, y, config=cfg)  # noqa: E731
    make().sync()
    check_close(f"gemv {n}x{k} {cfg}", y.to_torch(), ref, 1e-2)
    safe = time_ms(op_replay(make))
    yt = torch.empty_like(ref)
    cublas = time_ms(graph_replay(lambda: torch.nn.functional.linear(xt, wt, out=yt)))
    nbytes = (n * k + k + n) * 2
    return safe, cublas, nbytes


def gemv_stream(n, k, cfg=None, clean=False):
    """Decode-like timing: one graph of R back-to-back gemvs over R distinct weight copies
    (R * bytes >= 4x the 60 MB L2, so no copy is an L2 hit), as a decode step streams its
    layers. Returns (safe ms, cuBLAS ms) per gemv."""
    nbytes = n * k * 2
    r = max(2, min(32, -(-240 * 2**20 // nbytes)))
    ws = [st.randn((n, k), dtype=st.bf16, seed=10 + i).share() for i in range(r)]
    x = st.randn((k,), dtype=st.bf16, seed=4).share()
    ys = [st.empty((n,), dtype=st.bf16) for _ in range(r)]
    with st.graph_scope() as scope:
        for w, y in zip(ws, ys):
            scope.record(ops.gemv(w, x, y, config=cfg))
    scope.graph.launch().sync()
    cuda = getattr(scope.graph, "_cuda", None)
    replay = cuda.replay if cuda is not None else None
    wts = [w.to_torch() for w in ws]
    xt = x.to_torch()
    yts = [torch.empty((n,), dtype=torch.bfloat16, device="cuda") for _ in range(r)]
    cub = graph_replay(lambda: [torch.nn.functional.linear(xt, wt, out=yt)
                            for wt, yt in zip(wts, yts)])
    safe_ms = time_ms(replay) / r if replay is not None else None
    if clean:                           # also with L2 left clean (harness.time_ms_clean)
        from harness import time_ms_clean
        return safe_ms, time_ms(cub) / r, time_ms_clean(replay) / r, time_ms_clean(cub) / r
    return safe_ms, time_ms(cub) / r


def tune(deadline):
    rows = []

    def out_of_time():
        return time.time() > deadline

    gemv_cfgs = [GemvConfig(bn, bk, w, s, tma) for (bn, bk, w, s, tma) in [
        (8, 256, 4, 4, True), (16, 256, 4, 4, True), (4, 256, 4, 4, True),
        (8, 512, 4, 3, False), (16, 512, 8, 3, False), (8, 1024, 4, 2, False),
        (32, 256, 8, 3, True), (8, 256, 4, 6, True), (4, 512, 4, 4, False)]]
    for n, k in [(6144, 2560), (2560, 9728), (151936, 2560), (2560, 4096)]:
        for cfg in gemv_cfgs:
            if out_of_time():
                break
            try:
                ms, cub, nb = gemv_case(n, k, cfg)
                rows.append(dict(kind="gemv", shape=f"{n}x{k}", cfg=str(cfg), ms=ms,
                                 tbs=nb / ms / 1e9, cublas_tbs=nb / cub / 1e9))
            except Exception as e:                              # report and go on
                rows.append(dict(kind="gemv", shape=f"{n}x{k}", cfg=str(cfg), error=repr(e)[:200]))
            print(rows[-1], flush=True)
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
    write_results("gemm_tune", {"rows": rows})


def gemv_sweep(deadline):
    """Decode-like (graph of back-to-back gemvs) timing of gemv configurations on the Qwen3-4B
    shapes: the default (pdl) against prefetching the first weight blocks before the wait.
    Writes results/gemv_prefetch.json (results/gemv.json holds sweep 2; gemm.json the full
    table)."""
    rows = []
    # Sweeps 1-2 (results/gemv_sweep1.json, 2026-11-30): 6 stages, 1024-wide blocks and
    # 2-row programs lost everywhere; pdl gained 0.1-0.6 us (now the default). This sweep
    # times the default with pdl against prefetching the program's first 2 / all (masked
    # past K) W blocks into L2 before the pdl wait; config-major, so that a short time box
    # still compares every shape.
    shapes = [(name, nk) for name, nk in MODELS["4B"].items()
              if name != "lm_head"]                  # lm_head: already past the copy ceiling
    for pf in (0, 2, 32):
        for name, (n, k) in shapes:
            base = gemv_config(n, k)
            cfg = GemvConfig(base.bn, base.bk, base.num_warps, base.num_stages, base.tma,
                             base.pdl, pf)
            nb = (n * k + k + n) * 2
            if time.time() > deadline:
                rows.append(dict(shape=f"{n}x{k}", proj=name, cfg=str(cfg), error="skipped: out of time"))
                continue
            try:
                gemv_case_check(n, k, cfg)
                s_ms, c_ms, s_clean, c_clean = gemv_stream(n, k, cfg, clean=True)
                rows.append(dict(shape=f"{n}x{k}", proj=name, cfg=str(cfg), default=cfg == base,
                                 safe_us=s_ms * 1e3, cublas_us=c_ms * 1e3,
                                 safe_tbs=nb / s_ms / 1e9, frac_copy=nb / s_ms / 1e9 / COPY_TBS,
                                 clean_us=s_clean * 1e3, cublas_clean_us=c_clean * 1e3,
                                 clean_frac_copy=nb / s_clean / 1e9 / COPY_TBS,
                                 floor_us=nb / COPY_TBS / 1e6))
            except Exception as e:
                rows.append(dict(shape=f"{n}x{k}", proj=name, cfg=str(cfg), error=repr(e)[:300]))
            r = rows[-1]
            print(name, f"prefetch={pf}", *(f"{c}={r[c]:.3f}" for c in ("safe_us", "clean_us")
                                            if c in r), r.get("error", ""), flush=True)
            torch.cuda.empty_cache()
    gemv_defaults = {r["proj"]: r for r in rows if r.get("default")}
    for r in rows:                      # the gain over the default (pdl, no prefetch) per row
        d = gemv_defaults.get(r["proj"])
        if d is not None and "safe_us" in r:
            r["us_vs_default"] = r["safe_us"] - d["safe_us"]
    write_results("gemv_prefetch", {"rows": rows, "method": "graph of back-to-back gemvs over distinct "
                           "weights (>= 240 MB in all), do_bench median per gemv, L2 flushed"})
    print_table([{**r, "cfg": r["cfg"].split("(", 1)[-1][:60]} for r in rows],
                ["proj", "cfg", "safe_us", "us_vs_default", "frac_copy", "clean_us",
                 "clean_frac_copy", "error"])


def gemv_case_check(n, k, cfg):
    """A correctness check of one gemv configuration (fresh random inputs)."""
    w = st.randn((n, k), dtype=st.bf16, seed=5).share()
    x = st.randn((k,), dtype=st.bf16, seed=6).share()
    ref = torch.nn.functional.linear(x.to_torch(), w.to_torch())
    y = ops.gemv(w, x, config=cfg).sync()
    check_close(f"gemv {n}x{k} {cfg}", y.to_torch(), ref, 1e-2)


def bench(deadline, llm_only=False):
    rows = []
    shapes = [("square", "8192^3", 8192, 8192, 8192)]
    if not llm_only:                            # the gemv rows (also in results/gemv.json)
        for model, projs in MODELS.items():
            for name, (n, k) in projs.items():
                shapes.append((model, name, 1, n, k))
    for m in MS:
        for model, projs in MODELS.items():
            for name, (n, k) in projs.items():
                if (model, name, m) not in SKIP:
                    shapes.append((model, name, m, n, k))
    from gemm_sweep import prewarm
    jobs = []
    for model, name, m, n, k in shapes:
        if m > 1:
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
            if m == 1:
                safe, cub, nb = gemv_case(n, k)
                row.update(variant="gemv", single_safe_ms=safe, single_cublas_ms=cub,
                           single_safe_tbs=nb / safe / 1e9, single_cublas_tbs=nb / cub / 1e9,
                           single_frac_copy=nb / safe / 1e9 / COPY_TBS,
                           config=str(gemv_config(n, k)))
                try:
                    s_ms, c_ms = gemv_stream(n, k)
                    if s_ms is not None:
                        row.update(safe_ms=s_ms, cublas_ms=c_ms, safe_tbs=nb / s_ms / 1e9,
                                   cublas_tbs=nb / c_ms / 1e9,
                                   frac_copy=nb / s_ms / 1e9 / COPY_TBS, ratio=c_ms / s_ms)
                except Exception as e:
                    row["stream_error"] = repr(e)[:300]
                if "frac_copy" not in row:
                    row.update(safe_ms=safe, cublas_ms=cub, safe_tbs=nb / safe / 1e9,
                               frac_copy=row["single_frac_copy"], ratio=cub / safe)
            else:
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
    gemv4b = [r for r in rows if r.get("variant") == "gemv" and r["model"] == "4B" and "frac_copy" in r]
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
        gemv_4b_min_frac_copy=min((r["frac_copy"] for r in gemv4b), default=None),
        gemv_4b_geomean_frac_copy=math.exp(sum(math.log(r["frac_copy"]) for r in gemv4b)
                                           / len(gemv4b)) if gemv4b else None,
    )
    write_results("gemm", {"summary": summary, "rows": rows,
                           "method": "CUDA-graph replay, do_bench median, L2 flushed; M=1 gemv: frac_copy from a "
                     "graph of back-to-back gemvs over distinct weights (decode-like), single_* "
                     "from one isolated launch"
                     + ("; run with --llm-only: no M=1 rows (see results/gemv.json)"
                        if llm_only else "")})
    plot(rows)
    print_table([{**r, "what": f"{r['model']} {r['proj']}"} for r in rows],
                ["what", "M", "N", "K", "ratio", "safe_tflops", "cublas_tflops",
                 "safe_over_unsafe", "plain_store_over_unsafe", "safe_tbs", "frac_copy", "single_frac_copy", "error"])
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
    p.add_argument("--gemv-only", action="store_true",
                   help="decode-like gemv configuration sweep only -> results/gemv.json")
    p.add_argument("--sweep", action="store_true",
                   help="many configs per weak LLM shape, best per shape -> results/gemm_sweep.json")
    p.add_argument("--llm-only", action="store_true",
                   help="the table without the M = 1 gemv rows (those are in results/gemv.json)")
    p.add_argument("--budget-s", type=float, default=280.0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_gemm needs a CUDA GPU")
        return 1
    st.set_backend("triton")
    print(env_info(), flush=True)
    deadline = time.time() + args.budget_s
    if args.gemv_only:
        gemv_sweep(deadline)
    elif args.sweep:
        from gemm_sweep import sweep
        TIMING.update(warmup_ms=10, rep_ms=40)
        sweep(deadline, Case, write_results, print_table)
    else:
        tune(deadline) if args.tune else bench(deadline, llm_only=args.llm_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
