"""Sweep: grout's decode step with and without early triggers (each gemv and the attention
prologue letting its successor be scheduled as its programs start), to place
``model.EARLY_TRIGGER_MAX_HIDDEN``.

    python benchmarks/early_trigger_sweep.py --models qwen3-4b qwen3-8b qwen3-32b

Per model, one engine (random weights of the named shape) prefills a 127-token prompt; each
variant's graphs are recorded once, then chunks of 8 steps from position 127 (cursor and
token set back each time) are timed alternately, median over repeats. Before timing, the
variants' tokens must be identical: a trigger changes only when a kernel is scheduled.
Writes benchmarks/results/archive/early_trigger.json.
"""
from __future__ import annotations

import argparse
import gc

import torch

import harness
from step_sweep import START, chunk, engine, median_us


def sweep(name: str, repeats: int) -> dict:
    eng, origin = engine(name)
    r = eng.runner
    graphs, tokens = {}, {}
    for on in (False, True):
        r.gemm.trigger_early = on
        r.graphs, r.chunks = {}, {}
        tokens[on] = chunk(r, origin)[1]
        graphs[on] = (r.graphs, r.chunks)
    if tokens[True] != tokens[False]:
        raise AssertionError(f"{name}: early triggers changed the tokens: {tokens}")
    times = median_us(r, origin, graphs, repeats)
    off, on = times[False], times[True]
    row = dict(model=name, hidden_size=eng.config.hidden_size, off_us=off, on_us=on,
               off_over_on=off / on)
    del eng, r, graphs
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["qwen3-4b", "qwen3-8b", "qwen3-32b"])
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args()
    if not harness.start_gpu("early_trigger_sweep"):
        return
    rows = []
    for name in args.models:
        rows.append(sweep(name, args.repeats))
        print(rows[-1], flush=True)
    harness.print_table(rows, ["model", "hidden_size", "off_us", "on_us", "off_over_on"])
    harness.write_results("archive/early_trigger", dict(
        chunk=8, start=START, repeats=args.repeats, rows=rows, method=__doc__,
        note="µs per decode step of the whole model, median of repeats"))


if __name__ == "__main__":
    main()
