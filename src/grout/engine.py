"""The engine: ``grout.load(...)`` and ``Engine.generate / stream / chat / logits``.

Batch 1: one request at a time owns the device state (the cache and the decode buffers).
A request is checked completely before anything runs (``RequestError``), so a bad one
leaves the engine as it was. ``generate``, ``chat`` and ``logits`` own the engine for their
whole request: one called from another thread meanwhile waits its turn. ``stream`` returns
a generator that produces one :class:`Piece` per token; closing it (or dropping it) stops
generation, and a request made while a stream is unfinished supersedes it (the stream then
raises if resumed).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Iterator

import torch

import safetile as st

from . import config as config_mod
from .config import Qwen3Config
from .errors import CheckpointError, RequestError, check_flag, drop_locals, dropping_locals
from .logprobs import check_top_logprobs, check_vocabulary, step_logprobs
from .outputs import Completion, Piece, Stream
from .runner import Runner
from .sampler import SEED_END, SEED_MIN, SamplingParams, integer
from .stops import StopTail, stop_strings
from .tokenizer import StreamDecoder, Tokenizer, as_token_id, load_tokenizer, qwen_tokenizer
from .weights import Weights, load_checkpoint, random_weights
from .weights import from_tensors as weights_from_tensors

GEMMS = ("safetile", "cublas")
# The most decode steps in one chunk: a chunk is one graph of that many inlined steps, and
# its token buffers are allocated with the engine.
MAX_DECODE_CHUNK = 1024
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "f32": "float32",
               "bfloat16": "bfloat16", "bf16": "bfloat16",
               "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16"}


def resolve_device(device) -> torch.device:
    """None: CUDA when present, else the CPU; ``RequestError`` for CUDA without a GPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise RequestError(f"unknown device {device!r}; use 'cpu' or 'cuda'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RequestError(f"device {device!r} was asked for, but no CUDA GPU is available "
                           f"(run on the CPU executor instead: device='cpu', or --device cpu on the "
                           f"command line)")
    if dev.type not in ("cpu", "cuda"):
        raise RequestError(f"unsupported device {device!r}; use 'cpu' or 'cuda'")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype, default: str) -> str:
    """The dtype name ``dtype`` asks for; ``default`` (the checkpoint's) for None or "auto"."""
    if dtype is None or (isinstance(dtype, str) and dtype.lower() == "auto"):
        return default
    if isinstance(dtype, st.DType):
        dtype = dtype.name
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).removeprefix("torch.")
    name = DTYPE_NAMES.get(str(dtype).lower())
    if name is None:
        raise RequestError(f"unsupported dtype {dtype!r}; use float32, bfloat16, float16 or "
                           f"auto (the checkpoint's)")
    return name


def token_budget(max_seq_len: int, prompt_tokens: int) -> int:
    """The most tokens a request may generate: prompt and output together fit max_seq_len."""
    # One rule for the engine, the command line, bench and the server. The context counts
    # every token of the sequence, as vLLM's max_model_len and transformers' max_length do,
    # though the last token generated is never fed back and so needs no cache row.
    return max(0, max_seq_len - prompt_tokens)


def check_options(gemm, max_seq_len, decode_chunk) -> None:
    """``RequestError`` for an engine option out of range."""
    if gemm not in GEMMS:
        raise RequestError(f"gemm must be one of {GEMMS}, got {gemm!r}")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise RequestError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    n = decode_chunk
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_DECODE_CHUNK or \
            n & (n - 1):
        raise RequestError(f"decode_chunk must be a power of two from 1 to "
                           f"{MAX_DECODE_CHUNK}, got {n!r}")


def check_request(max_new_tokens, temperature, top_k, top_p, seed, stop, logprobs=None,
                  ignore_eos=False):
    """A request's arguments but the prompt, checked (``RequestError``) without an engine:
    (max_new_tokens as an int, its SamplingParams, its stop strings, logprobs as an int or
    None)."""
    if isinstance(max_new_tokens, SamplingParams):    # vLLM's generate(prompt, params)
        p = max_new_tokens
        raise RequestError(f"the second argument is max_new_tokens, got {p!r}: pass the "
                           f"sampling settings as keywords, generate(prompt, "
                           f"max_new_tokens=..., temperature={p.temperature!r}, "
                           f"top_k={p.top_k!r}, top_p={p.top_p!r}, seed={p.seed!r})")
    n = integer(max_new_tokens)
    if n is None or n < 0:
        raise RequestError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    sampling = SamplingParams(temperature, top_k, top_p, seed)
    stops = stop_strings(stop)
    check_flag("ignore_eos", ignore_eos)
    return n, sampling, stops, check_top_logprobs(logprobs)


