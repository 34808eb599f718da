"""Sweep: how long a chain of early-signalling PDL launches may grow before one launch goes
in plain stream order (``kernel_op.MAX_RUNNING``), the attention's early signal, and PDL at
the step's boundary, inside the whole decode step.

    python benchmarks/pdl_chain_sweep.py --model qwen3-4b [--start 1023] [--tag 1]
    python benchmarks/pdl_chain_sweep.py --variants max_running:n=64 attention:trigger=1
    python benchmarks/pdl_chain_sweep.py --roles boundary

Most kernels of the fused step signal at their start on models with early triggers, so the
launches that may still run when one starts grow along the step, and each launch past
``MAX_RUNNING`` of them drops programmatic launch, unless a kernel that signals after its
wait ends the chain (grout's attention does). Roles: ``max_running`` (option ``n``: the cap
while the step is recorded) and ``attention`` (option ``trigger``: 1 makes the attention
kernels signal at their start, 0 after their wait) and ``boundary`` (option ``pdl``: the
step's small kernels between one lm_head and the next layer 0 (the argmax's final kernel,
the cursor's advance, the token's copy into the history, the embedding) with programmatic
launch or, 0, in plain stream order; the embedding, a step graph's first launch, goes in
plain order either way). One engine (random weights of the named
shape) prefills ``--start`` tokens; each variant's graphs are recorded once, then chunks of
8 steps from that position are timed for every variant in turn, median over repeats. The
launch order changes no value, so every variant's greedy tokens must equal the default's.
Each variant's plain-order launches in its recorded chunk graphs are counted and printed.
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
    "boundary": [dict(pdl=0)],
}
BOUNDARY = ("copy", "add_scalar", "embedding")     # the ops the boundary role forces


def serial_launches(chunks: dict) -> int:
    """Plain-order launches in the recorded chunk graphs: kernels without programmatic
    launch, and PDL kernels launched in plain order."""
    return sum(1 for g in chunks.values() for rec in g.records
               if getattr(rec, "kernel", None) is not None and
               (rec.serial or not rec.kernel.opts.get("pdl")))


def forced(op, options: dict, /, *args, **kwargs):
    """``op(*args, **kwargs)`` with ``options`` in place of the caller's."""
    return op(*args, **{**kwargs, **options})


class PlainFinal:
    """The argmax's final kernel (``ops.gemv_argmax._FINAL``) without programmatic launch."""

    def __init__(self, configured):
        self.configured = configured

    def __call__(self, num_warps, pdl=False, trigger_early=False):
        return self.configured(num_warps)


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]],
          start: int) -> tuple[list, list]:
    from safetile import ops
    from safetile.kernel import kernel_op
    from safetile.ops import gemv_argmax
    eng, origin = engine(name, start)
    r = eng.runner
    variants = [("default", {})] + chosen
    serial: dict = {}

    @contextlib.contextmanager
    def applied(role, override):
        cap = kernel_op.MAX_RUNNING
        kernel_op.MAX_RUNNING = override.get("n", cap)
        if role == "attention" and "trigger" in override:
            patched = {"decode_attention": dict(trigger_early=bool(override["trigger"]))}
        elif role == "boundary":
            patched = dict.fromkeys(BOUNDARY, dict(pdl=bool(override["pdl"])))
        else:
            patched = {}
        saved = {name: getattr(ops, name) for name in patched}
        for name, options in patched.items():
            setattr(ops, name, functools.partial(forced, saved[name], options))
        final = gemv_argmax._FINAL
        if role == "boundary" and not override["pdl"]:
            gemv_argmax._FINAL = PlainFinal(final)
        try:
            yield
        finally:
            kernel_op.MAX_RUNNING, gemv_argmax._FINAL = cap, final
            for name, op in saved.items():
                setattr(ops, name, op)

    graphs, tokens, failed, errors = record(r, origin, variants, lambda *_: None, applied)
    for i, (_, chunks) in graphs.items():
        serial[i] = serial_launches(chunks)
        print(f"{variants[i]}: {serial[i]} plain-order launches in the chunk graphs", flush=True)
    differ = [variants[i] for i in tokens if tokens[i] != tokens[0]]
    if differ:
        raise AssertionError(f"the launch order changed the greedy tokens: {differ}")
    times = median_us(r, origin, graphs, repeats)
    return step_sweep.rows(variants, times, tokens, errors,
                           lambda i: dict(serial_launches=serial[i])), failed


if __name__ == "__main__":
    step_sweep.main("pdl_chain_sweep", __doc__, VARIANTS, sweep, 11,
                    "µs per decode step of the whole model, median of repeats; "
                    "serial_launches: plain-order launches in the recorded chunk graphs")
