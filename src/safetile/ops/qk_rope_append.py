"""Decode's attention prologue in one kernel: Qwen3's per-head q/k RMSNorm, RoPE on q and k,
and the append of k and v to the KV cache at the device-resident position.

Input: one token's fused qkv projection, viewed as rows of ``head_dim``: ``Hq`` q heads, then
``Hkv`` k heads, then ``Hkv`` v heads. Program ``h`` takes kv head ``h`` and its group of
``G = Hq / Hkv`` q heads: it owns a (1, GP, D) tile of the rotated queries (viewed as
(Hkv, G, D); GP is G rounded up to a power of two, the rows past G masked off) and kv head
``h``'s whole slab of each cache, into which it writes the one row ``pos`` through a
sub-partition (a store at a data-dependent sub-index, bounds-checked against the slab, as in
``ops.kv_append``).

The arithmetic is that of the unfused chain, step for step: ``ops.rmsnorm`` per head (scale
from the whole row, the normalized value rounded, times the weight, rounded), ``ops.rope``'s
rotate-half on the two halves of each head (cos and sin rounded to the dtype), and
``ops.kv_append``'s copy. So the result equals ``rmsnorm -> rope -> kv_append``.

A cache longer than ``max_cache_positions(D)`` rows (the most one program owns) takes two
kernels: this one without the append, writing the rotated k rows to a small buffer, then
``ops.kv_append``, whose programs own blocks of the cache.

Under programmatic dependent launch the norm weights, the position and ``inv_freq`` (written
by no kernel of a decode step; the launcher checks it at each launch) are read before the
wait; qkv, which the projection just wrote, after it.
"""
from __future__ import annotations

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from . import host
from .kv_cache import append_block, kv_append


@st.function
def normed_half(raw, w, r):
    """One half of each row of ``raw`` normalized with the rows' scales ``r``, times ``w``,
    rounded as ``ops.rmsnorm`` stores it."""
    xn = (raw.astype(st.f32) * r[:, None]).astype(raw.dtype)
    return (xn.astype(st.f32) * w.astype(st.f32)[None, :]).astype(raw.dtype)


@st.function
def row_scales(rows, n, eps):
    """``rsqrt(mean(x^2) + eps)`` of each row of ``rows`` (``n`` values a row)."""
    xf = rows.astype(st.f32)
    return sl.rsqrt(sl.sum(xf * xf, 1) / n + eps)


@st.kernel
def qk_norm_rope_append_kernel(qkv: st.In[st.floats, 2], q_weight: st.In[st.floats, 1],
                               k_weight: st.In[st.floats, 1], pos: st.In[st.i32, 1],
                               inv_freq: st.In[st.f32, 1], q_out: st.Out[st.floats, 3],
                               k_cache: st.Out[st.floats, 3], v_cache: st.Out[st.floats, 3],
                               eps: float, GROUP: st.Const[int], Q_HEADS: st.Const[int],
                               KV_HEADS: st.Const[int]):
    """q_out[h] = rope(norm(q rows of group h)); k_cache[h, pos] = rope(norm(k row h));
    v_cache[h, pos] = v row h."""
    h, _, _ = k_cache.index
    D = k_cache.shape[2]
    HALF = k_cache.shape[2] // 2
    GP = q_out.shape[1]
    p = pos.load_scalar((0,))
    angle = pos.load((0,), (1,)).astype(st.f32)[:, None] * inv_freq.load((0,), (HALF,))[None, :]
    qw1 = q_weight.load((0,), (HALF,))
    qw2 = q_weight.load((1,), (HALF,))
    kw1 = k_weight.load((0,), (HALF,))
    kw2 = k_weight.load((1,), (HALF,))
    # q rows past the group (GP > G) read the next heads' rows: finite, and never stored.
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
    q_halves = q_out.partition((1, GP, HALF))
    q_halves.store(sl.reshape(q1 * c - q2 * s, (1, GP, HALF)), (0, 0, 0))
    q_halves.store(sl.reshape(q2 * c + q1 * s, (1, GP, HALF)), (0, 0, 1))
    k_halves = k_cache.partition((1, 1, HALF))
    k_halves.store(sl.reshape(k1 * c - k2 * s, (1, 1, HALF)), (0, p, 0))
    k_halves.store(sl.reshape(k2 * c + k1 * s, (1, 1, HALF)), (0, p, 1))
    v_row = qkv.load_at((Q_HEADS + KV_HEADS + h, 0), (1, D))
    v_cache.partition((1, 1, D)).store(sl.reshape(v_row, (1, 1, D)), (0, p, 0))


