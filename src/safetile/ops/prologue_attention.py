"""Decode's attention prologue and a short context's attention in one kernel.

Program ``h`` takes kv head ``h``: as ``ops.qk_norm_rope_kv_append`` it normalizes and rotates
its group's q rows and its k row and writes k and v to row ``pos`` of kv head ``h``'s cache
slab, which it owns; then, as ``ops.decode_attention`` with one split, it attends the group
over rows ``0 .. pos`` of that slab, reading them back through the same sub-partitions (so
the row it has just written is ordered before the reads), and writes the group's output rows.
No other program touches the slab, so the read-back cannot race; q never leaves registers.

The arithmetic is that of the two kernels it replaces: the rotated q is rounded to the
dtype as ``q_out`` stores it, and the scores are the products of its two rotated halves
with the key halves (the same products as one ``q @ k.T``, summed in another order).
The whole slab is one program's tile, so the cache may hold at most ``max_cache_positions(D)``
rows, and D is at least 32 (``qk_norm_rope_attend_fits``); otherwise the prologue and the
attention run as separate kernels.
"""
from __future__ import annotations

import math

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host
from .decode_attention import DEFAULT_BLOCK_N, DEFAULT_STAGES, MIN_GROUP_ROWS
from .flash_attention import LOG2E, online_softmax_step
from .kv_cache import max_cache_positions
from .qk_rope_append import EARLY, normed_half, prologue_operands, row_scales


# Each rotated half of q and k is an mma operand, whose K must be at least 16.
MIN_HEAD_DIM = 32


def qk_norm_rope_attend_fits(head_dim: int, max_seq: int) -> bool:
    """Whether :func:`qk_norm_rope_attend` takes caches of ``max_seq`` rows of ``head_dim``
    (else run ``ops.qk_norm_rope_kv_append`` and ``ops.decode_attention``)."""
    return head_dim >= MIN_HEAD_DIM and max_seq <= max_cache_positions(head_dim)


