"""Sweep: how long a chain of early-signalling PDL launches may grow before one launch goes
in plain stream order (``kernel_op.MAX_RUNNING``), and the attention's early signal, inside
the whole decode step.

    python benchmarks/pdl_chain_sweep.py --model qwen3-4b [--start 1023] [--tag 1]
    python benchmarks/pdl_chain_sweep.py --variants max_running:n=64 attention:trigger=1

Most kernels of the fused step signal at their start on models with early triggers, so the
launches that may still run when one starts grow along the step, and each launch past
``MAX_RUNNING`` of them drops programmatic launch, unless a kernel that signals after its
wait ends the chain (grout's attention does). Roles: ``max_running`` (option ``n``: the cap
while the step is recorded) and ``attention`` (option ``trigger``: 1 makes the attention
kernels signal at their start, 0 after their wait). One engine (random weights of the named
shape) prefills ``--start`` tokens; each variant's graphs are recorded once, then chunks of
8 steps from that position are timed for every variant in turn, median over repeats. The
launch order changes no value, so every variant's greedy tokens must equal the default's.
Each variant's plain-order launches in its recorded step graphs are counted and printed.
Writes benchmarks/results/archive/pdl_chain_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import contextlib
import functools

import step_sweep
from step_sweep import engine, median_us, record

VARIANTS = {
    "max_running": [dict(n=16), dict(n=64), dict(n=1000)],
    "attention": [dict(trigger=1), dict(trigger=1, n=1000)],
}


def serial_launches(runner) -> int:
    """Plain-order launches among the PDL kernels of the recorded one-step graphs."""
    return sum(rec.serial for g in runner.graphs.values() for rec in g.records
               if getattr(rec, "kernel", None) is not None and rec.kernel.opts.get("pdl"))


def forced(attention, trigger: bool, /, *args, **kwargs):
    """``attention(*args, **kwargs)`` with ``trigger_early=trigger`` in place of the
    caller's."""
    return attention(*args, **{**kwargs, "trigger_early": trigger})


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]],
          start: int) -> tuple[list, list]:
    from safetile import ops
    from safetile.kernel import kernel_op
    eng, origin = engine(name, start)
    r = eng.runner
    variants = [("default", {})] + chosen
    serial: dict = {}

    @contextlib.contextmanager
    def applied(role, override):
        cap, attention = kernel_op.MAX_RUNNING, ops.decode_attention
        kernel_op.MAX_RUNNING = override.get("n", cap)
        if role == "attention" and "trigger" in override:
            ops.decode_attention = functools.partial(forced, attention, bool(override["trigger"]))
        try:
            yield
        finally:
            kernel_op.MAX_RUNNING, ops.decode_attention = cap, attention

    graphs, tokens, failed, errors = record(r, origin, variants, lambda *_: None, applied)
    for i, (g, _) in graphs.items():
        r.graphs = g
        serial[i] = serial_launches(r)
        print(f"{variants[i]}: {serial[i]} plain-order launches in the step graphs", flush=True)
    differ = [variants[i] for i in tokens if tokens[i] != tokens[0]]
    if differ:
        raise AssertionError(f"the launch order changed the greedy tokens: {differ}")
    times = median_us(r, origin, graphs, repeats)
    return step_sweep.rows(variants, times, tokens, errors,
                           lambda i: dict(serial_launches=serial[i])), failed


if __name__ == "__main__":
    step_sweep.main("pdl_chain_sweep", __doc__, VARIANTS, sweep, 11,
                    "µs per decode step of the whole model, median of repeats; "
                    "serial_launches: plain-order PDL launches in the recorded step graphs")