@st.kernel
def qk_norm_rope_kernel(qkv: st.In[st.floats, 2], q_weight: st.In[st.floats, 1],
                        k_weight: st.In[st.floats, 1], pos: st.In[st.i32, 1],
                        inv_freq: st.In[st.f32, 1], q_out: st.Out[st.floats, 3],
                        k_out: st.Out[st.floats, 3], eps: float, GROUP: st.Const[int],
                        Q_HEADS: st.Const[int]):
    """q_out[h] = rope(norm(q rows of group h)); k_out[h] = rope(norm(k row h)): the kernel
    above without the append, for caches longer than one program's block."""
    h, _, _ = k_out.index
    D = k_out.shape[2]
    HALF = k_out.shape[2] // 2
    GP = q_out.shape[1]
    angle = pos.load((0,), (1,)).astype(st.f32)[:, None] * inv_freq.load((0,), (HALF,))[None, :]
    q0 = h * GROUP
    rq = row_scales(qkv.load_at((q0, 0), (GP, D)), D, eps)
    q1 = normed_half(qkv.load_at((q0, 0), (GP, HALF)), q_weight.load((0,), (HALF,)), rq)
    q2 = normed_half(qkv.load_at((q0, HALF), (GP, HALF)), q_weight.load((1,), (HALF,)), rq)
    kr = Q_HEADS + h
    rk = row_scales(qkv.load_at((kr, 0), (1, D)), D, eps)
    k1 = normed_half(qkv.load_at((kr, 0), (1, HALF)), k_weight.load((0,), (HALF,)), rk)
    k2 = normed_half(qkv.load_at((kr, HALF), (1, HALF)), k_weight.load((1,), (HALF,)), rk)
    c = sl.cos(angle).astype(q1.dtype)
    s = sl.sin(angle).astype(q1.dtype)
    q_halves = q_out.partition((1, GP, HALF))
    q_halves.store(sl.reshape(q1 * c - q2 * s, (1, GP, HALF)), (0, 0, 0))
    q_halves.store(sl.reshape(q2 * c + q1 * s, (1, GP, HALF)), (0, 0, 1))
    k_halves = k_out.partition((1, 1, HALF))
    k_halves.store(sl.reshape(k1 * c - k2 * s, (1, 1, HALF)), (0, 0, 0))
    k_halves.store(sl.reshape(k2 * c + k1 * s, (1, 1, HALF)), (0, 0, 1))


EARLY = ("q_weight", "k_weight", "pos", "inv_freq")


def _kernel(kernel, num_warps: int, pdl: bool, trigger_early: bool = False):
    """``kernel`` with these launch options (``Kernel.options`` keeps one copy per set)."""
    return kernel.options(num_warps=num_warps, pdl=pdl, early=EARLY if pdl else (),
                          trigger_early=pdl and trigger_early)


