"""Decode's attention prologue and one-split attention in one kernel, for short caches.

Program ``h`` takes kv head ``h`` and its group of ``G = Hq / Hkv`` q heads. It computes what
``ops.qk_norm_rope_kv_append`` computes for them (q/k RMSNorm, RoPE at the device-resident
position ``pos``, k and v written to row ``pos`` of kv head ``h``'s slab of each cache), then
attends the group over rows ``0..pos`` of that slab (never past the cache's last row) as
``ops.decode_attention``'s one-split kernel does, and writes the group's rows of the output.
The rotated queries stay in registers, and the step loses one kernel boundary and the
attention's own length read.

Safety is that of the two kernels it replaces: each program owns kv head ``h``'s whole slab
of both caches (the cache may hold at most ``max_cache_positions(D)`` rows) and its group's
output rows. It reads cache rows back from its own slab only, after a CTA barrier that orders
those reads after its append, so row ``pos`` is read as stored (rounded to the cache dtype).

The scores are the rotated halves' two products, ``q1 @ k1.T + q2 @ k2.T``: the rotate-half
RoPE keeps the halves apart, and the sum equals ``q @ k.T`` up to fp32 summation order. The
query tile has ``max(16, G)`` rows (``tl.dot`` needs 16); rows past the group read the next
heads' rows of qkv (finite values) and fall outside the output, where the store masks them.
"""
from __future__ import annotations

import math

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host
from .decode_attention import WHOLE_STAGES, masked_step, valid_length
from .decode_workspace import MIN_GROUP_ROWS, keys_per_block
from .flash_attention import LOG2E
from .kv_cache import max_cache_positions
from .qk_rope_append import EARLY, check_prologue, normed_half, row_scales


@st.kernel
def prologue_attention_kernel(qkv: st.In[st.floats, 2], q_weight: st.In[st.floats, 1],
                              k_weight: st.In[st.floats, 1], pos: st.In[st.i32, 1],
                              inv_freq: st.In[st.f32, 1], k_cache: st.Out[st.floats, 3],
                              v_cache: st.Out[st.floats, 3], o: st.Out[st.floats, 3],
                              eps: float, qk_scale: float, max_seq: int,
                              GROUP: st.Const[int],
                              Q_HEADS: st.Const[int], KV_HEADS: st.Const[int],
                              BLOCK_N: st.Const[int]):
    """k_cache[h, pos], v_cache[h, pos] = rope(norm(k row h)), v row h; o[h] = attention of
    rope(norm(q rows of group h)) over rows 0..pos of kv head h."""
    h, _, _ = k_cache.index
    D = k_cache.shape[2]
    HALF = k_cache.shape[2] // 2
    GP = o.shape[1]
    p = pos.load_scalar((0,))
    angle = pos.load((0,), (1,)).astype(st.f32)[:, None] * inv_freq.load((0,), (HALF,))[None, :]
    q0 = h * GROUP
    rq = row_scales(qkv.load_at((q0, 0), (GP, D)), D, eps)
    q1 = normed_half(qkv.load_at((q0, 0), (GP, HALF)), q_weight.load((0,), (HALF,)), rq)
    q2 = normed_half(qkv.load_at((q0, HALF), (GP, HALF)), q_weight.load((1,), (HALF,)), rq)
    kr = Q_HEADS + h
    rk = row_scales(qkv.load_at((kr, 0), (1, D)), D, eps)
    k1 = normed_half(qkv.load_at((kr, 0), (1, HALF)), k_weight.load((0,), (HALF,)), rk)
    k2 = normed_half(qkv.load_at((kr, HALF), (1, HALF)), k_weight.load((1,), (HALF,)), rk)
    c = sl.cos(angle).astype(q1.dtype)                 # HF rounds cos/sin to q's dtype
    s = sl.sin(angle).astype(q1.dtype)
    q_rot1 = q1 * c - q2 * s
    q_rot2 = q2 * c + q1 * s
    k_rot1 = k1 * c - k2 * s
    k_rot2 = k2 * c + k1 * s
    k_halves = k_cache.partition((1, 1, HALF))
    k_halves.store(sl.reshape(k_rot1, (1, 1, HALF)), (0, p, 0))
    k_halves.store(sl.reshape(k_rot2, (1, 1, HALF)), (0, p, 1))
    v_row = qkv.load_at((Q_HEADS + KV_HEADS + h, 0), (1, D))
    v_cache.partition((1, 1, D)).store(sl.reshape(v_row, (1, 1, D)), (0, p, 0))
    # Rows 0..p, but never past the cache's ``max_seq`` rows (the slab's rows past them read
    # as zero keys): a position past the cache, which appends nothing, attends the whole cache,
    # one below 0 attends nothing, as ops.decode_attention.
    n = valid_length(p, 1, max_seq)
    k_blocks = k_cache.partition((1, BLOCK_N, HALF))
    v_blocks = v_cache.partition((1, BLOCK_N, D))
    m_i = sl.full((GP,), float("-inf"), st.f32)
    l_i = sl.zeros((GP,), st.f32)
    acc = sl.zeros((GP, D), st.f32)
    for j in range(sl.cdiv(n, BLOCK_N)):
        kt1 = sl.reshape(k_blocks.load((0, j, 0)), (BLOCK_N, HALF))
        kt2 = sl.reshape(k_blocks.load((0, j, 1)), (BLOCK_N, HALF))
        vt = sl.reshape(v_blocks.load((0, j, 0)), (BLOCK_N, D))
        scores = (sl.matmul(q_rot1, kt1.T) + sl.matmul(q_rot2, kt2.T)) * qk_scale
        m_i, l_i, acc = masked_step(scores, vt, j * BLOCK_N + sl.arange(BLOCK_N) < n,
                                    m_i, l_i, acc)
    # No row attended (a position below 0): zeros, not the 0 / 0 of an empty softmax.
    o.store(sl.reshape(sl.where(n > 0, acc / l_i[:, None], 0.0), (1, GP, D)))


