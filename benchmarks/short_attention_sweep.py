"""Sweep: grout's decode step with one-kernel attention against split-and-merge attention,
over the context length, to place ``runner.SHORT_ATTENTION_MAX``.

    python benchmarks/short_attention_sweep.py --model qwen3-4b

For each context C, one engine (random weights of the named shape) prefills a prompt of
C - 1 tokens, then both kinds of step run from that same cache: before timing, one greedy
step of each must give logits within 5% of each other (relative norm). The two attentions
round P to bf16 against different running maxima, and random weights amplify that through
every layer; the kernels themselves are checked against an fp32 reference in
tests/test_ops_attention_gpu.py. Each kind is timed as chunks of 8 graph-replayed steps
(``runner.steps``), alternating the kinds, median over repeats; a chunk's time includes
its host read. Writes benchmarks/results/archive/short_attention.json.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import harness

CONTEXTS = [64, 256, 512, 1024, 1536, 2048, 4096]


def time_chunk(runner, start: int, short_limit: int) -> float:
    """Seconds per step of one chunk of 8 steps from position ``start`` (the cursor is set
    back there first, so every chunk attends the same lengths)."""
    import safetile as st
    from safetile import ops
    runner.short_attention_max = short_limit
    runner.position = start
    cursor = st.from_torch(torch.tensor([start, 1], dtype=torch.int32, device="cuda"))
    ops.copy(cursor, out=runner.buf.cursor).sync()
    t0 = time.perf_counter()
    runner.steps(True, 8)
    return (time.perf_counter() - t0) / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    if not harness.start_gpu("short_attention_sweep"):
        return
    import grout
    from grout import runner as runner_module
    eng = grout.load(args.model, max_seq_len=max(CONTEXTS) + 64, progress=False)
    r = eng.runner
    params, key = grout.SamplingParams().tensors(eng.device)
    vocab = eng.config.vocab_size
    rows = []
    for c in CONTEXTS:
        ids = [(7 * i + 3) % vocab for i in range(c - 1)]
        logits = {}
        for short in (True, False):
            r.short_attention_max = 1 << 30 if short else 0
            r.begin(ids, params, key, True)
            r.step(True)
            logits[short] = r.buf.logits.to_torch().float()
        err = harness.check_close(f"context {c}: one-kernel vs split logits", logits[True],
                                  logits[False], 5e-2)
        start = c - 1
        for limit in (1 << 30, 0):             # warm-up: record both kinds' chunk graphs
            time_chunk(r, start, limit)
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for short in (True, False):
                times[short].append(time_chunk(r, start, 1 << 30 if short else 0))
        one, split = (statistics.median(times[s]) * 1e6 for s in (True, False))
        rows.append(dict(context=c, one_kernel_us=one, split_merge_us=split,
                         split_over_one=split / one, logits_rel_err=err))
        print(rows[-1], flush=True)
    r.short_attention_max = runner_module.SHORT_ATTENTION_MAX
    harness.print_table(rows, ["context", "one_kernel_us", "split_merge_us", "split_over_one"])
    harness.write_results("archive/short_attention", dict(
        model=args.model, chunk=8, repeats=args.repeats, rows=rows,
        method=__doc__, note="µs per decode step of the whole model, median of repeats"))


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = False
    main()
