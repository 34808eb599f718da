"""Split-KV decode attention: one query token per head against a long KV cache.

Layout:
- ``q``: (Hq, D), one token; ``k_cache``, ``v_cache``: (Hkv, max_seq, D); ``out``: (Hq, D).
- ``length``: a device int32 tensor of shape (1,); the first ``length + length_offset``
  positions of the cache are attended. Nothing about the length is known on the host, so one
  captured CUDA graph serves every decode step (grout passes its position tensor with
  ``length_offset=1``: the token just appended at ``pos`` attends positions ``0..pos``).
  Being on the device, the length cannot be refused: a length past the cache attends the
  whole cache, and a length of 0 or less attends nothing (the output is 0), on every path.

Decode reads the whole cache once, so it is bandwidth-bound, and it has one query row per
head, too little work for one program per head. Two kernels:

1. ``decode_split_kernel``: program (kv head, split) owns one tile of the fp32 partial output
   (Hkv, splits, G, D) and one of the log-sum-exps (Hkv, splits, G, 1), G the group size. It
   takes every q head of its group at once (a (GP, D) tile, GP = G padded to a power of two
   >= 16 for the tensor cores), so each KV block is read once per group, not once per q head;
   the owned tile is (1, 1, GP, D) over a G-row axis, so the padding rows are masked off at the
   store and the partials cost G/GP of the bytes (a quarter for Qwen3's G = 4). By default
   split ``s`` of ``S`` takes key blocks ``s, s + S, s + 2S, ...`` of the valid length
   (block-cyclic; ``cyclic=False``: the valid length divided evenly at run time into
   contiguous runs of whole blocks); a split with no block stores an empty result (output 0,
   log-sum-exp -inf).
2. ``decode_merge_kernel``: program (q head) owns one row of ``out`` and combines the splits'
   partial rows weighted by ``exp2(lse_s - max lse)`` (all weights 0, and the row 0, when no
   split attended a key).

With one split (a short cache, or ``num_splits=1``) the two become one kernel,
``decode_whole_kernel``: program (kv head) attends its group over the whole valid length and
writes the group's output rows itself. A short context has too few key blocks to feed one
program per split, and the merge's launch then costs more than the split saves.

With programmatic dependent launch (the default on Hopper) the split kernel does all its
reads before waiting for the kernel before it, so in a chain of attentions each split runs
under the previous merge; when the kernel before writes the cache, the query or the length
(a KV append), the launcher launches it in order instead.
"""
from __future__ import annotations

import math

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..lang.semantics import MAX_TILE_ELEMENTS
from . import host
from .decode_workspace import (DEFAULT_BLOCK_N, DecodeWorkspace, check_workspace,
                               default_splits, group_rows)
from .flash_attention import LOG2E, check_gqa, online_softmax_step

INT32_MAX = 2**31 - 1
# Defaults of the split kernel (measurements: benchmarks/TUNING.md, "decode attention defaults").
# Pipeline depth of the K/V loop: Triton keeps num_stages - 1 TMA buffers, so 3 stages
# double-buffer (one 64-key block of K and V in flight while the previous one is used).
DEFAULT_STAGES = 3
# The split kernel's partial last block runs masked inside the pipelined loop, as every block
# of the one-split kernel does, rather than after it: its load is then in flight with the
# others instead of adding one more memory round trip to the longest split.
DEFAULT_MASKED = True
# The one-split kernel's depth: 4 stages keep three 64-key blocks in flight, all of a short
# cache's, where its 8 programs wait on each block's latency rather than on bandwidth.
WHOLE_STAGES = 4
# Block-cyclic splits (every S-th key block): a head's splits stream neighbouring blocks at
# once, spread evenly at any length (contiguous runs round up to whole blocks per split).
DEFAULT_CYCLIC = True
# L2 prefetch of each split's first K/V blocks before the length read: off (the bytes compete
# with the previous kernel's stream, and past a short valid length they are wasted).
DEFAULT_PREFETCH = 0


