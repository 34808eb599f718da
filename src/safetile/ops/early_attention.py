"""Decode's attention prologue and one-split attention in one kernel that reads the cache
before the append: its cache loads go before the programmatic-launch wait.

Program ``h`` takes kv head ``h`` and its group of ``G = Hq / Hkv`` q heads. Before its PDL
wait it loads the first ``BLOCKS`` key blocks of kv head ``h``'s rows of both caches (K in
two halves, V whole; with ``TRIM``, a block past the new position reads nothing), the
position, the norm weights and the RoPE table. After the wait it loads the group's q rows
and kv head ``h``'s k and v rows of the token's qkv projection, applies q/k RMSNorm and RoPE
as ``ops.qk_norm_rope_kv_append`` does (same operations, same rounding: the rotated k is in
the cache dtype, as the append stores it), and attends the group over rows ``0..pos`` as
``ops.decode_attention``'s one-split kernel does (every key block masked to the first
``pos + 1`` rows, one online softmax). Row ``pos`` of a block is taken from registers (the
rotated k, the v row), not from the cache, which still holds the previous step's bytes
there; blocks past the early ones, for a position beyond them, are loaded after the wait.
The program writes its group's output rows and the rotated k row of head ``h`` to
``k_out`` (Hkv, D); ``ops.kv_append(k_out, v rows, pos, ...)`` then writes row ``pos`` of
both caches. Together the two compute what ``ops.qk_norm_rope_kv_append`` followed by
``ops.decode_attention(..., length_offset=1, num_splits=1)`` computes.

Safety: the caches are ``In`` parameters (shared, read-only) and the only ``Out``s are the
output rows of the group (a (1, GP, D) tile of the output viewed as (Hkv, G, D); padding
rows past G are masked at the store) and the (1, 1, D) row of ``k_out``, so no two programs
write one element and nothing is written that is read. The cache loads before the wait are
those of ``early`` Ins: at each launch the launcher checks that no launch that may still
run writes the caches, the position, the weights or the table, and otherwise launches in
plain stream order (the append comes after this kernel, so in grout's step none does).

The scores are the rotated halves' two products, ``q1 @ k1.T + q2 @ k2.T`` (as
``ops.qk_norm_rope_append_attention``): they equal ``q @ k.T`` up to fp32 summation order.
The query tile has ``max(16, G)`` rows (``tl.dot`` needs 16); rows past the group read the
next heads' rows of qkv (finite values) and fall outside the output.
"""
from __future__ import annotations

import math

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host
from .decode_attention import masked_step, valid_length
from .decode_workspace import MIN_GROUP_ROWS, keys_per_block
from .flash_attention import LOG2E
from .prologue_attention import MIN_HEAD_DIM
from .qk_rope_append import check_prologue, normed_half, row_scales

# Key blocks the kernel loads before its wait, written out one by one (a tile program holds
# no list of tiles): each costs registers for its K and V until the wait.
MAX_EARLY_BLOCKS = 4
# Positions covered before the wait by default: a short context of 4 blocks of 64 keys.
DEFAULT_EARLY_POSITIONS = 256
# Whether a key block past the new position skips its load (its rows are masked anyway).
DEFAULT_TRIM = True
# Warps: the early blocks' K and V (128 KB at 256 positions of head_dim 128 in bf16) stay in
# registers until the wait, so the warp count is the one whose sm_90 compile holds them
# without spilling (fewer warps have too few registers, more leave each thread too few).
DEFAULT_WARPS = 8
# Pipeline depth of the loop over key blocks past the early ones (after the wait): 1, no
# shared-memory buffers, since that loop only serves positions past the early blocks.
DEFAULT_STAGES = 1
# Loaded before the wait: inputs no kernel of a decode step writes while this one may run
# (the append of this step's row comes after it); the launcher checks it at each launch.
EARLY = ("k_cache", "v_cache", "pos", "q_weight", "k_weight", "inv_freq")


@st.function
def block_start(j, block_n, n, rows, trim):
    """The first cache row key block ``j`` loads: ``j * block_n``, or with ``trim`` a block
    that starts at or past ``n`` loads from ``rows`` (past the cache: nothing is read)."""
    start = j * block_n
    if trim:
        start = sl.where(start < n, start, rows)
    return start


