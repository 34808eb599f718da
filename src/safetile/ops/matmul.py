"""Matrix products ``C = A @ B`` in the safe language: fp32 accumulation, bf16/fp16/fp32 out.

``B`` comes either as a ``(K, N)`` matrix or as a weight ``(N, K)`` like ``nn.Linear`` keeps it
(``weight=True``: ``y = x @ W^T``, the case every transformer projection is).

How the kernels are built, and why:
- **Persistent, grouped.** ``C`` is partitioned into ``(BM, BN)`` tiles in grouped order
  (``group_size`` tile-rows walked column by column, so neighbouring programs reuse rows of
  ``A`` and columns of ``B`` from L2) and launched with one program per SM, each iterating
  ``for t in c.tiles():`` over the tiles it owns.
- **TMA.** Loads with static block shapes of TMA-eligible tensors compile to tensor-descriptor
  loads, and the single store of the owned tile to a descriptor store, which drops the
  elements of edge tiles that fall outside ``C``.
- **Split-K for skinny products.** When ``M`` is small the ``C`` tiles are too few to occupy
  the GPU while the weights still have to be streamed. Then ``K`` is split into ``S`` ranges:
  program ``(s, i, j)`` owns tile ``(s * gm + i, j)`` of an fp32 workspace of ``S`` stacked,
  row-padded copies of ``C``, and a second safe kernel sums the ``S`` partial tiles into ``C``.
  Both launches write only their own tiles; no atomics.

Host API: :func:`matmul` and :func:`linear` (``out=`` writes a preallocated result and then
allocates nothing, so the op can be recorded into a CUDA graph); :func:`choose_config` is
the tile-config table.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

import safetile as st
import safetile.lang as sl

from ..device.unsafe_block import in_unsafe_block, on_behalf
from ..errors import ArgumentError
from . import host

IN_DTYPES = st.bf16 | st.f16 | st.f32
OUT_DTYPES = st.bf16 | st.f16 | st.f32


@dataclass(frozen=True)
class MatmulConfig:
    """One tiling of a product: tile ``(bm, bn)``, K step ``bk``, and launch options.

    ``split_k > 1`` splits K into that many ranges (a partial product and a reduction).
    ``flatten`` / ``warp_specialize`` are scheduling hints for the persistent tiles loop.
    ``pdl`` launches every kernel of the product with programmatic dependent launch, so the
    split-K reduction is scheduled while the partial products finish.
    ``head_rows > 0`` with a ``tail`` config: rows ``[0, head_rows)`` run with this tiling and
    the remaining rows with ``tail``, as a second launch over the disjoint rest of ``C``. This
    fixes wave quantization: the head fills whole waves of wide tiles, the tail spreads the
    remainder over every SM in smaller tiles.
    ``tma_store`` writes each owned tile with one tensor-descriptor (TMA) store; off, with
    plain masked stores (the store instruction the unsafe twin uses, for comparisons).
    """

    bm: int
    bn: int
    bk: int
    num_warps: int
    num_stages: int
    group_size: int = 8
    split_k: int = 1
    flatten: bool = False
    warp_specialize: bool = False
    pdl: bool = False
    head_rows: int = 0
    tail: "MatmulConfig | None" = None
    tma_store: bool = True

    def __post_init__(self):
        # Tile sides are powers of two; the K step is the tensor cores' K, at least 16.
        host.check_fields(self, dict(
            bm=(host.check_pow2,), bn=(host.check_pow2,), bk=(host.check_pow2, 16),
            num_warps=(host.check_warps,), num_stages=(host.check_stages,),
            group_size=(host.check_int, 1), split_k=(host.check_int, 1),
            flatten=(host.check_flag,), warp_specialize=(host.check_flag,),
            pdl=(host.check_flag,), head_rows=(host.check_int, 0),
            tma_store=(host.check_flag,)))
        host.check_tiles("MatmulConfig", A=(self.bm, self.bk), B=(self.bk, self.bn),
                         C=(self.bm, self.bn))
        if self.tail is not None and not isinstance(self.tail, MatmulConfig):
            raise ArgumentError(f"MatmulConfig: tail must be a MatmulConfig or None, got "
                                f"{self.tail!r}")


def num_sms(device=None) -> int:
    """Streaming multiprocessors of the CUDA device (132 on an H200; also without a GPU)."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device or 0).multi_processor_count
    return 132


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# A tile program's share of HBM bandwidth when every SM streams (H200: ~4.0 TB/s sustained
# over 132 SMs), and the fixed cost of the split-K reduction launch (inside a graph).
_SM_BYTES_PER_S = 4.0e12 / 132
_REDUCE_FIXED_S = 3e-6
# Shared memory a program may use (H200: 227 KiB per block, less a margin for barriers).
_SMEM_BYTES = 220 * 1024


