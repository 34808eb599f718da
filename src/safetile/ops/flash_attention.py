"""Causal flash attention with grouped-query heads, for prefill.

Layout (what grout hands over):
- ``q``: (Hq, S, D); ``k``, ``v``: (Hkv, S, D) with ``Hq`` a multiple of ``Hkv`` (grouped-query
  attention: q head ``h`` reads kv head ``h // (Hq // Hkv)``). Any strides with a unit last
  stride work, so a (S, H, D) projection output can be passed as a permuted view.
- ``out``: (Hq, S, D), the dtype of ``q``.

Each program owns one (1, BLOCK_M, D) tile of the output: BLOCK_M query rows of one head. It
walks the key/value blocks up to the causal limit with an online softmax in fp32 (exp2, with
``log2(e)`` folded into the scale, so each logit costs one multiply): first the blocks wholly
below the diagonal, unmasked, then the blocks that cross it, masked ``key <= query``. The
output tile is normalized once at the end and stored in the output's dtype.
"""
from __future__ import annotations

import math

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host

LOG2E = 1.4426950408889634


@st.function
def online_softmax_step(s, vt, m_i, l_i, acc):
    """Fold one block of logits into the running softmax state.

    ``s``: (M, N) logits in log2 units (already scaled by ``scale * log2(e)``; masked entries
    are -inf); ``vt``: the (N, D) values; ``m_i``, ``l_i``: running row max and row sum (M,);
    ``acc``: the (M, D) unnormalized output. Every row must hold at least one finite logit
    by its first block, so the max is finite and ``exp2(-inf - m)`` is a clean 0.
    """
    m_new = sl.maximum(m_i, sl.max(s, 1))
    alpha = sl.exp2(m_i - m_new)
    p = sl.exp2(s - m_new[:, None])
    l_new = l_i * alpha + sl.sum(p, 1)
    # P is rounded to the operand type of V (bf16 on the tensor cores), accumulation in fp32.
    acc_new = sl.mma(p.astype(vt.dtype), vt, acc * alpha[:, None])
    return m_new, l_new, acc_new


