"""Chat templates: Qwen3's conversation format, and a checkpoint's jinja template rendered as
Hugging Face renders it.

A checkpoint's template (chat_template.jinja, else tokenizer_config.json's ``chat_template``)
is used whenever it has one; otherwise :func:`qwen3_chat` renders Qwen3's conversation format.
"""
from __future__ import annotations

import datetime
import functools
import json
from pathlib import Path

from .errors import CheckpointError, GroutError, RequestError, check_flag

ROLES = ("system", "user", "assistant", "tool")


def _message_text(m, i: int) -> tuple[str, str]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise RequestError(f"message {i}: expected a dict with a role in {ROLES}, got {m!r:.80}")
    role, content = m["role"], m.get("content")
    if isinstance(content, str) or (content is None and role == "assistant"):  # empty turn
        return role, content or ""
    got = "no 'content'" if "content" not in m else \
        "None" if content is None else type(content).__name__
    raise RequestError(f"message {i} ({role}): a {role} message needs its 'content' as a "
                       f"string or a list of text parts, got {got}")


def _openai_message(m):
    """An OpenAI-shaped message as the templates read one: ``developer`` as ``system``, text
    content parts joined by newlines (as the server and vLLM join them), vLLM's
    ``reasoning`` as ``reasoning_content``. Anything else is left for the checks."""
    if not isinstance(m, dict):
        return m
    m = dict(m)
    if m.get("role") == "developer":
        m["role"] = "system"
    content = m.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and
                                         isinstance(p.get("text"), str) for p in content):
        m["content"] = "\n".join(p["text"] for p in content)
    if m.get("reasoning_content") is None and isinstance(m.get("reasoning"), str):
        m["reasoning_content"] = m["reasoning"]
    return m


def _is_tool_result(role: str, content: str) -> bool:
    return role == "user" and content.startswith("<tool_response>") and \
        content.endswith("</tool_response>")


def qwen3_chat(messages, add_generation_prompt: bool = True, enable_thinking: bool = True) -> str:
    """Qwen3's conversation format.

    Every turn is ``<|im_start|>{role}\\n{content}<|im_end|>\\n``. An assistant turn's
    reasoning (its ``reasoning_content``, or what precedes ``</think>`` in its content) is
    kept as ``<think>\\n...\\n</think>\\n\\n`` only after the last user query (with none, no
    turn is after it): earlier turns' reasoning is dropped. The newlines that begin an answer
    are dropped only where its reasoning is split off or shown, as Qwen3's template does, so
    the prompt's tokens are the template's. Tool results become user turns wrapped in
    ``<tool_response>``.
    The generation prompt opens an assistant turn; ``enable_thinking=False`` pre-fills an
    empty think block, so the model answers directly."""
    messages = _checked(messages)
    turns = [_message_text(m, i) for i, m in enumerate(messages)]
    last_query = max((i for i, (r, c) in enumerate(turns)
                      if r == "user" and not _is_tool_result(r, c)), default=len(turns) - 1)
    out = []
    for i, (role, content) in enumerate(turns):
        if role in ("system", "user"):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            if messages[i].get("tool_calls"):       # dropping them would change the prompt
                raise RequestError(f"message {i}: tool_calls are not rendered by grout's Qwen3 "
                                   f"chat format; write the call into the content as "
                                   f"<tool_call>...</tool_call>, or load a checkpoint whose "
                                   f"chat template renders them")
            reasoning = messages[i].get("reasoning_content")
            if not isinstance(reasoning, str):
                reasoning = ""
                if "</think>" in content:
                    head, content = content.split("</think>")[0], content.split("</think>")[-1]
                    reasoning = head.split("<think>")[-1].strip("\n")
                    content = content.lstrip("\n")
            if i > last_query and (i == len(turns) - 1 or reasoning):
                content = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n" + \
                    content.lstrip("\n")
            out.append(f"<|im_start|>assistant\n{content}<|im_end|>\n")
        else:
            first = i == 0 or turns[i - 1][0] != "tool"
            last = i == len(turns) - 1 or turns[i + 1][0] != "tool"
            out.append(("<|im_start|>user" if first else "") +
                       f"\n<tool_response>\n{content}\n</tool_response>" +
                       ("<|im_end|>\n" if last else ""))
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def _checked(messages) -> list:
    """``messages`` as a list of message dicts (``RequestError`` for any other shape)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError("messages must be a non-empty list of {'role', 'content'} dicts")
    return [_openai_message(m) for m in messages]


def render(messages, add_generation_prompt: bool = True, enable_thinking: bool = True,
           template: str | None = None, template_source: str = "the chat template") -> str:
    """The prompt text of a conversation: a checkpoint's ``template``, else :func:`qwen3_chat`."""
    check_flag("add_generation_prompt", add_generation_prompt)
    check_flag("enable_thinking", enable_thinking)
    if template is None:
        return qwen3_chat(messages, add_generation_prompt, enable_thinking)
    messages = _checked(messages)
    # Checked; an assistant's None content renders as "" (as the server sends it), not "None".
    turns = [dict(m, content=_message_text(m, i)[1]) for i, m in enumerate(messages)]
    try:
        return _jinja(template).render(
            messages=turns, add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking, bos_token="", eos_token="<|im_end|>")
    except GroutError:
        raise
    except Exception as e:  # the template is the checkpoint's code: its failure, on these
        raise RequestError(f"{template_source}: the chat template failed on these "
                           f"messages ({type(e).__name__}: {e})") from None


