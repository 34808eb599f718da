"""grout end to end on the GPU: time to first token, decode tok/s and % of the bandwidth roofline
for one named shape, with the safetile projections (one graph per decode step) and the
torch.matmul (cuBLAS, eager) comparison path in the same process.

    python benchmarks/bench_grout.py --model qwen3-4b --prompt-len 18 --gen-len 128

Both engines get the same random weights (same seed). Before timing, the two variants'
prefill logits must agree (bf16 projections accumulated in different orders: within 5% of
the logits' scale) and each variant's greedy run must repeat itself token for token.
Writes benchmarks/results/grout_<model>.json and a bar plot next to it.
"""
from __future__ import annotations

import argparse
import gc
from pathlib import Path

import torch

import harness


def plot(rows: list, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot")
        return None
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = [f"{r['gemm']}\n({'graph' if r['graph'] else 'eager'})" for r in rows]
    ax.bar(names, [r["decode_tok_s"] for r in rows], color=["#3a7", "#888"][:len(rows)])
    ax.axhline(rows[0]["roofline_tok_s"], color="k", ls="--", lw=1, label="roofline (4.26 TB/s)")
    for i, r in enumerate(rows):
        ax.text(i, r["decode_tok_s"], f"{r['decode_tok_s']:.0f} tok/s\n{r['pct_of_roofline']:.0f}%",
                ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("decode tok/s (batch 1)")
    ax.set_title(f"grout {rows[0]['model']}, prompt {rows[0]['prompt_len']}, "
                 f"{rows[0]['gen_len']} tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--prompt-len", type=int, default=18)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--no-cublas", action="store_true")
    args = ap.parse_args()
    if not harness.start_gpu("bench_grout"):
        return
    import grout
    from grout import bench

    rows, logits = [], {}
    probe = bench.prompt_ids(16, seed=1)
    for gemm in ["safetile"] + ([] if args.no_cublas else ["cublas"]):
        eng = grout.load(args.model, device="cuda", max_seq_len=args.max_seq_len, gemm=gemm)
        logits[gemm] = eng.logits(probe)
        r = bench.run(eng, args.prompt_len, args.gen_len, repeats=args.repeats)
        print(bench.report(r), flush=True)
        rows.append(r)
        harness.write_results(f"grout_{args.model.replace('.', '_')}", {"model": args.model,
                                                                        "rows": rows})
        del eng
        gc.collect()
        torch.cuda.empty_cache()
    if "cublas" in logits:
        a, b = logits["safetile"], logits["cublas"]
        err = (a - b).abs().max().item() / a.abs().max().item()
        print(f"prefill logits, safetile vs cublas: max difference {err:.4f} of the scale")
        assert err < 0.05, "the two projection paths disagree"
        rows[1]["logits_vs_safetile"] = err
        rows[0]["speedup_vs_cublas"] = rows[0]["decode_tok_s"] / rows[1]["decode_tok_s"]
    harness.print_table(rows, ["gemm", "graph", "ttft_ms", "decode_tok_s", "ms_per_token",
                               "roofline_tok_s", "pct_of_roofline"])
    name = f"grout_{args.model.replace('.', '_')}"
    path = harness.write_results(name, {"model": args.model, "rows": rows})
    print(f"wrote {path}")
    png = plot(rows, path.with_suffix(".png"))
    if png is not None:
        import os
        import shutil
        if os.environ.get("OUT"):
            shutil.copy(png, Path(os.environ["OUT"]) / png.name)
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