def _stages(bm: int, bn: int, bk: int, in_bytes: int, out_bytes: int, most: int = 6) -> int:
    """Pipeline depth that fits: the operand stages plus the TMA-store staging tile."""
    return min(most, (_SMEM_BYTES - bm * bn * out_bytes) // ((bm + bn) * bk * in_bytes))


def _waves(units: int, sms: int) -> int:
    return -(-units // sms)


def _skinny(m: int, n: int, k: int, bk: int, in_bytes: int, out_bytes: int,
            sms: int) -> MatmulConfig:
    """Memory-bound products (M <= 256: fewer flops per weight byte than the H200's ~206
    FLOP/B balance point): the most weight-streaming programs that fit in one wave.

    Calibrated by ``bench_gemm.py --sweep`` (the figures: benchmarks/TUNING.md, "skinny GEMM
    rule"):
    - candidate tiles: M <= 16: 16 x {64, 128, 256} with a 128-deep K step; larger M: 64x128,
      128x128, 128x256 (bk=64);
    - split K into s <= 3 ranges to maximize tile programs x s within one wave, ties to the
      smaller s (more splits pay more for partials than they gain in programs);
    - for M > 16 a split must pay for its fp32 partials (s * M * N * 8 bytes): allowed when
      they are at most ~10% of the weight bytes (s * M * 40 <= K) or when unsplit tiles would
      use under a third of the SMs;
    - when no tile fits in one wave (gate_up, lm_head): the largest tile whose last wave is
      at least 95% full, else the largest;
    - the deepest pipeline that fits (up to 8 stages), and programmatic dependent launch for
      split products at M <= 16, where the reduction can launch early.
    """
    if m <= 16:
        tiles, bk = [(16, 64), (16, 128), (16, 256)], 2 * bk
    else:
        tiles = [(64, 128), (128, 128), (128, 256)]

    def stages(bm, bn, split):
        return _stages(bm, bn, bk, in_bytes, 4 if split > 1 else out_bytes, most=8)

    # programs of the best unsplit tiling that fits in one wave: too few to stream the
    # weights at full bandwidth below a third of the SMs
    few = max([u for u in (_cdiv(m, bm) * _cdiv(n, bn) for bm, bn in tiles) if u <= sms],
              default=0) * 3 < sms
    best = None                     # (programs, -split, config) within one wave
    for bm, bn in tiles:
        units = _cdiv(m, bm) * _cdiv(n, bn)
        for split in (1, 2, 3):
            if units * split > sms or (split > 1 and _cdiv(k, bk) < 4 * split):
                break
            if split > 1 and m > 16 and split * m * 40 > k and not few:
                break
            if stages(bm, bn, split) < 3:
                continue
            key = (units * split, -split)
            if best is None or key > best[0]:
                best = (key, MatmulConfig(bm, bn, bk, 8 if bm == 128 else 4,
                                          stages(bm, bn, split), split_k=split,
                                          pdl=split > 1 and m <= 16))
    if best is not None:
        return best[1]
    fill = None                     # several waves: the largest tile whose last wave is
    for bm, bn in tiles:            # at least 95% full, else the largest tile
        units = _cdiv(m, bm) * _cdiv(n, bn)
        key = (units / (_waves(units, sms) * sms) >= 0.95, bm * bn)
        if stages(bm, bn, 1) >= 3 and (fill is None or key > fill[0]):
            fill = (key, MatmulConfig(bm, bn, bk, 8 if bm == 128 else 4, stages(bm, bn, 1)))
    return fill[1]


def _head_tail(m: int, n: int, bk: int, sms: int) -> MatmulConfig | None:
    """128x256 tiles over the rows that fill whole waves, the rest in smaller tiles.

    Used when 128x256 tiles need 1 to 3 waves and the last is at most half full: a half-
    empty last wave of large tiles then costs more than smaller tiles over the rest. The
    tail tile is the one whose count comes closest to one wave without passing it (64x128
    for N = 2560, 128x128 for N = 5120). With many waves the idle share of the last one is
    small and the split does not pay (benchmarks/TUNING.md, "head/tail GEMM rule")."""
    gn = _cdiv(n, 256)
    tiles = _cdiv(m, 128) * gn
    whole, rest = divmod(tiles, sms)
    if not 1 <= whole <= 2 or not 0 < rest <= sms // 2:
        return None
    head_rows = (whole * sms // gn) * 128
    if head_rows >= m:
        return None
    tail_m = m - head_rows
    best = None
    for bm, bn, warps, stages in [(128, 128, 8, 4), (64, 256, 4, 4), (64, 128, 4, 6)]:
        units = _cdiv(tail_m, bm) * _cdiv(n, bn)
        if units <= sms and (best is None or units > best[0]):
            best = (units, MatmulConfig(bm, bn, bk, warps, stages))
    if best is None:
        return None
    return MatmulConfig(128, 256, bk, 8, 3, warp_specialize=True, head_rows=head_rows,
                        tail=best[1])


def choose_config(m: int, n: int, k: int, in_dtype=st.bf16, out_dtype=st.bf16,
                  sms: int | None = None) -> MatmulConfig:
    """The tile config for an ``(M, K) @ (K, N)`` product.

    - ``M <= 256`` is bound by streaming the weights: :func:`_skinny` picks the tile width
      and split-K factor by a bytes-per-wave model (16/32/64-row tiles for tiny M);
    - otherwise 128x256 tiles, 8 warps, 3 stages, warp-specialized (the most work per byte
      of shared memory); when they need one to three waves and the last is at most half
      full, a head of whole waves plus a tail in smaller tiles (:func:`_head_tail`); else
      128x128 tiles (less efficient per flop) when they fill the last wave better.
      benchmarks/TUNING.md has the sweeps behind these rules.
    fp32 inputs halve ``bk`` (same bytes per stage); an fp32 output keeps tiles 128 wide so
    that the epilogue buffer fits in shared memory beside the pipeline stages.
    """
    sms = sms or num_sms()
    wide = in_dtype is st.f32
    bk = 32 if wide else 64
    if m <= 256:
        return _skinny(m, n, k, bk, in_dtype.itemsize, out_dtype.itemsize, sms)
    split_rows = None if (out_dtype is st.f32 or wide) else _head_tail(m, n, bk, sms)
    if split_rows is not None:
        return split_rows
    else:
        big = _waves(_cdiv(m, 128) * _cdiv(n, 256), sms) * 2.0
        small = _waves(_cdiv(m, 128) * _cdiv(n, 128), sms) * 1.08
        cfg = MatmulConfig(128, 256, bk, 8, 3, warp_specialize=True) if big <= small \
            else MatmulConfig(128, 128, bk, 8, 4)
    if (out_dtype is st.f32 or wide) and cfg.bn > 128:
        cfg = replace(cfg, bn=128, num_stages=4)
    return cfg


@functools.lru_cache(maxsize=None)
def _kernels(BK: int, TRANS_B: bool):
    """The product kernels for K step ``BK`` and B layout (``TRANS_B``: B is ``(N, K)``).

    Both are compile-time constants of the body (closure values), so each pair of values is
    its own kernel with its own compiled variants.
    """

    @st.kernel
    def matmul_tiles(a: st.In[IN_DTYPES, 2], b: st.In[IN_DTYPES, 2], c: st.Out[OUT_DTYPES, 2],
                     r0: int):
        """c = a[r0 * BM:] @ b (or @ b.T when TRANS_B), one owned (BM, BN) tile at a time.

        ``c`` may be a row range of the whole product starting at tile-row ``r0`` (a head /
        tail split); ``a`` stays whole and read-only, so only the A tile-row is offset."""
        for t in c.tiles():
            i, j = c.index
            acc = sl.zeros(c.shape, st.f32)
            for k in range(sl.cdiv(a.shape[1], BK)):
                if TRANS_B:
                    bt = b.load((j, k), (c.shape[1], BK)).T
                else:
                    bt = b.load((k, j), (BK, c.shape[1]))
                acc = sl.mma(a.load((i + r0, k), (c.shape[0], BK)), bt, acc)
            c.store(acc)

    @st.kernel
    def matmul_partial(a: st.In[IN_DTYPES, 2], b: st.In[IN_DTYPES, 2], p: st.Out[st.f32, 2],
                       kb: int):
        """Split-K partials: tile (s * gm + i, j) of p holds a[i] @ b[:, j] over K-steps
        [s * kb, (s + 1) * kb) (gm = tile-rows of C, so each split is a row-padded copy)."""
        for t in p.tiles():
            si, j = p.index
            gm = sl.cdiv(a.shape[0], p.shape[0])
            s = si // gm
            i = si - s * gm
            acc = sl.zeros(p.shape, st.f32)
            for k in range(s * kb, min(s * kb + kb, sl.cdiv(a.shape[1], BK))):
                if TRANS_B:
                    bt = b.load((j, k), (p.shape[1], BK)).T
                else:
                    bt = b.load((k, j), (BK, p.shape[1]))
                acc = sl.mma(a.load((i, k), (p.shape[0], BK)), bt, acc)
            p.store(acc)

    return matmul_tiles, matmul_partial


@st.kernel
def splitk_reduce(p: st.In[st.f32, 2], c: st.Out[OUT_DTYPES, 2], splits: int, rows: int):
    """c = the sum over s < splits of p's tile (s * rows + i, j): the split-K reduction."""
    i, j = c.index
    acc = sl.zeros(c.shape, st.f32)
    for s in range(splits):
        acc += p.load((s * rows + i, j), c.shape)
    c.store(acc)


# The reduction scheduled early (programmatic dependent launch): it waits on the partials'
# grid in hardware instead of paying a full launch gap after it.
_splitk_reduce_pdl = splitk_reduce.options(pdl=True)


# ---- host API ----------------------------------------------------------------------------------

def _dims(name: str, a, b, weight: bool, operands: tuple) -> tuple[int, int, int]:
    """(M, N, K) of ``a`` and ``b``, named ``operands`` in the errors of the op ``name``."""
    first, second = operands
    host.check_value(f"{name}: {first}", a)
    host.check_value(f"{name}: {second}", b)
    if a.ndim != 2 or b.ndim != 2:
        raise ArgumentError(f"{name}: {first} and {second} must be matrices, got shapes "
                            f"{a.shape} and {b.shape}")
    (m, k), (r, s) = a.shape, b.shape
    n, kb = (r, s) if weight else (s, r)
    if kb != k:
        what = f"{'weight' if second == 'b' else second} {b.shape} (N, K)" if weight else \
            f"{second} {b.shape} (K, N)"
        raise ArgumentError(f"{name}: {first} {a.shape} (M, K) and {what} disagree on K")
    host.check_out_dtype(f"{name}: {first} and {second}'s dtype",
                         host.same_dtype(name, a, b), IN_DTYPES)
    return m, n, k


def workspace_shape(m: int, n: int, cfg: MatmulConfig) -> tuple[int, int]:
    """Shape of the fp32 split-K workspace for an ``(M, N)`` result under ``cfg``."""
    return (cfg.split_k * _cdiv(m, cfg.bm) * cfg.bm, n)


def _configured(kern, cfg: MatmulConfig):
    return kern.options(num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                        tma_store=cfg.tma_store, flatten=cfg.flatten,
                        warp_specialize=cfg.warp_specialize, pdl=cfg.pdl)


class OwnedStores:
    """How the safe product writes: each program stores the tiles it owns of a partition of
    ``C`` (or of the split-K workspace), so no two programs can name one element.

    :func:`build_product` takes this or another writer with the same three methods (the
    unsafe twin's raw-pointer stores); everything else about the launches is shared."""

    name = "ops.matmul"

    def tiles(self, cfg, weight, sms, a, b, rows, r0):
        """``rows`` (a row range of ``C``, a Tensor view) = A's tile-rows from ``r0`` on @ B."""
        part = rows.partition((cfg.bm, cfg.bn), order="grouped", group_size=cfg.group_size,
                              persistent=sms)
        return _configured(_kernels(cfg.bk, weight)[0], cfg)(a, b, part, r0)

    def partials(self, cfg, weight, sms, a, b, ws, kb):
        """The split-K partial products into the workspace view ``ws`` (``kb`` K-steps each)."""
        part = ws.partition((cfg.bm, cfg.bn), order="grouped", group_size=cfg.group_size,
                            persistent=sms)
        return _configured(_kernels(cfg.bk, weight)[1], cfg)(a, b, part, kb)

    def written(self, handle):
        """The workspace as a Tensor again, from what the partials launch handed back."""
        return handle.unpartition()


OWNED = OwnedStores()


def matmul(a, b, out=None, *, weight: bool = False, out_dtype=None,
           config: MatmulConfig | None = None, workspace=None) -> st.DeviceOp:
    """``a @ b``, or ``a @ b.T`` when ``weight`` (``b`` an ``(N, K)`` weight, as nn.Linear).

    ``a``, ``b``: bf16, fp16 or fp32 matrices (Tensor or Shared) of one dtype, accumulated in
    fp32; the result has ``out_dtype`` (default: the inputs' dtype). Returns a ``DeviceOp``
    whose output is the result tensor (``out`` when given).

    Preallocated use (``out`` given) allocates nothing, so it can be recorded in a graph. A
    split-K config also needs a float32 ``workspace`` of :func:`workspace_shape`; given
    ``out`` but no workspace, the product runs unsplit rather than allocate one.
    ``config`` overrides :func:`choose_config`.
    """
    return build_product(a, b, out, weight, out_dtype, config, workspace, OWNED)


def build_product(a, b, out, weight: bool, out_dtype, config, workspace, stores,
                  name: str | None = None, operands: tuple = ("a", "b")) -> st.DeviceOp:
    """The launches of one product, with ``stores`` deciding how C (or the partials) is written.

    One code path for the safe op and its unsafe twin, so both run the same config the same
    way: tile shapes, order, program count, launch options, the head/tail row split, and
    split-K with the same workspace and the same (safe) reduction kernel. Errors name the op
    ``name`` (default: the writer's) and its operands ``operands``."""
    name = name or stores.name
    weight = host.check_flag(f"{name}: weight", weight)
    m, n, k = _dims(name, a, b, weight, operands)
    device = a.device
    if out is not None and out_dtype is None:
        host.check_target(f"{name}: out", out)
        out_dtype = out.dtype
    out_dtype = host.check_out_dtype(f"{name}: out_dtype", out_dtype or a.dtype, OUT_DTYPES)
    sms = num_sms(device if device.type == "cuda" else None)
    cfg = host.config(name, config, MatmulConfig,
                      lambda: choose_config(m, n, k, a.dtype, out_dtype, sms))
    if workspace is not None:
        host.check_target(f"{name}: workspace", workspace)
    if cfg.split_k > 1 and workspace is None and out is not None:
        cfg = replace(cfg, split_k=1)
    c = host.output(f"{name}: out", out, (m, n), out_dtype, device)
    # Split-K and head/tail run two launches: refuse an overlap before the first.
    host.check_disjoint(name, {"a": a, "b": b},
                        {"out": c, "workspace": workspace if cfg.split_k > 1 else None})
    a, b = host.inputs(a, b)
    if cfg.tail is not None and 0 < cfg.head_rows < m and cfg.split_k == 1:
        head, tail = cfg, cfg.tail
        if head.head_rows % head.bm or head.head_rows % tail.bm or tail.split_k != 1:
            raise ArgumentError(f"{name}: head_rows {head.head_rows} must be a multiple of "
                             f"both tile heights, and the tail unsplit: {cfg}")

        marked = in_unsafe_block()      # the tail launches when the head has run, as the call
                                        # site that built both could (the unsafe twin's too)

        below = c.view(m, n).slice(0, head.head_rows, m)   # taken now, as the reservation

        def rest(a_, b_, *_):           # (the writers' launches differ past a and b)
            with on_behalf(marked):
                return stores.tiles(tail, weight, sms, a_, b_, below,
                                    head.head_rows // tail.bm)

        first = stores.tiles(head, weight, sms, a, b, c.view(m, n).slice(0, 0, head.head_rows), 0)
        return host.reserving(host.returning(first.then(rest), c), name, {"out": below})
    if cfg.split_k == 1:
        return host.returning(stores.tiles(cfg, weight, sms, a, b, c.view(m, n), 0), c)
    want = workspace_shape(m, n, cfg)
    ws = host.output(f"{name}: workspace", workspace, want, st.f32, device)
    kb = _cdiv(_cdiv(k, cfg.bk), cfg.split_k)
    gm = _cdiv(m, cfg.bm)

    cv = c.view(m, n)                   # taken now: the caller may move its handle meanwhile

    def reduce(_a, _b, p, *_):
        red = _splitk_reduce_pdl if cfg.pdl else splitk_reduce
        return red(stores.written(p), cv.partition((cfg.bm, cfg.bn)), cfg.split_k, gm)

    partials = stores.partials(cfg, weight, sms, a, b, ws.view(*want), kb)
    return host.reserving(host.returning(partials.then(reduce), c), name, {"out": c})


def linear(x, w, out=None, *, out_dtype=None, config: MatmulConfig | None = None,
           workspace=None) -> st.DeviceOp:
    """``x @ w.T`` for an ``nn.Linear``-style weight ``w`` of shape ``(N, K)``."""
    return build_product(x, w, out, True, out_dtype, config, workspace, OWNED, "ops.linear",
                         ("x", "w"))
