"""Sweep: L2 prefetches of the o projection's weight (and the gate/up weight's first rows)
issued before the attention, inside the whole decode step, to place ``model.L2_PREFETCH_O``.

    python benchmarks/prefetch_step_sweep.py --model qwen3-4b [--tag 1]
    python benchmarks/prefetch_step_sweep.py --variants qkv:trigger=0 prologue:gate_up_rows=2048

A variant's role is where the prefetch goes in each layer (``qkv``: right after the qkv
projection; ``prologue``: after the attention prologue); its options are ``trigger`` (1:
the prefetch kernel lets its successor be scheduled as its programs start, the default on
models with early triggers), ``o_rows`` (only that many leading rows of o's weight: 1
measures what the extra kernel costs by itself) and ``gate_up_rows`` (that many leading rows
of the gate/up weight prefetched after o's). One engine (random weights of the named shape) prefills a
127-token prompt (``--start`` tokens). Each variant's graphs are recorded once; chunks of 8
steps from that position (cursor and token set back each time) are then timed for every
variant in turn, median over repeats. A prefetch changes no value, so every variant's greedy
tokens must equal the default's (checked before timing). Writes
benchmarks/results/archive/prefetch_step_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import contextlib

import step_sweep
from step_sweep import engine, median_us, record

VARIANTS = {
    "qkv": [dict(), dict(trigger=0), dict(gate_up_rows=2048), dict(gate_up_rows=4096)],
    "prologue": [dict(), dict(trigger=0), dict(gate_up_rows=2048)],
}


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]],
          start: int) -> tuple[list, list]:
    eng, origin = engine(name, start)
    r = eng.runner
    gemm = r.gemm
    variants = [("default", {})] + chosen

    @contextlib.contextmanager
    def applied(role, override):
        saved = (gemm.prefetch_o, gemm.prefetch_o_rows, gemm.prefetch_gate_up_rows,
                 gemm.prefetch_trigger_early)
        gemm.prefetch_o, gemm.prefetch_o_rows = role, override.get("o_rows")
        gemm.prefetch_gate_up_rows = override.get("gate_up_rows", 0)
        gemm.prefetch_trigger_early = bool(override.get("trigger", gemm.trigger_early))
        try:
            yield
        finally:
            (gemm.prefetch_o, gemm.prefetch_o_rows, gemm.prefetch_gate_up_rows,
             gemm.prefetch_trigger_early) = saved

    graphs, tokens, failed, errors = record(r, origin, variants, lambda *_: None, applied)
    differ = [variants[i] for i in tokens if tokens[i] != tokens[0]]
    if differ:
        raise AssertionError(f"a prefetch changed the greedy tokens: {differ}")
    times = median_us(r, origin, graphs, repeats)
    return step_sweep.rows(variants, times, tokens, errors), failed


if __name__ == "__main__":
    step_sweep.main("prefetch_step_sweep", __doc__, VARIANTS, sweep, 11,
                    "µs per decode step of the whole model, median of repeats; role: where "
                    "the prefetch goes; override: its options")
