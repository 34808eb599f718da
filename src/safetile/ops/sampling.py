"""Seeded sampling of one token from a row of logits: temperature, top-k and top-p, on the device.

Everything a captured decode step needs stays on the device, so one recorded graph serves
every request and every step:

- ``params``: float32 ``(4,)`` = ``[temperature, top_k, top_p, 0]`` (:func:`sampling_params`);
  temperature 0 is greedy (the first maximum, as ``torch.argmax``), top_k 0 or >= the
  vocabulary and top_p 1 are off;
- ``key``: int64 ``(2,)``, the seed as two 32-bit words (:func:`sampling_key`);
- ``counter``: int32 ``(1,)``, the step counter the caller advances after each token.

The filters follow Hugging Face's order (temperature, then top-k, then top-p on the
renormalized top-k distribution). With ``z = (logit - max) / temperature`` they keep the
tokens with ``z >= tau``, where tau is found without sorting: top-k's tau is the largest
value with ``count(z >= tau) >= k``, top-p's the largest with ``mass(z >= tau) >= top_p *
mass(top-k set)`` (mass: the sum of ``exp(z)``). Each threshold is searched for in ``passes``
passes; a pass evaluates ``NT`` evenly spaced thresholds between the bounds ``lo`` (where the
condition holds) and ``hi`` (where it fails) over all blocks of the vocabulary at once
(``search_kernel``, one program per block) and narrows the bounds to the two neighbours
around the change (``step_kernel``, one program), so 6 passes resolve tau to ``range /
32**6``: values closer than that to the threshold count as ties and are kept, as ties are
in Hugging Face's filters. The token is then drawn with the Gumbel-max trick: the first
argmax over the kept tokens of ``z + g``, ``g = -log(-log(u))`` with ``u`` a counter-based
hash of (seed, counter, token index), so the same seed and counter give the same token on
every device and in every program order.

Launches: stats, init, ``passes`` x (search, step) per filter, draw, pick. A filter that is
off (or greedy decoding) skips the search kernels' work and carries the bounds through.
The most likely token is always kept (a top_p too small to keep anything keeps it alone).

Logits that are not finite: a NaN logit is never drawn (as ``ops.argmax``, NaN never wins);
a ``-inf`` logit has probability 0 and is never drawn; a ``+inf`` logit takes all the
probability (``z = 0`` for it, ``-inf`` for the finite ones), so it is drawn, the first of
several at temperature 0. When no logit is finite or ``+inf`` there is nothing to draw: the
token is then any index (index 0 at temperature 0, as ``ops.argmax``). The searches start at
``z = -Z_FLOOR``, not at the smallest logit: a token further below the maximum can never win
the draw (the Gumbel noise spans less than ``Z_FLOOR``) and its mass is below float32's
resolution of the top token's, so a masking logit such as ``-1e30`` neither stretches the
search range nor changes a draw.
"""
from __future__ import annotations

from dataclasses import dataclass

import safetile as st
import safetile.lang as sl

from ..errors import ArgumentError
from ..tensor import Tensor, alloc
from . import host
from .argmax import argmax_final_kernel

BLOCK = 1024                  # logits per program of the block kernels
NT = 32                       # thresholds evaluated per search pass
PASSES = 6                    # search passes per filter: tau resolved to range / NT**PASSES
# The most passes a caller may ask for: a search starts on a range under 2**6 (z in
# [-Z_FLOOR, 1)), which 32 passes narrow to 2**6 / NT**32 = 2**-154, below float32's smallest
# step (2**-149), so a further pass could not move a bound (each pass is two launches).
MAX_PASSES = 32
HEADER = 8                    # state slots before the thresholds
SLOTS = 64                    # state length (HEADER + NT, rounded up to a power of two)
# State slots: the global max logit, 1/temperature, count and mass at lo, the filter's
# target (k, or top_p times the top-k mass), hi; thresholds from slot HEADER (the first is lo).
MAX, INV_T, COUNT_LO, MASS_LO, TARGET, HI = range(6)
MASK32 = 0xFFFFFFFF
FLOAT32_TINY = 2.0 ** -126    # float32's smallest normal number
# The search's lowest z: the noise g = -log(-log(u)) of the draw lies in [-2.9, 17.4] for
# the u it uses, so a token with z < -20.3 never outscores the top token (z = 0).
Z_FLOOR = 32.0


