"""Measuring an engine: time to first token, decode speed, and the share of the bandwidth
roofline it reaches.

Batch-1 decode reads every weight once per token (the lm_head once even when tied) plus the
KV cache up to the current position, so the fastest possible step is those bytes over the
memory bandwidth: 4.26e12 B/s on the H200 (the measured copy bandwidth). ``% of roofline``
is the decode tok/s over that bound, at the mean context of the measured steps.
"""
from __future__ import annotations

import datetime
import platform
import random
import statistics
import sys
import time

import torch

import safetile as st

from .engine import token_budget
from .errors import RequestError
from .sampler import SamplingParams

H200_BANDWIDTH = 4.26e12        # bytes/s, measured copy bandwidth (FACTS.md)
# Prompt ids are drawn from [FIRST_ID, LAST_ID), cut at the model's vocabulary: Qwen3's
# ordinary tokens, past the single bytes and short of the special tokens (from 151643).
FIRST_ID, LAST_ID = 100, 151_000
QWEN3_VOCAB = 151_936


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt_ids(length: int, seed: int = 0, vocab_size: int = QWEN3_VOCAB) -> list:
    """A reproducible prompt of ``length`` random token ids, each an ordinary (non-special)
    Qwen3 token inside a vocabulary of ``vocab_size``: from [100, min(151000, vocab_size)).
    ``RequestError`` for a vocabulary of 100 ids or fewer, which holds none of them."""
    last = min(LAST_ID, vocab_size)
    if last <= FIRST_ID:
        raise RequestError(f"bench draws its prompt from the token ids [{FIRST_ID}, "
                           f"{LAST_ID}) that lie inside the model's vocabulary, and a "
                           f"vocabulary of {vocab_size} ids has none: bench a model whose "
                           f"vocab_size is above {FIRST_ID}")
    rng = random.Random(seed)
    return [rng.randrange(FIRST_ID, last) for _ in range(length)]


def bytes_per_token(engine, context: float) -> float:
    """Bytes one decode step reads at ``context`` positions: the weights and the KV cache."""
    cfg = engine.config
    itemsize = getattr(st, engine.dtype).itemsize
    kv = 2 * cfg.num_hidden_layers * cfg.kv_size * itemsize * context
    return cfg.decode_bytes(itemsize) + kv


def check_lengths(prompt_len: int, gen_len: int, max_seq_len: int,
                  model_context: int | None = None) -> None:
    """``RequestError`` unless a bench of these lengths fits a ``max_seq_len`` cache: the
    command line checks them against ``--max-seq-len`` before it loads the model (which a
    bench that cannot run should not wait for), :func:`run` against the engine's cache (the
    model's context may cap it further)."""
    if prompt_len < 1 or gen_len < 2:
        raise RequestError(f"bench needs prompt_len >= 1 and gen_len >= 2 (one timed decode "
                           f"step), got prompt_len {prompt_len} and gen_len {gen_len}")
    if gen_len > token_budget(max_seq_len, prompt_len):
        fix = ("the model's context (its max_position_embeddings): shorten the bench"
               if max_seq_len == model_context else "raise --max-seq-len or shorten the bench")
        raise RequestError(f"prompt_len {prompt_len} + gen_len {gen_len} = "
                           f"{prompt_len + gen_len} exceeds max_seq_len {max_seq_len}, {fix}")


def run(engine, prompt_len: int, gen_len: int, repeats: int = 3, seed: int = 0,
        progress: bool = False) -> dict:
    """TTFT and decode figures (medians over ``repeats`` after one warm-up) for greedy
    decoding of ``gen_len`` tokens after a ``prompt_len``-token prompt of random ids
    (:func:`prompt_ids` of ``seed``; greedy decoding draws nothing else). ``progress``: a
    bar of the tokens decoded on stderr."""
    check_lengths(prompt_len, gen_len, engine.max_seq_len,
                  engine.config.max_position_embeddings)
    ids = prompt_ids(prompt_len, seed, engine.config.vocab_size)
    runner, dev = engine.runner, engine.device
    params, key = SamplingParams(0.0, seed=0).tensors(dev)
    ttft, decode, tokens = [], [], None
    with st.backend(engine.backend), _bar(gen_len * (repeats + 1), repeats, progress) as bar:
        for r in range(repeats + 1):
            _sync(dev)
            t0 = time.perf_counter()
            out = [runner.begin(ids, params, key, greedy=True)]
            t1 = time.perf_counter()
            bar.update(1)
            while len(out) < gen_len:
                chunk = runner.steps(True, runner.chunk_size(gen_len - len(out)))
                out += chunk
                bar.update(len(chunk))
            t2 = time.perf_counter()
            if r == 0:
                tokens = out
                continue
            if out != tokens:
                raise RuntimeError("greedy decoding gave different tokens on a repeat run")
            ttft.append(t1 - t0)
            decode.append((t2 - t1) / (gen_len - 1))
    step = statistics.median(decode)
    context = prompt_len + gen_len / 2
    roofline = H200_BANDWIDTH / bytes_per_token(engine, context)
    return {
        "model": engine.config.name, "dtype": engine.dtype, "gemm": engine.gemm,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "prompt_len": prompt_len, "gen_len": gen_len, "repeats": repeats, "seed": seed,
        "ttft_ms": statistics.median(ttft) * 1e3, "ttft_ms_all": [t * 1e3 for t in ttft],
        "ms_per_token": step * 1e3, "decode_tok_s": 1.0 / step,
        "ms_per_token_all": [t * 1e3 for t in decode],
        "bytes_per_token": bytes_per_token(engine, context),
        "roofline_tok_s": roofline, "pct_of_roofline": 100.0 / step / roofline,
        "graph": runner.graphable(), "fused": runner.fused, "decode_chunk": runner.max_chunk,
        "tokens": tokens[:16],
    }


def _bar(total: int, repeats: int, enabled: bool):
    from tqdm import tqdm
    # a bar written to a log (not a terminal) stays, its line ended
    return tqdm(total=total, desc=f"bench: a warm-up run, then {repeats} timed", unit="tok",
                file=sys.stderr, disable=not enabled, leave=not sys.stderr.isatty(),
                dynamic_ncols=True)


def environment() -> dict:
    """Versions and date for a results file."""
    import triton
    return {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
            "torch": torch.__version__, "triton": triton.__version__,
            "safetile": st.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def report(r: dict) -> str:
    """A short human-readable summary of :func:`run`'s figures. The roofline is the H200's
    on every device (bench's figures are the same everywhere); a CPU run says so, since that
    bound says nothing of a CPU's speed."""
    text = (f"{r['model']} ({r['dtype']}, gemm={r['gemm']}, {r['device']}): prompt "
            f"{r['prompt_len']}, {r['gen_len']} new tokens\n"
            f"  time to first token  {r['ttft_ms']:9.2f} ms\n"
            f"  decode               {r['decode_tok_s']:9.1f} tok/s  ({r['ms_per_token']:.3f} "
            f"ms/token{', graph replays' if r['graph'] else ', eager'})")
    cpu = r["device"] == "cpu"
    pct = f"{r['pct_of_roofline']:.2g}" if cpu else f"{r['pct_of_roofline']:.1f}"
    caveat = "; a GPU bound, not this CPU's" if cpu else ""
    return (text + f"\n  roofline             {r['roofline_tok_s']:9.1f} tok/s  "
            f"({r['bytes_per_token'] / 1e9:.2f} GB/token at the H200's 4.26 TB/s{caveat})  "
            f"-> {pct}% of roofline")
