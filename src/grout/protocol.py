"""The OpenAI API's request fields and error bodies, as grout's server accepts them.

`parse_completion_request` and `parse_chat_request` turn a decoded JSON body into a
`GenerationRequest`, or raise `APIError` (HTTP 400) naming the offending field. Fields the
engine cannot honour are refused rather than ignored, so a client never silently gets a
different generation than it asked for; fields that change nothing (``user``, ``metadata``,
...) are accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import SAMPLING_KEYS, finite
from .errors import RequestError
from .tokenizer import check_unicode

MAX_TOP_LOGPROBS = 5        # completions' ``logprobs``, as the OpenAI API bounds it
MAX_TOP_LOGPROBS_CHAT = 20  # chat's ``top_logprobs``, as the OpenAI API bounds it
SEED_RANGE = (-2 ** 63, 2 ** 63 - 1)    # a signed 64-bit seed, as vLLM takes it
MAX_STOP_STRINGS = 16
# Characters in one stop string: far more than any real one, and the bound keeps a request's
# stop handling (its setup and each token's search are linear in the stops' length) small.
MAX_STOP_LENGTH = 4096


def encodable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``): an error that
    quotes what a client sent must still encode as UTF-8."""
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut short (a client may send megabytes)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return cut(repr(value), limit)


