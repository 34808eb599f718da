"""ops.matmul / ops.linear / ops.gemv / the unsafe matmul twin on the CPU executor, vs torch.

Small tiles keep these fast; shapes are chosen not to divide the tiles, so edge tiles
(masked loads and stores) are always exercised.
"""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.gemv import GemvConfig
from safetile.ops.matmul import MatmulConfig, choose_config, workspace_shape
from safetile.ops.unsafe_matmul import matmul_unsafe

SMALL = MatmulConfig(32, 32, 16, 4, 2, group_size=2)
TOL = {st.bf16: 1e-2, st.f16: 2e-3, st.f32: 1e-5}


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def operands(m, n, k, dtype, weight, seed=0):
    a = st.randn((m, k), dtype=dtype, seed=seed)
    b = st.randn((n, k) if weight else (k, n), dtype=dtype, seed=seed + 1)
    bt = b.to_torch().double()
    return a, b, a.to_torch().double() @ (bt.T if weight else bt)


@pytest.mark.parametrize("dtype", [st.bf16, st.f16, st.f32])
def test_matmul_kn_matches_torch_on_edge_shapes(dtype):
    a, b, want = operands(70, 45, 50, dtype, weight=False)
    c = ops.matmul(a, b, config=SMALL).sync()
    assert c.shape == (70, 45) and c.dtype is dtype
    assert rel_err(c.to_torch(), want) < TOL[dtype]


@pytest.mark.parametrize("dtype", [st.bf16, st.f16])
def test_linear_takes_nn_linear_weights(dtype):
    a, w, want = operands(37, 66, 40, dtype, weight=True)
    c = ops.linear(a, w, config=SMALL).sync()
    assert c.shape == (37, 66)
    assert rel_err(c.to_torch(), want) < TOL[dtype]


def test_matmul_fp32_output_from_bf16_inputs():
    a, w, want = operands(33, 40, 48, st.bf16, weight=True)
    c = ops.matmul(a, w, weight=True, out_dtype=st.f32, config=SMALL).sync()
    assert c.dtype is st.f32
    assert rel_err(c.to_torch(), want) < 1e-5      # bf16 products, exact in fp32 sums


def test_default_config_matches_torch():
    a, w, want = operands(20, 24, 30, st.bf16, weight=True)
    assert rel_err(ops.linear(a, w).sync().to_torch(), want) < 1e-2


@pytest.mark.parametrize("weight", [False, True])
def test_split_k_sums_partials_over_uneven_k_ranges(weight):
    # 300 / 16 = 19 K-steps over 3 splits: ranges of 7, 7 and 5 steps.
    a, b, want = operands(20, 40, 300, st.bf16, weight=weight)
    cfg = MatmulConfig(16, 32, 16, 4, 2, split_k=3)
    c = ops.matmul(a, b, weight=weight, config=cfg).sync()
    assert rel_err(c.to_torch(), want) < 1e-2


def test_preallocated_output_is_written_and_returned():
    a, w, want = operands(24, 40, 32, st.f16, weight=True)
    out = st.full((24, 40), float("nan"), dtype=st.f16)
    c = ops.linear(a, w, out, config=SMALL).sync()
    assert c is out
    assert rel_err(out.to_torch(), want) < 2e-3


def test_preallocated_split_k_uses_the_given_workspace():
    a, w, want = operands(20, 40, 300, st.bf16, weight=True)
    cfg = MatmulConfig(16, 32, 16, 4, 2, split_k=3)
    out = st.empty((20, 40), dtype=st.bf16)
    ws = st.full(workspace_shape(20, 40, cfg), float("nan"), dtype=st.f32)
    ops.linear(a, w, out, config=cfg, workspace=ws).sync()
    assert rel_err(out.to_torch(), want) < 1e-2
    assert not torch.isnan(ws.to_torch()[:20]).any()          # split 0, real rows written


@pytest.mark.parametrize("weight", [False, True])
def test_head_and_tail_row_ranges_cover_the_product(weight):
    # Rows [0, 64) in 32x32 tiles, rows [64, 90) in 16x16 tiles: two launches over disjoint
    # row ranges of one output, the tail's A tile-rows offset by 64 / 16 = 4.
    a, b, want = operands(90, 45, 50, st.bf16, weight=weight)
    cfg = MatmulConfig(32, 32, 16, 4, 2, head_rows=64,
                       tail=MatmulConfig(16, 16, 16, 4, 2, group_size=2))
    out = st.full((90, 45), float("nan"), dtype=st.bf16)
    c = ops.matmul(a, b, out, weight=weight, config=cfg).sync()
    assert c is out and not torch.isnan(out.to_torch()).any()
    assert rel_err(out.to_torch(), want) < 1e-2