@st.function
def _mix(h):
    """A 32-bit integer hash (xorshift-multiply rounds) of an int64 value in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * 0x21F0AAAD) & MASK32
    h = h ^ (h >> 15)
    h = (h * 0x735A2D97) & MASK32
    return h ^ (h >> 15)


@st.function
def _slot(state, i):
    """Scalar ``state[i]`` of a state tile (a masked sum: tiles have no scalar indexing)."""
    return sl.sum(sl.where(sl.arange(SLOTS) == i, state, 0.0), 0)


@st.function
def _logits(x):
    """Logits as fp32, a NaN as -inf (never drawn)."""
    xf = x.astype(st.f32)
    return sl.where(xf == xf, xf, float("-inf"))


@st.function
def _z(x, m, inv_t):
    """``(x - m) / temperature`` with the maximum ``m`` at exactly 0, also when it is +inf."""
    return sl.where(x == m, 0.0, (x - m) * inv_t)


@st.function
def _inv_temperature(temperature):
    """1 / temperature, or 1 for greedy decoding (temperature 0)."""
    return sl.where(temperature > 0.0, 1.0 / sl.maximum(temperature, 1e-30), 1.0)


@st.function
def _filter_on(temperature, top_k, top_p, n, top_p_phase):
    """Whether the filter (top-k, or top-p when ``top_p_phase``) changes anything."""
    k_on = (top_k > 0.0) & (top_k < n)
    return (temperature > 0.0) & sl.where(top_p_phase, top_p < 1.0, k_on)


@st.function
def _state_tile(m, inv_t, count_lo, mass_lo, target, lo, hi):
    """The state vector: the header, then NT thresholds evenly spaced from lo towards hi."""
    i = sl.arange(SLOTS)
    t = lo + (hi - lo) * ((i - HEADER).astype(st.f32) / NT)
    head = sl.where(i == MAX, m, sl.where(i == INV_T, inv_t, sl.where(
        i == COUNT_LO, count_lo, sl.where(i == MASS_LO, mass_lo, sl.where(
            i == TARGET, target, sl.where(i == HI, hi, 0.0))))))
    return sl.where(i >= HEADER, t, head)


@st.kernel
def stats_kernel(logits: st.In[st.floats, 1], params: st.In[st.f32, 1],
                 stats: st.Out[st.f32, 2], B: st.Const[int]):
    """stats[b] = [max, smallest finite, sum exp((l - max) / T), 0] over block b's logits."""
    b = stats.index[0]
    x = _logits(logits.load((b,), (B,), padding=float("-inf")))
    m = sl.max(x, 0)
    mn = sl.min(sl.where(x > float("-inf"), x, float("inf")), 0)
    s = sl.sum(sl.exp(_z(x, m, _inv_temperature(params.load_scalar((0,))))), 0)
    col = sl.arange(4)
    row = sl.where(col == 0, m, sl.where(col == 1, mn, sl.where(col == 2, s, 0.0)))
    stats.store(sl.reshape(row, (1, 4)))


@st.kernel
def init_kernel(stats: st.In[st.f32, 2], params: st.In[st.f32, 1], state: st.Out[st.f32, 1],
                n: int, NB: st.Const[int]):
    """The global max, the total mass and the top-k search's first bounds [lo, 1)."""
    maxes = sl.reshape(stats.load((0, 0), (NB, 1), padding=float("-inf")), (NB,))
    mins = sl.reshape(stats.load((0, 1), (NB, 1), padding=float("inf")), (NB,))
    sums = sl.reshape(stats.load((0, 2), (NB, 1)), (NB,))
    inv_t = _inv_temperature(params.load_scalar((0,)))
    m = sl.max(maxes, 0)
    total = sl.sum(sums * sl.exp(_z(maxes, m, inv_t)), 0)
    zmin = (sl.min(mins, 0) - m) * inv_t
    # NaN (no finite logit below an infinite maximum) and anything under the floor start
    # the search at the floor; the bound never passes 0, where the top token is.
    lo = sl.where(zmin >= -Z_FLOOR, sl.minimum(zmin, 0.0), -Z_FLOOR)
    state.store(_state_tile(m, inv_t, n * 1.0, total, params.load_scalar((1,)), lo, 1.0))


