"""Sweep: ``Engine.stream`` with its chunks decoded ahead on a worker thread (the default)
against decoding each chunk when the reader needs it, and ``runner.steps`` (the same chunks
with no per-token host work: the floor a stream can reach), in one engine and one process.

    python benchmarks/decode_ahead_sweep.py --models qwen3-4b qwen3-8b [--tokens 128]

Each request is an 18-token prompt, then ``--tokens`` greedy tokens (end tokens ignored);
a stream is timed from its first piece to its last, as bench_decode times grout. The
variants run in turn, ``--repeats`` rounds, after one warm-up round; the figure is the
median µs per decoded token. Both stream variants must give the tokens of runner.steps.
Writes benchmarks/results/archive/decode_ahead_sweep.json.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

import harness

PROMPT = 18


def stream_us(eng, prompt: list, n: int, ahead: bool) -> tuple[float, list]:
    eng.decode_ahead = ahead
    tokens, t0 = [], None
    for piece in eng.stream(prompt, max_new_tokens=n, ignore_eos=True):
        if t0 is None:
            t0 = time.perf_counter()
        tokens.append(piece.token_id)
    return (time.perf_counter() - t0) / (n - 1) * 1e6, tokens


def steps_us(eng, prompt: list, n: int) -> tuple[float, list]:
    import safetile as st
    from grout.sampler import SamplingParams
    r = eng.runner
    params, key = SamplingParams().tensors(eng.device)
    with st.backend(eng.backend):
        tokens = [r.begin(prompt, params, key, True)]
        t0 = time.perf_counter()
        tokens += r.steps(True, n - 1)
    return (time.perf_counter() - t0) / (n - 1) * 1e6, tokens


def sweep(name: str, n: int, repeats: int) -> dict:
    import grout
    eng = grout.load(name, max_seq_len=2048, progress=False)
    prompt = [(7 * i + 3) % eng.config.vocab_size for i in range(PROMPT)]
    variants = {"stream, decoded ahead": lambda: stream_us(eng, prompt, n, True),
                "stream, each chunk when needed": lambda: stream_us(eng, prompt, n, False),
                "runner.steps (no host work)": lambda: steps_us(eng, prompt, n)}
    times: dict = {k: [] for k in variants}
    tokens: dict = {}
    for round_ in range(repeats + 1):
        for label, run in variants.items():
            us, tokens[label] = run()
            if round_:                           # round 0 warms up (chunk graphs recorded)
                times[label].append(us)
    want = tokens["runner.steps (no host work)"]
    differ = [k for k, t in tokens.items() if t != want]
    if differ:
        raise AssertionError(f"{name}: {differ} gave other tokens than runner.steps")
    base = statistics.median(times["stream, each chunk when needed"])
    rows = [dict(model=name, variant=k, us_per_token=statistics.median(v),
                 tok_s=1e6 / statistics.median(v),
                 speedup_over_inline=base / statistics.median(v), samples=v)
            for k, v in times.items()]
    del eng
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-4b"])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    if not harness.start_gpu("decode_ahead_sweep"):
        return 0
    rows = []
    for name in args.models:
        rows += sweep(name, args.tokens, args.repeats)
        harness.print_table(rows, ["model", "variant", "us_per_token", "tok_s",
                                   "speedup_over_inline"])
    harness.write_results("archive/decode_ahead_sweep", dict(
        prompt_tokens=PROMPT, tokens=args.tokens, repeats=args.repeats, rows=rows,
        note="µs per decoded token, median of rounds in turn; one engine per model"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