# The scores' products take half a head per operand: tl.dot needs K >= 16.
MIN_HEAD_DIM = 32


def prologue_attention_fits(head_dim: int, max_seq: int) -> bool:
    """Whether ``qk_norm_rope_append_attention`` takes caches of ``max_seq`` rows at
    ``head_dim``: one program must own a head's whole slab, and each half of a head must
    feed the tensor cores."""
    head_dim = host.check_int("ops.prologue_attention_fits: head_dim", head_dim, 1)
    max_seq = host.check_int("ops.prologue_attention_fits: max_seq", max_seq, 0)
    return head_dim >= MIN_HEAD_DIM and max_seq <= max_cache_positions(head_dim)


def _kernel(num_warps: int, num_stages: int, pdl: bool, trigger_early: bool):
    """The kernel with these launch options (``Kernel.options`` keeps one copy per set)."""
    return prologue_attention_kernel.options(
        num_warps=num_warps, num_stages=num_stages, pdl=pdl, early=EARLY if pdl else (),
        trigger_early=pdl and trigger_early)


@host.naming_overlaps("out", "k_cache", "v_cache")
def qk_norm_rope_append_attention(qkv, q_norm_weight, k_norm_weight, pos, inv_freq, k_cache,
                                  v_cache, eps: float = 1e-6, out=None, *,
                                  scale: float | None = None, block_n: int | None = None,
                                  num_warps: int = 4, num_stages: int = WHOLE_STAGES,
                                  pdl: bool | None = None,
                                  trigger_early: bool = False) -> st.DeviceOp:
    """One decode token's attention from its qkv projection, in one kernel: what
    ``ops.qk_norm_rope_kv_append`` followed by ``ops.decode_attention(q, k_cache, v_cache,
    pos, length_offset=1, num_splits=1)`` computes.

    Arguments as in ``qk_norm_rope_kv_append``, where ``prologue_attention_fits(D,
    max_seq)``: the caches may hold at most ``max_cache_positions(D)`` rows (one program
    owns a head's whole slab), and D is at least ``MIN_HEAD_DIM``. ``out``: (Hq, D)
    in qkv's dtype (allocated when not given); ``scale`` defaults to ``1/sqrt(D)``;
    ``block_n`` (``DEFAULT_BLOCK_N``) keys per block of the pipelined loop of
    ``num_stages`` stages; ``pdl`` (default: on Hopper and later): programmatic dependent
    launch, the norm weights, position and table read before the wait; ``trigger_early``:
    the next kernel may be scheduled as soon as this one's programs start. Every block of
    the loop is masked to the first ``pos + 1`` rows, so one kernel serves every position
    (as a replayed graph needs), but its ``Hkv`` programs read the whole valid cache: meant
    for short contexts. Returns a ``DeviceOp`` whose output is ``(out, k_cache, v_cache)``.

    A position outside the cache writes nothing; one past the cache attends the whole cache
    and a negative one nothing (zeros). On the CPU executor a position outside the owned slab
    (negative, or at or past the cache's rows rounded up to a power of two) raises
    ``OutOfBoundsError``."""
    name = "ops.qk_norm_rope_append_attention"
    hq, hkv, max_seq, d, rows = check_prologue(name, qkv, q_norm_weight, k_norm_weight, pos,
                                               inv_freq, k_cache, v_cache)
    if not prologue_attention_fits(d, max_seq):
        why = (f"head_dim {d} is below {MIN_HEAD_DIM}" if d < MIN_HEAD_DIM else
               f"a cache of {max_seq} rows is more than one program owns "
               f"({max_cache_positions(d)} at head_dim {d})")
        raise ArgumentError(f"{name}: {why}; use ops.qk_norm_rope_kv_append, then "
                            f"ops.decode_attention")
    block_n = keys_per_block(name, block_n, d)
    eps = host.check_eps(name, eps)
    pdl, trigger_early = host.pdl_flags(name, pdl, trigger_early)
    num_warps, num_stages = host.check_counts(name, num_warps, num_stages)
    z = host.output(f"{name}: out", out, (hq, d), qkv.dtype, qkv.device)
    group = hq // hkv
    rows_per_program = max(MIN_GROUP_ROWS, host.next_pow2(group))
    scale = 1.0 / math.sqrt(d) if scale is None else \
        host.check_number(f"{name}: scale", scale)
    slab = (1, host.next_pow2(max_seq), d)
    op = _kernel(num_warps, num_stages, pdl, trigger_early)(
        *host.inputs(rows, q_norm_weight, k_norm_weight, pos, inv_freq),
        host.owned_view(k_cache, tuple(k_cache.shape)).partition(slab),
        host.owned_view(v_cache, tuple(v_cache.shape)).partition(slab),
        host.owned_view(z, (hkv, group, d), f"{name}: out").partition((1, rows_per_program, d)),
        eps, scale * LOG2E, max_seq, group, hq, hkv, block_n)
    return host.returning(op, (z, k_cache, v_cache))
