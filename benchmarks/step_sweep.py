"""What the whole-step sweeps share (``gemv_step_sweep.py``, ``attention_step_sweep.py``,
``early_trigger_sweep.py``): the engine at a start position (``START`` unless told), timing
recorded variants in turn, and the command line.

A variant is ``(role, override)``: ``role`` names what it changes in grout's decode step,
``override`` the options it passes (``role:option=value,...`` on the command line).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import NamedTuple

import torch

import harness

START = 127                  # the default start position (after a 127-token prompt)

__all__ = ["START", "Origin", "chunk", "parse_variant", "engine", "record", "median_us",
           "rows", "main"]


class Origin(NamedTuple):
    """Where every timed chunk starts: the position, and the token fed to its first step."""
    position: int
    token: int


def chunk(runner, origin: Origin) -> tuple[float, list]:
    """Seconds per step of 8 steps from ``origin`` (cursor and token set back first), and
    their tokens."""
    import safetile as st
    from safetile import ops
    runner.position = origin.position
    for values, out in (([origin.position, 1], runner.buf.cursor),
                        ([origin.token], runner.buf.token)):
        t = st.from_torch(torch.tensor(values, dtype=torch.int32, device="cuda"))
        ops.copy(t, out=out).sync()
    t0 = time.perf_counter()
    tokens = runner.steps(True, 8)
    return (time.perf_counter() - t0) / 8, tokens


# Options that are flags: the ops refuse an int for them, so 0 / 1 on the command line are
# passed as False / True.
FLAGS = {"masked", "cyclic", "trim", "tma", "early", "pdl", "trigger_early"}


def parse_variant(text: str) -> tuple[str, dict]:
    """``"down:bk=1024,num_stages=4"`` -> ``("down", {"bk": 1024, "num_stages": 4})``;
    ``"split:masked=1"`` -> ``("split", {"masked": True})``."""
    role, _, fields = text.partition(":")
    pairs = (f.split("=") for f in fields.split(",") if f)
    return role, {k: bool(int(v)) if k in FLAGS else int(v) for k, v in pairs}


def engine(name: str, start: int = START):
    """A grout engine of ``name``'s shape (random weights) that has prefilled ``start``
    tokens: returns it and the :class:`Origin` of its timed chunks."""
    import grout
    eng = grout.load(name, max_seq_len=max(2048, 2 * start), progress=False)
    params, key = grout.SamplingParams().tensors(eng.device)
    vocab = eng.config.vocab_size
    first = eng.runner.begin([(7 * i + 3) % vocab for i in range(start)], params, key, True)
    return eng, Origin(start, first)


def record(runner, origin: Origin, variants: list, check, applied) -> tuple:
    """Record each variant's graphs (``variants[0]`` the default). ``check(role, override)``
    returns ``(error, the default's error, slack)`` of the variant's op, or None to check
    nothing; an error above twice the default's plus ``slack`` stops the sweep.
    ``applied(role, override)`` is a context manager in force while its graphs are
    recorded. Returns ``(graphs, tokens, failed, errors)``, by variant index: a variant the
    kernels refuse is in ``failed`` and has no graphs."""
    graphs, tokens, failed, errors = {}, {}, [], {}
    for i, (role, override) in enumerate(variants):
        runner.graphs, runner.chunks = {}, {}
        try:
            found = check(role, override) if i else None
            with applied(role, override) if i else contextlib.nullcontext():
                tokens[i] = chunk(runner, origin)[1]
        except Exception as e:                # options the kernels refuse, or out of resources
            failed.append(dict(role=role, override=override, error=f"{type(e).__name__}: {e}"))
            print(f"{role} {override}: {type(e).__name__}: {e}", flush=True)
            continue
        if found is not None:
            errors[i] = found[:2]
            if not found[0] <= 2 * found[1] + found[2]:
                raise AssertionError(f"{role} {override}: relative error {found[0]:.2e}, "
                                     f"the default's {found[1]:.2e}")
        graphs[i] = (runner.graphs, runner.chunks)
    return graphs, tokens, failed, errors


def median_us(runner, origin: Origin, graphs: dict, repeats: int) -> dict:
    """Per variant ``i`` of ``graphs`` (its recorded ``(graphs, chunks)``): the median µs per
    step of chunks of 8 from ``origin``, the variants timed in turn ``repeats`` times."""
    times: dict = {i: [] for i in graphs}
    for _ in range(repeats):
        for i, g in graphs.items():
            runner.graphs, runner.chunks = g
            times[i].append(chunk(runner, origin)[0])
    return {i: statistics.median(t) * 1e6 for i, t in times.items()}


def rows(variants: list, times: dict, tokens: dict, errors: dict, extra=None) -> list:
    """One row per timed variant ``(role, override)``: its µs per step, the default's time
    over it, its op's error and the default's, whether its greedy tokens are the default's;
    ``extra(i)`` adds fields."""
    out = []
    for i, us in times.items():
        role, override = variants[i]
        out.append(dict(role=role, override=override, **(extra(i) if extra else {}),
                        us_per_step=us, default_over_this=times[0] / us,
                        rel_error=errors.get(i, (None,))[0],
                        default_rel_error=errors.get(i, (None, None))[1],
                        tokens_equal=tokens[i] == tokens[0]))
    return out


def main(name: str, doc: str, variants: dict, sweep, repeats: int, note: str) -> None:
    """The command line of a sweep ``name``: ``sweep(model, repeats, chosen, start)``
    returns its rows and failed variants; they are printed and written to
    results/archive/<name>_<model>_<tag>.json."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--roles", nargs="+", default=list(variants))
    ap.add_argument("--variants", nargs="+", default=None,
                    help="role:option=value,... (instead of the roles' default variants)")
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--tag", default="1")
    ap.add_argument("--start", type=int, default=START,
                    help="the position chunks start at (the prompt's length)")
    args = ap.parse_args()
    chosen = [parse_variant(v) for v in args.variants] if args.variants else \
        [(role, o) for role in args.roles for o in variants[role]]
    if not harness.start_gpu(name):
        return
    table, failed = sweep(args.model, args.repeats, chosen, args.start)
    harness.print_table(table, ["role", "override", "us_per_step", "default_over_this",
                               "rel_error", "tokens_equal"])
    harness.write_results(f"archive/{name}_{args.model}_{args.tag}", dict(
        model=args.model, chunk=8, start=args.start, repeats=args.repeats, rows=table,
        failed=failed, method=doc, note=note))
