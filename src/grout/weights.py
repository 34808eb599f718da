"""Weights on the device: read from safetensors (single or sharded) or built at random.

Every weight becomes a read-only ``st.Shared`` value once, on the device. The decode step's
projections are fused at load time into one matrix each (q|k|v rows, gate|up rows), so a
layer streams three weights instead of five per token; the separate q, k and v matrices
that prefill multiplies by are row ranges of the fused one, shared again (read-only views of
one storage may overlap). A checkpoint is checked completely (grout.checkpoint: headers,
names, shapes, sizes, each file's layout) before anything is allocated, so a bad one raises
``CheckpointError`` with nothing left behind; an error after the allocation (a file that
fails while it is read) leaves nothing allocated either (see :func:`_build`).

``Linear.t`` keeps a torch alias of a projection's storage only for ``gemm="cublas"``, the
torch.matmul comparison path: a Shared value is never written while shared, so torch may
read it at any time.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import safetile as st

from .checkpoint import open_files, plan, tensor_names
from .config import Qwen3Config
from .errors import CheckpointError, drop_locals


@dataclass
class Linear:
    """A projection weight (N, K): ``w`` for safetile's ops, ``t`` for torch (cublas only)."""

    w: st.Shared
    t: torch.Tensor | None = None


@dataclass
class Layer:
    input_norm: st.Shared
    post_norm: st.Shared
    q_norm: st.Shared
    k_norm: st.Shared
    qkv: Linear            # (q_size + 2 kv_size, hidden): q, k, v rows
    q: Linear              # row ranges of qkv (prefill multiplies by each)
    k: Linear
    v: Linear
    o: Linear              # (hidden, q_size)
    gate_up: Linear        # (2 intermediate, hidden): gate rows, then up rows
    down: Linear           # (hidden, intermediate)


@dataclass
class Weights:
    embed: st.Shared       # (vocab, hidden)
    lm_head: Linear        # (vocab, hidden); the embedding's storage when tied
    final_norm: st.Shared
    layers: list

    def release(self) -> None:
        """Drop every handle (the storage is freed once no operation holds it)."""
        for v in [self.embed, self.final_norm, self.lm_head.w] + [
                getattr(layer, f) for layer in self.layers
                for f in ("input_norm", "post_norm", "q_norm", "k_norm")] + [
                getattr(layer, f).w for layer in self.layers
                for f in ("qkv", "q", "k", "v", "o", "gate_up", "down")]:
            v.release()
        self.layers = []


def _progress(total: int, desc: str, enabled: bool, unit: str = "B"):
    from tqdm import tqdm
    # bytes scale (kB, MB, ...); a count of layers stays a whole number; a bar written to a
    # log (not a terminal) stays, its line ended, so that what is logged next starts a line
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", file=sys.stderr,
                disable=not enabled, leave=not sys.stderr.isatty(), dynamic_ncols=True)


