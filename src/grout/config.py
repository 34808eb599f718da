"""The model's dimensions: ``Qwen3Config``, read from a checkpoint's config.json or named.

Named shapes carry the published Qwen3 configs' dimensions (random weights are built for
them): ``tiny`` is a CPU-sized model with Qwen3's vocabulary, so text round-trips through
the real tokenizer while every op stays small enough for the CPU executor.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import CheckpointError, RequestError

ARCHITECTURE = "Qwen3ForCausalLM"
QWEN3_VOCAB = 151936
# <|im_end|> and <|endoftext|>: Qwen3's chat models stop on either.
QWEN3_EOS = (151645, 151643)
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Qwen3Config:
    """The dimensions and constants of a Qwen3 model (Hugging Face's config.json names)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 40960
    dtype: str = "bfloat16"
    eos_token_ids: tuple = QWEN3_EOS
    name: str = ""
    # generation_config.json's sampling settings, as (name, value) pairs of SAMPLING_KEYS:
    # the defaults `grout serve` gives requests that leave them out (--generation-config).
    sampling_defaults: tuple = ()

    def __post_init__(self):
        where = self.name or "config"
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "num_key_value_heads", "head_dim",
                  "max_position_embeddings"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"{where}: {f} must be a positive int, "
                                      f"got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(f"{where}: num_attention_heads "
                                  f"{self.num_attention_heads} is not a multiple of "
                                  f"num_key_value_heads {self.num_key_value_heads}")
        d = self.head_dim
        if d < 16 or d & (d - 1):
            raise CheckpointError(f"{where}: head_dim {d} is not supported (the attention "
                                  f"kernels need a power of two >= 16; Qwen3 uses 128)")
        if self.dtype not in DTYPES:
            raise CheckpointError(f"{where}: dtype {self.dtype!r} is not one of {DTYPES}")

    @property
    def q_size(self) -> int:
        """Width of the query projection (heads x head_dim; not always hidden_size)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of each of the key and value projections."""
        return self.num_key_value_heads * self.head_dim

    @property
    def group(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def num_parameters(self) -> int:
        """Parameters, counting a tied embedding once."""
        h, i = self.hidden_size, self.intermediate_size
        layer = h * (self.q_size + 2 * self.kv_size) + self.q_size * h + 3 * h * i \
            + 2 * h + 2 * self.head_dim
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embed + h

    def decode_bytes(self, itemsize: int = 2) -> int:
        """Bytes a decode step reads at least: every weight once (the lm_head once even when
        tied: the embedding lookup reads one row)."""
        h = self.hidden_size
        embed_rows = 0 if self.tie_word_embeddings else self.vocab_size * h
        return (self.num_parameters() - embed_rows) * itemsize

    def with_dtype(self, dtype: str) -> "Qwen3Config":
        """This config with another compute ``dtype`` (a name: "float32", "bfloat16", ...)."""
        return replace(self, dtype=dtype)


def _shape(name, hidden, inter, layers, heads, tied, kv=8, head_dim=128, vocab=QWEN3_VOCAB):
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim, tie_word_embeddings=tied,
                       name=name)


# The published Qwen3 config.json dimensions (vocab 151936, 8 kv heads, head_dim 128,
# rope_theta 1e6, rms_norm_eps 1e-6, 40960 positions, bfloat16).
SHAPES = {
    "tiny": _shape("tiny", 32, 64, 2, 4, True, kv=2, head_dim=16),
    "qwen3-0.6b": _shape("qwen3-0.6b", 1024, 3072, 28, 16, True),
    "qwen3-1.7b": _shape("qwen3-1.7b", 2048, 6144, 28, 16, True),
    "qwen3-4b": _shape("qwen3-4b", 2560, 9728, 36, 32, True),
    "qwen3-8b": _shape("qwen3-8b", 4096, 12288, 36, 32, False),
    "qwen3-14b": _shape("qwen3-14b", 5120, 17408, 40, 40, False),
    "qwen3-32b": _shape("qwen3-32b", 5120, 25600, 64, 64, False),
}