@functools.lru_cache(maxsize=4)
def _jinja(source: str):
    """``source`` compiled in the environment Hugging Face renders chat templates in
    (transformers' chat_template_utils), so a template that works there works here and gives
    the same text: a sandbox with trim_blocks and lstrip_blocks; ``{% break %}`` and
    ``{% continue %}``; the ``{% generation %}`` block (it marks the assistant's text for
    training masks and renders its body); ``tojson`` as ``json.dumps`` (no HTML escaping,
    keys in their order: jinja's own escapes ``<`` and sorts keys); ``raise_exception`` and
    ``strftime_now``."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_generation_tag(), jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _template_error
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@functools.lru_cache(maxsize=1)
def _generation_tag():
    """The jinja extension of ``{% generation %} ... {% endgeneration %}``: its body, rendered
    in a scope of its own (a call block, as Hugging Face's is)."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()
    return Generation


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _template_error(message):
    raise RequestError(f"chat template: {message}")


def checkpoint_template(directory: Path) -> tuple[str, Path] | None:
    """The checkpoint's chat template and its file, compiled once to check it: a template
    that cannot compile would fail every chat request, so the load fails instead."""
    jinja = directory / "chat_template.jinja"
    cfg = directory / "tokenizer_config.json"
    if jinja.is_file():
        try:
            template, where = jinja.read_text(encoding="utf-8"), jinja
        except (OSError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{jinja}: cannot be read as UTF-8 text ({e})") from None
    elif cfg.is_file():
        try:
            template, where = json.loads(cfg.read_text(encoding="utf-8")), cfg
        except (OSError, ValueError, RecursionError) as e:
            raise CheckpointError(f"{cfg}: not valid JSON ({e!s:.200})") from None
        template = template.get("chat_template") if isinstance(template, dict) else None
        if isinstance(template, list):       # Hugging Face's named templates: the default
            template = next((t.get("template") for t in template if isinstance(t, dict)
                             and t.get("name") == "default"), None)
        if not isinstance(template, str):
            return None
    else:
        return None
    try:
        _jinja(template)
    except Exception as e:  # syntax errors, unknown filters and tests: whatever compiling says
        raise CheckpointError(f"{where}: the chat template does not compile "
                              f"({type(e).__name__}: {e})") from None
    return template, where
