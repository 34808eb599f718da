"""KV-cache appends at a device-resident position.

Layout: the caches are (Hkv, max_seq, D); the position ``pos`` is a device int32 tensor of shape
(1,), so a captured decode graph appends each step's token where the device says, with no
host round trip.

- ``kv_append`` (one token, decode): ``k_new``, ``v_new`` are (Hkv, D). Program (h, b) owns
  block ``b`` of kv head ``h``'s rows of each cache (a (1, block_s, D) tile; by default the
  whole cache rounded up to a power of two, or as many rows as a tile holds) and the program
  whose block holds ``pos`` writes that one row through a sub-partition of its block: a store
  at a data-dependent sub-index, which can never leave the block (bounds are enforced: out of
  the block it is masked off on the GPU and an error on the CPU executor). The first and last
  blocks also take a position before or past the cache, so such a position reaches that
  check. The last block may reach past the cache (its rows rounded up to whole blocks): a
  position between the cache's end and the block's writes nothing, on both backends, as
  every store past a tensor's edge does. Only the new row's bytes are written.
- ``kv_append_many`` (S tokens, prefill): ``k_new``, ``v_new`` are (Hkv, S, D), written at
  positions ``pos .. pos+S-1``. Program (h, b) owns a (1, BLOCK_S, D) block of the cache.
  Blocks the new rows do not touch do nothing; blocks wholly inside store the new rows
  (gathered at an element offset, since ``pos`` need not be block-aligned); the at most two
  blocks at the ends keep their old rows outside the range (a read of the owned block, then a
  store, ordered by the token chain). Rows that would land before or past the cache (a
  negative ``pos``, or one near the end) are dropped: the position is a device value, so it
  cannot be refused.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from . import host


@st.kernel
def kv_append_kernel(k_new: st.In[st.floats, 2], v_new: st.In[st.floats, 2],
                     pos: st.In[st.i32, 1], k_cache: st.Out[st.floats, 3],
                     v_cache: st.Out[st.floats, 3], max_seq: int):
    """k_cache[h, pos] = k_new[h]; v_cache[h, pos] = v_new[h] (program (h, b): block b of
    head h's rows, storing when the block holds pos)."""
    h, b, _ = k_cache.index
    p = pos.load_scalar((0,))
    lo = b * k_cache.shape[1]
    hi = lo + k_cache.shape[1]
    if ((p >= lo) | (b == 0)) & ((p < hi) | (hi >= max_seq)):
        k_rows = k_cache.partition((1, 1, k_cache.shape[2]))
        v_rows = v_cache.partition((1, 1, v_cache.shape[2]))
        k_rows.store(sl.reshape(k_new.load((h, 0), (1, k_cache.shape[2])),
                                (1, 1, k_cache.shape[2])), (0, p - lo, 0))
        v_rows.store(sl.reshape(v_new.load((h, 0), (1, v_cache.shape[2])),
                                (1, 1, v_cache.shape[2])), (0, p - lo, 0))


@st.kernel
def kv_append_many_kernel(k_new: st.In[st.floats, 3], v_new: st.In[st.floats, 3],
                          pos: st.In[st.i32, 1], k_cache: st.Out[st.floats, 3],
                          v_cache: st.Out[st.floats, 3]):
    """k_cache[h, pos + i] = k_new[h, i] for i < S (likewise v), one cache block per program."""
    h, b, _ = k_cache.index
    p = pos.load_scalar((0,))
    n = k_new.shape[1]
    lo = b * k_cache.shape[1]
    hi = lo + k_cache.shape[1]
    if (lo < p + n) & (hi > p):
        kt = k_new.load_at((h, lo - p, 0), (1, k_cache.shape[1], k_cache.shape[2]))
        vt = v_new.load_at((h, lo - p, 0), (1, k_cache.shape[1], k_cache.shape[2]))
        if (lo >= p) & (hi <= p + n):
            k_cache.store(kt)
            v_cache.store(vt)
        else:
            rows = lo + sl.arange(k_cache.shape[1])
            inside = ((rows >= p) & (rows < p + n))[None, :, None]
            k_cache.store(sl.where(inside, kt, k_cache.load()))
            v_cache.store(sl.where(inside, vt, v_cache.load()))


def _check(name: str, k_new, v_new, pos, k_cache, v_cache, rank: int) -> None:
    for what, x in (("k_new", k_new), ("v_new", v_new), ("pos", pos)):
        host.check_value(f"{name}: {what}", x)
    host.check_target(f"{name}: k_cache", k_cache)
    host.check_target(f"{name}: v_cache", v_cache)
    host.same_dtype(name, k_new, v_new, k_cache, v_cache)
    host.check_dtype(f"{name}: k_new", k_new, st.floats)
    host.check_device_int(f"{name}: pos", pos)
    if k_cache.ndim != 3 or tuple(k_cache.shape) != tuple(v_cache.shape) or not k_cache.shape[1]:
        raise ArgumentError(f"{name}: caches must both be (Hkv, max_seq, D) with max_seq >= 1, "
                            f"got {k_cache.shape} and {v_cache.shape}")
    hkv, _, d = k_cache.shape
    if k_new.ndim != rank or tuple(k_new.shape) != tuple(v_new.shape) or \
            k_new.shape[0] != hkv or k_new.shape[-1] != d:
        want = "(Hkv, D)" if rank == 2 else "(Hkv, S, D)"
        raise ArgumentError(f"{name}: new rows must both be {want} = {(hkv, d)} heads and dims, "
                         f"got {k_new.shape} and {v_new.shape}")
    if d < 1 or d & (d - 1) or d > MAX_TILE_ELEMENTS:
        raise ArgumentError(f"{name}: head_dim {d} must be a power of two up to "
                            f"{MAX_TILE_ELEMENTS} (a program owns whole cache rows)")


def max_cache_positions(head_dim: int) -> int:
    """The most cache positions one append program owns at ``head_dim``: a tile holds at
    most ``MAX_TILE_ELEMENTS`` elements. Longer caches are split into blocks of this many
    rows (``kv_append``), and ``qk_norm_rope_kv_append`` runs as two kernels for them."""
    head_dim = host.check_int("ops.max_cache_positions: head_dim", head_dim, 1)
    return MAX_TILE_ELEMENTS // host.next_pow2(head_dim)


def append_block(name: str, max_seq: int, head_dim: int, block_s: int | None) -> int:
    """The rows one append program owns: ``block_s`` (a power of two, at most
    ``max_cache_positions(head_dim)``), else the whole cache rounded up to a power of two, or
    ``max_cache_positions(head_dim)`` rows where that is fewer."""
    limit = max_cache_positions(head_dim)
    if block_s is None:
        return min(host.next_pow2(max_seq), limit)
    return host.check_pow2(f"{name}: block_s", block_s, 1, limit)


@host.naming_overlaps("k_cache", "v_cache")
def kv_append(k_new, v_new, pos, k_cache, v_cache, *, block_s: int | None = None,
              pdl: bool | None = None, trigger_early: bool = False):
    """Write one token's ``k_new``, ``v_new`` (Hkv, D) at row ``pos[0]`` of the caches.

    ``block_s``: cache rows one program owns (default: :func:`append_block`). ``pdl``
    (default: on Hopper and later): programmatic dependent launch, every load after the
    wait; ``trigger_early`` (with ``pdl``): the next kernel may be scheduled as soon as this
    one's programs start. Returns a ``DeviceOp`` whose output is ``(k_cache, v_cache)``.

    A position outside the cache writes nothing. On the CPU executor a position outside the
    owned blocks, negative or at or past the cache's rows rounded up to whole blocks,
    raises ``OutOfBoundsError``; one between the cache's end and the last block's end
    writes nothing there too."""
    _check("ops.kv_append", k_new, v_new, pos, k_cache, v_cache, 2)
    hkv, max_seq, d = k_cache.shape
    block = (1, append_block("ops.kv_append", max_seq, d, block_s), d)
    pdl, trigger_early = host.pdl_flags("ops.kv_append", pdl, trigger_early)
    op = kv_append_kernel.options(pdl=pdl, trigger_early=pdl and trigger_early)(
        *host.inputs(k_new, v_new, pos),
        host.owned_view(k_cache, tuple(k_cache.shape)).partition(block),
        host.owned_view(v_cache, tuple(v_cache.shape)).partition(block), max_seq)
    return host.returning(op, (k_cache, v_cache))


@host.naming_overlaps("k_cache", "v_cache")
def kv_append_many(k_new, v_new, pos, k_cache, v_cache, *, block_s: int = 64):
    """Write ``k_new``, ``v_new`` (Hkv, S, D) at rows ``pos[0] .. pos[0]+S-1`` of the caches.

    Rows that fall outside the cache are dropped: past its end, or before its start when
    ``pos[0]`` is negative (the position is a device value, so it cannot be refused).
    ``block_s``: cache rows one program owns (a power of two). Returns a ``DeviceOp`` whose
    output is ``(k_cache, v_cache)``."""
    _check("ops.kv_append_many", k_new, v_new, pos, k_cache, v_cache, 3)
    hkv, max_seq, d = k_cache.shape
    tile = (1, append_block("ops.kv_append_many", max_seq, d, block_s), d)
    op = kv_append_many_kernel(*host.inputs(k_new, v_new, pos),
                               host.owned_view(k_cache, tuple(k_cache.shape)).partition(tile),
                               host.owned_view(v_cache, tuple(v_cache.shape)).partition(tile))
    return host.returning(op, (k_cache, v_cache))
