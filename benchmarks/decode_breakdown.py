"""Where one grout decode step spends its time: each stage of the fused step alone, over
every layer, against the whole step.

A stage is one position of the fused layer (model.decode_layer_fused): the qkv gemv with
the input norm, the attention prologue (q/k norm, RoPE, KV append), decode attention (split
and merge; at a short context one kernel per kv head, which also runs the prologue: the
kind the engine decodes this context with), the o gemv with the residual add, the gate/up gemv with the post-attention norm,
the down gemv with silu*mul and the residual add; plus the embedding, the lm_head with its
argmax, and the cursor's advance. Each stage's launches over all layers (distinct weights,
so nothing stays in L2 from one to the next) are recorded as one graph and replayed back to
back (harness.time_ms_steady); its time per step is that replay's. Bytes are what the stage
must read (weights; the KV cache up to the context for attention); the sum of the stages is
compared with the whole step's graph replayed the same way, and with a chunk of 8 steps.
Each stage's marginal cost inside the step is measured too: the whole step recorded without
that stage's launches (its consumers then read the previous step's values), timed the same
way, subtracted from the whole step. On the CPU (``--smoke``) every graph is recorded and
replayed once, untimed.
"""
from __future__ import annotations

import time

import torch

from harness import print_table, write_results

COPY_TBS = 4.26
LAYER_STAGES = ["qkv+norm", "qk_norm_rope_append", "attention", "o+residual",
                "gate_up+norm", "down+silu_mul+residual"]
# The short step's layer, the prologue and the attention in one kernel
FUSED_LAYER_STAGES = ["qkv+norm", "qk_norm_rope_append+attention", "o+residual",
                      "gate_up+norm", "down+silu_mul+residual"]
CONTEXT = 128
REPS = 8


def stage_bytes(eng, context: int) -> dict:
    """Bytes each stage reads per step (weights, and the cache for attention)."""
    cfg, w = eng.config, eng.runner.w
    item = w.embed.dtype.itemsize
    L = cfg.num_hidden_layers

    def nbytes(lin):
        n, k = lin.w.shape
        return n * k * item
    first = w.layers[0]
    return {"embedding": cfg.hidden_size * item,
            "qkv+norm": L * nbytes(first.qkv),
            "qk_norm_rope_append": L * (cfg.q_size + 2 * cfg.kv_size) * item,
            "attention": L * 2 * cfg.kv_size * context * item,
            "qk_norm_rope_append+attention": L * ((cfg.q_size + 2 * cfg.kv_size)
                                                  + 2 * cfg.kv_size * context) * item,
            "o+residual": L * nbytes(first.o),
            "gate_up+norm": L * nbytes(first.gate_up),
            "down+silu_mul+residual": L * nbytes(first.down),
            "lm_head+argmax": nbytes(w.lm_head), "cursor": 0}


def stages(eng, steps: list) -> dict:
    """Stage name -> the functions of ``steps`` (the fused greedy step) in that stage."""
    r = eng.runner
    L = eng.config.num_hidden_layers
    names = layer_stages(eng, steps)
    n = len(names)
    layer_steps = steps[1:1 + n * L]
    out = {"embedding": [steps[0]]}
    for i, name in enumerate(names):
        out[name] = layer_steps[i::n]
    out["lm_head+argmax"] = [steps[1 + n * L]]
    out["cursor"] = steps[2 + n * L:]
    return out


def layer_stages(eng, steps: list) -> list:
    """The stage names of one layer of ``steps`` (the fused greedy step)."""
    L = eng.config.num_hidden_layers
    for names in (LAYER_STAGES, FUSED_LAYER_STAGES):
        if eng.runner.fused and len(steps) == 1 + len(names) * L + 3:
            return names
    raise RuntimeError("decode_breakdown takes the fused greedy step (fused=True)")


def record(fns):
    import safetile as st
    with st.graph_scope() as scope:
        for f in fns:
            scope.record(f())
    return scope.graph


