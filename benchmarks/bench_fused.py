"""Decode-step fusion on the GPU: each fused kernel against the unfused chain it replaces, and
whole Qwen3 decode steps (every layer, lm_head, argmax) assembled both ways (and the fused
step with the attention's reads before its PDL wait, as the unfused step has them).

Every figure is a CUDA graph over distinct weights replayed back to back
(``harness.time_ms_steady``), as decode runs: a stage chain is one stage of every layer of
the model (36 or 64 copies, each with its own weights, so L2 never serves them), a step is
the whole decode step of ``decode_layers.py``. All graphs are timed three times in turn;
medians. Bandwidth is the bytes that must be read (weights; the KV cache up to the context)
over the time, as a fraction of the 4.26 TB/s copy ceiling (../shared/FACTS.md). Every graph
is checked before it is timed: stage chains against torch (the last layer's result), the
fused step's logits against the unfused step's.

Stages partition a layer's kernels: qkv = [add_rmsnorm, gemv] vs [rmsnorm_gemv];
attn_prologue = [rmsnorm q, rmsnorm k, rope q, rope k, kv_append] vs
[qk_norm_rope_kv_append]; prologue+attention = the prologue and decode attention (split,
merge), its reads before the PDL wait vs after it (``early=False``: its launch then overlaps
the append before it; with the reads before, the launcher puts it in plain order after the
append); o = [gemv] vs
[gemv_add]; gate_up = [add_rmsnorm, gemv] vs [rmsnorm_gemv]; down = [silu_mul, gemv] vs
[silu_mul_gemv_add]; lm_head = [add_rmsnorm, gemv, argmax] vs [rmsnorm_gemv_argmax]. The
plain gemv of each projection is timed too (``gemv``): the floor a fused gemv aims at. A
layer is qkv + prologue+attention + o + gate_up + down.

    python benchmarks/bench_fused.py                      # qwen3-4b, then qwen3-32b
    python benchmarks/bench_fused.py --models qwen3-4b --budget-s 120
    python benchmarks/bench_fused.py --smoke              # tiny shapes on the CPU executor:
                                                          # the checks only, nothing timed
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from harness import (RESULTS, check_close, print_table, save_figure, start_gpu,
                     time_ms_steady, write_results)

import safetile as st  # noqa: E402

import decode_layers as dl  # noqa: E402
from fused_stages import Stages, T  # noqa: E402

COPY_TBS = 4.26
LM_HEAD_COPIES = 4      # lm_head chains: 4 passes over its 0.8-1.6 GB (far past L2)


def record(bodies, items):
    """The graph of ``body(rec, item)`` for every item, in order."""
    with st.graph_scope() as scope:
        for item in items:
            bodies(scope.record, item)
    return scope.graph


def replay_of(graph, smoke: bool):
    if smoke:
        return lambda: graph.launch().sync()
    cuda = graph._cuda

    def replay(_keep=graph):            # keeps the graph (and what it records) alive
        cuda.replay()
    return replay


def serial_launches(graph) -> int:
    """PDL launches of the graph that went in plain order (the launcher's check)."""
    return sum(1 for r in graph.records if r.kernel.opts.get("pdl") and getattr(r, "serial", 0))


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure(replays: list, rounds: int) -> list:
    """Median ms of each replay, timed ``rounds`` times in turn (None for 0 rounds: the
    smoke run times nothing)."""
    if not rounds:
        return [None] * len(replays)
    samples = [[] for _ in replays]
    for _ in range(rounds):
        for i, r in enumerate(replays):
            samples[i].append(time_ms_steady(r))
    return [statistics.median(x) for x in samples]


def checked(name: str, got, want, rel: float):
    """The relative error, or the failure's message (the variant is then not timed)."""
    try:
        return check_close(name, got, want, rel), None
    except AssertionError as e:
        print("CHECK FAILED:", e, flush=True)
        return None, str(e)


def step_variants(breakdown: bool) -> dict:
    """name -> (recorder, checked): the steps to time. ``checked`` False marks a diagnostic
    (not a decode step: nothing to check it against)."""
    F = dl.record_fused
    out = {"unfused": (dl.record_unfused, True),
           "fused": (F, True),
           "fused_attn_early": (lambda rec, s: F(rec, s, attention_early=True), True),
           "fused_no_pdl": (lambda rec, s: F(rec, s, pdl=False), True)}
    if breakdown:
        for stage in ("qkv", "prologue", "o", "gate_up", "down", "lm_head"):
            out[f"fused_but_{stage}"] = (
                lambda rec, s, stage=stage: F(rec, s, unfused=frozenset([stage])), True)
        out["fused_no_attention"] = (lambda rec, s: F(rec, s, with_attention=False), False)
        out["gemvs_only"] = (dl.record_gemvs_only, False)
    return out


MAIN_STEPS = ("unfused", "fused")   # also timed at the other contexts


def time_steps(name: str, shape, step: dl.Step, contexts, smoke: bool, rounds: int,
               breakdown: bool = False) -> list[dict]:
    """The whole step, each variant, at each context (the breakdown's variants at the first
    only): checked against the unfused step's logits, then timed."""
    variants = step_variants(breakdown)
    graphs = {v: record(lambda rec, f: f(rec, step), [f]) for v, (f, _) in variants.items()}
    replays = {v: replay_of(g, smoke) for v, g in graphs.items()}
    rows = []
    for n, context in enumerate(contexts):
        step.set_context(context)
        names = list(replays) if n == 0 else [v for v in replays if v in MAIN_STEPS]
        out = {}
        for v in names:
            replays[v]()
            sync()
            out[v] = (T(step.logits), T(step.next_token).item())
        checks = {v: checked(f"{name} step at {context}: {v} vs unfused logits", out[v][0],
                             out["unfused"][0], 3e-2) if variants[v][1] else (None, None)
                  for v in names}
        good = [v for v in names if checks[v][1] is None]
        times = dict(zip(good, measure([replays[v] for v in good], rounds)))
        for v in names:
            g, ms = graphs[v], times.get(v)
            rows.append(dict(model=name, context=context, variant=v, kernels=len(g.records),
                             pdl_serial=serial_launches(g), step_us=ms and ms * 1e3,
                             tok_s=ms and 1e3 / ms,
                             frac_roofline=ms and shape.step_bytes(context) / (ms * 1e-3)
                             / (COPY_TBS * 1e12),
                             logits_rel_err_vs_unfused=checks[v][0],
                             same_token=out[v][1] == out["unfused"][1] if variants[v][1]
                             else None,
                             error=checks[v][1] or (None if variants[v][1] else
                                                    "diagnostic: not a decode step, unchecked")))
            print(rows[-1], flush=True)
    step.set_context(contexts[0])
    return rows


def time_stages(name: str, step: dl.Step, smoke: bool, rounds: int) -> list[dict]:
    """Every stage chain, each variant: checked against torch, then timed."""
    stages = Stages(step)
    found = []
    for row in stages.table() + [stages.lm_head()]:
        items = [None] * LM_HEAD_COPIES if row["name"] == "lm_head" else step.layers
        for variant in ("unfused", "fused", "gemv"):
            if row.get(variant) is None:
                continue
            g = record(row[variant], items)
            r = replay_of(g, smoke)
            r()
            sync()
            err, error = checked(f"{name} {row['name']} {variant}", T(row["out"]).reshape(-1),
                                 row["want"](variant, items[-1]).reshape(-1), 2e-2)
            found.append(dict(model=name, stage=row["name"], variant=variant,
                              kernels_per_layer=len(g.records) // len(items), chain=len(items),
                              nbytes=row["nbytes"], rel_err=err, pdl_serial=serial_launches(g),
                              error=error, replay=None if error else r))
    timed_rows = [f for f in found if f["replay"] is not None]
    for f, ms in zip(timed_rows, measure([f["replay"] for f in timed_rows], rounds)):
        f["us"] = ms and ms * 1e3 / f["chain"]
        f["frac_copy"] = f["us"] and f["nbytes"] and f["nbytes"] / (f["us"] * 1e-6) \
            / (COPY_TBS * 1e12)
    for f in found:
        del f["replay"]
        print(f, flush=True)
    return found


def run_model(name: str, args, smoke: bool, save=lambda result: None) -> dict:
    """Build the model's step, time its steps then its stage chains (``save`` is called with
    the partial result after each)."""
    shape = dl.MODELS[name]
    t0 = time.time()
    step = dl.Step(shape, args.max_seq, args.contexts[0])
    sync()
    result = dict(build_s=time.time() - t0)
    rounds = 0 if smoke else args.rounds
    result["steps"] = time_steps(name, shape, step, args.contexts, smoke, rounds,
                                 args.breakdown)
    save(result)
    result["stages"] = time_stages(name, step, smoke, rounds) if args.stages else []
    result["summary"] = summarize(name, shape, result["stages"], result["steps"],
                                  args.contexts[0])
    save(result)
    del step
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def summarize(name, shape, rows, step_rows, context) -> dict:
    """Per-layer sums of the stages, each way, against the measured steps."""
    out = {}
    for v in ("unfused", "fused"):
        per_layer = sum(r.get("us") or 0 for r in rows if r["variant"] == v
                        and r["stage"] not in ("lm_head", "attn_prologue"))
        head = next((r.get("us") for r in rows if r["stage"] == "lm_head"
                     and r["variant"] == v), None) or 0
        step = next((r for r in step_rows if r["variant"] == v and r["context"] == context),
                    {})
        out[v] = dict(stage_sum_us=per_layer * shape.layers + head * 1.0,
                      step_us=step.get("step_us"), tok_s=step.get("tok_s"),
                      frac_roofline=step.get("frac_roofline"))
    return out


def plot(results: dict, path) -> bool:
    """Per-layer µs of each stage, unfused vs fused, one panel per model (False without
    matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = [m for m in results if results[m].get("summary")]
    if not models:
        return False
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models):
        rows = results[m]["stages"]
        names = [n for n in dict.fromkeys(r["stage"] for r in rows)]
        for dx, v in ((-0.27, "unfused"), (0, "fused"), (0.27, "gemv")):
            ys = [next((r.get("us") for r in rows if r["stage"] == n and r["variant"] == v), 0)
                  or 0 for n in names]
            ax.bar([i + dx for i in range(len(names))], ys, 0.27,
                   label={"gemv": "plain gemv"}.get(v, v))
        su = results[m]["summary"]
        ax.set_title(f"{m}: step {su['unfused']['step_us'] or 0:.0f} -> "
                     f"{su['fused']['step_us'] or 0:.0f} us (H200)")
        ax.set_xticks(range(len(names)), names, rotation=20)
        ax.set_ylabel("us per layer (lm_head: per pass)")
        ax.legend()
    save_figure(fig, path)
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3-4b,qwen3-32b")
    p.add_argument("--contexts", default="128,4096", help="step contexts (the first also "
                   "sets the attention stage's)")
    p.add_argument("--max-seq", type=int, default=4096)
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="models not started by then are skipped")
    p.add_argument("--name", default="fused", help="results file name")
    p.add_argument("--rounds", type=int, default=3, help="times every graph is timed in turn")
    p.add_argument("--breakdown", action="store_true",
                   help="also the step with one stage unfused at a time, and diagnostics")
    p.add_argument("--no-stages", dest="stages", action="store_false",
                   help="time the steps only, not the stage chains")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes on the CPU executor: build, record and check only")
    args = p.parse_args()
    args.contexts = [int(c) for c in args.contexts.split(",")]
    if args.smoke:
        args.models, args.max_seq, args.contexts, args.breakdown = "tiny", 64, [10, 40], True
        with st.backend("interpret", seed=0):
            run_model("tiny", args, smoke=True)
        print("smoke: every check passed")
        return 0
    if not start_gpu("bench_fused"):
        return 1
    deadline = time.time() + args.budget_s
    results = {}
    for m in args.models.split(","):
        if time.time() > deadline:
            results[m] = {"error": "skipped: out of time"}
            continue
        def save(result, m=m):
            results[m] = result
            write_results(args.name, {"models": results, "method": __doc__.split("\n\n")[1]})
        try:
            run_model(m, args, smoke=False, save=save)
        except Exception as e:                            # report and go on
            save({**results.get(m, {}), "error": f"{type(e).__name__}: {e}"[:400]})
            print(m, results[m], flush=True)
    try:
        plot(results, RESULTS / f"{args.name}.png")
    except Exception as e:                                # the JSON is written already
        print("plot failed:", type(e).__name__, e)
    for m, r in results.items():
        if "steps" in r:
            print(f"\n{m} stages (us per layer; lm_head per pass)")
            print_table(r.get("stages", []), ["stage", "variant", "kernels_per_layer", "us",
                                              "frac_copy", "rel_err", "pdl_serial", "error"])
            print_table(r["steps"], ["context", "variant", "kernels", "pdl_serial", "step_us",
                                     "tok_s", "frac_roofline", "logits_rel_err_vs_unfused"])
            print("summary:", r.get("summary"), "error:", r.get("error"))
        else:
            print(m, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