def test_head_rows_must_align_with_both_tiles():
    a, w, _ = operands(90, 45, 50, st.bf16, weight=True)
    cfg = MatmulConfig(32, 32, 16, 4, 2, head_rows=48, tail=MatmulConfig(16, 16, 16, 4, 2))
    with pytest.raises(ValueError, match="multiple of"):
        ops.linear(a, w, config=cfg)


def test_pdl_split_k_config_matches_torch():
    a, w, want = operands(20, 40, 300, st.bf16, weight=True)
    cfg = MatmulConfig(16, 32, 16, 4, 2, split_k=3, pdl=True)
    assert rel_err(ops.linear(a, w, config=cfg).sync().to_torch(), want) < 1e-2


def test_inputs_come_back_usable():
    a, w, _ = operands(16, 16, 16, st.bf16, weight=True)
    ops.linear(a, w, config=SMALL).sync()
    ops.linear(a, w, config=SMALL).sync()                     # no MovedError


def test_dtype_mismatch_is_refused():
    a = st.randn((8, 8), dtype=st.bf16)
    b = st.randn((8, 8), dtype=st.f16)
    with pytest.raises(TypeError, match="different dtypes"):
        ops.matmul(a, b)


def test_inner_dimension_mismatch_is_refused():
    a = st.randn((8, 16), dtype=st.bf16)
    w = st.randn((8, 12), dtype=st.bf16)
    with pytest.raises(ValueError, match="disagree on K"):
        ops.linear(a, w)


def test_config_table_uses_wide_tiles_for_large_products():
    cfg = choose_config(8192, 8192, 8192, sms=132)
    assert (cfg.bm, cfg.bn, cfg.bk, cfg.split_k) == (128, 256, 64, 1)


def test_config_table_splits_rows_when_wide_tiles_leave_a_small_last_wave():
    # 2048 x 2560: 160 tiles of 128x256 on 132 SMs; 130 of them fill one wave, the last
    # 384 rows run as 120 tiles of 64x128
    cfg = choose_config(2048, 2560, 4096, sms=132)
    assert (cfg.bm, cfg.bn, cfg.head_rows) == (128, 256, 1664)
    assert (cfg.tail.bm, cfg.tail.bn) == (64, 128)
    assert choose_config(8192, 2560, 4096, sms=132).tail is None    # ~5 waves: no split


