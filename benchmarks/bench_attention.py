"""Attention on the GPU: safetile's ops against torch's scaled_dot_product_attention.

Shapes are Qwen3-4B's attention (32 q heads, 8 kv heads, head_dim 128, bf16, batch 1):
- prefill: causal attention over S = 1k and 8k tokens, in TFLOP/s (causal FLOPs:
  2 products x 2 FLOP x S^2/2 x D x Hq) and as a ratio to SDPA (is_causal, enable_gqa);
- decode: one query token against a KV cache holding 1k / 8k / 32k tokens (the length read
  from a device tensor), in microseconds and achieved bandwidth (bytes = the K and V rows
  read + q + out), as a fraction of the H200's 4.26 TB/s copy bandwidth. SDPA gets q of
  length 1.

Every variant is checked against an fp32 SDPA reference before it is timed. Both sides are
timed as CUDA-graph replays (safetile: ``op.graph()``, the form grout's decode step runs in;
torch: ``torch.cuda.graph``), so host launch costs do not hide the kernels' time. Prefill:
median of repeated replays, the best of a few configurations. Decode: the headline is the
time per attention in a graph of R attentions over R distinct caches replayed back to back
(``harness.time_ms_steady``), for the op's default configuration (the others are in the
JSON, with a single attention's graph and the split kernel alone). Writes
benchmarks/results/attention.json (+ attention.png).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import safetile as st  # noqa: E402
from safetile.ops import (DecodeWorkspace, decode_attention,  # noqa: E402
                          decode_attention_split, flash_attention)
from safetile.ops.decode_attention import DEFAULT_BLOCK_N  # noqa: E402

HQ, HKV, D = 32, 8, 128
COPY_TBPS = 4.26
PREFILL_LENGTHS = (1024, 8192)
DECODE_LENGTHS = (1024, 8192, 32768)
# (block_m, block_n, num_warps, num_stages)
PREFILL_CONFIGS = [(128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3)]
# (num_splits, block_n, num_stages, pdl, trigger_early); None: the op's defaults (what earlier
# sweeps found: benchmarks/TUNING.md, "decode attention defaults").
# (num_splits, block_n, num_stages, pdl, trigger_early[, masked]); None: the op's defaults.
DECODE_CONFIGS = [None, (16, 64, 3, False, False), (16, 128, 3, False, False),
                  (16, 64, 3, True, False), (16, 128, 3, True, False), (16, 64, 3, True, True),
                  (16, 128, 3, True, True), (16, 64, 3, True, True, False)]


def graph_time_ms(graph_replay) -> float:
    return harness.time_ms(graph_replay, warmup_ms=20, rep_ms=60)




def st_graph(op):
    """Record ``op`` into a safetile graph; returns the raw CUDA-graph replay and the graph."""
    g = op.graph()
    return g._cuda.replay, g


def randn(shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16)


def bench_prefill(s: int) -> dict:
    q, k, v = randn((HQ, s, D), 1), randn((HKV, s, D), 2), randn((HKV, s, D), 3)
    ref = F.scaled_dot_product_attention(q[None].float(), k[None].float(), v[None].float(),
                                         is_causal=True, enable_gqa=True)[0]
    flops = 4.0 * s * s / 2 * D * HQ
    row = {"case": f"prefill {s}", "tokens": s}

    def sdpa():
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                              enable_gqa=True)
    harness.check_close(f"sdpa prefill {s}", sdpa()[0], ref, 2e-2)
    t_sdpa = graph_time_ms(harness.graph_replay(sdpa))

    qh, kh, vh = st.from_torch(q), st.from_torch(k), st.from_torch(v)
    out = st.empty((HQ, s, D), dtype=st.bf16)
    configs = []
    for bm, bn, w, stg in PREFILL_CONFIGS:
        kw = dict(block_m=bm, block_n=bn, num_warps=w, num_stages=stg)
        try:
            got = flash_attention(qh, kh, vh, out, **kw).sync()
            err = harness.check_close(f"safetile prefill {s} {kw}", got.to_torch(), ref, 2e-2)
            replay, _ = st_graph(flash_attention(qh, kh, vh, out, **kw))
            t = graph_time_ms(replay)
            configs.append({**kw, "ms": t, "tflops": flops / t / 1e9, "rel_err": err})
        except Exception as e:                  # a config that does not fit is reported
            configs.append({**kw, "error": f"{type(e).__name__}: {e}"[:300]})
    best = min((c for c in configs if "ms" in c), key=lambda c: c["ms"])
    row.update(safetile_ms=best["ms"], sdpa_ms=t_sdpa, safetile_tflops=best["tflops"],
               sdpa_tflops=flops / t_sdpa / 1e9, ratio=t_sdpa / best["ms"],
               best_config={k: best[k] for k in ("block_m", "block_n", "num_warps", "num_stages")},
               configs=configs)
    return row


def record_stream(streams, length, ws, kw, split_only=False):
    """The replay of one graph of attentions over every cache in ``streams``."""
    q = st.from_torch(randn((HQ, D), 4))
    with st.graph_scope() as scope:
        for k, v, out in streams:
            op = decode_attention_split(q, k, v, length, ws, **kw) if split_only else \
                decode_attention(q, k, v, length, out, ws, **kw)
            scope.record(op)
    replay = scope.graph._cuda.replay
    replay()
    return replay


def bench_decode(n: int) -> dict:
    """Decode against an n-token cache. Headline: the steady time per attention in a graph
    of R >= 16 attentions over R distinct caches (>= 300 MB in all), replayed back to back
    (harness.time_ms_steady), as a decode step's layers run; SDPA timed the same way."""
    max_seq = n
    q = randn((HQ, D), 4)
    k, v = randn((HKV, max_seq, D), 5), randn((HKV, max_seq, D), 6)
    ref = F.scaled_dot_product_attention(q[None, :, None].float(), k[None].float(),
                                         v[None].float(), enable_gqa=True)[0, :, 0]
    nbytes = 2 * HKV * n * D * 2 + 2 * HQ * D * 2
    row = {"case": f"decode {n}", "context": n, "bytes": nbytes}
    q4 = q[None, :, None]

    def sdpa():
        return F.scaled_dot_product_attention(q4, k[None], v[None], enable_gqa=True)
    harness.check_close(f"sdpa decode {n}", sdpa()[0, :, 0], ref, 2e-2)
    row["sdpa_single_us"] = graph_time_ms(harness.graph_replay(sdpa)) * 1e3

    qh, kh, vh = st.from_torch(q), st.from_torch(k), st.from_torch(v)
    length = st.from_torch(torch.tensor([n], dtype=torch.int32, device=q.device))
    out = st.empty((HQ, D), dtype=st.bf16)
    r = min(32, max(16, -(-300 * 2**20 // nbytes)))     # as bench_gemv's Stream
    caches = [(randn((HKV, max_seq, D), 100 + i), randn((HKV, max_seq, D), 200 + i))
              for i in range(r)]
    outs = [torch.empty_like(q4) for _ in range(r)]
    sdpa_stream = harness.graph_replay(lambda: [o.copy_(F.scaled_dot_product_attention(
        q4, kc[None], vc[None], enable_gqa=True)) for (kc, vc), o in zip(caches, outs)])
    row["sdpa_us"] = harness.time_ms_steady(sdpa_stream) / r * 1e3
    streams = [(st.from_torch(kc), st.from_torch(vc), st.empty((HQ, D), dtype=st.bf16))
               for kc, vc in caches]
    row["stream_layers"] = r
    configs = []
    for c in DECODE_CONFIGS:
        kw = {} if c is None else dict(zip(("num_splits", "block_n", "num_stages", "pdl",
                                            "trigger_early", "masked"), c))
        if time.time() > DEADLINE[0]:
            configs.append({**kw, "error": "skipped: out of time"})
            continue
        try:
            ws = DecodeWorkspace.for_cache(qh, kh, num_splits=kw.pop("num_splits", None),
                                           block_n=kw.get("block_n", DEFAULT_BLOCK_N))
            got = decode_attention(qh, kh, vh, length, out, ws, **kw).sync()
            err = harness.check_close(f"safetile decode {n} {kw}", got.to_torch(), ref, 2e-2)
            single, _ = st_graph(decode_attention(qh, kh, vh, length, out, ws, **kw))
            replay = record_stream(streams, length, ws, kw)
            split_only = record_stream(streams, length, ws, kw, split_only=True)
            us = harness.time_ms_steady(replay) / r * 1e3
            configs.append({"default": c is None, "num_splits": ws.num_splits, **kw,
                            "us": us, "tbps": nbytes / us / 1e6,
                            "fraction_of_copy": nbytes / us / 1e6 / COPY_TBPS, "rel_err": err,
                            "single_us": graph_time_ms(single) * 1e3,
                            "flushed_us": graph_time_ms(replay) / r * 1e3,
                            "split_kernel_us": harness.time_ms_steady(split_only) / r * 1e3})
        except Exception as e:
            configs.append({**kw, "error": f"{type(e).__name__}: {e}"[:300]})
        cfg = configs[-1]
        print(f"decode {n}: " + (f"{c or 'default'} {cfg['us']:.2f} us "
                                 f"({100 * cfg['fraction_of_copy']:.0f}%), split kernel alone "
                                 f"{cfg['split_kernel_us']:.2f} us, single graph "
                                 f"{cfg['single_us']:.2f} us" if "us" in cfg else str(cfg)),
              flush=True)
    best = next((c for c in configs if c.get("default") and "us" in c), None) or \
        min((c for c in configs if "us" in c), key=lambda c: c["us"])
    row.update(safetile_us=best["us"], safetile_tbps=best["tbps"],
               fraction_of_copy=best["fraction_of_copy"], sdpa_tbps=nbytes / row["sdpa_us"] / 1e6,
               sdpa_fraction_of_copy=nbytes / row["sdpa_us"] / 1e6 / COPY_TBPS,
               ratio=row["sdpa_us"] / best["us"], split_kernel_us=best["split_kernel_us"],
               best_fraction_of_copy=max(c["fraction_of_copy"] for c in configs if "us" in c),
               configs=configs)
    return row


def plot(prefill: list, decode: list, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(prefill))
    a.bar([x - 0.2 for x in xs], [r["safetile_tflops"] for r in prefill], 0.4, label="safetile")
    a.bar([x + 0.2 for x in xs], [r["sdpa_tflops"] for r in prefill], 0.4, label="torch SDPA")
    a.set_xticks(list(xs), [f"S={r['tokens']}" for r in prefill])
    a.set_ylabel("TFLOP/s")
    a.set_title("causal prefill, 32q/8kv heads, D=128, bf16")
    a.legend()
    xs = range(len(decode))
    b.bar([x - 0.2 for x in xs], [r["safetile_tbps"] for r in decode], 0.4, label="safetile")
    b.bar([x + 0.2 for x in xs], [r["sdpa_tbps"] for r in decode], 0.4, label="torch SDPA")
    b.axhline(COPY_TBPS, color="gray", ls="--", label="copy 4.26 TB/s")
    b.axhline(0.7 * COPY_TBPS, color="gray", ls=":", label="70% target")
    b.set_xticks(list(xs), [f"ctx={r['context']}" for r in decode])
    b.set_ylabel("TB/s")
    b.set_title("decode (1 token), KV bytes read / time")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    out = os.environ.get("OUT")
    if out:
        fig.savefig(Path(out) / path.name, dpi=110)
    return path


DEADLINE = [float("inf")]


def bench_empty_graphs() -> dict:
    """The floor under any decode figure: a graph of one, and of two, tiny kernels (an
    element-wise add of 4096 floats each), timed the same way."""
    from safetile.ops import add
    x, y = st.randn((4096,)), st.randn((4096,))
    z1, z2 = st.empty((4096,)), st.empty((4096,))
    one, _ = st_graph(add(x, y, z1))
    with st.graph_scope() as scope:
        scope.record(add(x, y, z1))
        scope.record(add(x, y, z2))
    two = scope.graph._cuda.replay
    return {"one_kernel_graph_us": graph_time_ms(one) * 1e3,
            "two_kernel_graph_us": graph_time_ms(two) * 1e3}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--decode-only", action="store_true",
                   help="skip prefill; keep the prefill rows of the existing results file")
    p.add_argument("--budget-s", type=float, default=float("inf"),
                   help="skip the remaining decode configurations after this many seconds")
    p.add_argument("--name", default="attention",
                   help="results file name (another name keeps results/attention.json; no plot)")
    p.add_argument("--contexts", type=str, default=",".join(map(str, DECODE_LENGTHS)),
                   help="comma-separated decode contexts (default: %(default)s)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU; nothing measured")
        return 0
    st.set_backend("triton")
    DEADLINE[0] = time.time() + args.budget_s
    if args.decode_only:
        import json
        old = harness.RESULTS / "attention.json"
        prefill = json.loads(old.read_text())["prefill"] if old.exists() else []
    else:
        prefill = [bench_prefill(s) for s in PREFILL_LENGTHS]
    floor = bench_empty_graphs()
    print("empty graphs:", floor, flush=True)
    decode = [bench_decode(int(n)) for n in args.contexts.split(",")]
    path = harness.write_results(args.name, {
        "shape": {"q_heads": HQ, "kv_heads": HKV, "head_dim": D, "dtype": "bf16"},
        "copy_tbps": COPY_TBPS, "launch_floor": floor, "prefill": prefill,
        "prefill_measured": "earlier run (kept)" if args.decode_only else "this run",
        "decode": decode})
    png = plot(prefill, decode, harness.RESULTS / "attention.png") \
        if args.name == "attention" else None
    print(f"results: {path}" + (f", plot: {png}" if png else ""))
    harness.print_table(
        [{"case": r["case"], "safetile": f"{r['safetile_tflops']:.0f} TFLOP/s",
          "sdpa": f"{r['sdpa_tflops']:.0f} TFLOP/s", "ratio": r["ratio"]} for r in prefill] +
        [{"case": r["case"], "safetile": f"{r['safetile_us']:.1f} us {r['safetile_tbps']:.2f} TB/s",
          "sdpa": f"{r['sdpa_us']:.1f} us {r['sdpa_tbps']:.2f} TB/s", "ratio": r["ratio"],
          "of copy": f"{100 * r['fraction_of_copy']:.0f}%",
          "split alone": f"{r['split_kernel_us']:.1f} us"} for r in decode],
        ["case", "safetile", "sdpa", "ratio", "of copy", "split alone"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
