"""Batch-1 greedy decode on the GPU: tok/s of grout and of every peer that runs here, at Qwen3
shapes with random bf16 weights (transformers' initialization: std 0.02, never zeros).

Variants (``--variants``, decode_variants.py; each is checked before it is timed):
- ``grout``: the fused decode step, chunked graph replays; ``grout_unfused``: the unfused
  step (``fused=False``); ``grout_cublas``: projections on torch.matmul (eager);
- ``hf_eager``: transformers ``generate`` with its dynamic cache;
- ``hf_static``: ``generate(cache_implementation="static")`` without compilation;
- ``hf_static_compile``: the same with transformers' own ``torch.compile`` path (run in a
  child process under ``--compile-timeout``);
- ``torch_graph``: ``torch_decode.py``, a pure-torch static-cache step (the gpt-fast
  recipe) captured in a CUDA graph, the argmax inside it;
- ``torch_compile``: that step under ``torch.compile(mode="reduce-overhead")`` (child
  process, ``--compile-timeout``).

Figures per (model, variant, generation length): whole-request tok/s (prefill included),
decode tok/s (over the tokens after the first: from the first token's arrival on the host
for grout and the torch step, else the request's time less the time to first token),
ms/token, % of the bandwidth roofline (weight bytes and the KV cache read per token
over 4.26 TB/s), and the time to first token for 18- and 1024-token prompts.
``--breakdown`` adds the per-stage breakdown of grout's 4B step (decode_breakdown.py).

    python benchmarks/bench_decode.py --quick --budget-s 480      # the headline rows
    python benchmarks/bench_decode.py --rows qwen3-4b:grout:128/8192 --rows qwen3-32b:grout
    python benchmarks/bench_decode.py --breakdown --rows qwen3-4b:grout:128
    python benchmarks/bench_decode.py --smoke          # tiny model on the CPU: the checks only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from harness import RESULTS, env_info, print_table, save_figure, write_results

from decode_variants import (CHILD, LONG_PROMPT, PROMPT, VARIANTS, Reference, Variant,
                             build_model, bytes_per_token, prompt_ids)

COPY_TBS = 4.26
WARM_UP_TOKENS = 9          # past grout's longest chunk of decode steps (recorded on first use)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def measure(variant: Variant, model, lengths: list, repeats: int, device) -> list[dict]:
    """Decode time is from the first token's arrival on the host to the last (engines that
    hand the first token over early), else the request's time less the separately measured
    time to first token."""
    vocab = model.config.vocab_size
    p18, p1k = prompt_ids(PROMPT, vocab, device), prompt_ids(LONG_PROMPT, vocab, device)
    reps = 1 if variant.slow else repeats
    variant.generate(p18, WARM_UP_TOKENS)     # warm-up: first-shape costs (kernel choices,
    variant.generate(p1k, 1)                  # graphs, cache allocation) stay out of the figures
    ttft = statistics.median(timed(lambda: variant.generate(p18, 1)) for _ in range(reps))
    ttft_1k = statistics.median(timed(lambda: variant.generate(p1k, 1)) for _ in range(reps))
    rows = []
    for n in lengths:
        totals, decodes = [], []
        for _ in range(reps):
            variant.first_token_at = None
            sync()
            t0 = time.perf_counter()
            variant.generate(p18, n)
            sync()
            t1 = time.perf_counter()
            first = variant.first_token_at
            totals.append(t1 - t0)
            decodes.append((t1 - first) if first is not None else max(t1 - t0 - ttft, 1e-9))
        total, decode_s = statistics.median(totals), statistics.median(decodes)
        decode = (n - 1) / decode_s
        roof = COPY_TBS * 1e12 / bytes_per_token(model, PROMPT + n // 2)
        rows.append(dict(gen_len=n, request_tok_s=n / total, decode_tok_s=decode,
                         ms_per_token=1e3 / decode, frac_roofline=decode / roof,
                         ttft_ms=ttft * 1e3, ttft_1024_ms=ttft_1k * 1e3, repeats=reps,
                         decode_timed_from="first token" if first is not None
                         else "request less ttft"))
    return rows


def run_variant(name: str, model_name: str, model, lengths: list, args, device) -> list[dict]:
    max_seq = max(LONG_PROMPT, PROMPT + max(lengths)) + 8
    t0 = time.time()
    if next(model.parameters()).device.type != torch.device(device).type:
        model.to(device)                        # back from the host (see below)
    ref = Reference(model, prompt_ids(PROMPT, model.config.vocab_size, device))
    staged = VARIANTS[name].copies_weights and (args.reference_on_host or not fits_beside(model))
    if staged:                    # its copy would not fit beside the reference model: build it
        model.to("cpu")           # from the host, and time it with the GPU to itself
        free_memory()
    v = VARIANTS[name](model, max_seq, device)
    checked = dict(v.check(ref), reference_on_host=staged)
    setup = time.time() - t0
    if args.smoke:
        return [dict(model=model_name, variant=name, checked=True, **checked)]
    rows = measure(v, model, lengths, args.repeats, device)
    del v
    return [dict(model=model_name, variant=name, setup_s=setup, **checked, **r) for r in rows]


def fits_beside(model) -> bool:
    """Whether a second copy of ``model``'s weights (and a margin for caches and
    workspaces) fits in the GPU's free memory."""
    if not torch.cuda.is_available():
        return True
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return torch.cuda.mem_get_info()[0] > weights + (4 << 30)