class Engine:
    """A loaded model: ``generate``, ``stream``, ``chat``, ``logits``, ``tokenizer``,
    ``config``."""

    def __init__(self, cfg: Qwen3Config, weights: Weights, tokenizer: Tokenizer,
                 device: torch.device, dtype: str, max_seq_len: int, gemm: str,
                 progress: bool = True, fused: bool = True, decode_chunk: int = 8):
        self.config = cfg
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.gemm = gemm
        self.backend = "interpret" if device.type == "cpu" else "triton"
        self.eos_ids = frozenset(cfg.eos_token_ids)
        self._lock = threading.RLock()
        self._request = 0
        with st.backend(self.backend):
            self.runner = Runner(cfg, weights, device, getattr(st, dtype), max_seq_len, gemm,
                                 progress, fused, decode_chunk)

    def __repr__(self) -> str:
        return (f"<grout.Engine {self.config.name} on {self.device} ({self.dtype}, "
                f"max_seq_len={self.max_seq_len}, gemm={self.gemm})>")

    @property
    def max_seq_len(self) -> int:
        """Positions of the KV cache: prompt and generated tokens together fit in it."""
        return self.runner.max_seq_len

    # -- requests ------------------------------------------------------------------------
    def _ids(self, prompt) -> list:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) or hasattr(prompt, "tolist"):
            # a list of ids, or an array of them (numpy, torch): each taken as a plain int
            ids = prompt.tolist() if hasattr(prompt, "tolist") else list(prompt)
            if not isinstance(ids, list):
                raise RequestError(f"prompt must be a str or a list of token ids, got a 0-d "
                                   f"{type(prompt).__name__}")
            ids = [_prompt_token_id(i) for i in ids]
        else:
            raise RequestError(f"prompt must be a str or a list of token ids, got "
                               f"{type(prompt).__name__}")
        if not ids:
            raise RequestError("the prompt is empty (it has no tokens)")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise RequestError(f"token ids {bad[:5]} are outside the vocabulary "
                               f"[0, {self.config.vocab_size})")
        if len(ids) > self.max_seq_len:
            raise RequestError(f"the prompt has {len(ids)} tokens; it does not fit the "
                               f"{self.max_seq_len}-position cache (max_seq_len)")
        return ids

    def stream(self, prompt, max_new_tokens: int = 32, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
               stop=None, *, logprobs: int | None = None,
               ignore_eos: bool = False) -> "Stream":
        """An iterator of :class:`Piece` (one per token); the request is checked now, the
        work runs as it is iterated. ``close()`` it to stop early.

        ``logprobs=k`` gives each piece its token's log-probability and the k most likely
        tokens' (grout.logprobs); ``ignore_eos`` generates past end tokens (for benchmarks)."""
        max_new_tokens, sampling, stops, logprobs = check_request(
            max_new_tokens, temperature, top_k, top_p, seed, stop, logprobs, ignore_eos)
        check_vocabulary(logprobs, self.config.vocab_size)
        ids = self._ids(prompt)
        max_new_tokens = min(max_new_tokens, token_budget(self.max_seq_len, len(ids)))
        stream = Stream(len(ids))
        stream._gen = self._generate(ids, max_new_tokens, sampling, stops, logprobs,
                                     ignore_eos, stream)
        return stream

    def _generate(self, ids, max_new_tokens, sampling, stops, logprobs, ignore_eos,
                  stream: Stream) -> Iterator[Piece]:
        if max_new_tokens == 0:
            return
        with self._lock:
            self._request += 1
            request = self._request
            params, key = sampling.tensors(self.device)
            with dropping_locals(), st.backend(self.backend):
                token = self.runner.begin(ids, params, key, sampling.greedy)
                lp = step_logprobs(self.runner, token, logprobs)
                if max_new_tokens > 1 and self.runner.graphable():
                    # Recorded (on first use) before the first token is shown: a progress
                    # bar drawn after it would clear the line the token was printed on.
                    self.runner.graph(sampling.greedy, self.runner.short())
            stream.decoded = 1
        decoder, text, emitted = StreamDecoder(self.tokenizer), "", 0
        tail = StopTail(stops)
        # Tokens decoded ahead in one chunk of graph replays (runner.steps). A chunk never
        # runs past max_new_tokens, which the token budget keeps inside the cache; tokens
        # after a stop are dropped, and what they wrote (cache rows, the cursor) the next
        # request's prefill starts over.
        ahead: list = []
        for n in range(1, max_new_tokens + 1):
            finish, start = None, len(text)
            if token in self.eos_ids and not ignore_eos:
                finish = "stop"
            else:
                more = decoder.push(token)
                text += more
                tail.feed(more)
            hit = _find_stop(text, stops, emitted)
            if hit < 0 and finish is None and n == max_new_tokens:
                finish = "length"
            if finish is not None and hit < 0:
                # Text the decoder held back (a character not yet complete) comes out now,
                # and may hold a stop string: b" \xe2\x80" is a space and half a dash.
                text += decoder.flush()
                hit = _find_stop(text, stops, emitted)
            if hit >= 0:
                finish, end = "stop", hit
            elif finish is not None:
                end = len(text)
            else:
                end = len(text) - tail.held
            piece, emitted = text[emitted:end], max(emitted, end)
            yield Piece(piece, token, finish, lp, start)
            if finish is not None:
                return
            with self._lock:
                if self._request != request:
                    raise RequestError("this stream was superseded by a newer request on the "
                                       "same engine")
                with dropping_locals(), st.backend(self.backend):
                    if not ahead:
                        # logprobs read each step's logits: one step at a time then
                        wanted = 1 if logprobs is not None else max_new_tokens - n
                        ahead = self.runner.steps(sampling.greedy,
                                                  self.runner.chunk_size(wanted))
                        stream.decoded += len(ahead)
                    token = ahead.pop(0)
                    lp = step_logprobs(self.runner, token, logprobs)

    def generate(self, prompt, max_new_tokens: int = 32, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 stop=None, *, logprobs: int | None = None,
                 ignore_eos: bool = False) -> Completion:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (a str or token ids);
        ``logprobs`` and ``ignore_eos`` as :meth:`stream`."""
        stream = self.stream(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop,
                             logprobs=logprobs, ignore_eos=ignore_eos)
        # The whole request holds the (reentrant) lock, so a request from another thread
        # waits for it rather than superseding it between two steps.
        with self._lock:
            pieces = list(stream)
        return Completion("".join(p.text for p in pieces), [p.token_id for p in pieces],
                          pieces[-1].finish_reason if pieces else "length", stream.prompt_tokens,
                          None if logprobs is None else [p.logprobs for p in pieces])

    def chat(self, messages, enable_thinking: bool = False, **kwargs) -> Completion:
        """Generate the assistant's reply to ``messages`` (the chat template applied)."""
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                    enable_thinking=enable_thinking)
        return self.generate(prompt, **kwargs)

    def logits(self, ids) -> torch.Tensor:
        """Prefill logits of ``ids``: torch.float32 (len, vocab) on the CPU."""
        ids = self._ids(ids)
        with self._lock:
            self._request += 1
            with dropping_locals(), st.backend(self.backend):
                return self.runner.logits(ids)


