"""OpenAI response bodies and server-sent-event chunks for one request.

Logprob entries arrive in one neutral form per token, ``{"token", "bytes", "logprob",
"top": [{"token", "logprob", "bytes"}], "offset"}`` (offset: the length of the completion's
text sent before the token's own chunk), and are written in each endpoint's own format: the
legacy completions columns or chat's ``content`` list. A logprob is a JSON number or null:
-inf is written as -9999.0 and NaN as null (grout.serving.json_logprob).
"""
from __future__ import annotations

import json
from typing import Any

from grout.protocol import APIError
from grout.scheduler import Delta, Finished, Job


def usage(finished: Finished) -> dict[str, int]:
    """Exact token counts: the prompt as tokenized, every token the engine produced."""
    return {"prompt_tokens": finished.prompt_tokens,
            "completion_tokens": finished.completion_tokens,
            "total_tokens": finished.prompt_tokens + finished.completion_tokens}


def completion_logprobs(entries: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The legacy completions format: parallel lists, top alternatives as {token: logprob}."""
    tops = []
    for e in entries:
        top: dict[str, float] = {}
        for t in [*e["top"], e]:      # best first; tokens that print alike keep the best
            top.setdefault(t["token"], t["logprob"])
        tops.append(top)
    return {"tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": tops,
            "text_offset": [e["offset"] for e in entries]}


def chat_logprobs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The chat format: one object per token with its ``top_logprobs`` list."""
    return {"content": [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
                         "top_logprobs": e["top"]} for e in entries],
            "refusal": None}


def _logprobs(job: Job, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    if job.request.logprobs is None:
        return None
    if job.request.kind == "chat":
        return chat_logprobs(entries)
    return completion_logprobs(entries)


def full_body(job: Job, model: str, text: str, entries: list[dict[str, Any]],
              finished: Finished) -> dict[str, Any]:
    """The body of a non-streamed response."""
    choice: dict[str, Any] = {"index": 0, "logprobs": _logprobs(job, entries),
                              "finish_reason": finished.finish_reason}
    if job.request.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text, "refusal": None,
                             "tool_calls": []}
        obj = "chat.completion"
    else:
        choice["text"] = text
        obj = "text_completion"
    return {"id": job.id, "object": obj, "created": job.created, "model": model,
            "choices": [choice], "usage": usage(finished), "system_fingerprint": None}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line. Strict JSON, as a
    non-streamed body is: NaN or infinity raise rather than print as invalid JSON."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"),
                                                               allow_nan=False)
    return f"data: {data}\n\n".encode()


class ChunkWriter:
    """Writes one streamed response's chunks, in the order OpenAI clients expect.

    Chat sends the role on the first delta; exactly one chunk carries ``finish_reason``;
    with ``stream_options.include_usage`` every chunk has ``usage: null`` and one last chunk
    with no choices carries the counts; ``data: [DONE]`` ends the stream.
    """

    def __init__(self, job: Job, model: str) -> None:
        self.job = job
        self.chat = job.request.kind == "chat"
        self._base = {"id": job.id, "object": "chat.completion.chunk" if self.chat
                      else "text_completion", "created": job.created, "model": model,
                      "system_fingerprint": None}

    def _chunk(self, text: str | None, entries: list[dict[str, Any]],
               finish_reason: str | None, role: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = _logprobs(self.job, entries) if entries else None
        choice["finish_reason"] = finish_reason
        chunk = dict(self._base, choices=[choice])
        if self.job.request.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    def opening(self) -> list[bytes]:
        """Chat streams open with the role and empty content, before any token."""
        return [self._chunk("", [], None, role=True)] if self.chat else []

    def delta(self, d: Delta) -> bytes | None:
        """A chunk for released text; None when the step released nothing."""
        if not d.text and not d.logprobs:
            return None
        return self._chunk(d.text, d.logprobs, None)

    def closing(self, f: Finished) -> list[bytes]:
        """The chunk with finish_reason (and the last text), the usage chunk, [DONE]."""
        out = [self._chunk(f.text if f.text or not self.chat else None, f.logprobs,
                           f.finish_reason)]
        if self.job.request.include_usage:
            out.append(sse(dict(self._base, choices=[], usage=usage(f))))
        out.append(sse("[DONE]"))
        return out

    @staticmethod
    def failure(error: APIError) -> list[bytes]:
        """An error in the middle of a stream: an error event (clients raise it), then [DONE]."""
        return [sse(error.body()), sse("[DONE]")]