def cut(text: str, limit: int = 60) -> str:
    """``text`` for an error message, cut short at ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


class APIError(Exception):
    """An error the server answers with an OpenAI-shaped body and an HTTP status."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = encodable(message)
        self.status = status
        self.type = type
        self.param = None if param is None else encodable(param)
        self.code = code

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` body OpenAI clients parse."""
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def internal_error(message: str) -> APIError:
    """An HTTP 500 for a failure inside one request."""
    return APIError(message, status=500, type="server_error", code="internal_error")


def client_closed() -> APIError:
    """The end of a request whose client went away (nobody reads it; logs name it)."""
    return APIError("the client closed the connection", status=499,
                    code="client_closed_request")


@dataclass
class GenerationRequest:
    """One request, validated: what to generate and how to answer."""

    kind: str                                   # "completion" | "chat"
    prompt: str | list[int] | None = None       # completions
    messages: list[dict[str, str]] | None = None  # chat: role, content, reasoning_content
    enable_thinking: bool = True
    max_tokens: int | None = None               # None: up to the context's end
    max_tokens_param: str = "max_tokens"        # the field max_tokens came from (errors name it)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                              # 0: no top-k cut
    sampling_sent: frozenset = frozenset()      # which of temperature, top_p, top_k were sent
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None                 # None: off; k: chosen token plus k alternatives
    ignore_eos: bool = False                    # an extension (vLLM's): generate past end tokens


# Fields accepted and ignored: they describe the caller, not the generation.
_IGNORED = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
            "prompt_cache_retention", "parallel_tool_calls"}
# Fields refused unless they hold their default (which means "not used").
_DEFAULTS_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None,),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
    "tool_choice": (None, "none"), "function_call": (None, "none"), "audio": (None,),
    "prediction": (None,), "response_format": (None, {"type": "text"}),
    "modalities": (None, ["text"]), "reasoning_effort": (None,), "web_search_options": (None,),
    "moderation": (None,), "prompt_cache_options": (None,), "verbosity": (None,),
    # vLLM's sampling extensions, which its clients (`vllm bench serve`) send at these values
    "repetition_penalty": (None, 1), "min_p": (None, 0), "min_tokens": (None, 0),
    "stop_token_ids": (None, []), "include_stop_str_in_output": (None, False),
    "add_generation_prompt": (None, True), "continue_final_message": (None, False),
}
_COUNTS = {"n", "best_of"}                  # completions a request: one
_COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k",
           "seed", "stop", "ignore_eos"}
_COMPLETION_FIELDS = _COMMON | {"prompt", "logprobs"}
_CHAT_FIELDS = _COMMON | {"messages", "logprobs", "top_logprobs", "max_completion_tokens",
                          "chat_template_kwargs"}
_ROLES = {"system", "user", "assistant", "tool", "developer"}


def parse_completion_request(body: Any, model_name: str) -> GenerationRequest:
    """Validate a ``POST /v1/completions`` body."""
    fields = _check_fields(body, _COMPLETION_FIELDS)
    req = GenerationRequest(kind="completion", prompt=_prompt(fields))
    _common(fields, req, model_name)
    req.max_tokens = _int(fields, "max_tokens", default=16, low=0)
    req.logprobs = _int(fields, "logprobs", default=None, low=0, high=MAX_TOP_LOGPROBS)
    return req


def parse_chat_request(body: Any, model_name: str) -> GenerationRequest:
    """Validate a ``POST /v1/chat/completions`` body."""
    fields = _check_fields(body, _CHAT_FIELDS)
    req = GenerationRequest(kind="chat", messages=_messages(fields))
    _common(fields, req, model_name)
    # Both are checked; the newer max_completion_tokens wins when both are sent.
    legacy = _int(fields, "max_tokens", default=None, low=0)
    req.max_tokens = _int(fields, "max_completion_tokens", default=legacy, low=0)
    if fields.get("max_completion_tokens") is not None:
        req.max_tokens_param = "max_completion_tokens"
    want = _bool(fields, "logprobs", default=False)
    top = _int(fields, "top_logprobs", default=None, low=0, high=MAX_TOP_LOGPROBS_CHAT)
    if top is not None and not want:
        raise APIError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    req.logprobs = (top or 0) if want else None
    kwargs = fields.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict) or set(kwargs) - {"enable_thinking"}:
            raise APIError("'chat_template_kwargs' supports only 'enable_thinking'",
                           param="chat_template_kwargs")
        req.enable_thinking = _bool(kwargs, "enable_thinking", default=True,
                                    param="chat_template_kwargs.enable_thinking")
    return req


def _check_fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object")
    for name, value in body.items():
        if name in allowed or name in _IGNORED:
            continue
        if name in _DEFAULTS_ONLY:
            if not any(_same(value, d) for d in _DEFAULTS_ONLY[name]):
                if name in _COUNTS and isinstance(value, int) and \
                        not isinstance(value, bool) and value < 1:
                    raise APIError(f"'{name}' must be at least 1, got {shown(value)}",
                                   param=name)
                why = " (it generates one completion a request)" if name in _COUNTS else ""
                raise APIError(f"'{name}' = {shown(value)} is not supported by this server"
                               f"{why}", param=name, code="unsupported_parameter")
            continue
        raise APIError(f"unrecognized request argument {shown(name)}", param=name[:200],
                       code="unsupported_parameter")
    return body


def _same(value: Any, default: Any) -> bool:
    """``value`` is ``default``: numbers by value (1 and 1.0 alike, never a bool), anything
    else by type and value."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if number(default):
        return number(value) and value == default
    return type(value) is type(default) and value == default


def _common(fields: dict[str, Any], req: GenerationRequest, model_name: str) -> None:
    # No model, or an empty name, is the served one (as vLLM takes it).
    model = fields.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(f"'model' must be a string, got {shown(model)}", param="model")
    if model and model != model_name:
        raise APIError(f"the model {shown(model)} does not exist; this server serves "
                       f"'{model_name}'", status=404, param="model", code="model_not_found")
    req.stream = _bool(fields, "stream", default=False)
    options = fields.get("stream_options")
    if options is not None:
        if not req.stream:
            raise APIError("'stream_options' is only allowed with 'stream': true",
                           param="stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage",
                                                            "continuous_usage_stats"}:
            raise APIError("'stream_options' supports only 'include_usage' (and "
                           "'continuous_usage_stats': false)", param="stream_options")
        if options.get("continuous_usage_stats") not in (None, False):
            raise APIError("'stream_options.continuous_usage_stats' is not supported by this "
                           "server", param="stream_options.continuous_usage_stats",
                           code="unsupported_parameter")
        req.include_usage = _bool(options, "include_usage", default=False,
                                  param="stream_options.include_usage")
    req.sampling_sent = frozenset(k for k in SAMPLING_KEYS if fields.get(k) is not None)
    req.temperature = _float(fields, "temperature", default=1.0, low=0.0)
    req.top_p = _float(fields, "top_p", default=1.0)
    if not 0.0 < req.top_p <= 1.0:
        raise APIError(f"'top_p' must be in (0, 1], got {shown(req.top_p)}", param="top_p")
    top_k = _int(fields, "top_k", default=0, low=-1) or 0
    req.top_k = 0 if top_k == -1 else top_k
    req.seed = _int(fields, "seed", default=None, low=SEED_RANGE[0], high=SEED_RANGE[1])
    req.stop = _stop(fields)
    req.ignore_eos = _bool(fields, "ignore_eos", default=False)


def _prompt(fields: dict[str, Any]) -> str | list[int]:
    prompt = fields.get("prompt")
    if prompt is None:
        raise APIError("'prompt' is required", param="prompt")
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt) or
                                                all(isinstance(p, list) for p in prompt)):
        if len(prompt) != 1:
            raise APIError("a list of several prompts is not supported (batch 1): send one "
                           "prompt per request", param="prompt", code="unsupported_parameter")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError("'prompt' must not be empty", param="prompt")
        return _unicode(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return list(prompt)
    raise APIError("'prompt' must be a non-empty string, a non-empty list of token ids (ints), "
                   "or a list holding one of those", param="prompt")


def _messages(fields: dict[str, Any]) -> list[dict[str, str]]:
    messages = fields.get("messages")
    if messages is None:
        raise APIError("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise APIError("'messages' must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(f"{where} must be an object", param=where)
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise APIError(f"{where}.role must be one of {sorted(_ROLES)}, got {shown(role)}",
                           param=f"{where}.role")
        if message.get("tool_calls"):
            raise APIError(f"{where}.tool_calls: tool calls are not supported",
                           param=f"{where}.tool_calls", code="unsupported_parameter")
        turn = {"role": "system" if role == "developer" else role,
                "content": _unicode(_content(message, role, f"{where}.content"),
                                    f"{where}.content")}
        if role == "assistant":
            reasoning = _reasoning(message, where)
            if reasoning is not None:
                turn["reasoning_content"] = _unicode(reasoning, f"{where}.reasoning_content")
        out.append(turn)
    return out


def _reasoning(message: dict[str, Any], where: str) -> str | None:
    """An assistant message's ``reasoning_content`` (or vLLM's newer ``reasoning``), or None."""
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise APIError(f"{where}.{name} must be a string, got {shown(value)}",
                           param=f"{where}.{name}")
        return value
    return None


def _content(message: dict[str, Any], role: str, where: str) -> str:
    """A message's text, its string or its text parts joined by newlines (as vLLM joins
    them for a template that reads text content); only an assistant's may be null."""
    content = message.get("content")
    if content is None:
        if role == "assistant":
            return ""
        got = "null" if "content" in message else "no 'content'"
        raise APIError(f"{where}: a {role} message needs its content (a string or a list of "
                       f"text parts), got {got}", param=where)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise APIError(f"{where}: only text content parts are supported (in a {role} "
                               f"message)", param=where, code="unsupported_parameter")
            texts.append(part["text"])
        return "\n".join(texts)
    raise APIError(f"{where}: a {role} message's content must be a string or a list of text "
                   f"parts, got {shown(content)}", param=where)


def _stop(fields: dict[str, Any]) -> list[str]:
    stop = fields.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise APIError("'stop' must be a string or a list of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    for i, s in enumerate(stop):
        if len(s) > MAX_STOP_LENGTH:
            raise APIError(f"'stop' strings may be at most {MAX_STOP_LENGTH} characters long; "
                           f"stop[{i}] has {len(s)}", param="stop")
        # Generated text is valid Unicode: a stop string holding a lone surrogate (JSON's
        # "\ud800") could never match, so it is refused as prompts holding one are.
        _unicode(s, f"stop[{i}]", param="stop")
    return [s for s in stop if s]


def _unicode(text: str, where: str, param: str | None = None) -> str:
    """``text`` (the request's field ``where``) unless it holds a lone surrogate."""
    try:
        check_unicode(text, fix="a JSON string's \\uD800-\\uDFFF escapes come in pairs, "
                                "high then low")
    except RequestError as err:
        raise APIError(f"{where}: {err}", param=param or where) from None
    return text


def _bool(fields: dict[str, Any], name: str, *, default: bool, param: str | None = None) -> bool:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise APIError(f"'{param or name}' must be a boolean", param=param or name)
    return value


def _int(fields: dict[str, Any], name: str, *, default: int | None, low: int | None = None,
         high: int | None = None) -> int | None:
    value = fields.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise APIError(f"'{name}' must be an integer, got {shown(value)}", param=name)
    if low is not None and value < low:
        raise APIError(f"'{name}' must be >= {low}, got {shown(value)}", param=name)
    if high is not None and value > high:
        raise APIError(f"'{name}' must be <= {high}, got {shown(value)}", param=name)
    return value


def _float(fields: dict[str, Any], name: str, *, default: float,
           low: float | None = None) -> float:
    value = fields.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not finite(value):
        raise APIError(f"'{name}' must be a finite number, got {shown(value)}", param=name)
    if low is not None and value < low:
        raise APIError(f"'{name}' must be >= {low}, got {shown(value)}", param=name)
    return float(value)