def run(model: str, device: str, budget_s: float, smoke: bool = False) -> list[dict]:
    """The breakdown of ``model``'s fused greedy step at context ``CONTEXT``; written to
    results/decode_breakdown.json for the Qwen3-4B, else to
    results/archive/decode_breakdown_<model>.json (not under ``smoke``)."""
    import grout
    import safetile as st
    from grout.sampler import SamplingParams
    from safetile import ops
    t0 = time.time()
    if budget_s < 60 and not smoke:
        print("decode_breakdown: skipped, out of budget")
        return []
    eng = grout.load(model, device=device, dtype="float32" if smoke else None,
                     max_seq_len=CONTEXT + 16, progress=False)
    r = eng.runner
    params, key = SamplingParams().tensors(eng.device)
    ids = [(i * 7919) % 150000 + 100 for i in range(CONTEXT - 1)]
    if smoke:
        ids = [i % eng.config.vocab_size for i in ids]
    with st.backend(eng.backend):
        r.begin(ids, params, key, greedy=True)          # the step then attends CONTEXT rows
        steps = r.decode_steps(True, r.short())
        parts = stages(eng, steps)
        graphs = {name: record(fns) for name, fns in parts.items()}
        less = {name: record([f for f in steps if f not in fns]) for name, fns in parts.items()}
        whole, chunk = r.graph(True, r.short()), r.chunk(True, 8, r.short(8))
        start = st.from_torch(r.buf.cursor.to_torch().clone())

        def rewind():
            """The cursor back at the prompt's end: every trial attends the same lengths."""
            ops.copy(start, out=r.buf.cursor).sync()

        def timed(g, per=1, reps=REPS):
            if smoke:
                rewind()
                g.launch().sync()
                return None
            return time_replays(g, reps, rewind=rewind) / per

        rows = []
        nbytes = stage_bytes(eng, CONTEXT)
        for name, g in graphs.items():
            ms = timed(g)
            row = dict(stage=name, kernels=len(g.records), bytes=nbytes[name])
            if ms is not None:
                row.update(us=ms * 1e3, pct_of_bandwidth=100 * nbytes[name] / (ms * 1e-3)
                           / (COPY_TBS * 1e12) if nbytes[name] else None)
            rows.append(row)
        step_ms, chunk_ms = timed(whole), timed(chunk, 8, reps=1)
        for row in rows:
            ms = timed(less[row["stage"]])
            if ms is not None:
                row["marginal_us"] = (step_ms - ms) * 1e3
    total = sum(nbytes.values())
    summary = dict(model=model, context=CONTEXT, short_attention=r.short(),
                   kernels_per_step=len(whole.records),
                   kernels_per_layer=sum(len(graphs[n].records)
                                         for n in layer_stages(eng, steps))
                   // eng.config.num_hidden_layers, bytes_per_step=total)
    if step_ms is not None:
        stage_sum = sum(row["us"] for row in rows)
        summary.update(step_us=step_ms * 1e3, chunk8_us_per_step=chunk_ms * 1e3,
                       stage_sum_us=stage_sum,
                       step_pct_of_roofline=100 * total / (step_ms * 1e-3) / (COPY_TBS * 1e12),
                       setup_s=time.time() - t0)
        name = "decode_breakdown" if model == "qwen3-4b" else f"archive/decode_breakdown_{model}"
        write_results(name, {"rows": rows, "summary": summary,
                             "method": __doc__.split("\n\n")[1]})
    print_table(rows, ["stage", "kernels", "us", "marginal_us", "bytes", "pct_of_bandwidth"])
    print("breakdown:", summary, flush=True)
    del graphs, less, whole, chunk, eng
    return rows


def time_replays(g, reps: int = REPS, trials: int = 7, rewind=None) -> float:
    """Milliseconds of one replay of ``g``, from a graph of ``reps`` replays back to back
    (one host launch and sync per ``reps``), the median over ``trials``; ``rewind()`` runs
    (untimed) before each trial."""
    import statistics
    rep = record([g.launch] * reps)
    rep.launch().sync()
    samples = []
    for _ in range(trials):
        if rewind is not None:
            rewind()
        t0 = time.perf_counter()
        rep.launch().sync()
        samples.append((time.perf_counter() - t0) * 1e3 / reps)
    return statistics.median(samples)
