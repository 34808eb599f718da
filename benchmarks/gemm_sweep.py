"""Config sweep for the LLM-shape GEMMs where ``choose_config`` trails cuBLAS, in one process.

    python benchmarks/bench_gemm.py --sweep --budget-s 200     # -> results/archive/gemm_sweep.json

For each weak shape it builds a candidate list (tile height and width, K step, split-K
factors that fill one, two or three waves of the SMs, the deepest pipeline that fits; for
M = 2048 a head of whole waves of 128x256 tiles plus a tail in smaller tiles), compiles all
of them first in parallel worker processes (they fill Triton's on-disk cache, so the timing
process only loads binaries), then times each in the timing process exactly as the table
does (CUDA-graph replay, do_bench median, L2 flushed by a zero fill, cuBLAS timed the same
way), re-times the best few with programmatic dependent launch, and prints the best per
shape. Time-boxed per shape so every shape gets its share of the budget.

``prewarm`` (the parallel compile) is also used by the full table to keep its run short.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import replace

import torch

import safetile as st
from safetile import ops
from safetile.ops.matmul import MatmulConfig, _stages, choose_config, workspace_shape

SMS = 132


def _cdiv(a, b):
    return -(-a // b)


# ---- parallel compilation ---------------------------------------------------------------------

def _compile_jobs(jobs, deadline):
    """Worker: run each (kind, m, n, k, cfg) once (which compiles it into Triton's cache)."""
    st.set_backend("triton")
    from safetile.ops.unsafe_matmul import matmul_unsafe
    inputs, errors = {}, []
    for kind, m, n, k, cfg in jobs:
        if time.time() > deadline:
            break
        try:
            if (m, n, k) not in inputs:
                inputs.clear()
                torch.cuda.empty_cache()
                inputs[(m, n, k)] = (st.randn((m, k), dtype=st.bf16, seed=0).share(),
                                     st.randn((n, k), dtype=st.bf16, seed=1).share(),
                                     st.empty((m, n), dtype=st.bf16))
            x, w, out = inputs[(m, n, k)]
            ws = st.empty(workspace_shape(m, n, cfg), dtype=st.f32) \
                if cfg.split_k > 1 else None
            if kind == "unsafe":
                with st.unsafe():
                    matmul_unsafe(x, w, out, weight=True, config=cfg, workspace=ws).sync()
            else:
                ops.linear(x, w, out, config=cfg, workspace=ws).sync()
        except Exception as e:                                  # reported by the timing pass
            errors.append((kind, m, n, k, str(cfg), repr(e)[:200]))
    return errors


def prewarm(jobs, deadline, workers=None):
    """Compile ``jobs`` ((kind, m, n, k, cfg) tuples) in parallel spawned processes.

    Jobs are grouped by shape (a worker keeps one shape's inputs at a time) and dealt out
    round-robin by group. Returns the errors the workers saw; compile failures (for example
    a pipeline that does not fit in shared memory) show up again, per config, when timed."""
    if not jobs:
        return []
    workers = workers or max(1, min(14, (os.cpu_count() or 2) - 2))
    jobs = sorted(set(jobs), key=lambda j: (j[1], j[2], j[3], j[0], str(j[4])))
    shards = [[] for _ in range(workers)]
    for i, j in enumerate(jobs):
        shards[i % workers].append(j)
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        errs = sum(pool.starmap(_compile_jobs, [(s, deadline) for s in shards if s]), [])
    print(f"prewarm: {len(jobs)} compiles on {workers} processes in {time.time() - t0:.1f} s, "
          f"{len(errs)} failed", flush=True)
    return errs


# ---- candidates -------------------------------------------------------------------------------

def skinny_candidates(m, n, k, sms=SMS, keep=18):
    """Configs for M <= 256: tile height, width and K step, split-K factors that fill whole
    waves, the deepest pipeline that fits; ranked by waves used and pruned to ``keep``."""
    bms = (16, 64) if m <= 16 else (32, 64) if m <= 32 else (64, 128)
    cands = []
    for bm in bms:
        for bn in (64, 128, 256):
            for bk in (64, 128):
                units = _cdiv(m, bm) * _cdiv(n, bn)
                nkb = _cdiv(k, bk)
                splits = set()
                for target in (1, 2, 3):
                    s = max(1, min(nkb // 2, (target * sms) // units))
                    splits.add(s)
                for s in splits:
                    stages = _stages(bm, bn, bk, 2, 4 if s > 1 else 2, most=8)
                    if stages < 2:
                        continue
                    # rank by the bytes-per-wave model of ops.matmul._skinny (SM share of
                    # HBM bandwidth; partial tiles written and read back once more)
                    kps = _cdiv(nkb, s)
                    # (A rows past M are zero-filled by TMA, not read: count min(M, BM))
                    unit = kps * bk * (min(m, bm) + bn) * 2 + (bm * bn * 4 if s > 1 else 0)
                    t = _cdiv(units * s, sms) * unit / (4.0e12 / sms)
                    if s > 1:
                        t += s * _cdiv(m, bm) * bm * n * 8 / 4.0e12 + 3e-6
                    cands.append((t, bm, bn, bk, s, stages))
    cands.sort()
    out = []
    for _, bm, bn, bk, s, stages in cands[:keep]:
        out.append(MatmulConfig(bm, bn, bk, 8 if bm == 128 else 4, stages, split_k=s))
    return out


def head_tail_candidates(m, n, k, sms=SMS):
    """For large M: 128x256 warp-specialized tiles over the rows that fill whole waves, and
    the remaining rows in smaller tiles (one more launch), against the plain configs."""
    big = MatmulConfig(128, 256, 64, 8, 3, warp_specialize=True)
    out = [big, MatmulConfig(128, 128, 64, 8, 4), MatmulConfig(128, 256, 64, 8, 3)]
    gn = _cdiv(n, 256)
    waves = (_cdiv(m, 128) * gn) // sms
    if waves < 1:
        return out
    head_rows = (waves * sms // gn) * 128
    if head_rows >= m:
        return out
    for tbm, tbn, warps, stages, ws in [(64, 128, 4, 6, False), (128, 64, 4, 6, False),
                                       (128, 128, 8, 4, False), (64, 256, 4, 4, False),
                                       (128, 128, 8, 4, True), (64, 128, 4, 6, True)]:
        out.append(replace(big, head_rows=head_rows,
                           tail=MatmulConfig(tbm, tbn, 64, warps, stages, warp_specialize=ws)))
    # one wave fewer in the head (a larger tail) when the tail has several waves' worth
    if waves >= 2:
        hr = ((waves - 1) * sms // gn) * 128
        out.append(replace(big, head_rows=hr, tail=MatmulConfig(128, 128, 64, 8, 4)))
    return out


MODELS = {
    "4B": {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560),
           "down": (2560, 9728), "lm_head": (151936, 2560)},
    "32B": {"qkv": (10240, 5120), "o": (5120, 8192), "gate_up": (51200, 5120),
            "down": (5120, 25600), "lm_head": (151936, 5120)},
}


def sweep_shapes():
    """The shapes swept, weakest first (the order and the extra candidates: TUNING.md,
    "GEMM sweep shapes")."""
    shapes = []
    for m in (128, 16):
        for model in ("4B", "32B"):
            for proj in ("o", "qkv", "down", "gate_up", "lm_head"):
                n, k = MODELS[model][proj]
                shapes.append((f"{model} {proj}", m, n, k, skinny_candidates(m, n, k)))
    for model, proj in [("4B", "o"), ("4B", "down"), ("32B", "down"), ("32B", "o")]:
        n, k = MODELS[model][proj]
        shapes.append((f"{model} {proj}", 2048, n, k, head_tail_candidates(2048, n, k)))
    n, k = MODELS["4B"]["o"]
    shapes.append(("4B o", 8192, n, k, head_tail_candidates(8192, n, k)
                   + [MatmulConfig(128, 256, 64, 8, 3, group_size=16, warp_specialize=True)]))
    # the lm_heads at small M are the longest shapes: few candidates, and last
    shapes = [s for s in shapes if "lm_head" not in s[0]] + \
             [(a, m, n, k, c[:6] + ([MatmulConfig(128, 256, 64, 8, 3, warp_specialize=True)]
                                    if m > 64 else []))
              for a, m, n, k, c in shapes if "lm_head" in a]
    # the best config of the first tune (results/archive/gemm_tune.json) for this shape
    extra = {(16, 2560, 9728): [MatmulConfig(64, 128, 128, 4, 4, split_k=6)]}
    for i, (name, m, n, k, cands) in enumerate(shapes):
        cands = cands + extra.get((m, n, k), [])
        base = choose_config(m, n, k)
        shapes[i] = (name, m, n, k, [base] + [c for c in cands if c != base])
    return shapes


def short(c) -> str:
    """A compact name for a config: BMxBNxBK, warps, stages, split, hints, tail."""
    if c is None:
        return ""
    t = f"{c.bm}x{c.bn}x{c.bk} w{c.num_warps} s{c.num_stages}"
    t += f" k{c.split_k}" if c.split_k > 1 else ""
    t += " ws" if c.warp_specialize else ""
    t += " pdl" if c.pdl else ""
    t += f" g{c.group_size}" if c.group_size != 8 else ""
    t += f" +[{short(c.tail)}]@{c.head_rows}" if c.tail is not None else ""
    return t


# ---- timing -----------------------------------------------------------------------------------

def sweep(deadline, case_cls, write_results, print_table, pdl_top=3):
    shapes = sweep_shapes()
    jobs = []
    for _, m, n, k, cands in shapes:
        for c in cands:
            jobs.append(("safe", m, n, k, c))
            if c.split_k > 1:
                jobs.append(("safe", m, n, k, replace(c, pdl=True)))
    start = time.time()
    prewarm(jobs, start + 0.45 * (deadline - start))
    rows, best = [], []
    for si, (name, m, n, k, cands) in enumerate(shapes):
        left = deadline - time.time()
        if left <= 2:
            print(f"deadline: skipped {name} M={m} and later", flush=True)
            break
        shape_deadline = time.time() + left / (len(shapes) - si)
        case = case_cls(m, n, k)
        cub = case.run_cublas()

        def timed(cfg, tag, case=case):
            if time.time() > shape_deadline:
                return None
            try:
                ms = case.run_safe(cfg)
                r = dict(shape=f"{m}x{n}x{k}", what=name, M=m, tag=tag, cfg=str(cfg), us=ms * 1e3,
                         cublas_us=cub * 1e3, ratio=cub / ms)
            except Exception as e:
                r = dict(shape=f"{m}x{n}x{k}", what=name, M=m, tag=tag, cfg=str(cfg),
                         error=repr(e)[:200])
            rows.append(r)
            return r

        got = []
        for i, c in enumerate(cands):
            r = timed(c, "default" if i == 0 else "cand")
            if r is not None and "ratio" in r:
                got.append((r["ratio"], c))
        got.sort(key=lambda t: -t[0])
        for _, c in got[:pdl_top]:
            if c.split_k > 1:
                r = timed(replace(c, pdl=True), "pdl")
                if r is not None and "ratio" in r:
                    got.append((r["ratio"], replace(c, pdl=True)))
        got.sort(key=lambda t: -t[0])
        base = next((r["ratio"] for r in rows if r.get("tag") == "default"
                     and r["shape"] == f"{m}x{n}x{k}" and "ratio" in r), None)
        if got:
            b = dict(what=name, M=m, N=n, K=k, cublas_us=cub * 1e3, default_ratio=base,
                     best_ratio=got[0][0], best=str(got[0][1]),
                     second=str(got[1][1]) if len(got) > 1 else "",
                     second_ratio=got[1][0] if len(got) > 1 else None)
            best.append(b)
            print(f"{name} M={m}: cuBLAS {cub * 1e3:.1f} us, default {base or 0:.3f}, best "
                  f"{got[0][0]:.3f} {short(got[0][1])}, then "
                  + "; ".join(f"{r:.3f} {short(c)}" for r, c in got[1:4]), flush=True)
        del case
        torch.cuda.empty_cache()
        write_results("archive/gemm_sweep", {"best": best, "rows": rows,
                                     "method": "CUDA-graph replay, do_bench median (zero-fill L2 "
                                               "flush, as the gemm table), cuBLAS timed alike"})
    print_table([{**b, "best": short(eval_cfg(b["best"]))} for b in best],
                ["what", "M", "cublas_us", "default_ratio", "best_ratio", "best"])


def eval_cfg(text):
    """A config back from its repr (the rows store ``str(cfg)``)."""
    return eval(text, {"MatmulConfig": MatmulConfig})