@st.function
def masked_step(s, vt, valid, m_i, l_i, acc):
    """``online_softmax_step`` over the keys where ``valid`` (N,) holds: the others' logits
    are -inf and their values 0, since cache rows past the length may hold anything (even
    NaN, and 0 * NaN would poison P @ V). ``valid`` must hold somewhere in the first block."""
    return online_softmax_step(sl.where(valid[None, :], s, float("-inf")),
                               sl.where(valid[:, None], vt, 0.0), m_i, l_i, acc)


@st.function
def valid_length(length, offset, size):
    """``length + offset`` clamped to ``[0, size]``, computed so that no int32 overflows: the
    device length cannot be refused at launch, so one past the cache attends the whole cache
    (rows past it would read as zero keys and take softmax weight) and one of 0 or less
    attends nothing."""
    return max(min(length, size - offset), -offset) + offset


@st.kernel
def decode_split_kernel(q: st.In[st.floats, 2], k: st.In[st.floats, 3], v: st.In[st.floats, 3],
                        length: st.In[st.i32, 1], o: st.Out[st.f32, 4], lse: st.Out[st.f32, 4],
                        qk_scale: float, BLOCK_N: st.Const[int], LENGTH_OFFSET: st.Const[int],
                        CYCLIC: st.Const[bool], PREFETCH: st.Const[int],
                        MASKED: st.Const[bool]):
    """Partial attention of one kv head's q group over one split of the valid cache.

    ``CYCLIC``: split ``s`` takes key blocks ``s, s + S, s + 2S, ...`` (S splits) instead of
    one contiguous run; its blocks are then known before the length is, so the first
    ``PREFETCH`` of them (K and V) are prefetched into L2 before the length is read (and, with
    pdl, before the wait for the previous kernel). A prefetch delivers no value, so the rows it
    touches (even one the previous kernel is appending) cannot change any result; blocks past
    the cache are masked off, blocks past the valid length are wasted bandwidth (up to
    ``PREFETCH * S`` blocks per head at a short context)."""
    kvh, split, _, _ = o.index
    group = q.shape[0] // k.shape[0]
    num_splits = sl.num_blocks(1)             # the Out grid is (kv heads, splits, 1, 1)
    if CYCLIC:
        for p in range(PREFETCH):
            k.prefetch((kvh, split + p * num_splits, 0), (1, BLOCK_N, o.shape[3]))
            v.prefetch((kvh, split + p * num_splits, 0), (1, BLOCK_N, o.shape[3]))
    n = valid_length(length.load_scalar((0,)), LENGTH_OFFSET, k.shape[1])
    # This split's key blocks: first, first + step, ... below the end of its run, ``stop``.
    if CYCLIC:
        stop = n
        first, step = split, num_splits
    else:
        chunk = sl.cdiv(sl.cdiv(n, num_splits), BLOCK_N) * BLOCK_N
        start = split * chunk
        stop = min(start + chunk, n)
        first, step = start // BLOCK_N, 1
    # Rows past the group read the next heads' queries (or zeros past the last head): finite
    # values whose results the merge never reads.
    qt = q.load_at((kvh * group, 0), (o.shape[2], o.shape[3]))
    m_i = sl.full((o.shape[2],), float("-inf"), st.f32)
    l_i = sl.zeros((o.shape[2],), st.f32)
    acc = sl.zeros((o.shape[2], o.shape[3]), st.f32)
    # Whole key blocks need no mask: V goes from the TMA buffer straight into the product.
    # With ``MASKED`` the partial last block runs in the loop, masked like every block.
    end = sl.cdiv(stop, BLOCK_N) if MASKED else stop // BLOCK_N
    for j in range(first, end, step):
        kt = sl.reshape(k.load((kvh, j, 0), (1, BLOCK_N, o.shape[3])), (BLOCK_N, o.shape[3]))
        vt = sl.reshape(v.load((kvh, j, 0), (1, BLOCK_N, o.shape[3])), (BLOCK_N, o.shape[3]))
        if MASKED:
            m_i, l_i, acc = masked_step(sl.matmul(qt, kt.T) * qk_scale, vt,
                                        j * BLOCK_N + sl.arange(BLOCK_N) < stop, m_i, l_i, acc)
        else:
            m_i, l_i, acc = online_softmax_step(sl.matmul(qt, kt.T) * qk_scale, vt, m_i, l_i,
                                                acc)
    if not MASKED:
        # The partial last block, if there is one and it is among this split's blocks.
        j = stop // BLOCK_N
        if (stop % BLOCK_N != 0) & (j >= first) & ((j - first) % step == 0):
            kt = sl.reshape(k.load((kvh, j, 0), (1, BLOCK_N, o.shape[3])),
                            (BLOCK_N, o.shape[3]))
            vt = sl.reshape(v.load((kvh, j, 0), (1, BLOCK_N, o.shape[3])),
                            (BLOCK_N, o.shape[3]))
            m_i, l_i, acc = masked_step(sl.matmul(qt, kt.T) * qk_scale, vt,
                                        j * BLOCK_N + sl.arange(BLOCK_N) < stop, m_i, l_i, acc)
    has = l_i > 0.0
    l_safe = sl.where(has, l_i, 1.0)
    o.store(sl.reshape(acc / l_safe[:, None], (1, 1, o.shape[2], o.shape[3])))
    lse.store(sl.reshape(sl.where(has, m_i + sl.log2(l_safe), float("-inf")),
                         (1, 1, o.shape[2], 1)))