@st.function
def attend_block(q1, q2, ka, kb, vt, rows, p, n, k1, k2, v_new, qk_scale, m_i, l_i, acc):
    """One masked online-softmax step over key block ``ka | kb`` (K's halves), ``vt``, whose
    rows are ``rows``: the row at ``p`` replaced by the new ``k1 | k2``, ``v_new``, rows from
    ``n`` (``p + 1`` clamped to the cache) on masked off."""
    new = (rows == p)[:, None]
    ka = sl.where(new, k1, ka)
    kb = sl.where(new, k2, kb)
    vt = sl.where(new, v_new, vt)
    scores = (sl.matmul(q1, ka.T) + sl.matmul(q2, kb.T)) * qk_scale
    return masked_step(scores, vt, rows < n, m_i, l_i, acc)


@st.kernel
def early_attention_kernel(k_cache: st.In[st.floats, 3], v_cache: st.In[st.floats, 3],
                           pos: st.In[st.i32, 1], q_weight: st.In[st.floats, 1],
                           k_weight: st.In[st.floats, 1], inv_freq: st.In[st.f32, 1],
                           qkv: st.In[st.floats, 2], o: st.Out[st.floats, 3],
                           k_out: st.Out[st.floats, 3], eps: float, qk_scale: float,
                           GROUP: st.Const[int], Q_HEADS: st.Const[int],
                           KV_HEADS: st.Const[int], BLOCK_N: st.Const[int],
                           BLOCKS: st.Const[int], TRIM: st.Const[bool]):
    """o[h] = attention of rope(norm(q rows of group h)) over k_cache[h, :pos] plus the new
    row rope(norm(k row h)), v row h; k_out[h] = rope(norm(k row h))."""
    h, _, _ = o.index
    D = o.shape[2]
    HALF = o.shape[2] // 2
    GP = o.shape[1]
    # Before the wait (early Ins only): the position, key blocks 0..BLOCKS-1, the weights.
    p = pos.load_scalar((0,))
    # The rows attended: a position past the cache attends the whole cache (its row is not
    # appended), one below 0 attends nothing, as ops.decode_attention.
    n = valid_length(p, 1, k_cache.shape[1])
    r0 = block_start(0, BLOCK_N, n, k_cache.shape[1], TRIM)
    ka0 = sl.reshape(k_cache.load_at((h, r0, 0), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
    kb0 = sl.reshape(k_cache.load_at((h, r0, HALF), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
    v0 = sl.reshape(v_cache.load_at((h, r0, 0), (1, BLOCK_N, D)), (BLOCK_N, D))
    if BLOCKS > 1:
        r1 = block_start(1, BLOCK_N, n, k_cache.shape[1], TRIM)
        ka1 = sl.reshape(k_cache.load_at((h, r1, 0), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        kb1 = sl.reshape(k_cache.load_at((h, r1, HALF), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        v1 = sl.reshape(v_cache.load_at((h, r1, 0), (1, BLOCK_N, D)), (BLOCK_N, D))
    if BLOCKS > 2:
        r2 = block_start(2, BLOCK_N, n, k_cache.shape[1], TRIM)
        ka2 = sl.reshape(k_cache.load_at((h, r2, 0), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        kb2 = sl.reshape(k_cache.load_at((h, r2, HALF), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        v2 = sl.reshape(v_cache.load_at((h, r2, 0), (1, BLOCK_N, D)), (BLOCK_N, D))
    if BLOCKS > 3:
        r3 = block_start(3, BLOCK_N, n, k_cache.shape[1], TRIM)
        ka3 = sl.reshape(k_cache.load_at((h, r3, 0), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        kb3 = sl.reshape(k_cache.load_at((h, r3, HALF), (1, BLOCK_N, HALF)), (BLOCK_N, HALF))
        v3 = sl.reshape(v_cache.load_at((h, r3, 0), (1, BLOCK_N, D)), (BLOCK_N, D))
    qw1 = q_weight.load((0,), (HALF,))
    qw2 = q_weight.load((1,), (HALF,))
    kw1 = k_weight.load((0,), (HALF,))
    kw2 = k_weight.load((1,), (HALF,))
    angle = pos.load((0,), (1,)).astype(st.f32)[:, None] * inv_freq.load((0,), (HALF,))[None, :]
    # After the wait: what the projection just wrote. q rows past the group read the next
    # heads' rows (finite, never stored).
    q0 = h * GROUP
    rq = row_scales(qkv.load_at((q0, 0), (GP, D)), D, eps)
    q1 = normed_half(qkv.load_at((q0, 0), (GP, HALF)), qw1, rq)
    q2 = normed_half(qkv.load_at((q0, HALF), (GP, HALF)), qw2, rq)
    kr = Q_HEADS + h
    rk = row_scales(qkv.load_at((kr, 0), (1, D)), D, eps)
    k1 = normed_half(qkv.load_at((kr, 0), (1, HALF)), kw1, rk)
    k2 = normed_half(qkv.load_at((kr, HALF), (1, HALF)), kw2, rk)
    v_new = qkv.load_at((Q_HEADS + KV_HEADS + h, 0), (1, D))
    c = sl.cos(angle).astype(q1.dtype)                 # HF rounds cos/sin to q's dtype
    s = sl.sin(angle).astype(q1.dtype)
    q_rot1 = q1 * c - q2 * s
    q_rot2 = q2 * c + q1 * s
    k_rot1 = k1 * c - k2 * s
    k_rot2 = k2 * c + k1 * s
    m_i = sl.full((GP,), float("-inf"), st.f32)
    l_i = sl.zeros((GP,), st.f32)
    acc = sl.zeros((GP, D), st.f32)
    keys = sl.arange(BLOCK_N)
    m_i, l_i, acc = attend_block(q_rot1, q_rot2, ka0, kb0, v0, keys, p, n, k_rot1, k_rot2,
                                 v_new, qk_scale, m_i, l_i, acc)
    if BLOCKS > 1:
        m_i, l_i, acc = attend_block(q_rot1, q_rot2, ka1, kb1, v1, BLOCK_N + keys, p, n,
                                     k_rot1, k_rot2, v_new, qk_scale, m_i, l_i, acc)
    if BLOCKS > 2:
        m_i, l_i, acc = attend_block(q_rot1, q_rot2, ka2, kb2, v2, 2 * BLOCK_N + keys, p, n,
                                     k_rot1, k_rot2, v_new, qk_scale, m_i, l_i, acc)
    if BLOCKS > 3:
        m_i, l_i, acc = attend_block(q_rot1, q_rot2, ka3, kb3, v3, 3 * BLOCK_N + keys, p, n,
                                     k_rot1, k_rot2, v_new, qk_scale, m_i, l_i, acc)
    # A position past the early blocks: the rest of its rows, after the wait.
    for j in range(BLOCKS, sl.cdiv(n, BLOCK_N)):
        ka = sl.reshape(k_cache.load_at((h, j * BLOCK_N, 0), (1, BLOCK_N, HALF)),
                        (BLOCK_N, HALF))
        kb = sl.reshape(k_cache.load_at((h, j * BLOCK_N, HALF), (1, BLOCK_N, HALF)),
                        (BLOCK_N, HALF))
        vt = sl.reshape(v_cache.load_at((h, j * BLOCK_N, 0), (1, BLOCK_N, D)), (BLOCK_N, D))
        m_i, l_i, acc = attend_block(q_rot1, q_rot2, ka, kb, vt, j * BLOCK_N + keys, p, n,
                                     k_rot1, k_rot2, v_new, qk_scale, m_i, l_i, acc)
    # No row attended (a position below 0): zeros, not the 0 / 0 of an empty softmax.
    o.store(sl.reshape(sl.where(n > 0, acc / l_i[:, None], 0.0), (1, GP, D)))
    k_halves = k_out.partition((1, 1, HALF))
    k_halves.store(sl.reshape(k_rot1, (1, 1, HALF)), (0, 0, 0))
    k_halves.store(sl.reshape(k_rot2, (1, 1, HALF)), (0, 0, 1))


def early_attention_fits(head_dim: int) -> bool:
    """Whether ``qk_norm_rope_attention`` takes heads of ``head_dim``: each half of a head
    must feed the tensor cores."""
    return host.check_int("ops.early_attention_fits: head_dim", head_dim, 1) >= MIN_HEAD_DIM


def early_blocks(block_n: int, early_positions: int, max_seq: int) -> int:
    """Key blocks loaded before the wait: those of ``early_positions`` rows, no more than the
    cache has."""
    return max(1, -(-min(early_positions, max_seq) // block_n))


def _kernel(num_warps: int, num_stages: int, pdl: bool, trigger_early: bool):
    """The kernel with these launch options (``Kernel.options`` keeps one copy per set)."""
    return early_attention_kernel.options(
        num_warps=num_warps, num_stages=num_stages, pdl=pdl, early=EARLY if pdl else (),
        trigger_early=pdl and trigger_early)


@host.naming_overlaps("out", "k_out")
def qk_norm_rope_attention(qkv, q_norm_weight, k_norm_weight, pos, inv_freq, k_cache,
                           v_cache, eps: float = 1e-6, out=None, k_out=None, *,
                           scale: float | None = None, block_n: int | None = None,
                           early_positions: int = DEFAULT_EARLY_POSITIONS,
                           trim: bool = DEFAULT_TRIM, num_warps: int = DEFAULT_WARPS,
                           num_stages: int = DEFAULT_STAGES, pdl: bool | None = None,
                           trigger_early: bool = False) -> st.DeviceOp:
    """One decode token's attention from its qkv projection, reading the cache before the
    append: q/k RMSNorm and RoPE at ``pos[0]``, then the attention of the q heads over
    cache rows ``0..pos-1`` and the new row (the rotated k, the v row) at ``pos``; the
    rotated k rows go to ``k_out`` for ``ops.kv_append(k_out, v, pos, k_cache, v_cache)``,
    which stores row ``pos`` afterwards. The pair computes what ``ops.qk_norm_rope_kv_append``
    followed by ``ops.decode_attention(q, k_cache, v_cache, pos, length_offset=1,
    num_splits=1)`` computes.

    Arguments as in ``qk_norm_rope_kv_append``; the caches (Hkv, max_seq, D) are only read,
    and head_dim is at least ``MIN_HEAD_DIM``. ``out``: (Hq, D), ``k_out``: (Hkv, D), in
    qkv's dtype (allocated when not given); ``scale`` defaults to ``1/sqrt(D)``;
    ``block_n`` (``DEFAULT_BLOCK_N``): keys per block; ``early_positions``: the cache rows
    loaded before the programmatic-launch wait, in whole blocks (at most
    ``MAX_EARLY_BLOCKS``), rows past them in a loop of ``num_stages`` stages after it;
    ``trim``: skip the loads of early blocks past the position; ``pdl`` (default: on Hopper
    and later): programmatic dependent launch, the caches, position, weights and table read
    before the wait; ``trigger_early``: the next kernel may be scheduled as soon as this
    one's programs start. Returns a ``DeviceOp`` whose output is ``(out, k_out)``. A
    position past the cache attends the whole cache (as ``ops.decode_attention``), one below
    0 attends nothing and gives zeros; ``ops.kv_append`` then writes no row (see its
    docstring for the CPU executor's checks)."""
    name = "ops.qk_norm_rope_attention"
    hq, hkv, max_seq, d, rows = check_prologue(name, qkv, q_norm_weight, k_norm_weight, pos,
                                               inv_freq, k_cache, v_cache, writes_caches=False)
    if not early_attention_fits(d):
        raise ArgumentError(f"{name}: head_dim {d} is below {MIN_HEAD_DIM} (each half of a "
                            f"head feeds the tensor cores); use ops.qk_norm_rope_kv_append, "
                            f"then ops.decode_attention")
    block_n = keys_per_block(name, block_n, d)
    early_positions = host.check_int(f"{name}: early_positions", early_positions, lo=1)
    blocks = early_blocks(block_n, early_positions, max_seq)
    if blocks > MAX_EARLY_BLOCKS:
        raise ArgumentError(f"{name}: early_positions={early_positions} is "
                            f"{-(-early_positions // block_n)} blocks of {block_n} keys; at "
                            f"most {MAX_EARLY_BLOCKS} are loaded before the wait")
    num_warps, num_stages = host.check_counts(name, num_warps, num_stages)
    trim = host.check_flag(f"{name}: trim", trim)
    eps = host.check_eps(name, eps)
    pdl, trigger_early = host.pdl_flags(name, pdl, trigger_early)
    z = host.output(f"{name}: out", out, (hq, d), qkv.dtype, qkv.device)
    k = host.output(f"{name}: k_out", k_out, (hkv, d), qkv.dtype, qkv.device)
    host.check_disjoint(name, {"k_cache": k_cache, "v_cache": v_cache, "qkv": qkv},
                        {"out": z, "k_out": k})
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else host.check_number(f"{name}: scale", scale)
    op = _kernel(num_warps, num_stages, pdl, trigger_early)(
        *host.inputs(k_cache, v_cache, pos, q_norm_weight, k_norm_weight, inv_freq, rows),
        host.owned_view(z, (hkv, group, d)).partition(
            (1, max(MIN_GROUP_ROWS, host.next_pow2(group)), d)),
        host.owned_view(k, (hkv, 1, d)).partition((1, 1, d)), eps, scale * LOG2E,
        group, hq, hkv, block_n, blocks, trim)
    return host.returning(op, (z, k))
