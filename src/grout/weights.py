"""Weights on the device: read from safetensors (single or sharded) or built at random.

Every weight becomes a read-only ``st.Shared`` value once, on the device. The decode step's
projections are fused at load time into one matrix each (q|k|v rows, gate|up rows), so a
layer streams three weights instead of five per token; the separate q, k and v matrices
that prefill multiplies by are row ranges of the fused one, shared again (read-only views of
one storage may overlap). A checkpoint is checked completely (headers, names, shapes,
sizes) before anything is allocated, so a bad one raises ``CheckpointError`` with nothing
left behind.

``Linear.t`` keeps a torch alias of a projection's storage only for ``gemm="cublas"``, the
torch.matmul comparison path: a Shared value is never written while shared, so torch may
read it at any time.
"""
from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import safetile as st

from .config import Qwen3Config
from .errors import CheckpointError

SAFETENSORS_DTYPES = {"BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
                      "F32": (torch.float32, 4)}
MAX_HEADER = 100 << 20


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


def tensor_names(cfg: Qwen3Config) -> dict:
    """Hugging Face's tensor name -> expected shape, for every weight grout reads."""
    h, i, q, kv, d = (cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size,
                      cfg.head_dim)
    names = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = (cfg.vocab_size, h)
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        names.update({
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i)})
    return names


def read_header(path: Path) -> dict:
    """The tensor table of a safetensors file, checked against the file's size: name ->
    (dtype, shape, (begin, end)) with offsets into the file. ``CheckpointError`` names the
    file (and the tensor) for a truncated or corrupt file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: truncated ({size} bytes; not a safetensors file)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: corrupt or truncated (header of {n} bytes in a "
                                      f"file of {size})")
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        table = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as e:     # ValueError: decoding, digits
        raise CheckpointError(f"{path}: corrupt safetensors header ({e!s:.200})") from None
    if not isinstance(table, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    table.pop("__metadata__", None)
    out = {}
    for name, info in table.items():
        try:
            dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has a corrupt header entry") from None
        if not isinstance(dtype, str) or not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise CheckpointError(f"{path}: tensor {name!r} has a corrupt header entry (dtype "
                                  f"{dtype!r:.40}, shape {shape!r:.60})")
        shape = tuple(shape)
        if dtype not in SAFETENSORS_DTYPES:
            out[name] = (dtype, shape, (8 + n + b, 8 + n + e))
            continue
        want = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e and e - b == want):
            raise CheckpointError(f"{path}: tensor {name!r}: data offsets {[b, e]} do not hold "
                                  f"{dtype} {list(shape)}")
        if 8 + n + e > size:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} ends at byte {8 + n + e}, "
                                  f"the file has {size}")
        out[name] = (dtype, shape, (8 + n + b, 8 + n + e))
    return out


def checkpoint_files(directory: Path) -> dict:
    """Tensor name -> safetensors file, from model.safetensors.index.json or the one file."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return {name: directory / file for name, file in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise CheckpointError(f"{index}: corrupt index ({e!r})") from None
    single = directory / "model.safetensors"
    if single.is_file():
        return {name: single for name in read_header(single)}
    raise CheckpointError(f"{directory}: no model.safetensors or model.safetensors.index.json")


def plan(directory: Path, cfg: Qwen3Config) -> dict:
    """Check the checkpoint against the config: name -> (file, header entry) for each tensor
    grout needs, every header and shape verified. Allocates nothing."""
    where = checkpoint_files(directory)
    headers: dict = {}
    found = {}
    for name, shape in tensor_names(cfg).items():
        path = where.get(name)
        if path is None:
            raise CheckpointError(f"{directory}: tensor {name!r} is missing from the checkpoint")
        if path not in headers:
            if not path.is_file():
                raise CheckpointError(f"{path}: missing (listed for {name!r})")
            headers[path] = read_header(path)
        entry = headers[path].get(name)
        if entry is None:
            raise CheckpointError(f"{path}: tensor {name!r} is missing (the index lists it "
                                  f"there)")
        if entry[0] not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {entry[0]}; grout reads "
                                  f"{', '.join(SAFETENSORS_DTYPES)}")
        if tuple(entry[1]) != tuple(shape):
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(entry[1])}, "
                                  f"config.json implies {list(shape)}")
        found[name] = (path, entry)
    return found


def _progress(total: int, desc: str, enabled: bool, unit: str = "B"):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=sys.stderr,
                disable=not enabled, leave=False, dynamic_ncols=True)


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
    from safetensors import SafetensorError, safe_open

    found = plan(directory, cfg)
    total = sum(e[2][1] - e[2][0] for _, e in found.values())
    handles: dict = {}
    bar = _progress(total, f"loading {directory.name or directory}", progress)

    def read(name: str, out: torch.Tensor) -> torch.Tensor:
        path, entry = found[name]
        try:
            if path not in handles:
                handles[path] = safe_open(str(path), framework="pt", device="cpu")
            out.copy_(handles[path].get_tensor(name))
        except (SafetensorError, OSError, RuntimeError) as e:
            e.__traceback__ = None
            raise CheckpointError(f"{path}: reading tensor '{name}' failed ({e})") from None
        bar.update(entry[2][1] - entry[2][0])
        return out

    try:
        return _build(cfg, device, dtype, keep_torch, read)
    except (SafetensorError, OSError, RuntimeError) as e:
        e.__traceback__ = None
        raise CheckpointError(f"{directory}: reading the weights failed ({e})") from None
    finally:
        handles.clear()
        bar.close()


def _build(cfg: Qwen3Config, device: torch.device, dtype: torch.dtype, keep_torch: bool,
           read) -> Weights:
    """Weights whose every tensor ``read(hf_name, buffer)`` copies into its device buffer."""
    b = _Builder(cfg, device, dtype, keep_torch)
    h = cfg.hidden_size
    embed = read("model.embed_tokens.weight", b.empty(cfg.vocab_size, h))
    norm = read("model.norm.weight", b.empty(h))
    head = None if cfg.tie_word_embeddings else read("lm_head.weight",
                                                     b.empty(cfg.vocab_size, h))
    layers = [b.layer(lambda part, buf, n=n: read(f"model.layers.{n}.{part}.weight", buf))
              for n in range(cfg.num_hidden_layers)]
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
        return out.copy_(tensors[name])
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

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> torch.Tensor:
        return t.normal_(mean, std, generator=gen)

    b = _Builder(cfg, device, dtype, keep_torch)
    h = cfg.hidden_size
    fan_in = {"self_attn.o_proj": cfg.q_size, "mlp.down_proj": cfg.intermediate_size}

    def fill(part: str, buf: torch.Tensor) -> None:
        if buf.dim() == 1:
            normal(buf, 0.05, 1.0)
        else:
            normal(buf, (2.0 if part in fan_in else 1.0) * fan_in.get(part, h) ** -0.5)

    bar = _progress(cfg.num_hidden_layers, f"random {cfg.name or 'weights'}", progress,
                    unit="layer")
    try:
        embed = normal(b.empty(cfg.vocab_size, h), 2.5 / h ** 0.5)
        norm = normal(b.empty(h), 0.05, 1.0)
        head = None if cfg.tie_word_embeddings else normal(b.empty(cfg.vocab_size, h),
                                                           2.5 / h ** 0.5)
        layers = []
        for _ in range(cfg.num_hidden_layers):
            layers.append(b.layer(fill))
            bar.update(1)
        return b.weights(embed, head, norm, layers)
    finally:
        bar.close()