def test_config_table_splits_k_when_tiles_cannot_fill_the_gpu():
    cfg = choose_config(16, 2560, 9728, sms=132)
    assert cfg.bm == 16 and cfg.split_k > 1          # 16-row tiles: no padded rows to stream
    tiles = -(-2560 // cfg.bn)
    assert tiles * cfg.split_k >= 132 // 2


@pytest.mark.parametrize("dtype", [st.bf16, st.f16, st.f32])
def test_gemv_matches_torch_on_edge_shapes(dtype):
    w = st.randn((100, 300), dtype=dtype, seed=3)
    x = st.randn((300,), dtype=dtype, seed=4)
    want = w.to_torch().double() @ x.to_torch().double()
    y = ops.gemv(w, x, config=GemvConfig(16, 64, 4, 2)).sync()
    assert y.shape == (100,)
    assert rel_err(y.to_torch(), want) < TOL[dtype]


@pytest.mark.parametrize("prefetch", [1, 8])
def test_gemv_with_weight_prefetch_matches_torch(prefetch):
    # More prefetched blocks than K has (8 x 64 > 300) are masked off.
    w = st.randn((100, 300), dtype=st.bf16, seed=3)
    x = st.randn((300,), dtype=st.bf16, seed=4)
    want = w.to_torch().double() @ x.to_torch().double()
    cfg = GemvConfig(16, 64, 4, 2, tma=False, pdl=True, prefetch=prefetch)
    assert rel_err(ops.gemv(w, x, config=cfg).sync().to_torch(), want) < TOL[st.bf16]


@pytest.mark.parametrize("head,bk", [(0, 64), (2, 64), (2, 256)])
def test_gemv_with_or_without_blocks_ahead_of_the_loop_matches_torch(head, bk):
    # head 2 x 256 columns > 300: the second block is partly masked and the loop is empty
    w = st.randn((100, 300), dtype=st.bf16, seed=3)
    x = st.randn((300,), dtype=st.bf16, seed=4)
    want = w.to_torch().double() @ x.to_torch().double()
    cfg = GemvConfig(16, bk, 4, 2, tma=False, pdl=True, head=head)
    assert rel_err(ops.gemv(w, x, config=cfg).sync().to_torch(), want) < TOL[st.bf16]


def test_gemv_rejects_a_head_other_than_0_or_2_blocks():
    with pytest.raises(ValueError, match="head must be 0 or 2"):
        ops.gemv(st.randn((8, 16), dtype=st.bf16), st.randn((16,), dtype=st.bf16),
                 config=GemvConfig(8, 16, 4, 2, head=3))


def test_gemv_of_a_row_vector_returns_a_row():
    w = st.randn((48, 80), dtype=st.bf16, seed=5)
    x = st.randn((1, 80), dtype=st.bf16, seed=6)
    want = x.to_torch().double() @ w.to_torch().double().T
    y = ops.gemv(w, x, config=GemvConfig(8, 32, 4, 2)).sync()
    assert y.shape == (1, 48)
    assert rel_err(y.to_torch(), want) < 1e-2


def test_gemv_rejects_a_vector_of_the_wrong_length():
    with pytest.raises(ValueError, match="x must have shape"):
        ops.gemv(st.randn((8, 16), dtype=st.bf16), st.randn((12,), dtype=st.bf16))


# One config per family the safe op launches: plain persistent, split-K (+ pdl), and the
# head/tail row split. The twin runs the same launches, so its result is bitwise the safe one.
TWIN_CONFIGS = {
    "plain": MatmulConfig(32, 32, 16, 4, 2, group_size=2),
    "plain_ws": MatmulConfig(32, 16, 16, 4, 2, group_size=3, warp_specialize=True),
    "split_k": MatmulConfig(16, 32, 16, 4, 2, split_k=3),
    "split_k_pdl": MatmulConfig(16, 32, 16, 4, 2, group_size=2, split_k=2, pdl=True),
    "row_split": MatmulConfig(32, 32, 16, 4, 2, head_rows=64,
                              tail=MatmulConfig(16, 16, 16, 4, 2, group_size=2)),
}


@pytest.mark.parametrize("family", sorted(TWIN_CONFIGS))
@pytest.mark.parametrize("weight", [False, True])
def test_unsafe_twin_matches_the_safe_op(family, weight):
    cfg = TWIN_CONFIGS[family]
    a, b, want = operands(90, 45, 150, st.bf16, weight=weight)     # no dimension divides
    ws = st.empty(workspace_shape(90, 45, cfg), dtype=st.f32) if cfg.split_k > 1 else None
    safe = ops.matmul(a, b, st.full((90, 45), float("nan"), dtype=st.bf16), weight=weight,
                      config=cfg, workspace=ws).sync().to_torch()
    ws = st.empty(workspace_shape(90, 45, cfg), dtype=st.f32) if cfg.split_k > 1 else None
    with st.unsafe():
        raw = matmul_unsafe(a, b, st.full((90, 45), float("nan"), dtype=st.bf16),
                            weight=weight, config=cfg, workspace=ws).sync().to_torch()
    assert rel_err(safe, want) < 1e-2
    assert torch.equal(raw, safe)


def test_unsafe_twin_uses_the_default_config_and_allocates_its_workspace():
    a, w, want = operands(16, 40, 1600, st.bf16, weight=True)
    assert choose_config(16, 40, 1600).split_k > 1
    with st.unsafe():
        c = matmul_unsafe(a, w, weight=True).sync()
    assert c.shape == (16, 40)
    assert rel_err(c.to_torch(), want) < 1e-2


def test_unsafe_twin_needs_an_unsafe_block():
    a, w, _ = operands(16, 16, 16, st.bf16, weight=True)
    with pytest.raises(st.UnsafeError):
        matmul_unsafe(a, w, weight=True, config=SMALL)


def test_the_unsafe_twin_built_in_a_block_runs_its_tail_launch_when_synced_outside():
    a, b, want = operands(90, 45, 50, st.bf16, weight=True)
    cfg = MatmulConfig(32, 32, 16, 4, 2, head_rows=64, tail=MatmulConfig(16, 16, 16, 4, 2))
    with st.unsafe():
        op = matmul_unsafe(a, b, weight=True, config=cfg)
    c = op.sync()                                 # the tail launches now, outside the block
    assert rel_err(c.to_torch(), want) < 1e-2