def check_prologue(name: str, qkv, q_norm_weight, k_norm_weight, pos, inv_freq, k_cache,
                   v_cache, writes_caches: bool = True) -> tuple:
    """Check the decode prologue's arguments (``qk_norm_rope_kv_append``; the caches are
    Tensors where the op writes them); returns ``(Hq, Hkv, max_seq, D, rows)``, ``rows`` the
    qkv projection as an (Hq + 2 Hkv, D) view."""
    check_inputs(name, qkv=qkv, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                 pos=pos, inv_freq=inv_freq, k_cache=k_cache, v_cache=v_cache)
    if writes_caches:
        host.check_target(f"{name}: k_cache", k_cache)
        host.check_target(f"{name}: v_cache", v_cache)
    if k_cache.ndim != 3 or tuple(k_cache.shape) != tuple(v_cache.shape) or not k_cache.shape[1]:
        raise ArgumentError(f"{name}: caches must both be (Hkv, max_seq, D) with max_seq >= 1, "
                            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    hkv, max_seq, d = k_cache.shape
    hq, rows = check_rows(name, qkv, q_norm_weight, k_norm_weight, pos, inv_freq, hkv, d,
                          also_same_dtype=(k_cache, v_cache))
    return hq, hkv, max_seq, d, rows


def check_inputs(name: str, **values) -> None:
    """Each of ``values`` must be a safetile Tensor or Shared, checked in the order given."""
    for what, v in values.items():
        host.check_value(f"{name}: {what}", v)


def check_rows(name: str, qkv, q_norm_weight, k_norm_weight, pos, inv_freq, hkv: int,
               d: int, also_same_dtype: tuple = ()) -> tuple:
    """Check the prologue's inputs, already known to be safetile values (``check_inputs``),
    for ``hkv`` kv heads of ``d`` (``also_same_dtype``: more values that must have qkv's
    dtype); returns ``(Hq, rows)``, ``rows`` the qkv projection as an (Hq + 2 Hkv, D) view."""
    if d < 2 or d & (d - 1):
        raise ArgumentError(f"{name}: head_dim must be a power of two, got {d}")
    if hkv < 1:
        raise ArgumentError(f"{name}: the cache has no kv heads (shape gives {hkv})")
    width = qkv.shape[-1] * (qkv.shape[0] if qkv.ndim == 2 else 1) if qkv.ndim else 0
    if qkv.ndim not in (1, 2) or (qkv.ndim == 2 and qkv.shape[1] != d) or width % d \
            or width // d <= 2 * hkv or (width // d - 2 * hkv) % hkv:
        raise ArgumentError(f"{name}: qkv must hold (Hq + 2 * {hkv}) heads of {d} (Hq a "
                            f"multiple of {hkv}), as ((Hq + 2 Hkv) * D,) or (rows, {d}); got "
                            f"shape {tuple(qkv.shape)}")
    hq = width // d - 2 * hkv
    host.same_dtype(name, qkv, q_norm_weight, k_norm_weight, *also_same_dtype)
    host.check_dtype(f"{name}: qkv", qkv, st.floats)
    for what, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if tuple(w.shape) != (d,):
            raise ArgumentError(f"{name}: {what} must have shape ({d},), got {tuple(w.shape)}")
    host.check_device_int(f"{name}: pos", pos)
    if inv_freq.dtype is not st.f32 or tuple(inv_freq.shape) != (d // 2,):
        raise ArgumentError(f"{name}: inv_freq must be an fp32 tensor of shape ({d // 2},) "
                            f"(ops.inv_freq_table), got {inv_freq.dtype!r} "
                            f"{tuple(inv_freq.shape)}")
    if qkv.ndim == 2:
        rows = host.borrow(qkv)
    elif hasattr(qkv, "view"):
        rows = qkv.view(width // d, d)
    else:
        raise ArgumentError(f"{name}: a Shared qkv must be 2-D (rows, {d})")
    return hq, rows


@host.naming_overlaps("q_out", "k_cache", "v_cache", "k_rows")
def qk_norm_rope_kv_append(qkv, q_norm_weight, k_norm_weight, pos, inv_freq, k_cache, v_cache,
                           eps: float = 1e-6, q_out=None, *, pdl: bool | None = None,
                           num_warps: int = 4, k_rows=None, block_s: int | None = None,
                           trigger_early: bool = False) -> st.DeviceOp:
    """One decode token's attention prologue: per-head RMSNorm of q and k, RoPE at position
    ``pos[0]``, and k, v written to row ``pos[0]`` of the caches; replaces ``ops.rmsnorm``
    (q, k), ``ops.rope`` (q, k) and ``ops.kv_append``.

    ``qkv``: ((Hq + 2 Hkv) * D,) or (Hq + 2 Hkv, D), the fused projection's output;
    ``q_norm_weight``, ``k_norm_weight``: (D,); ``pos``: int32 (1,) on the device;
    ``inv_freq``: ``ops.inv_freq_table(D, theta)``; ``k_cache``, ``v_cache``: (Hkv, max_seq,
    D). ``pdl`` (default: on Hopper and later): programmatic dependent launch, the weights,
    position and table read before the wait; ``trigger_early`` (with ``pdl``): the next
    kernel may be scheduled as soon as this one's programs start. Returns a ``DeviceOp``
    whose output is ``(q_out, k_cache, v_cache)``, ``q_out`` (Hq, D) in qkv's dtype
    (allocated when not given). A position outside the cache writes nothing. On the CPU
    executor a position outside the owned slab (negative, or at or past the cache's rows
    rounded up to a power of two, or to whole ``block_s`` blocks) raises
    ``OutOfBoundsError``; one between the cache's end and the slab's writes nothing there
    too.

    ``block_s`` (default: the whole cache, up to ``max_cache_positions(D)`` rows): cache rows
    one append program owns; a cache longer than one block takes two kernels, the rotated k
    rows going through ``k_rows``, an (Hkv, D) tensor in qkv's dtype (allocated when not
    given, so inside a graph scope it must be given)."""
    name = "ops.qk_norm_rope_kv_append"
    hq, hkv, max_seq, d, rows = check_prologue(name, qkv, q_norm_weight, k_norm_weight, pos,
                                               inv_freq, k_cache, v_cache)
    block = append_block(name, max_seq, d, block_s)
    eps = host.check_eps(name, eps)
    pdl, trigger_early = host.pdl_flags(name, pdl, trigger_early)
    num_warps = host.check_warps(f"{name}: num_warps", num_warps)
    if block < max_seq and not isinstance(qkv, st.Tensor):
        raise ArgumentError(f"{name}: a cache longer than {block} rows takes qkv as an "
                            f"st.Tensor (its v rows are read by a second kernel), got a Shared")
    q = host.output(f"{name}: q_out", q_out, (hq, d), qkv.dtype, qkv.device)
    group = hq // hkv
    if block >= max_seq:
        q_tiles = host.owned_view(q, (hkv, group, d)).partition((1, host.next_pow2(group), d))
        slab = (1, host.next_pow2(max_seq), d)
        op = _kernel(qk_norm_rope_append_kernel, num_warps, pdl, trigger_early)(
            *host.inputs(rows, q_norm_weight, k_norm_weight, pos, inv_freq), q_tiles,
            host.owned_view(k_cache, tuple(k_cache.shape)).partition(slab),
            host.owned_view(v_cache, tuple(v_cache.shape)).partition(slab), eps, group,
            hq, hkv)
        return host.returning(op, (q, k_cache, v_cache))
    k = host.output(f"{name}: k_rows", k_rows, (hkv, d), qkv.dtype, qkv.device)
    # Two launches: the append writes the caches only after the first kernel has run.
    host.check_disjoint(name, dict(qkv=qkv, q_norm_weight=q_norm_weight,
                                   k_norm_weight=k_norm_weight, pos=pos, inv_freq=inv_freq),
                        dict(q_out=q, k_cache=k_cache, v_cache=v_cache, k_rows=k))
    v = rows.slice(0, hq + hkv, hq + 2 * hkv)
    op = _rotate(rows, q_norm_weight, k_norm_weight, pos, inv_freq, eps, q, k, hq, hkv,
                 num_warps, pdl, trigger_early)
    # The append is built from handles taken now: the caller may move its own meanwhile.
    kr, at, kc, vc = host.inputs(k, pos, k_cache, v_cache)
    return host.reserving(op.then(lambda *_: host.returning(
        kv_append(kr, v, at, kc, vc, block_s=block), (q, k_cache, v_cache))), name,
        {"k_cache": k_cache, "v_cache": v_cache})


@host.naming_overlaps("q_out", "k_out")
def qk_norm_rope(qkv, q_norm_weight, k_norm_weight, pos, inv_freq, kv_heads: int,
                 eps: float = 1e-6, q_out=None, k_out=None, *, pdl: bool | None = None,
                 num_warps: int = 4, trigger_early: bool = False) -> st.DeviceOp:
    """The prologue without the append: q/k RMSNorm and RoPE at ``pos[0]`` of one token's
    qkv, for a cache longer than one program's block (then ``ops.kv_append`` writes
    ``k_out`` and qkv's v rows; as two ops, a recorded step launches both with programmatic
    launch, where ``qk_norm_rope_kv_append`` chains them through a callback).

    Arguments as in :func:`qk_norm_rope_kv_append`; ``kv_heads``: Hkv. Returns a
    ``DeviceOp`` whose output is ``(q_out, k_out)``, (Hq, D) and (Hkv, D) in qkv's dtype
    (allocated when not given)."""
    name = "ops.qk_norm_rope"
    check_inputs(name, qkv=qkv, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight,
                 pos=pos, inv_freq=inv_freq)
    kv_heads = host.check_int(f"{name}: kv_heads", kv_heads, 1)
    if q_norm_weight.ndim != 1:
        raise ArgumentError(f"{name}: q_norm_weight must have shape (D,), got "
                            f"{tuple(q_norm_weight.shape)}")
    d = q_norm_weight.shape[0]
    hq, rows = check_rows(name, qkv, q_norm_weight, k_norm_weight, pos, inv_freq, kv_heads, d)
    eps = host.check_eps(name, eps)
    pdl, trigger_early = host.pdl_flags(name, pdl, trigger_early)
    num_warps = host.check_warps(f"{name}: num_warps", num_warps)
    q = host.output(f"{name}: q_out", q_out, (hq, d), qkv.dtype, qkv.device)
    k = host.output(f"{name}: k_out", k_out, (kv_heads, d), qkv.dtype, qkv.device)
    op = _rotate(rows, q_norm_weight, k_norm_weight, pos, inv_freq, eps, q, k, hq, kv_heads,
                 num_warps, pdl, trigger_early)
    return host.returning(op, (q, k))


def _rotate(rows, q_norm_weight, k_norm_weight, pos, inv_freq, eps, q, k, hq, hkv, num_warps,
            pdl, trigger_early):
    """Launch ``qk_norm_rope_kernel`` from the (Hq + 2 Hkv, D) ``rows`` into ``q``, ``k``."""
    group = hq // hkv
    d = q.shape[1]
    q_tiles = host.owned_view(q, (hkv, group, d)).partition((1, host.next_pow2(group), d))
    return _kernel(qk_norm_rope_kernel, num_warps, pdl, trigger_early)(
        *host.inputs(rows, q_norm_weight, k_norm_weight, pos, inv_freq), q_tiles,
        host.owned_view(k, (hkv, 1, d)).partition((1, 1, d)),
        eps, group, hq)
