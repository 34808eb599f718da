"""A checkpoint directory's safetensors files, checked against the config before anything is
allocated.

:func:`plan` reads every file's header (single file, or sharded through
model.safetensors.index.json) and checks what grout needs (each tensor present, of a dtype
grout reads, of the shape config.json implies) and what the safetensors format itself
requires of a file: the tensors' bytes cover the data section after the header exactly,
with no bytes left over, no gap between two tensors and no two tensors overlapping (the
``safetensors`` reader refuses any other file). :func:`open_files` then opens each file with
that reader, which checks the header once more. Both raise ``CheckpointError`` naming the
file and the tensor or byte range, so a bad checkpoint fails before a weight is allocated.
"""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import torch

from .config import Qwen3Config
from .errors import CheckpointError

# The tensor dtypes grout reads, each converted to the compute dtype as it is copied.
SAFETENSORS_DTYPES = {"BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2),
                      "F32": (torch.float32, 4), "F64": (torch.float64, 8)}
MAX_HEADER = 100_000_000
REPAIR = "re-download the checkpoint or save it again with safetensors"


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


def _offset(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
        if not (_offset(b) and _offset(e) and b <= e):
            raise CheckpointError(f"{path}: tensor {name!r}: data offsets {[b, e]!r:.60} are "
                                  f"not a byte range")
        shape = tuple(shape)
        if dtype in SAFETENSORS_DTYPES and e - b != math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]:
            raise CheckpointError(f"{path}: tensor {name!r}: data offsets {[b, e]} do not hold "
                                  f"{dtype} {list(shape)}")
        out[name] = (dtype, shape, (8 + n + b, 8 + n + e))
    _check_coverage(path, out, 8 + n, size)
    return out


def _check_coverage(path: Path, table: dict, start: int, size: int) -> None:
    """``CheckpointError`` unless the tensors' byte ranges tile the data section, bytes
    [start, size) of the file, exactly: in offset order each begins where the one before
    it ends (the first at ``start``), and the last ends with the file."""
    end, last = start, None
    for name, (_, _, (b, e)) in sorted(table.items(), key=lambda item: item[1][2]):
        if e > size:
            raise CheckpointError(f"{path}: truncated: tensor {name!r} ends at byte {e}, the "
                                  f"file has {size}; {REPAIR}")
        after = "the header" if last is None else f"tensor {last[0]!r}"
        if b > end:
            raise CheckpointError(f"{path}: corrupt: bytes [{end}, {b}) lie between {after} "
                                  f"and tensor {name!r} and belong to no tensor; {REPAIR}")
        if b < end:
            raise CheckpointError(f"{path}: corrupt: tensor {name!r} (bytes [{b}, {e})) "
                                  f"overlaps {after} (bytes [{last[1]}, {end})); {REPAIR}")
        end, last = e, (name, b)
    if end < size:
        after = "the header" if last is None else f"the last tensor, {last[0]!r}"
        raise CheckpointError(f"{path}: corrupt: {size - end} stray bytes [{end}, {size}) "
                              f"follow {after}; {REPAIR}")


def checkpoint_files(directory: Path) -> dict:
    """Tensor name -> safetensors file, from model.safetensors.index.json or the one file."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = {name: Path(file) for name, file in weight_map.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise CheckpointError(f"{index}: corrupt index ({e!r})") from None
        for name, file in files.items():
            if file.is_absolute() or ".." in file.parts or "\0" in str(file):
                raise CheckpointError(f"{index}: weight_map names {str(file)!r} for {name!r}: "
                                      f"a shard is named by a path inside the checkpoint "
                                      f"folder, without '..', absolute parts or NUL bytes")
        return {name: directory / file for name, file in files.items()}
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


def open_files(found: dict) -> dict:
    """File -> an open ``safetensors`` reader, for every file :func:`plan` found tensors in.
    Opening parses and validates the header, so whatever else the reader refuses is a
    ``CheckpointError`` here too, before anything is allocated."""
    from safetensors import SafetensorError, safe_open
    handles = {}
    for path in dict.fromkeys(path for path, _ in found.values()):
        try:
            handles[path] = safe_open(str(path), framework="pt", device="cpu")
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: the safetensors reader refuses the file ({e}); "
                                  f"{REPAIR}") from None
    return handles
