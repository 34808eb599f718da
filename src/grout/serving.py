"""One server request on the engine: its prompt, its generation, its stop strings and logprobs.

`prepare` tokenizes a request's prompt (chat template included) and checks it against the
context; `generate` runs on the engine thread, turning the engine's token stream into the
`Delta`/`Finished` events of a `Job`. Stop strings are matched here, over the decoded text,
so that text which may begin a stop string is held back instead of being sent and then
retracted; the engine itself runs without stop strings and is closed as soon as one is seen.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import grout
from grout.logprobs import TokenLogprobs, token_bytes
from grout.protocol import APIError, GenerationRequest
from grout.scheduler import Delta, Finished, Job
from grout.stop_strings import StopStringMatcher

FAULT_HEADER = "x-grout-fault"


def load_and_warm_up(args: argparse.Namespace) -> Any:
    """Load the engine, then run a short greedy and a short sampled generation.

    The warm-up compiles every kernel a request uses and captures the decode graph, so that
    ``/health`` says ok only when the first request will be served at full speed.
    """
    eng = grout.load(args.model, device=args.device, dtype=args.dtype,
                     max_seq_len=args.max_seq_len)
    ids = eng.tokenizer.encode("Hello")
    for temperature in (0.0, 1.0):
        for _ in eng.stream(ids, max_new_tokens=2, temperature=temperature, seed=0,
                            logprobs=1):
            pass
    return eng


def max_model_len(engine: Any) -> int:
    """The context length: prompt plus generated tokens."""
    return int(engine.max_seq_len)


def prepare(engine: Any, job: Job) -> None:
    """Tokenize the job's prompt and fix its token budget; APIError(400) when it cannot fit."""
    req = job.request
    tokenizer = engine.tokenizer
    if req.kind == "chat":
        try:
            text = tokenizer.apply_chat_template(req.messages, add_generation_prompt=True,
                                                 enable_thinking=req.enable_thinking)
        except grout.RequestError as err:
            raise APIError(str(err), param="messages") from None
        ids, param = tokenizer.encode(text), "messages"
    elif isinstance(req.prompt, str):
        ids, param = tokenizer.encode(req.prompt), "prompt"
    else:
        ids, param = list(req.prompt or []), "prompt"
        vocab = engine.config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise APIError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})",
                           param="prompt")
    context = max_model_len(engine)
    if len(ids) >= context:
        raise APIError(f"this model's maximum context length is {context} tokens, and the "
                       f"prompt has {len(ids)}: shorten it", param=param,
                       code="context_length_exceeded")
    budget = context - len(ids)
    if req.max_tokens is not None and req.max_tokens > budget:
        raise APIError(f"this model's maximum context length is {context} tokens: the prompt "
                       f"has {len(ids)} and {req.max_tokens} more were asked for; ask for at "
                       f"most {budget}", param="max_tokens", code="context_length_exceeded")
    job.prompt_ids = ids
    job.max_new_tokens = budget if req.max_tokens is None else req.max_tokens


def token_entry(tokenizer: Any, piece: Any, offset: int) -> dict[str, Any]:
    """The neutral logprob entry (grout.responses) of one generated token."""
    lp: TokenLogprobs = piece.logprobs

    def one(token_id: int, logprob: float) -> dict[str, Any]:
        raw = token_bytes(tokenizer, token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(raw)}

    entry = one(lp.token_id, lp.logprob)
    entry["top"] = [one(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)]
    entry["offset"] = offset
    return entry


class _Released:
    """Logprob entries waiting for their text to be released past the stop-string hold."""

    def __init__(self) -> None:
        self.pending: list[dict[str, Any]] = []
        self.released_chars = 0

    def take(self, released: str, final: bool = False) -> list[dict[str, Any]]:
        self.released_chars += len(released)
        if final:
            out, self.pending = self.pending, []
            return out
        n = 0
        while n < len(self.pending) and self.pending[n]["offset"] < self.released_chars:
            n += 1
        out, self.pending = self.pending[:n], self.pending[n:]
        return out


def generate(engine: Any, job: Job) -> None:
    """Engine thread: run the job's generation and emit its events (exactly one terminal)."""
    req: GenerationRequest = job.request
    assert job.prompt_ids is not None
    matcher = StopStringMatcher(req.stop)
    entries = _Released()
    want_logprobs = req.logprobs is not None
    text_len = 0
    finish_reason = "length"
    pieces = engine.stream(job.prompt_ids, max_new_tokens=job.max_new_tokens,
                           temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                           seed=req.seed, logprobs=req.logprobs if want_logprobs else None)
    try:
        for piece in pieces:
            job.last_token_at = time.perf_counter()
            if not job.generated:
                job.first_token_at = job.last_token_at
            job.generated += 1
            if want_logprobs:
                entries.pending.append(token_entry(engine.tokenizer, piece, text_len))
            text_len += len(piece.text)
            released = matcher.feed(piece.text)
            if matcher.matched is not None:
                job.emit(Delta(released, entries.take(released)))
                finish_reason = "stop"
                break
            job.emit(Delta(released, entries.take(released)))
            if job.fault_after is not None and job.generated >= job.fault_after:
                raise RuntimeError(f"fault injected after {job.generated} tokens "
                                   f"({FAULT_HEADER} header)")
            if job.cancelled:
                finish_reason = "cancelled"
                break
        else:
            finish_reason = piece_finish_reason(pieces, job)
    finally:
        pieces.close()
    tail = matcher.flush()
    if matcher.matched is not None:
        tail_entries: list[dict[str, Any]] = []
        entries.pending = []
    else:
        tail_entries = entries.take(tail, final=True)
    job.emit(Finished(finish_reason, tail, tail_entries, len(job.prompt_ids), job.generated))


def piece_finish_reason(pieces: Any, job: Job) -> str:
    """Why the engine's stream ended on its own: its token budget, else an end token."""
    return "length" if job.generated >= job.max_new_tokens else "stop"