@st.kernel
def decode_merge_kernel(po: st.In[st.f32, 4], plse: st.In[st.f32, 4], out: st.Out[st.floats, 2],
                        GROUP: st.Const[int], SPLITS: st.Const[int]):
    """out[h] = sum_s w_s po[g, s, r] / sum_s w_s, w_s = exp2(lse_s - max lse), h = g*GROUP + r."""
    h, _ = out.index
    kvh = h // GROUP
    r = h % GROUP
    # Splits past the launch's count read lse = -inf: weight 0.
    lse = sl.reshape(plse.load((kvh, 0, r, 0), (1, SPLITS, 1, 1), padding=float("-inf")),
                     (SPLITS,))
    parts = sl.reshape(po.load((kvh, 0, r, 0), (1, SPLITS, 1, out.shape[1])),
                       (SPLITS, out.shape[1]))
    # When no split attended a key (a length of 0 or less) every lse is -inf: the weights
    # are then all 0 (not exp2(-inf - -inf), NaN) and the row is 0, as with one split.
    m = sl.max(lse, 0)
    w = sl.exp2(lse - sl.where(m > float("-inf"), m, 0.0))
    total = sl.sum(w, 0)
    out.store(sl.reshape(sl.sum(parts * w[:, None], 0) / sl.where(total > 0.0, total, 1.0),
                         (1, out.shape[1])))