def run_child(name: str, model_name: str, lengths: list, args) -> list[dict]:
    """``name`` in a fresh process (its own model, reference and check), killed after
    ``--compile-timeout`` seconds."""
    spec = f"{model_name}:{name}:{'/'.join(map(str, lengths))}"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--rows", spec,
           "--repeats", str(args.repeats)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.compile_timeout)
    except subprocess.TimeoutExpired:
        return [dict(model=model_name, variant=name,
                     error=f"did not compile and run within {args.compile_timeout:.0f} s")]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ROWS ")]
    if p.returncode or not lines:
        return [dict(model=model_name, variant=name,
                     error=f"exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}")]
    return json.loads(lines[-1][5:])


def plot(rows: list[dict], path) -> bool:
    """tok/s (decode) against generation length, one line per (model, variant)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    keys = dict.fromkeys((r["model"], r["variant"]) for r in rows if "decode_tok_s" in r)
    for m, v in keys:
        pts = sorted((r["gen_len"], r["decode_tok_s"]) for r in rows
                     if (r["model"], r["variant"]) == (m, v) and "decode_tok_s" in r)
        ax.plot(*zip(*pts), marker="o", label=f"{m} {v}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("generated tokens (prompt 18)")
    ax.set_ylabel("decode tok/s, batch 1")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    ax.set_title(f"Qwen3 shapes, random bf16 weights, {gpu}")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def summary(rows: list[dict]) -> dict:
    """The issue's headline keys, from the fastest variant measured at each point."""
    out = {}
    for key, model, n in (("qwen3-4b_tok_s_128", "qwen3-4b", 128),
                          ("qwen3-4b_tok_s_8192", "qwen3-4b", 8192),
                          ("qwen3-8b_tok_s_128", "qwen3-8b", 128),
                          ("qwen3-32b_tok_s_128", "qwen3-32b", 128)):
        best = max((r for r in rows if r["model"] == model and r.get("gen_len") == n
                    and "decode_tok_s" in r), key=lambda r: r["decode_tok_s"], default=None)
        out[key] = best and round(best["decode_tok_s"], 2)
        out[key + "_variant"] = best and best["variant"]
    return out


SLOW_LENGTHS = [128]
FAST_LENGTHS = [128, 1024, 8192]           # qwen3-4b, the variants not marked slow
QUICK = ["qwen3-4b:grout:128/1024/8192", "qwen3-4b:torch_graph:128", "qwen3-4b:hf_static:128",
         "qwen3-4b:grout_unfused:128", "qwen3-4b:grout_cublas:128", "qwen3-4b:hf_eager:128",
         "qwen3-8b:grout:128", "qwen3-32b:grout:128"]
MODEL_SETUP_S = 60          # a model is not built with less budget left than this
VARIANT_SETUP_S = 25        # nor a variant started