class Arena:
    """One device allocation carved into aligned tensors.

    Every weight of a model lives in one storage (and the decode step's buffers in another):
    a recorded graph borrows each storage it touches for every replay, so a few storages
    keep that host cost independent of the layer count."""

    ALIGN = 256                 # bytes: tensor-descriptor (TMA) loads need 16

    def __init__(self, nbytes: int, device: torch.device, zero: bool = False):
        alloc = torch.zeros if zero else torch.empty
        self.buf = alloc(nbytes, dtype=torch.uint8, device=device)
        self.used = 0

    @classmethod
    def size(cls, shapes, itemsize: int) -> int:
        """Bytes an arena needs for tensors of ``shapes``."""
        return sum(-(-math.prod(s) * itemsize // cls.ALIGN) * cls.ALIGN for s in shapes)

    def take(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """The next ``shape`` tensor of ``dtype`` (uninitialized)."""
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if self.used + n > self.buf.numel():
            raise RuntimeError(f"arena of {self.buf.numel()} bytes is full")
        t = self.buf[self.used:self.used + n].view(dtype).view(shape)
        self.used += -(-n // self.ALIGN) * self.ALIGN
        return t


def weight_shapes(cfg: Qwen3Config) -> list:
    """Shapes of the device tensors grout keeps: fused per-layer weights, norms, embedding."""
    c = cfg
    h, i, q, kv = c.hidden_size, c.intermediate_size, c.q_size, c.kv_size
    layer = [(q + 2 * kv, h), (2 * i, h), (h, q), (h, i), (h,), (h,), (c.head_dim,),
             (c.head_dim,)]
    head = [] if c.tie_word_embeddings else [(c.vocab_size, h)]
    return [(c.vocab_size, h), (h,)] + head + layer * c.num_hidden_layers


class _Builder:
    """Fills fused device buffers (in one arena) and shares them as weights."""

    def __init__(self, cfg: Qwen3Config, device: torch.device, dtype: torch.dtype,
                 keep_torch: bool):
        self.cfg, self.device, self.dtype, self.keep_torch = cfg, device, dtype, keep_torch
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.arena = Arena(Arena.size(weight_shapes(cfg), itemsize), device)

    def empty(self, *shape) -> torch.Tensor:
        return self.arena.take(shape, self.dtype)

    def shared(self, t: torch.Tensor) -> st.Shared:
        return st.from_torch(t).share()

    def linear(self, t: torch.Tensor) -> Linear:
        return Linear(self.shared(t), t if self.keep_torch else None)

    def layer(self, fill) -> Layer:
        """A layer whose tensors ``fill(part, buffer)`` writes (part: the HF name suffix)."""
        c = self.cfg
        q, kv, h, i = c.q_size, c.kv_size, c.hidden_size, c.intermediate_size
        qkv, gate_up = self.empty(q + 2 * kv, h), self.empty(2 * i, h)
        o, down = self.empty(h, q), self.empty(h, i)
        norms = [self.empty(n) for n in (h, h, c.head_dim, c.head_dim)]
        for part, buf in (("self_attn.q_proj", qkv[:q]), ("self_attn.k_proj", qkv[q:q + kv]),
                          ("self_attn.v_proj", qkv[q + kv:]), ("self_attn.o_proj", o),
                          ("mlp.gate_proj", gate_up[:i]), ("mlp.up_proj", gate_up[i:]),
                          ("mlp.down_proj", down), ("input_layernorm", norms[0]),
                          ("post_attention_layernorm", norms[1]),
                          ("self_attn.q_norm", norms[2]), ("self_attn.k_norm", norms[3])):
            fill(part, buf)
        return Layer(*(self.shared(n) for n in norms), qkv=self.linear(qkv),
                     q=self.linear(qkv[:q]), k=self.linear(qkv[q:q + kv]),
                     v=self.linear(qkv[q + kv:]), o=self.linear(o),
                     gate_up=self.linear(gate_up), down=self.linear(down))

    def weights(self, embed: torch.Tensor, lm_head: torch.Tensor | None, norm: torch.Tensor,
                layers: list) -> Weights:
        head = self.linear(embed if lm_head is None else lm_head)
        return Weights(self.shared(embed), head, self.shared(norm), layers)


def load_checkpoint(directory: Path, cfg: Qwen3Config, device: torch.device,
                    dtype: torch.dtype, keep_torch: bool = False,
                    progress: bool = True) -> Weights:
    """The checkpoint's weights on ``device`` in ``dtype`` (converted there if need be)."""
    from safetensors import SafetensorError

    found = plan(directory, cfg)
    handles = open_files(found)
    total = sum(e[2][1] - e[2][0] for _, e in found.values())
    bar = _progress(total, f"loading {directory.name or directory}", progress)

    def read(name: str, out: torch.Tensor) -> torch.Tensor:
        path, entry = found[name]
        try:
            out.copy_(handles[path].get_tensor(name))
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{path}: reading tensor '{name}' failed ({e})") from None
        bar.update(entry[2][1] - entry[2][0])
        return out

    try:
        return _build(cfg, device, dtype, keep_torch, read)
    except (SafetensorError, OSError, RuntimeError) as e:    # the device's memory, ...
        raise CheckpointError(f"{directory}: reading the weights failed ({e})") from None
    finally:
        handles.clear()
        bar.close()


def _build(cfg: Qwen3Config, device: torch.device, dtype: torch.dtype, keep_torch: bool,
           read, layer_done=None) -> Weights:
    """Weights whose every tensor ``read(hf_name, buffer)`` writes into its device buffer,
    in a fixed order (``layer_done()`` after each layer).

    A failure leaves nothing allocated behind: the arena is referenced only from the frames
    of this call, and an error keeps the frames it passed through (and their locals) alive
    for as long as the error itself is kept (a REPL keeps the last one), so their locals
    are dropped before the error leaves."""
    handled = sys.exc_info()[1]           # the caller's own, if it is handling one
    builder = _Builder(cfg, device, dtype, keep_torch)
    try:
        return _fill(builder, cfg, read, layer_done or (lambda: None))
    except BaseException as e:
        drop_locals(e, handled)
        del builder
        raise


def _fill(b: _Builder, cfg: Qwen3Config, read, layer_done) -> Weights:
    h = cfg.hidden_size
    embed = read("model.embed_tokens.weight", b.empty(cfg.vocab_size, h))
    norm = read("model.norm.weight", b.empty(h))
    head = None if cfg.tie_word_embeddings else read("lm_head.weight",
                                                     b.empty(cfg.vocab_size, h))
    layers = []
    for n in range(cfg.num_hidden_layers):
        layers.append(b.layer(lambda part, buf: read(f"model.layers.{n}.{part}.weight", buf)))
        layer_done()
    return b.weights(embed, head, norm, layers)


def from_tensors(cfg: Qwen3Config, tensors, device: torch.device, dtype: torch.dtype,
                 keep_torch: bool = False) -> Weights:
    """Weights copied from in-memory torch tensors under Hugging Face's names (a
    ``Qwen3ForCausalLM``'s ``state_dict()``, on any device, in any float dtype). Every name
    and shape is checked before anything is allocated (``CheckpointError`` names the
    tensor); the caller's tensors are only read."""
    for name, shape in tensor_names(cfg).items():
        t = tensors.get(name)
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"from_tensors: tensor {name!r} is missing")
        if tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"from_tensors: tensor {name!r} has shape {list(t.shape)}, "
                                  f"the config implies {list(shape)}")
        if not t.dtype.is_floating_point:
            raise CheckpointError(f"from_tensors: tensor {name!r} has dtype {t.dtype}; "
                                  f"weights are floating point")

    def read(name: str, out: torch.Tensor) -> torch.Tensor:
        try:
            return out.copy_(tensors[name])
        except RuntimeError as e:       # a tensor without data (on the meta device), ...
            raise CheckpointError(f"from_tensors: copying tensor {name!r} failed ({e}); pass "
                                  f"tensors that hold their values") from None
    return _build(cfg, device, dtype, keep_torch, read)


def random_weights(cfg: Qwen3Config, device: torch.device, dtype: torch.dtype, seed: int = 0,
                   keep_torch: bool = False, progress: bool = True) -> Weights:
    """Random weights of ``cfg``'s shape, drawn on the device (no host copy).

    Projections are N(0, 1/fan_in), so each keeps its input's scale, and the two that write
    the residual stream (o, down) twice that, so every layer outweighs the token's own
    embedding there (with tied embeddings that term alone would make each token predict
    itself); the embedding is N(0, (2.5/sqrt(hidden))^2), so the logits
    (lm_head times a unit-RMS state) have a standard deviation of about 2.5: peaked enough
    that greedy decoding follows the context, spread enough that sampling varies. Norm
    weights are 1 plus a little noise."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h = cfg.hidden_size
    fan_in = {"self_attn.o_proj": cfg.q_size, "mlp.down_proj": cfg.intermediate_size}

    def draw(name: str, buf: torch.Tensor) -> torch.Tensor:
        if buf.dim() == 1:
            return buf.normal_(1.0, 0.05, generator=gen)
        if not name.startswith("model.layers."):             # the embedding, the lm_head
            return buf.normal_(0.0, 2.5 / h ** 0.5, generator=gen)
        part = name.split(".", 3)[3].removesuffix(".weight")   # model.layers.N.PART.weight
        scale = 2.0 if part in fan_in else 1.0
        return buf.normal_(0.0, scale * fan_in.get(part, h) ** -0.5, generator=gen)

    bar = _progress(cfg.num_hidden_layers, f"random {cfg.name or 'weights'}", progress,
                    unit="layer")
    try:
        return _build(cfg, device, dtype, keep_torch, draw, lambda: bar.update(1))
    finally:
        bar.close()