@st.kernel
def search_kernel(logits: st.In[st.floats, 1], state: st.In[st.f32, 1],
                  params: st.In[st.f32, 1], counts: st.Out[st.f32, 2],
                  masses: st.Out[st.f32, 2], B: st.Const[int], PHASE: st.Const[int]):
    """counts[b, j], masses[b, j] = count and mass of block b's z >= threshold j."""
    if _filter_on(params.load_scalar((0,)), params.load_scalar((1,)), params.load_scalar((2,)),
                  logits.shape[0], PHASE == 1):
        b = counts.index[0]
        s = state.load((0,), (SLOTS,))
        x = _logits(logits.load((b,), (B,), padding=float("-inf")))
        z = _z(x, _slot(s, MAX), _slot(s, INV_T))
        t = state.load_at((HEADER,), (NT,))
        ge = z[:, None] >= t[None, :]
        counts.store(sl.reshape(sl.sum(ge.astype(st.f32), 0), (1, NT)))
        masses.store(sl.reshape(sl.sum(sl.where(ge, sl.exp(z)[:, None], 0.0), 0), (1, NT)))


@st.kernel
def step_kernel(counts: st.In[st.f32, 2], masses: st.In[st.f32, 2], state: st.In[st.f32, 1],
                params: st.In[st.f32, 1], new: st.Out[st.f32, 1], n: int, NB: st.Const[int],
                PHASE: st.Const[int], LAST: st.Const[bool]):
    """Narrow [lo, hi) to the thresholds around the last one that meets the filter's target;
    after top-k's last pass (``LAST``) set up top-p's search over [tau_k, 1)."""
    s = state.load((0,), (SLOTS,))
    on = _filter_on(params.load_scalar((0,)), params.load_scalar((1,)), params.load_scalar((2,)),
                    n, PHASE == 1)
    c = sl.sum(counts.load((0, 0), (NB, NT)), 0)
    w = sl.sum(masses.load((0, 0), (NB, NT)), 0)
    j = sl.arange(NT)
    target = _slot(s, TARGET)
    meets = sl.where(PHASE == 1, w >= target, c >= target)
    best = sl.max(sl.where(meets | (j == 0), j, 0), 0)
    t = state.load_at((HEADER,), (NT,))
    lo_old = _slot(s, HEADER)
    hi_old = _slot(s, HI)
    lo_new = sl.sum(sl.where(j == best, t, 0.0), 0)
    hi_new = sl.where(best == NT - 1, hi_old, sl.sum(sl.where(j == best + 1, t, 0.0), 0))
    lo = sl.where(on, lo_new, lo_old)
    hi = sl.where(on, hi_new, hi_old)
    count_lo = sl.where(on, sl.sum(sl.where(j == best, c, 0.0), 0), _slot(s, COUNT_LO))
    mass_lo = sl.where(on, sl.sum(sl.where(j == best, w, 0.0), 0), _slot(s, MASS_LO))
    if LAST:
        target = params.load_scalar((2,)) * mass_lo
        hi = 1.0 + lo * 0.0
    new.store(_state_tile(_slot(s, MAX), _slot(s, INV_T), count_lo, mass_lo, target, lo, hi))


@st.function
def _gumbel(k0, k1, counter, idx):
    """Gumbel(0, 1) noise for token indices ``idx`` (int64) from the key words and counter."""
    seed = _mix(_mix(k0 ^ 0x3C6EF372) ^ k1)
    step = _mix(seed ^ counter)
    h = _mix(_mix(idx ^ step) ^ seed)
    u = ((h >> 8).astype(st.f32) + 0.5) * (1.0 / 16777216.0)
    return -sl.log(-sl.log(u))