def named(name: str) -> Qwen3Config:
    """The config of a named shape, or ``RequestError`` listing the names."""
    try:
        return SHAPES[name.lower()]
    except KeyError:
        raise RequestError(f"unknown model {name!r}: not a checkpoint directory and not a named "
                           f"shape ({', '.join(SHAPES)})") from None


def _read_json(path: Path, required: bool) -> dict | None:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path}: missing (a Hugging Face Qwen3 checkpoint directory "
                                  f"has config.json next to its safetensors files)")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:   # ValueError: decoding, digits
        raise CheckpointError(f"{path}: not valid JSON ({e!s:.200})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


# What transformers' Qwen3Config reads for a key that config.json leaves out (a null is read
# otherwise: see from_dict); a checkpoint it saved loads with the shapes it was saved with.
MISSING_AS_TRANSFORMERS = {"head_dim": 128, "num_key_value_heads": 32,
                           "max_position_embeddings": 32768, "rope_theta": 10_000.0}


def _rope_theta(raw: dict, path: Path) -> float:
    """rope_theta from transformers 5's ``rope_parameters`` or the older top-level keys;
    only the default (unscaled) rotary embedding is supported."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    for key, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{path}: {key} must be an object (or null), got "
                                  f"{value!r:.60}")
    # transformers applies a rope_scaling beside rope_parameters (Qwen's docs enable YaRN by
    # adding one to config.json), so either one's scaling is refused.
    for value in (params, scaling):
        kind = (value or {}).get("rope_type", (value or {}).get("type", "default"))
        if kind != "default":
            raise CheckpointError(f"{path}: rope scaling {kind!r:.60} is not supported (only "
                                  f"the default rotary embedding)")
    # partial_rotary_factor is not read: transformers' Qwen3 rotates the whole head_dim
    # whatever it says (its default rotary embedding never looks at it), and so does grout.
    theta = (params or {}).get("rope_theta", raw.get("rope_theta"))
    if theta is None:
        theta = MISSING_AS_TRANSFORMERS["rope_theta"]
    return _number(path, "rope_theta", theta, positive=True)


def finite(value) -> bool:
    """Whether the real number ``value`` is finite (an int too large for a float is not:
    ``math.isfinite`` would raise OverflowError for it)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _number(path, key: str, value, positive: bool = False) -> float:
    """A float field of config.json: finite, and > 0 (``positive``) or >= 0; a NaN or a
    negative rope_theta would load and only make the model's output garbage."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and \
        finite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        raise CheckpointError(f"{path}: {key} must be a finite number "
                              f"{'> 0' if positive else '>= 0'}, got {value!r:.60}")
    return float(value)


def _flag(path, key: str, value, default: bool = False) -> bool:
    """A boolean field of config.json: JSON true or false, null for the default (the string
    "false" would read as true and load the model with the wrong head)."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"{path}: {key} must be true or false, got {value!r:.60}")
    return value


def _eos_ids(raw: dict, path, generation: dict | None, generation_path) -> tuple:
    """Qwen3's end tokens and those of config.json and generation_config.json (a token id or
    a list of them in each); an id that is not an int would never stop a generation."""
    ids = list(QWEN3_EOS)
    for source, where in ((raw, path), (generation or {}, generation_path)):
        v = source.get("eos_token_id")
        items = [] if v is None else v if isinstance(v, list) else [v]
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
            raise CheckpointError(f"{where}: eos_token_id must be a token id (an int >= 0) or a "
                                  f"list of them, got {v!r:.60}")
        ids += [i for i in items if i not in ids]
    return tuple(ids)


SAMPLING_KEYS = ("temperature", "top_k", "top_p")


def _sampling_defaults(generation: dict | None, path) -> tuple:
    """generation_config.json's temperature, top_k and top_p (a null counts as absent), each
    checked as a request's would be: a default no request could send would fail every one."""
    found = []
    for key in SAMPLING_KEYS:
        value = (generation or {}).get(key)
        if value is None:
            continue
        if key == "top_k":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"{path}: top_k must be an int >= 0, got {value!r:.60}")
        else:
            value = _number(path, key, value, positive=key == "top_p")
            if key == "top_p" and value > 1:
                raise CheckpointError(f"{path}: top_p must be in (0, 1], got {value!r:.60}")
        found.append((key, value))
    return tuple(found)