def plan(args) -> list[tuple[str, str, list]]:
    """(model, variant, lengths) in run order, grouped by model."""
    if args.smoke:
        return [("tiny", v, [8]) for v in VARIANTS if v not in CHILD]
    specs = [s for r in (args.rows or (QUICK if args.quick else [])) for s in r.split(",")]
    if not specs:
        specs = [f"{m}:{v}" for m in args.models.split(",") for v in args.variants.split(",")]
    out = []
    for s in specs:
        model, variant, *lengths = s.split(":")
        if variant not in VARIANTS:
            raise SystemExit(f"unknown variant {variant!r} in {s!r}; one of {sorted(VARIANTS)}")
        if lengths:
            ls = [int(x) for x in lengths[0].split("/")]
        else:
            ls = FAST_LENGTHS if model == "qwen3-4b" and not VARIANTS[variant].slow \
                else SLOW_LENGTHS
        out.append((model, variant, ls))
    order = list(dict.fromkeys(m for m, _, _ in out))
    return sorted(out, key=lambda row: order.index(row[0]))


def run_plan(todo: list, args, device, deadline: float) -> list[dict]:
    rows: list[dict] = []
    model, built = None, None
    for m, v, lengths in todo:
        left = deadline - time.time()
        if left < VARIANT_SETUP_S or (built != m and left < MODEL_SETUP_S):
            rows.append(dict(model=m, variant=v, error="skipped: out of budget"))
            print(rows[-1], flush=True)
            continue
        try:
            if v in CHILD and not args.smoke and not args.child:
                rows += run_child(v, m, lengths, args)
            else:
                if built != m:
                    model, built = None, None
                    free_memory()
                    model, built = build_model(m, device), m
                rows += run_variant(v, m, model, lengths, args, device)
        except Exception as e:                     # report and go on
            rows.append(dict(model=m, variant=v, error=f"{type(e).__name__}: {e}"[:400]))
        print(rows[-1], flush=True)
        free_memory()
        if not args.smoke and not args.child:
            write_results(args.name, {"rows": rows, "summary": summary(rows),
                                      "method": __doc__.split("\n\n")[2]})
    return rows


def free_memory() -> None:
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3-4b,qwen3-8b,qwen3-32b")
    p.add_argument("--variants", default="grout,torch_graph,hf_static,hf_static_compile,"
                                         "torch_compile,grout_unfused,grout_cublas,hf_eager")
    p.add_argument("--rows", action="append", help="model:variant[:len/len...], comma-"
                   "separated or repeated; replaces --models/--variants")
    p.add_argument("--quick", action="store_true", help="the headline rows (QUICK)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile-timeout", type=float, default=240.0)
    p.add_argument("--budget-s", type=float, default=1e9, help="device seconds for the run: "
                   "rows that would start too late are skipped (and reported)")
    p.add_argument("--breakdown", action="store_true",
                   help="also the per-stage breakdown of grout's qwen3-4b step")
    p.add_argument("--reference-on-host", action="store_true",
                   help="build grout's variants from host copies of the weights and time them "
                        "with the transformers model off the GPU (automatic where the two "
                        "copies do not fit together)")
    p.add_argument("--name", default="decode", help="results file name")
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU: checks only")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    t_start = time.time()
    deadline = t_start + args.budget_s
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and not torch.cuda.is_available():
        print("bench_decode needs a CUDA GPU")
        return 1
    import safetile as st
    st.set_backend("interpret" if args.smoke else "triton")
    todo = plan(args)
    if args.child:
        print("ROWS " + json.dumps(run_plan(todo, args, device, deadline)))
        return 0
    print(env_info(), flush=True)
    rows = run_plan(todo, args, device, deadline)
    if args.breakdown or args.smoke:
        import decode_breakdown
        rest = deadline - time.time()
        decode_breakdown.run("tiny" if args.smoke else "qwen3-4b", device, rest, args.smoke)
    if args.smoke:
        bad = [r for r in rows if "error" in r]
        print("smoke:", "every check passed" if not bad else bad)
        return 1 if bad else 0
    try:
        plot(rows, RESULTS / f"{args.name}.png")
    except Exception as e:                                # the JSON is written already
        print("plot failed:", type(e).__name__, e)
    print_table(rows, ["model", "variant", "gen_len", "decode_tok_s", "request_tok_s",
                       "ms_per_token", "frac_roofline", "ttft_ms", "ttft_1024_ms",
                       "tokens_agreeing", "error"])
    print("summary:", summary(rows))
    print(f"bench_decode: {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
