"""``DecodeWorkspace``: the split decode attention's partials, and the checks of one."""
from __future__ import annotations

import safetile as st

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from ..tensor.hints import a_type_name
from . import host

# Rows of the group tile: tl.dot needs at least 16 rows.
MIN_GROUP_ROWS = 16
# Keys per block of the decode kernels, and so of a workspace's default split count
# (measurements: benchmarks/TUNING.md, "decode attention defaults"). With programmatic
# dependent launch, on by default where the GPU has it (Hopper and later), the split kernel
# does every read (length, q, K, V) before its wait, and both kernels signal the next at their
# start, so in a chain of attentions the next split streams its cache while this one drains.
# 64-key blocks: a program's two stages then leave room on the SM for the next split's
# program, which a 128-key program does not.
DEFAULT_BLOCK_N = 64


def default_splits(n_kv_heads: int, max_seq: int, block_n: int) -> int:
    """Splits per kv head: about 128 programs in all, one wave on an H100/H200, never more
    than the cache has key blocks: more, shorter programs pay the per-program prologue (device
    length, q, pipeline fill) more often and make the merge read more partials."""
    want = host.next_pow2(max(1, 128 // max(n_kv_heads, 1)))
    return max(1, min(want, -(-max_seq // block_n)))


class DecodeWorkspace:
    """The fp32 partial outputs and log-sum-exps of the split kernel.

    Allocate it once, outside any graph scope, and pass it to every decode step: the ops
    partition views of it, so the same buffers serve each captured step. The buffers hold
    ``group`` rows per (kv head, split); ``rows`` (the padded group) is the split kernel's
    tile height, whose extra rows fall outside the buffer and are never written."""

    def __init__(self, n_kv_heads: int, group: int, head_dim: int, num_splits: int,
                 device=None):
        n_kv_heads, group, head_dim, num_splits = (
            host.check_int(f"DecodeWorkspace: {what}", v, 1) for what, v in zip(
                ("n_kv_heads", "group", "head_dim", "num_splits"),
                (n_kv_heads, group, head_dim, num_splits)))
        self.group, self.num_splits = group, num_splits
        self.rows = group_rows(group)
        self.partial = st.empty((n_kv_heads, num_splits, group, head_dim), dtype=st.f32,
                                device=device)
        self.lse = st.empty((n_kv_heads, num_splits, group, 1), dtype=st.f32, device=device)

    @classmethod
    def for_cache(cls, q, k_cache, num_splits: int | None = None, block_n: int | None = None):
        """A workspace sized for ``q`` (Hq, D) against ``k_cache`` (Hkv, max_seq, D)."""
        if getattr(q, "ndim", None) != 2 or getattr(k_cache, "ndim", None) != 3:
            raise ArgumentError(f"DecodeWorkspace.for_cache: q must be (Hq, D) and k_cache "
                                f"(Hkv, max_seq, D), got {getattr(q, 'shape', q)!r}, "
                                f"{getattr(k_cache, 'shape', k_cache)!r}")
        hkv, max_seq, d = k_cache.shape
        if block_n is not None:
            block_n = host.check_pow2("DecodeWorkspace.for_cache: block_n", block_n, 16,
                                      max(16, MAX_TILE_ELEMENTS // max(d, 1)))
        splits = default_splits(hkv, max_seq, block_n or DEFAULT_BLOCK_N) \
            if num_splits is None else num_splits
        return cls(hkv, q.shape[0] // max(hkv, 1), d, splits, device=q.device)


def check_workspace(name: str, ws, hkv=None, group: int = 0, d: int = 0, splits=None):
    """``ws`` must be a DecodeWorkspace, and (given ``hkv``) one for that cache, group, splits."""
    if not isinstance(ws, DecodeWorkspace):
        raise ArgumentError(f"{name}: workspace must be a DecodeWorkspace (build one with "
                            f"DecodeWorkspace.for_cache(q, k_cache)), got {a_type_name(ws)}")
    # Its fields are plain attributes a caller may have replaced (or, on an object whose
    # __init__ never ran, lack): each is checked, and the launches read the buffers' shapes.
    counts = {field: host.check_int(f"{name}: workspace.{field}", getattr(ws, field, None), 1)
              for field in ("group", "num_splits", "rows")}
    host.check_workspace(name, ws, ("partial", "lse"))
    for field in ("partial", "lse"):
        host.check_dtype(f"{name}: workspace.{field}", getattr(ws, field), st.f32,
                         "build the workspace with DecodeWorkspace.for_cache")
    p = tuple(ws.partial.shape)
    if len(p) != 4 or tuple(ws.lse.shape) != p[:3] + (1,) or \
            p[1:3] != (counts["num_splits"], counts["group"]) or \
            counts["rows"] != group_rows(counts["group"]):
        raise ArgumentError(f"{name}: the workspace's fields disagree (partial {p}, lse "
                            f"{ws.lse.shape}, group {ws.group}, rows {ws.rows}, num_splits "
                            f"{ws.num_splits}); build it with DecodeWorkspace.for_cache")
    if hkv is not None and (p != (hkv, splits or p[1], group, d)):
        raise ArgumentError(f"{name}: the workspace {p} does not fit {hkv * group} q heads, "
                            f"{hkv} kv heads of {d} in {splits or p[1]} splits: build "
                            f"it with DecodeWorkspace.for_cache, or omit num_splits")


def keys_per_block(name: str, block_n, d: int) -> int:
    """``block_n`` (``None``: ``DEFAULT_BLOCK_N``) as the keys per block of a kernel that
    loads (block_n, d) tiles of the cache: a power of two from 16 (the tensor cores' least K
    of P @ V) whose tile holds at most ``MAX_TILE_ELEMENTS``."""
    if block_n is None:
        return DEFAULT_BLOCK_N
    return host.check_pow2(f"{name}: block_n", block_n, 16, max(16, MAX_TILE_ELEMENTS // d))


def group_rows(group: int) -> int:
    """The split kernel's tile height for ``group`` q heads per kv head (tl.dot's least M)."""
    return max(MIN_GROUP_ROWS, host.next_pow2(group))