@st.kernel
def draw_kernel(logits: st.In[st.floats, 1], state: st.In[st.f32, 1], params: st.In[st.f32, 1],
                key: st.In[st.i64, 1], counter: st.In[st.i32, 1], values: st.Out[st.f32, 1],
                indices: st.Out[st.i32 | st.i64, 1], B: st.Const[int]):
    """values[b], indices[b] = max and first argmax over block b's kept tokens of z + g."""
    b = values.index[0]
    s = state.load((0,), (SLOTS,))
    x = _logits(logits.load((b,), (B,), padding=float("-inf")))
    z = _z(x, _slot(s, MAX), _slot(s, INV_T))
    idx = b * B + sl.arange(B)
    g = _gumbel(key.load_scalar((0,)), key.load_scalar((1,)),
                counter.load_scalar((0,)).astype(st.i64), idx.astype(st.i64))
    noisy = sl.where(params.load_scalar((0,)) > 0.0, z + g, z)
    # The most likely token has z = 0 exactly: a threshold above it (a top_p of 0 makes
    # every mass meet the target) would keep nothing, so it is kept whatever tau is.
    # (The last block's padding is never a token: with every logit -inf or NaN it would
    # tie with them at z = 0.)
    keep = (z >= sl.minimum(_slot(s, HEADER), 0.0)) & (idx < logits.shape[0])
    score = sl.where(keep, noisy, float("-inf"))
    values.store(sl.max(score, 0))
    indices.store(sl.argmax(score, 0) + b * B)


@dataclass
class SamplerWorkspace:
    """Scratch of :func:`sample` for ``n`` logits (allocate once, outside graph scopes)."""

    stats: Tensor          # (blocks, 4): per-block max, min, sum of exp
    counts: Tensor         # (blocks, NT)
    masses: Tensor         # (blocks, NT)
    states: tuple          # two (SLOTS,) state vectors, written in turn
    values: Tensor         # (blocks,) per-block best score
    indices: Tensor        # (blocks,) per-block best token
    n: int
    block: int

    @property
    def blocks(self) -> int:
        return self.stats.shape[0]