def _find_stop(text: str, stops, emitted: int) -> int:
    """Where the first stop string ending past ``text[:emitted]`` begins (-1: none)."""
    return min((i for i in (text.find(s, max(0, emitted - len(s) + 1)) for s in stops)
                if i >= 0), default=-1)


def _prompt_token_id(i) -> int:
    """A prompt's token id as a plain int; RequestError, naming what to pass instead of a
    batch engine's input (a row of input_ids, a list of prompt strings)."""
    if isinstance(i, (list, tuple)):       # a row of a (1, n) input_ids, as tokenizers give
        raise RequestError("the prompt must be one sequence of token ids, not a batch of "
                           "them (grout runs one request at a time: pass input_ids[0])")
    if isinstance(i, str):                 # a list of prompts, as batch engines take
        raise RequestError("the prompt must be one str or one list of token ids, not a list "
                           "of strings (grout runs one request at a time)")
    return as_token_id(i)


DEFAULT_MAX_SEQ_LEN = 4096


def load(model, device=None, dtype=None, max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
         gemm: str = "safetile", *, seed: int = 0, progress: bool = True, fused: bool = True,
         decode_chunk: int = 8) -> Engine:
    """Load a checkpoint directory or a named shape (random weights, ``seed``) as an Engine.

    ``max_seq_len``: positions of the preallocated cache (at most the model's
    max_position_embeddings: a larger value is capped, with a warning); ``gemm="cublas"``
    runs the projections on torch.matmul; ``fused=False``: the unfused decode step (for
    comparison); ``decode_chunk``: the most decode steps replayed between two reads of the
    host (1: a read after every token)."""
    check_options(gemm, max_seq_len, decode_chunk)
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise RequestError(f"model must be a checkpoint directory or a named shape "
                           f"({', '.join(config_mod.SHAPES)}), got {model!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_MIN <= seed < SEED_END:
        got = repr(seed) if isinstance(seed, bool) or not isinstance(seed, int) else \
            f"an int of {seed.bit_length()} bits"
        raise RequestError(f"seed (of a named shape's random weights) must be an int in "
                           f"[-2**63, 2**64), got {got}")
    dev = resolve_device(device)
    path = Path(model).expanduser()
    if path.is_dir():
        cfg = config_mod.from_checkpoint(path, resolve_dtype(dtype, None))   # None: its own
        tokenizer = load_tokenizer(path)
    elif isinstance(model, str) and model.lower() in config_mod.SHAPES:
        cfg, tokenizer, path = config_mod.named(model), qwen_tokenizer(), None
    elif path.exists():
        raise CheckpointError(f"{path}: a file, not a checkpoint directory; pass the directory "
                              f"that holds it (config.json and the safetensors files)")
    elif isinstance(model, str) and ("/" in model or model.startswith(".")):
        hub = model.count("/") == 1 and not model.startswith((".", "/", "~"))
        raise CheckpointError(f"{path}: no such checkpoint directory" + (
            f" (grout loads local files only; download it first, e.g. `huggingface-cli "
            f"download {model} --local-dir DIR`, then pass DIR)" if hub else ""))
    else:
        cfg = config_mod.named(str(model))           # RequestError listing the names
        tokenizer, path = qwen_tokenizer(), None
    if path is not None:
        build = functools.partial(load_checkpoint, path)
    else:
        def build(cfg, dev, tdtype, keep_torch, progress):
            return random_weights(cfg, dev, tdtype, seed, keep_torch, progress)
    return _engine(cfg, build, tokenizer, dev, dtype, max_seq_len, gemm, progress, fused,
                   decode_chunk)


def _engine(cfg, build, tokenizer, dev, dtype, max_seq_len, gemm, progress, fused,
            decode_chunk) -> Engine:
    name = resolve_dtype(dtype, cfg.dtype)
    cfg = cfg.with_dtype(name)
    seq = min(max_seq_len, cfg.max_position_embeddings)
    if seq < max_seq_len and max_seq_len != DEFAULT_MAX_SEQ_LEN:
        warnings.warn(f"max_seq_len={max_seq_len} is past the model's context "
                      f"(max_position_embeddings={seq}): the cache holds {seq} positions",
                      stacklevel=3)
    handled = sys.exc_info()[1]           # the caller's own, if it is handling one
    weights = build(cfg, dev, getattr(torch, name), gemm == "cublas", progress)
    try:
        return Engine(cfg, weights, tokenizer, dev, name, seq, gemm, progress, fused,
                      decode_chunk)
    except BaseException as e:
        # Nothing stays allocated: the frames the error passed through would keep the
        # weights (and the engine's buffers) alive for as long as the error is kept.
        weights.release()
        drop_locals(e, handled)
        del weights
        raise


def from_tensors(config: Qwen3Config, tensors, device=None, dtype=None,
                 max_seq_len: int = 4096, gemm: str = "safetile", *, progress: bool = False,
                 fused: bool = True, decode_chunk: int = 8) -> Engine:
    """An Engine over in-memory weights: ``tensors`` maps Hugging Face's names to torch
    tensors (a ``Qwen3ForCausalLM``'s ``state_dict()``), ``config`` a grout Qwen3Config
    (``grout.config.from_dict(hf_config.to_dict(), ...)``); they are copied, never kept.
    The tokenizer is Qwen's BPE. Other arguments as :func:`load`."""
    check_options(gemm, max_seq_len, decode_chunk)

    def build(cfg, dev, tdtype, keep_torch, _progress):
        return weights_from_tensors(cfg, tensors, dev, tdtype, keep_torch)
    return _engine(config, build, qwen_tokenizer(), resolve_device(device), dtype,
                   max_seq_len, gemm, progress, fused, decode_chunk)


__all__ = ["Engine", "Completion", "Piece", "Stream", "load", "from_tensors", "token_budget"]