@st.kernel
def flash_attention_kernel(q: st.In[st.floats, 3], k: st.In[st.floats, 3],
                           v: st.In[st.floats, 3], o: st.Out[st.floats, 3],
                           qk_scale: float, BLOCK_N: st.Const[int]):
    """o[h, i] = softmax_j<=i(q[h, i] . k[g, j] * scale) @ v[g, :], g = h // (Hq // Hkv)."""
    h, mb, _ = o.index
    kvh = h // (q.shape[0] // k.shape[0])
    qt = sl.reshape(q.load((h, mb, 0), (1, o.shape[1], o.shape[2])), (o.shape[1], o.shape[2]))
    rows = mb * o.shape[1] + sl.arange(o.shape[1])
    m_i = sl.full((o.shape[1],), float("-inf"), st.f32)
    l_i = sl.zeros((o.shape[1],), st.f32)
    acc = sl.zeros((o.shape[1], o.shape[2]), st.f32)
    # Key blocks wholly at or below the first query row of the tile need no mask; the rest,
    # up to the last query row (or the end of the sequence), cross the diagonal.
    n_full = (mb * o.shape[1]) // BLOCK_N
    n_all = sl.cdiv(min((mb + 1) * o.shape[1], k.shape[1]), BLOCK_N)
    for j in range(0, n_full):
        kt = sl.reshape(k.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        vt = sl.reshape(v.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        s = sl.matmul(qt, kt.T) * qk_scale
        m_i, l_i, acc = online_softmax_step(s, vt, m_i, l_i, acc)
    for j in range(n_full, n_all):
        kt = sl.reshape(k.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        vt = sl.reshape(v.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        cols = j * BLOCK_N + sl.arange(BLOCK_N)
        s = sl.where(cols[None, :] <= rows[:, None], sl.matmul(qt, kt.T) * qk_scale,
                     float("-inf"))
        m_i, l_i, acc = online_softmax_step(s, vt, m_i, l_i, acc)
    o.store(sl.reshape(acc / l_i[:, None], (1, o.shape[1], o.shape[2])))


_FLASH = {}


def _configured(num_warps: int, num_stages: int):
    key = (num_warps, num_stages)
    if key not in _FLASH:
        _FLASH[key] = flash_attention_kernel.options(num_warps=num_warps, num_stages=num_stages)
    return _FLASH[key]


def check_gqa(name: str, q, k, v, q_rank: int) -> tuple[int, int, int]:
    """(Hq, Hkv, D) of a grouped-query triple, or an ArgumentError saying what does not fit."""
    host.check_value(f"{name}: q", q)
    host.check_value(f"{name}: k", k)
    host.check_value(f"{name}: v", v)
    host.same_dtype(name, q, k, v)
    host.check_dtype(f"{name}: q", q, st.floats)
    if q.ndim != q_rank or k.ndim != 3 or v.ndim != 3:
        raise ArgumentError(f"{name}: expected q of rank {q_rank} and k, v of rank 3 "
                         f"(heads, seq, head_dim), got {q.shape}, {k.shape}, {v.shape}")
    if tuple(k.shape) != tuple(v.shape):
        raise ArgumentError(f"{name}: k {k.shape} and v {v.shape} differ")
    hq, hkv, d = q.shape[0], k.shape[0], k.shape[2]
    if q.shape[-1] != d or not hkv or hq % hkv:
        raise ArgumentError(f"{name}: q {q.shape} does not fit k {k.shape}: the head dims must "
                         f"agree and the q heads must be a multiple of the kv heads")
    if d & (d - 1) or d < 16:
        # q @ k.T takes head_dim as the product's K: the tensor cores need K >= 16.
        raise ArgumentError(f"{name}: head_dim {d} must be a power of two >= 16")
    return hq, hkv, d


@host.naming_overlaps("out")
def flash_attention(q, k, v, out=None, *, scale: float | None = None, block_m: int = 64,
                    block_n: int = 64, num_warps: int = 4, num_stages: int = 3):
    """Causal attention ``softmax(q k^T * scale + causal mask) v`` with grouped-query heads.

    ``q``: (Hq, S, D); ``k``, ``v``: (Hkv, S, D) (see the module docstring for the layout);
    ``scale`` defaults to ``1/sqrt(D)``; ``out`` (Hq, S, D) in q's dtype is allocated when not
    given. ``block_m`` query rows per program and ``block_n`` keys per step are powers of two
    from 16 (the tensor cores' least K); the defaults were chosen by measurement
    (benchmarks/TUNING.md, "decode attention defaults").
    Returns a ``DeviceOp`` whose output is the result tensor.
    """
    hq, hkv, d = check_gqa("ops.flash_attention", q, k, v, 3)
    if q.shape[1] != k.shape[1]:
        raise ArgumentError(f"ops.flash_attention: q has {q.shape[1]} positions, k has "
                         f"{k.shape[1]}; prefill attends a sequence to itself")
    scale = 1.0 / math.sqrt(d) if scale is None else \
        host.check_number("ops.flash_attention: scale", scale)
    block_m = host.check_pow2("ops.flash_attention: block_m", block_m, 16)
    block_n = host.check_pow2("ops.flash_attention: block_n", block_n, 16)
    z = host.output("ops.flash_attention: out", out, tuple(q.shape), q.dtype, q.device)
    s = q.shape[1]
    bm = min(block_m, max(16, host.next_pow2(s)))
    bn = min(block_n, bm)
    host.check_tiles("ops.flash_attention", **{"q (block_m x head_dim)": (bm, d)})
    kern = _configured(*host.check_counts("ops.flash_attention", num_warps, num_stages))
    zv = host.owned_view(z, tuple(z.shape), "ops.flash_attention: out")
    op = kern(*host.inputs(q, k, v), zv.partition((1, bm, d)),
              scale * LOG2E, bn)
    return host.returning(op, z)
