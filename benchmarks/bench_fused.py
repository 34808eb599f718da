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
import os
import statistics
import sys
import time

import torch

from harness import RESULTS, check_close, print_table, start_gpu, time_ms_steady, write_results

import safetile as st  # noqa: E402
from safetile import ops  # noqa: E402

import decode_layers as dl  # noqa: E402

COPY_TBS = 4.26
LM_HEAD_COPIES = 4      # lm_head chains: 4 passes over its 0.8-1.6 GB (far past L2)


def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Qwen3's RMSNorm as transformers computes it, as float64."""
    h = x.float()
    return (w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + dl.EPS)).to(x.dtype)).double()


def T(v) -> torch.Tensor:
    """A copy of a safetile value as a torch tensor."""
    return v.to_torch()


class Stages:
    """Stage chains over a ``Step``'s layers. ``table()`` lists, per stage: its name, the
    unfused and the fused recorder (``body(rec, layer)``; None where the variant does not
    exist), the output to check and the torch reference of each variant's last-layer
    result, and the bytes a layer's stage must read."""

    def __init__(self, step: dl.Step):
        self.s = s = step
        sh, dev = step.shape, step.logits.device
        rnd = lambda *shape: dl._rand(shape, dev, 1.0)  # noqa: E731
        # fixed inputs of every layer of a chain
        self.x, self.prev = rnd(sh.hidden), rnd(sh.hidden)
        self.attn_in, self.gu_in = rnd(sh.q_heads * sh.head_dim), rnd(2 * sh.inter)
        self.resid = rnd(sh.hidden)
        self.xs = (T(self.prev).float() + T(self.x).float()).to(torch.bfloat16)  # their sum

    def _norm_gemv(self, norm: str, weight: str, out):
        s = self

        def unfused(rec, L):
            rec(ops.add_rmsnorm(s.prev, s.x, getattr(L, norm), out=s.s.normed,
                                residual_out=s.resid))
            rec(ops.gemv(getattr(L, weight), s.s.normed, out))

        def fused(rec, L):
            rec(ops.rmsnorm_gemv(s.x, getattr(L, norm), getattr(L, weight), dl.EPS, out=out))

        def gemv(rec, L):
            rec(ops.gemv(getattr(L, weight), s.s.normed, out))

        def want(variant, L):
            w, nw = T(getattr(L, weight)).double(), T(getattr(L, norm))
            if variant == "gemv":
                return w @ T(s.s.normed).double()
            return w @ hf_rmsnorm(s.xs if variant == "unfused" else T(s.x), nw)
        return unfused, fused, gemv, want

    def table(self) -> list[dict]:
        s, sh, st_ = self, self.s.shape, self.s
        inter = sh.inter
        rows = []
        for name, norm, weight, out, n in (("qkv", "ln1", "wqkv", st_.qkv, sh.qkv_rows),
                                            ("gate_up", "ln2", "wgu", st_.gu, 2 * inter)):
            unfused, fused, gemv, want = self._norm_gemv(norm, weight, out)
            rows.append(dict(name=name, unfused=unfused, fused=fused, gemv=gemv, out=out,
                             want=want, nbytes=n * sh.hidden * 2))
        q = sh.q_heads * sh.head_dim
        rows.append(dict(
            name="o", out=st_.o, nbytes=sh.hidden * q * 2,
            unfused=lambda rec, L: rec(ops.gemv(L.wo, s.attn_in, st_.o)),
            fused=lambda rec, L: rec(ops.gemv_add(L.wo, s.attn_in, s.x, out=st_.o)),
            gemv=lambda rec, L: rec(ops.gemv(L.wo, s.attn_in, st_.o)),
            want=lambda v, L: T(L.wo).double() @ T(s.attn_in).double()
            + (T(s.x).double() if v == "fused" else 0)))

        def act():
            g = T(s.gu_in).double()
            return torch.nn.functional.silu(g[:inter]) * g[inter:]

        def down_unfused(rec, L):
            rec(ops.silu_mul(s.gu_in.slice(0, 0, inter), s.gu_in.slice(0, inter, 2 * inter),
                             out=st_.act))
            rec(ops.gemv(L.wd, st_.act, st_.down))
        rows.append(dict(
            name="down", out=st_.down, nbytes=sh.hidden * inter * 2, unfused=down_unfused,
            fused=lambda rec, L: rec(ops.silu_mul_gemv_add(L.wd, s.gu_in, s.x, out=st_.down)),
            gemv=lambda rec, L: rec(ops.gemv(L.wd, st_.act, st_.down)),
            want=lambda v, L: T(L.wd).double() @ (act() if v != "gemv" else T(st_.act).double())
            + (T(s.x).double() if v == "fused" else 0)))
        rows.append(dict(
            name="attn_prologue", out=st_.q, nbytes=0,
            unfused=lambda rec, L: dl.attention_prologue_unfused(rec, st_, L),
            fused=lambda rec, L: dl.attention_prologue_fused(rec, st_, L), gemv=None,
            want=self._prologue_want))
        def attention(prologue, early):
            def body(rec, L):
                prologue(rec, st_, L)
                dl.attention(rec, st_, L, early)
            return body
        rows.append(dict(
            name="prologue+attention", out=st_.attn,
            nbytes=2 * sh.kv_heads * st_.context * sh.head_dim * 2,
            unfused=attention(dl.attention_prologue_unfused, True),
            fused=attention(dl.attention_prologue_fused, False), gemv=None,
            want=self._attention_want))
        return rows

    def _prologue_want(self, variant, L):
        """Qwen3's q norm and rotate-half RoPE at the position, from the qkv the chain reads."""
        sh, d = self.s.shape, self.s.shape.head_dim
        q = T(self.s.qkv).view(-1, d)[:sh.q_heads]
        h = q.float()
        q = T(L.q_norm) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + dl.EPS)).to(q.dtype)
        inv = T(self.s.inv_freq)
        emb = torch.cat([inv, inv]) * float(self.s.context - 1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return (q * cos + torch.cat([-q[:, d // 2:], q[:, :d // 2]], -1) * sin).double()

    def _attention_want(self, variant, L):
        sh, n = self.s.shape, self.s.context
        q = T(self.s.q).double()
        k = T(L.k_cache)[:, :n].double().repeat_interleave(sh.q_heads // sh.kv_heads, 0)
        v = T(L.v_cache)[:, :n].double().repeat_interleave(sh.q_heads // sh.kv_heads, 0)
        p = torch.softmax(torch.einsum("hd,hnd->hn", q, k) / sh.head_dim ** 0.5, -1)
        return torch.einsum("hn,hnd->hd", p, v)

    def lm_head(self) -> dict:
        s, st_ = self, self.s

        def unfused(rec, _):
            rec(ops.add_rmsnorm(s.prev, s.x, st_.final_norm, out=st_.normed,
                                residual_out=s.resid))
            rec(ops.gemv(st_.lm_head, st_.normed, st_.logits))
            rec(ops.argmax(st_.logits, st_.next_token, st_.argmax_ws))

        def fused(rec, _):
            rec(ops.rmsnorm_gemv_argmax(s.x, st_.final_norm, st_.lm_head, dl.EPS,
                                        logits=st_.logits, token=st_.next_token,
                                        workspace=st_.head_ws))

        def want(variant, _):
            lg = T(st_.logits)
            if T(st_.next_token).item() != int(torch.argmax(lg)):
                raise AssertionError(f"lm_head {variant}: the token is not the logits' argmax")
            x = s.xs if variant == "unfused" else T(s.x)
            return T(st_.lm_head).double() @ hf_rmsnorm(x, T(st_.final_norm))
        return dict(name="lm_head", out=st_.logits, unfused=unfused, fused=fused, gemv=None,
                    want=want, nbytes=st_.shape.vocab * st_.shape.hidden * 2)


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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    if os.environ.get("OUT"):
        fig.savefig(os.path.join(os.environ["OUT"], path.name), dpi=110)
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