@st.kernel
def decode_whole_kernel(q: st.In[st.floats, 2], k: st.In[st.floats, 3], v: st.In[st.floats, 3],
                        length: st.In[st.i32, 1], o: st.Out[st.floats, 3], qk_scale: float,
                        BLOCK_N: st.Const[int], LENGTH_OFFSET: st.Const[int]):
    """Attention of one kv head's q group over the whole valid cache, normalized into the
    group's rows of the output (one split: no partials, no merge). ``o`` is the output viewed
    as (Hkv, G, D), its tiles (1, GP, D): the padding rows fall outside and are masked off.

    Every key block, the partial last one too, goes through one masked, pipelined loop: a
    short cache has only a few blocks, so the last one's load must be in flight with the
    others rather than issued after the loop."""
    kvh, _, _ = o.index
    n = valid_length(length.load_scalar((0,)), LENGTH_OFFSET, k.shape[1])
    qt = q.load_at((kvh * (q.shape[0] // k.shape[0]), 0), (o.shape[1], o.shape[2]))
    m_i = sl.full((o.shape[1],), float("-inf"), st.f32)
    l_i = sl.zeros((o.shape[1],), st.f32)
    acc = sl.zeros((o.shape[1], o.shape[2]), st.f32)
    for j in range(sl.cdiv(n, BLOCK_N)):
        kt = sl.reshape(k.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        vt = sl.reshape(v.load((kvh, j, 0), (1, BLOCK_N, o.shape[2])), (BLOCK_N, o.shape[2]))
        m_i, l_i, acc = masked_step(sl.matmul(qt, kt.T) * qk_scale, vt,
                                    j * BLOCK_N + sl.arange(BLOCK_N) < n, m_i, l_i, acc)
    # A length of 0 attends nothing: the rows stay 0 rather than 0 / 0.
    l_safe = sl.where(l_i > 0.0, l_i, 1.0)
    o.store(sl.reshape(acc / l_safe[:, None], (1, o.shape[1], o.shape[2])))


_SPLIT: dict = {}


def _split_kernel(num_warps: int, num_stages: int, pdl: bool = False,
                  trigger_early: bool = False, early: bool = True):
    """The split kernel with these options. Under ``pdl`` with ``early`` every read (query,
    cache, length) runs before the wait, so the whole split overlaps the kernel before it
    (the previous attention's merge) and only its stores wait; the launcher drops
    programmatic launch when that kernel may write the cache, the query or the length (a KV
    append). Without ``early`` every read follows the wait, so the launch keeps programmatic
    launch after such a kernel (its launch overlaps the kernel before, its reads do not)."""
    key = (num_warps, num_stages, pdl, trigger_early, early)
    if key not in _SPLIT:
        _SPLIT[key] = decode_split_kernel.options(
            num_warps=num_warps, num_stages=num_stages, pdl=pdl,
            early=("q", "k", "v", "length") if pdl and early else (),
            trigger_early=pdl and trigger_early)
    return _SPLIT[key]


def _options(name: str, d: int, max_seq: int, scale, length_offset, block_n, pdl,
             trigger_early, early, prefetch=0, cyclic=True, masked=True) -> dict:
    """The kernels' options, checked (an ArgumentError naming ``name``) and resolved."""
    what = f"{name}: {{}}".format
    o = dict(
        qk_scale=(1.0 / math.sqrt(d) if scale is None else
                  host.check_number(what("scale"), scale)) * LOG2E,
        # |offset| + max_seq below 2**31 keeps ``valid_length``'s int32 arithmetic exact.
        length_offset=host.check_int(what("length_offset"), length_offset,
                                     max_seq - INT32_MAX, INT32_MAX - max_seq),
        # P @ V takes BLOCK_N keys as the product's K: the tensor cores need K >= 16.
        block_n=DEFAULT_BLOCK_N if block_n is None else
        host.check_pow2(what("block_n"), block_n, 16, max(16, MAX_TILE_ELEMENTS // d)),
        early=host.check_flag(what("early"), early),
        prefetch=host.check_int(what("prefetch"), prefetch, 0),
        cyclic=host.check_flag(what("cyclic"), cyclic),
        masked=host.check_flag(what("masked"), masked))
    o["pdl"], o["trigger_early"] = host.pdl_flags(name, pdl, trigger_early)
    if o["prefetch"] and not o["cyclic"]:
        raise ArgumentError(f"{name}: prefetch={o['prefetch']} needs cyclic splits (a "
                            f"contiguous split's first block depends on the length)")
    return o


def _launch_split(q, k_cache, v_cache, length, ws, o: dict, num_warps, num_stages):
    _, _, group, d = ws.partial.shape
    rows = group_rows(group)
    po = host.owned_view(ws.partial, tuple(ws.partial.shape)).partition((1, 1, rows, d))
    pl = host.owned_view(ws.lse, tuple(ws.lse.shape)).partition((1, 1, rows, 1))
    kernel = _split_kernel(num_warps, num_stages, o["pdl"], o["trigger_early"], o["early"])
    op = kernel(*host.inputs(q, k_cache, v_cache, length), po, pl, o["qk_scale"], o["block_n"],
                o["length_offset"], o["cyclic"], o["prefetch"], o["masked"])
    return host.returning(op, ws)


def _launch_merge(ws, out, num_warps, pdl: bool, trigger_early: bool):
    hq, d = out.shape
    _, splits, group, _ = ws.partial.shape
    # Each program holds all splits of one row in registers: more splits, more warps.
    warps = min(8, host.warps_for(host.next_pow2(splits) * d)) if num_warps is None \
        else host.check_pow2("ops.decode_attention_merge: num_warps", num_warps, 1, 32)
    op = decode_merge_kernel.options(num_warps=warps, pdl=pdl,
                                     trigger_early=pdl and trigger_early)(
        *host.inputs(ws.partial, ws.lse),
        host.owned_view(out, (hq, d), "ops.decode_attention: out").partition((1, d)),
        group, host.next_pow2(splits))
    return host.returning(op, out)


def _launch_whole(q, k_cache, v_cache, length, out, o: dict, num_warps, num_stages):
    """The one-split attention: one program per kv head, straight into ``out``."""
    hq, d = out.shape
    hkv = k_cache.shape[0]
    rows = group_rows(hq // hkv)
    kernel = decode_whole_kernel.options(
        num_warps=num_warps, num_stages=num_stages, pdl=o["pdl"],
        early=("q", "k", "v", "length") if o["pdl"] and o["early"] else (),
        trigger_early=o["pdl"] and o["trigger_early"])
    out_rows = host.owned_view(out, (hkv, hq // hkv, d), "ops.decode_attention: out")
    op = kernel(*host.inputs(q, k_cache, v_cache, length),
                out_rows.partition((1, rows, d)), o["qk_scale"], o["block_n"],
                o["length_offset"])
    return host.returning(op, out)


def decode_attention_split(q, k_cache, v_cache, length, workspace: DecodeWorkspace, *,
                           scale: float | None = None, length_offset: int = 0,
                           block_n: int | None = None, num_warps: int = 4,
                           num_stages: int = DEFAULT_STAGES, pdl: bool | None = None,
                           prefetch: int = DEFAULT_PREFETCH, cyclic: bool = DEFAULT_CYCLIC,
                           trigger_early: bool | None = None, early: bool = True,
                           masked: bool = DEFAULT_MASKED):
    """The split kernel alone: fills ``workspace``; the op's output is the workspace.
    ``block_n``: keys per block (``DEFAULT_BLOCK_N``; a power of two >= 16); ``pdl``
    (default: on Hopper and later) launches with programmatic dependent launch, every read
    before the wait; ``trigger_early`` (default: as ``pdl``): the next kernel may be
    scheduled as soon as this one's programs start; ``early`` (with ``pdl``): read q, the
    cache and the length before the wait (the default; pass False after a kernel that writes
    them, such as a KV append, to keep programmatic launch there).
    ``cyclic``: split ``s`` takes key blocks ``s, s + S, ...`` rather than one contiguous run
    (the default); ``prefetch``: how many of those blocks of K and V each program
    prefetches into L2 before it reads the length (needs ``cyclic``); ``masked``: the partial
    last block runs masked inside the loop (``DEFAULT_MASKED``), not after it. The option
    flags are bools (``None`` for a default where stated)."""
    name = "ops.decode_attention_split"
    hq, hkv, d = check_gqa(name, q, k_cache, v_cache, 2)
    host.check_device_int(f"{name}: length", length)
    check_workspace(name, workspace, hkv, hq // hkv, d)
    host.check_disjoint(name, dict(q=q, k_cache=k_cache, v_cache=v_cache, length=length),
                        {"workspace.partial": workspace.partial, "workspace.lse": workspace.lse})
    num_warps, num_stages = host.check_counts(name, num_warps, num_stages)
    o = _options(name, d, k_cache.shape[1], scale, length_offset, block_n, pdl, trigger_early,
                 early, prefetch, cyclic, masked)
    return _launch_split(q, k_cache, v_cache, length, workspace, o, num_warps, num_stages)


def decode_attention_merge(workspace: DecodeWorkspace, out, *, num_warps: int | None = None,
                           pdl: bool | None = None, trigger_early: bool | None = None):
    """The merge kernel alone: combines ``workspace``'s splits into ``out`` (Hq, D), a
    float32, float16 or bfloat16 Tensor (Hq = the workspace's kv heads times its group).
    ``pdl``: launch it with programmatic dependent launch, so that it is scheduled while the
    split kernel finishes and waits for it on the device rather than on the launch queue."""
    name = "ops.decode_attention_merge"
    check_workspace(name, workspace)
    hkv, _, group, d = workspace.partial.shape
    host.check_target(f"{name}: out", out)
    if out.dtype not in st.floats:
        raise ArgumentError(f"{name}: out must be float32, float16 or bfloat16, got "
                            f"{out.dtype!r}")
    host.check_out(f"{name}: out", out, (hkv * group, d), out.dtype, workspace.partial.device)
    host.check_disjoint(name, {"workspace.partial": workspace.partial,
                               "workspace.lse": workspace.lse}, {"out": out})
    return _launch_merge(workspace, out, num_warps, *host.pdl_flags(name, pdl, trigger_early))


@host.naming_overlaps("out")
def decode_attention(q, k_cache, v_cache, length, out=None, workspace=None, *,
                     scale: float | None = None, length_offset: int = 0,
                     block_n: int | None = None, num_splits: int | None = None,
                     num_warps: int = 4, num_stages: int | None = None,
                     pdl: bool | None = None, prefetch: int = DEFAULT_PREFETCH,
                     cyclic: bool = DEFAULT_CYCLIC, trigger_early: bool | None = None,
                     early: bool = True, masked: bool = DEFAULT_MASKED):
    """Attention of one query token ``q`` (Hq, D) over the first ``length[0] + length_offset``
    positions of ``k_cache``/``v_cache`` (Hkv, max_seq, D), grouped-query heads. A length
    past ``max_seq`` attends the whole cache; a length of 0 or less gives zeros.

    ``scale`` defaults to ``1/sqrt(D)``; ``out`` (Hq, D) in q's dtype and ``workspace`` (a
    :class:`DecodeWorkspace`, ``num_splits`` splits per kv head) are allocated when not given;
    pass both inside graph scopes. ``block_n``, ``pdl`` and ``trigger_early`` (both kernels),
    ``prefetch``/``cyclic``/``early``/``masked`` as in :func:`decode_attention_split`. Returns a
    ``DeviceOp`` whose output is ``out``. With one split (``num_splits=1``, a one-split
    workspace, or a cache of one key block) a single kernel attends each kv head's whole valid
    length (every key block masked, in one pipelined loop of ``num_stages`` stages, default
    ``WHOLE_STAGES``) and writes ``out`` directly: no partials, no merge, the workspace unused.
    """
    name = "ops.decode_attention"
    hq, hkv, d = check_gqa(name, q, k_cache, v_cache, 2)
    host.check_device_int(f"{name}: length", length)
    num_warps, num_stages = host.check_counts(name, num_warps, num_stages)
    z = host.output(f"{name}: out", out, (hq, d), q.dtype, q.device)
    o = _options(name, d, k_cache.shape[1], scale, length_offset, block_n, pdl, trigger_early,
                 early, prefetch, cyclic, masked)
    if num_splits is not None:
        num_splits = host.check_int(f"{name}: num_splits", num_splits, 1)
    if workspace is not None:
        check_workspace(name, workspace, hkv, hq // hkv, d, num_splits)
    splits = workspace.partial.shape[1] if workspace is not None else \
        num_splits or default_splits(hkv, k_cache.shape[1], o["block_n"])
    if splits == 1 or not hq:         # no q heads: an empty result, and no group to split
        return _launch_whole(q, k_cache, v_cache, length, z, o, num_warps,
                             WHOLE_STAGES if num_stages is None else num_stages)
    if workspace is None:
        host.not_given(f"{name}: workspace")
    ws = workspace or DecodeWorkspace(hkv, hq // hkv, d, splits, device=q.device)
    ws, zv = host.taken(ws, ("partial", "lse")), host.borrow(z)    # the merge's, taken now
    host.check_disjoint(name, dict(q=q, k_cache=k_cache, v_cache=v_cache, length=length),
                        {"out": z, "workspace.partial": ws.partial, "workspace.lse": ws.lse})
    split = _launch_split(q, k_cache, v_cache, length, ws, o, num_warps,
                          DEFAULT_STAGES if num_stages is None else num_stages)
    merged = split.then(lambda ws: _launch_merge(ws, zv, None, o["pdl"], o["trigger_early"]))
    return host.reserving(host.returning(merged, z), name, {"out": z})
