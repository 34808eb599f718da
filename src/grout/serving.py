"""One server request on the engine: its prompt, its generation, its logprob entries.

`prepare` tokenizes a request's prompt (chat template included) and checks it against the
context; `generate` runs on the engine thread, turning the engine's token stream into the
`Delta`/`Finished` events of a `Job`.
"""
from __future__ import annotations

import math
import time
from typing import Any

import grout
from grout.engine import token_budget
from grout.logprobs import TokenLogprobs, check_vocabulary
from grout.protocol import APIError, GenerationRequest, shown
from grout.scheduler import Delta, Failed, Finished, Job

FAULT_HEADER = "x-grout-fault"


def warm_up(engine: Any) -> Any:
    """Run a short greedy and a short sampled generation (with logprobs); returns ``engine``.

    The warm-up compiles every kernel a request uses and records both decode graphs, so that
    ``/health`` says ok only when the first request will be served at full speed.
    """
    # One token id: text could tokenize longer than a short context, or into ids past a
    # model vocabulary smaller than its tokenizer's, and fail the load.
    ids = [0]
    for temperature in (0.0, 1.0):
        for _ in engine.stream(ids, max_new_tokens=2, temperature=temperature, seed=0,
                               logprobs=1):
            pass
    return engine


def max_model_len(engine: Any) -> int:
    """The context length: prompt plus generated tokens (grout.engine.token_budget)."""
    return int(engine.max_seq_len)


def _prompt_ids(engine: Any, req: GenerationRequest) -> list[int]:
    """The request's prompt as token ids (chat template applied); RequestError (the
    template failed, the text is not valid Unicode) or APIError for a bad prompt."""
    tokenizer = engine.tokenizer
    if req.kind == "chat":
        return tokenizer.encode(tokenizer.apply_chat_template(
            req.messages, add_generation_prompt=True, enable_thinking=req.enable_thinking))
    if isinstance(req.prompt, str):
        return tokenizer.encode(req.prompt)
    ids = list(req.prompt or [])
    vocab = engine.config.vocab_size
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise APIError(f"token ids {shown(bad[:5])} are outside the vocabulary [0, {vocab})",
                       param="prompt")
    return ids


def prepare(engine: Any, job: Job) -> None:
    """Check the job's logprobs, tokenize its prompt, fix its budget; APIError(400) if unfit."""
    # The budget is the engine's (token_budget), and so are the prompts it refuses: those
    # longer than the context. Where the engine would cut a generation short, the server
    # refuses the request instead, as vLLM does: a max_tokens past the budget. A prompt that
    # fills the context and asks for no tokens (chat without max_tokens, or max_tokens 0) is
    # answered as the engine answers it, with nothing and "length".
    req = job.request
    param = "messages" if req.kind == "chat" else "prompt"
    top = "top_logprobs" if req.kind == "chat" else "logprobs"
    try:
        check_vocabulary(req.logprobs, engine.config.vocab_size, f"'{top}'")
    except grout.RequestError as err:
        raise APIError(str(err), param=top) from None
    try:
        ids = _prompt_ids(engine, req)
    except grout.RequestError as err:
        raise APIError(str(err), param=param) from None
    context = max_model_len(engine)
    budget = token_budget(context, len(ids))
    if len(ids) > context:
        raise APIError(f"this model's maximum context length is {context} tokens, and the "
                       f"prompt has {len(ids)}: shorten it", param=param,
                       code="context_length_exceeded")
    if req.max_tokens is not None and req.max_tokens > budget:
        raise APIError(f"this model's maximum context length is {context} tokens: the prompt "
                       f"has {len(ids)} and {shown(req.max_tokens)} more were asked for; ask "
                       f"for at most {budget}", param=req.max_tokens_param,
                       code="context_length_exceeded")
    job.prompt_ids = ids
    job.max_new_tokens = budget if req.max_tokens is None else req.max_tokens


# The logprob written for -inf (a token of probability 0 in fp32): OpenAI's and vLLM's floor.
LOGPROB_FLOOR = -9999.0


def json_logprob(value: float) -> float | None:
    """A logprob as JSON can hold it: NaN (a model whose logits are NaN) as null, -inf as
    LOGPROB_FLOOR (JSON has neither)."""
    return None if math.isnan(value) else max(value, LOGPROB_FLOOR)


def token_entry(tokenizer: Any, lp: TokenLogprobs, offset: int) -> dict[str, Any]:
    """The neutral logprob entry (grout.responses) of one generated token."""
    def one(token_id: int, logprob: float) -> dict[str, Any]:
        raw = tokenizer.token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": json_logprob(logprob),
                "bytes": list(raw)}

    entry = one(lp.token_id, lp.logprob)
    entry["top"] = [one(t, v) for t, v in zip(lp.top_ids, lp.top_logprobs)]
    entry["offset"] = offset
    return entry


def generate(engine: Any, job: Job) -> None:
    """Engine thread: run the job's generation and emit its events, exactly one terminal.

    The engine holds back text that may still become a stop string (or an incomplete
    character) and cuts it at a stop string, so each piece's text can be sent as it comes.
    A cancelled job stops before the engine starts another chunk of decode steps.
    """
    req: GenerationRequest = job.request
    assert job.prompt_ids is not None
    try:
        stream = engine.stream(job.prompt_ids, max_new_tokens=job.max_new_tokens,
                               temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                               seed=req.seed, stop=req.stop or None, logprobs=req.logprobs,
                               ignore_eos=req.ignore_eos)
    except grout.RequestError as err:
        raise APIError(str(err)) from None
    with stream:
        for piece in stream:
            job.decoded = stream.decoded
            job.last_token_at = time.perf_counter()
            if not job.generated:
                job.first_token_at = job.last_token_at
            job.generated += 1
            entries = [] if piece.logprobs is None else \
                [token_entry(engine.tokenizer, piece.logprobs, piece.offset)]
            if piece.finish_reason is not None:
                job.emit(Finished(piece.finish_reason, piece.text, entries,
                                  len(job.prompt_ids), job.generated))
                return
            job.emit(Delta(piece.text, entries))
            if job.fault_after is not None and job.generated >= job.fault_after:
                raise RuntimeError(f"fault injected after {job.generated} tokens "
                                   f"({FAULT_HEADER} header)")
            if job.cancelled:
                job.emit(Failed(job.cancel_reason))
                return
    # Only a request for no tokens at all ends without a final piece.
    job.emit(Finished("length", "", [], len(job.prompt_ids), job.generated))