def sampler_workspace(n: int, dtype=st.i32, device=None, block: int = BLOCK) -> SamplerWorkspace:
    """The scratch :func:`sample` needs for ``n`` logits; ``dtype``: the token's int type."""
    n = host.check_int("ops.sampler_workspace: n", n, 1)
    block = host.check_pow2("ops.sampler_workspace: block", block, 16)
    if dtype not in (st.i32, st.i64):
        raise ArgumentError(f"ops.sampler_workspace: the token dtype must be st.i32 or st.i64, "
                            f"got {dtype!r}")
    nb = -(-n // block)
    if nb > 16384:
        raise ArgumentError(f"ops.sampler_workspace: {n} logits in blocks of {block} need {nb} "
                            f"blocks (at most 16384); use a larger block")

    def empty(shape, dt=st.f32):
        return alloc.empty(shape, dtype=dt, device=device)
    return SamplerWorkspace(empty((nb, 4)), empty((nb, NT)), empty((nb, NT)),
                            (empty((SLOTS,)), empty((SLOTS,))), empty((nb,)),
                            empty((nb,), dtype), n, block)


def sampling_params(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                    device=None) -> Tensor:
    """The ``params`` tensor of :func:`sample` (allocates: copy it into the recorded one)."""
    temperature = host.check_number("ops.sampling_params: temperature (0 is greedy)",
                                    temperature, lo=0.0)
    top_k = host.check_int("ops.sampling_params: top_k (0 is off)", top_k, lo=0)
    top_p = host.check_number("ops.sampling_params: top_p (1 is off)", top_p, above=0.0)
    if top_p > 1.0:
        raise ArgumentError(f"ops.sampling_params: top_p must be in (0, 1] (1 is off), got "
                            f"{top_p}")
    # A top_p below float32's smallest normal would round (or flush) to 0: keep it positive,
    # which keeps only the most likely token, as the tiny top_p means.
    top_p = max(float(top_p), FLOAT32_TINY)
    return host.filled([float(temperature), float(min(top_k, 1 << 24)), top_p, 0.0], st.f32,
                       device)


def sampling_key(seed: int, device=None) -> Tensor:
    """The ``key`` tensor of :func:`sample` for a seed (any int; its low 64 bits count)."""
    s = host.check_int("ops.sampling_key: seed", seed) & ((1 << 64) - 1)
    return host.filled([s & MASK32, s >> 32], st.i64, device)


def _check(logits, params, key, counter, ws: SamplerWorkspace) -> int:
    """Check the arguments of :func:`sample`; returns the workspace's block as an int (a
    numpy int too: the launches compute with it)."""
    for name, v in (("logits", logits), ("params", params), ("key", key), ("counter", counter)):
        host.check_value(f"ops.sample: {name}", v)
    if logits.ndim != 1:
        raise ArgumentError(f"ops.sample: logits must be (n,), got shape {logits.shape}")
    for name, v, dtype, shape in (("params", params, st.f32, (4,)), ("key", key, st.i64, (2,)),
                                  ("counter", counter, st.i32, (1,))):
        if v.dtype is not dtype or tuple(v.shape) != shape:
            raise ArgumentError(f"ops.sample: {name} must be {dtype!r} of shape {shape}, got "
                                f"{v.dtype!r} {tuple(v.shape)}")
    if not isinstance(ws, SamplerWorkspace):
        raise ArgumentError(f"ops.sample: workspace must be a SamplerWorkspace "
                            f"(ops.sampler_workspace), got {type(ws).__name__}")
    host.check_workspace("ops.sample", ws, ("stats", "counts", "masses", "values", "indices"))
    if not isinstance(ws.states, tuple) or len(ws.states) != 2:
        raise ArgumentError(f"ops.sample: workspace.states must be a pair of st.Tensors, got "
                            f"{ws.states!r}")
    for i, state in enumerate(ws.states):
        host.check_target(f"ops.sample: workspace.states[{i}]", state)
    if host.check_int("ops.sample: workspace.n", ws.n) != logits.shape[0]:
        raise ArgumentError(f"ops.sample: the workspace is for {ws.n} logits, got "
                            f"{logits.shape[0]}")
    block = host.check_pow2("ops.sample: workspace.block", ws.block, 16)
    nb = -(-logits.shape[0] // block)
    want = {"stats": ((nb, 4), st.f32), "counts": ((nb, NT), st.f32),
            "masses": ((nb, NT), st.f32), "values": ((nb,), st.f32),
            "states[0]": ((SLOTS,), st.f32), "states[1]": ((SLOTS,), st.f32),
            "indices": ((nb,), ws.indices.dtype if ws.indices.dtype in (st.i32, st.i64)
                        else st.i32)}
    got = {"stats": ws.stats, "counts": ws.counts, "masses": ws.masses, "values": ws.values,
           "states[0]": ws.states[0], "states[1]": ws.states[1], "indices": ws.indices}
    for name, (shape, dtype) in want.items():
        t = got[name]
        if tuple(t.shape) != shape or t.dtype is not dtype:
            raise ArgumentError(f"ops.sample: workspace.{name} is {t.dtype!r} {tuple(t.shape)}, "
                                f"where {ws.n} logits in blocks of {ws.block} need {dtype!r} "
                                f"{shape}: build the workspace with ops.sampler_workspace")
    return block


def sample(logits, params, key, counter, out=None, workspace: SamplerWorkspace | None = None,
           *, passes: int = PASSES, pdl: bool | None = None):
    """One token drawn from ``logits`` (n,) under ``params``, ``key`` and ``counter`` (see the
    module docstring). Returns a ``DeviceOp`` whose output is a (1,) int tensor (``out``, or
    int32). Pass ``out`` and ``workspace`` (:func:`sampler_workspace`) to allocate nothing.
    ``passes``: search passes per filter, an int in [1, ``MAX_PASSES``]. ``pdl`` (default:
    on Hopper and later): each of the op's launches with programmatic dependent launch,
    every load after the wait."""
    host.check_value("ops.sample: logits", logits)
    if isinstance(logits, Tensor) and logits.ndim == 2 and logits.shape[0] == 1:
        logits = logits.view(-1)
    if logits.ndim != 1:
        raise ArgumentError(f"ops.sample: logits must be (n,) (or (1, n) for a Tensor), got "
                            f"shape {tuple(logits.shape)}")
    host.check_dtype("ops.sample: logits", logits, st.floats)
    n = logits.shape[-1]
    passes = host.check_int("ops.sample: passes", passes, 1, MAX_PASSES)
    pdl = host.pdl_flags("ops.sample", pdl, False)[0]
    if n == 0:
        raise ArgumentError("ops.sample: there is no token to draw from 0 logits")
    if out is not None:
        host.check_target("ops.sample: out", out)
        if out.dtype not in (st.i32, st.i64):
            raise ArgumentError(f"ops.sample: out must be st.i32 or st.i64 (a token id), got "
                                f"{out.dtype!r}")
    if workspace is None:
        host.not_given("ops.sample: workspace")
    ws = workspace if workspace is not None else sampler_workspace(
        n, out.dtype if out is not None else st.i32, logits.device)
    block = _check(logits, params, key, counter, ws)
    z = host.output("ops.sample: out", out, (1,), ws.indices.dtype, logits.device)
    # Several launches: an output overlapping an input is refused before the first.
    host.check_disjoint("ops.sample", {"logits": logits, "params": params, "key": key,
                                       "counter": counter},
                        {"out": z, "workspace.stats": ws.stats, "workspace.counts": ws.counts,
                         "workspace.masses": ws.masses, "workspace.states[0]": ws.states[0],
                         "workspace.states[1]": ws.states[1], "workspace.values": ws.values,
                         "workspace.indices": ws.indices})
    # Every launch is built from handles taken now: the later ones are built when the op runs,
    # and the caller may move its own handles, or reassign workspace fields, meanwhile.
    logits, params = host.inputs(logits, params)
    key, counter = host.later_input(key), host.later_input(counter)
    ws = host.taken(ws, ("stats", "counts", "masses", "states", "values", "indices"))
    ws.block = block
    zv = host.owned_view(z, (1,))
    nb, blk = ws.blocks, ws.block
    warps = host.warps_for(blk)
    b = host.borrow

    def rows(t):
        return t.view(tuple(t.shape)).partition((1, t.shape[1]))

    stats_k, search_k, draw_k = (k.options(num_warps=warps, pdl=pdl)
                                 for k in (stats_kernel, search_kernel, draw_kernel))
    init_k, step_k, final_k = (k.options(pdl=pdl)
                               for k in (init_kernel, step_kernel, argmax_final_kernel))
    op = stats_k(b(logits), b(params), rows(ws.stats), blk)
    op = op.then(lambda *_: init_k(
        b(ws.stats), b(params), ws.states[0].view(SLOTS).partition((SLOTS,)), n,
        host.next_pow2(nb)))
    state = 0
    for phase in (0, 1):
        for p in range(passes):
            src, dst = ws.states[state], ws.states[1 - state]
            op = op.then(lambda *_, src=src, phase=phase: search_k(
                b(logits), b(src), b(params), rows(ws.counts), rows(ws.masses), blk, phase))
            op = op.then(lambda *_, src=src, dst=dst, phase=phase, last=(
                phase == 0 and p == passes - 1): step_k(
                    b(ws.counts), b(ws.masses), b(src), b(params),
                    dst.view(SLOTS).partition((SLOTS,)), n, host.next_pow2(nb), phase, last))
            state = 1 - state
    final = ws.states[state]
    op = op.then(lambda *_: draw_k(
        b(logits), b(final), b(params), b(key), b(counter),
        ws.values.view(nb).partition((1,)), ws.indices.view(nb).partition((1,)), blk))
    op = op.then(lambda *_: final_k(
        b(ws.values), b(ws.indices), zv.partition((1,)), host.next_pow2(nb)))
    return host.reserving(host.returning(op, z), "ops.sample", {
        "out": z, "workspace.states[0]": ws.states[0], "workspace.states[1]": ws.states[1],
        "workspace.counts": ws.counts, "workspace.masses": ws.masses,
        "workspace.values": ws.values, "workspace.indices": ws.indices},
        reads={"key": key, "counter": counter})       # read by the draw alone