@st.kernel
def qk_norm_rope_attend_kernel(qkv: st.In[st.floats, 2], q_weight: st.In[st.floats, 1],
                               k_weight: st.In[st.floats, 1], pos: st.In[st.i32, 1],
                               inv_freq: st.In[st.f32, 1], out: st.Out[st.floats, 3],
                               k_cache: st.Out[st.floats, 3], v_cache: st.Out[st.floats, 3],
                               eps: float, qk_scale: float, GROUP: st.Const[int],
                               Q_HEADS: st.Const[int], KV_HEADS: st.Const[int],
                               BLOCK_N: st.Const[int]):
    """k_cache[h, pos], v_cache[h, pos] = rope(norm(k row h)), v row h; out[h] = the group's
    attention over rows 0..pos, with q = rope(norm(q rows of group h))."""
    h, _, _ = k_cache.index
    D = k_cache.shape[2]
    HALF = k_cache.shape[2] // 2
    GP = out.shape[1]
    p = pos.load_scalar((0,))
    angle = pos.load((0,), (1,)).astype(st.f32)[:, None] * inv_freq.load((0,), (HALF,))[None, :]
    qw1 = q_weight.load((0,), (HALF,))
    qw2 = q_weight.load((1,), (HALF,))
    kw1 = k_weight.load((0,), (HALF,))
    kw2 = k_weight.load((1,), (HALF,))
    # q rows past the group (GP > G) read the next heads' rows (or 0 past qkv): finite, and
    # their output rows fall outside `out`.
    q0 = h * GROUP
    rq = row_scales(qkv.load_at((q0, 0), (GP, D)), D, eps)
    q1 = normed_half(qkv.load_at((q0, 0), (GP, HALF)), qw1, rq)
    q2 = normed_half(qkv.load_at((q0, HALF), (GP, HALF)), qw2, rq)
    kr = Q_HEADS + h
    rk = row_scales(qkv.load_at((kr, 0), (1, D)), D, eps)
    k1 = normed_half(qkv.load_at((kr, 0), (1, HALF)), kw1, rk)
    k2 = normed_half(qkv.load_at((kr, HALF), (1, HALF)), kw2, rk)
    c = sl.cos(angle).astype(q1.dtype)                 # HF rounds cos/sin to q's dtype
    s = sl.sin(angle).astype(q1.dtype)
    qa = q1 * c - q2 * s
    qb = q2 * c + q1 * s
    k_halves = k_cache.partition((1, 1, HALF))
    k_halves.store(sl.reshape(k1 * c - k2 * s, (1, 1, HALF)), (0, p, 0))
    k_halves.store(sl.reshape(k2 * c + k1 * s, (1, 1, HALF)), (0, p, 1))
    v_row = qkv.load_at((Q_HEADS + KV_HEADS + h, 0), (1, D))
    v_cache.partition((1, 1, D)).store(sl.reshape(v_row, (1, 1, D)), (0, p, 0))
    n = p + 1
    k_blocks = k_cache.partition((1, BLOCK_N, HALF))
    v_blocks = v_cache.partition((1, BLOCK_N, D))
    m_i = sl.full((GP,), float("-inf"), st.f32)
    l_i = sl.zeros((GP,), st.f32)
    acc = sl.zeros((GP, D), st.f32)
    for j in range(n // BLOCK_N):
        ka = sl.reshape(k_blocks.load((0, j, 0)), (BLOCK_N, HALF))
        kb = sl.reshape(k_blocks.load((0, j, 1)), (BLOCK_N, HALF))
        vt = sl.reshape(v_blocks.load((0, j, 0)), (BLOCK_N, D))
        scores = (sl.matmul(qa, ka.T) + sl.matmul(qb, kb.T)) * qk_scale
        m_i, l_i, acc = online_softmax_step(scores, vt, m_i, l_i, acc)
    if (n > 0) & (n % BLOCK_N != 0):
        j = n // BLOCK_N
        ka = sl.reshape(k_blocks.load((0, j, 0)), (BLOCK_N, HALF))
        kb = sl.reshape(k_blocks.load((0, j, 1)), (BLOCK_N, HALF))
        vt = sl.reshape(v_blocks.load((0, j, 0)), (BLOCK_N, D))
        valid = j * BLOCK_N + sl.arange(BLOCK_N) < n
        scores = sl.where(valid[None, :], (sl.matmul(qa, ka.T) + sl.matmul(qb, kb.T)) * qk_scale,
                          float("-inf"))
        # Cache rows past the length may hold anything (even NaN): 0 * NaN would poison P @ V.
        m_i, l_i, acc = online_softmax_step(scores, sl.where(valid[:, None], vt, 0.0), m_i,
                                            l_i, acc)
    l_safe = sl.where(l_i > 0.0, l_i, 1.0)            # a negative position attends nothing
    out.store(sl.reshape(acc / l_safe[:, None], (1, GP, D)))


def qk_norm_rope_attend(qkv, q_norm_weight, k_norm_weight, pos, inv_freq, k_cache, v_cache,
                        eps: float = 1e-6, out=None, *, scale: float | None = None,
                        block_n: int = DEFAULT_BLOCK_N, num_warps: int = 4,
                        num_stages: int = DEFAULT_STAGES, pdl: bool | None = None,
                        trigger_early: bool = False) -> st.DeviceOp:
    """``ops.qk_norm_rope_kv_append`` then ``ops.decode_attention`` over the first
    ``pos[0] + 1`` positions, in one kernel (one program per kv head): for short contexts.

    Arguments as ``ops.qk_norm_rope_kv_append``'s; ``out`` (Hq, D) in qkv's dtype (allocated
    when not given); ``scale`` defaults to ``1/sqrt(D)``; ``block_n`` keys per block. The
    caches must fit one program (:func:`qk_norm_rope_attend_fits`). ``pdl`` (default: on Hopper and
    later) reads the norm weights, the position and ``inv_freq`` before the wait;
    ``trigger_early`` lets the next kernel be scheduled as soon as this one's programs start.
    Returns a ``DeviceOp`` whose output is ``(out, k_cache, v_cache)``. A position outside the
    cache raises ``OutOfBoundsError`` on the CPU executor; on the GPU it writes nothing, and
    the output attends the cache with zero keys past its end."""
    name = "ops.qk_norm_rope_attend"
    rows, hq, (hkv, max_seq, d) = prologue_operands(name, qkv, q_norm_weight, k_norm_weight,
                                                    pos, inv_freq, k_cache, v_cache)
    if not qk_norm_rope_attend_fits(d, max_seq):
        why = f"head_dim {d} is below {MIN_HEAD_DIM}" if d < MIN_HEAD_DIM else \
            f"a cache of {max_seq} rows is longer than one program owns " \
            f"({max_cache_positions(d)} at head_dim {d})"
        raise ArgumentError(f"{name}: {why}; use ops.qk_norm_rope_kv_append and "
                            f"ops.decode_attention")
    if block_n < 16 or block_n & (block_n - 1):
        raise ArgumentError(f"{name}: block_n must be a power of two >= 16, got {block_n}")
    z = host.output(f"{name}: out", out, (hq, d), qkv.dtype, qkv.device)
    group = hq // hkv
    gp = max(MIN_GROUP_ROWS, host.next_pow2(group))
    pdl = host.pdl_available() if pdl is None else bool(pdl)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    slab = (1, host.next_pow2(max_seq), d)
    kernel = qk_norm_rope_attend_kernel.options(
        num_warps=num_warps, loop_stages=num_stages, pdl=pdl, early=EARLY if pdl else (),
        trigger_early=pdl and trigger_early)
    op = kernel(rows, host.borrow(q_norm_weight), host.borrow(k_norm_weight), host.borrow(pos),
                host.borrow(inv_freq), host.owned_view(z, (hkv, group, d)).partition((1, gp, d)),
                host.owned_view(k_cache, tuple(k_cache.shape)).partition(slab),
                host.owned_view(v_cache, tuple(v_cache.shape)).partition(slab), float(eps),
                scale * LOG2E, group, hq, hkv, block_n)
    return host.returning(op, (z, k_cache, v_cache))