def from_checkpoint(directory: Path, dtype: str | None = None) -> Qwen3Config:
    """The config of a Hugging Face Qwen3 checkpoint: config.json (required) and
    generation_config.json (its eos ids and sampling defaults, when present).
    ``CheckpointError`` names the file. ``dtype``: as :func:`from_dict`."""
    path = directory / "config.json"
    raw = _read_json(path, required=True)
    generation_path = directory / "generation_config.json"
    generation = _read_json(generation_path, required=False)
    return from_dict(raw, path, generation, name=str(directory), generation_path=generation_path,
                     dtype=dtype)


def _dtype(raw: dict, path, dtype: str | None) -> str:
    """The compute dtype: ``dtype`` when given (the weights are converted to it, so the
    checkpoint's own need not be one grout computes in), else config.json's."""
    source = str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16").removeprefix("torch.")
    if dtype is None and source not in DTYPES:
        raise CheckpointError(f"{path}: dtype {source!r} is not one grout computes in "
                              f"({', '.join(DTYPES)}); pass the dtype to convert the weights to, "
                              f"e.g. dtype=\"float32\" (--dtype float32 on the command line)")
    return source if dtype is None else dtype


def from_dict(raw: dict, path, generation: dict | None = None, name: str = "",
              generation_path="generation_config.json", dtype: str | None = None) -> Qwen3Config:
    """The config of a config.json's contents ``raw`` (``transformers``' ``config.to_dict()``
    works too); ``path`` (and ``generation_path``) name the source in a ``CheckpointError``.
    ``dtype`` (one of ``DTYPES``) replaces config.json's dtype, which then may be any."""
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"{path}: architectures must be a list of class names, got "
                              f"{archs!r:.60}")
    if ARCHITECTURE not in archs and not (not archs and raw.get("model_type") == "qwen3"):
        raise CheckpointError(f"{path}: architecture {archs or raw.get('model_type')!r} is not "
                              f"supported; grout runs {ARCHITECTURE}")
    for key, ok in (("attention_bias", False), ("use_sliding_window", False)):
        if raw.get(key, ok) != ok:
            raise CheckpointError(f"{path}: {key}={raw[key]!r} is not supported")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (silu)")
    quant = raw.get("quantization_config")
    if quant:                       # its weights are stored in a form grout does not read
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise CheckpointError(f"{path}: quantization_config ({method!r:.40}): quantized "
                              f"checkpoints are not supported; use the bf16 release")
    dtype = _dtype(raw, path, dtype)
    eos = _eos_ids(raw, path, generation, generation_path)
    sampling = _sampling_defaults(generation, generation_path)
    try:
        heads, hidden = raw["num_attention_heads"], raw["hidden_size"]
        kv = raw.get("num_key_value_heads", MISSING_AS_TRANSFORMERS["num_key_value_heads"])
        cfg = Qwen3Config(
            vocab_size=raw["vocab_size"], hidden_size=hidden,
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"], num_attention_heads=heads,
            # null as transformers reads it: as many key/value heads as query heads
            num_key_value_heads=heads if kv is None else kv,
            head_dim=raw.get("head_dim", MISSING_AS_TRANSFORMERS["head_dim"]),
            tie_word_embeddings=_flag(path, "tie_word_embeddings",
                                      raw.get("tie_word_embeddings", False)),
            rope_theta=_rope_theta(raw, path),
            rms_norm_eps=_number(path, "rms_norm_eps", raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=raw.get(
                "max_position_embeddings", MISSING_AS_TRANSFORMERS["max_position_embeddings"]),
            dtype=dtype, eos_token_ids=eos, name=name, sampling_defaults=sampling)
    except KeyError as e:
        raise CheckpointError(f"{path}: missing key {e.args[0]!r}") from None
    except CheckpointError as e:
        # Qwen3Config's checks name the model; name the file instead (once).
        message = str(e)
        if not message.startswith(f"{path}: "):
            message = f"{path}: {message.removeprefix((name or 'config') + ': ')}"
        raise CheckpointError(message) from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    return cfg


__all__ = ["Qwen3Config", "SHAPES", "named", "from_checkpoint", "from_dict"]
