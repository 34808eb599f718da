"""Arguments of the library ops at their limits: configs whose tiles no kernel can take,
workspaces filled by hand (numpy ints, a buffer of another length or dtype, an object that is
not a workspace), numpy scalars where ints are expected, and a ``num_splits`` that disagrees
with the workspace. Each is an ArgumentError naming the op and the argument, raised before
anything is launched, or is taken as the int it holds."""
import numpy as np
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=5)


def int32(value):
    return st.from_torch(torch.tensor([value], dtype=torch.int32))


# ---- configs --------------------------------------------------------------------------------

@pytest.mark.parametrize("sides", [(2048, 1024, 16), (16, 16, 1 << 17), (1024, 16, 2048)])
def test_matmul_config_refuses_tiles_over_the_element_limit_of_one_tile(sides):
    with pytest.raises(st.ArgumentError, match="MatmulConfig: the .* tile has .* elements"):
        ops.MatmulConfig(*sides, num_warps=4, num_stages=2)


def test_gemv_config_refuses_a_weight_tile_over_the_element_limit_of_one_tile():
    with pytest.raises(st.ArgumentError, match="GemvConfig: the 1024 x 2048 W tile"):
        ops.GemvConfig(1024, 2048, 4, 2)


def test_a_head_tail_product_with_a_tail_that_cannot_launch_is_refused_before_the_head_writes():
    # The tail launches only once the head has written its rows: a tail config no launch
    # takes must be refused when it is made, not half-way through the product.
    for bad in (dict(bm=16, num_warps=3), dict(bm=2048, bn=1024)):
        with pytest.raises(st.ArgumentError, match="MatmulConfig"):
            ops.MatmulConfig(**{**dict(bm=16, bn=16, bk=16, num_warps=4, num_stages=2), **bad})


@pytest.mark.parametrize("workspace", ["torch", "list"])
def test_matmul_refuses_a_workspace_that_is_not_a_tensor(workspace):
    a, b, out = wrap(rand((5, 37), st.f32, 1)), wrap(rand((37, 19), st.f32, 2)), st.empty((5, 19))
    bad = torch.zeros(32, 19) if workspace == "torch" else [0.0]
    cfg = ops.MatmulConfig(16, 16, 16, 4, 2, split_k=2)
    with pytest.raises(st.ArgumentError, match="ops.matmul: workspace: expected an st.Tensor"):
        ops.matmul(a, b, out, config=cfg, workspace=bad)
    assert out.shape == (5, 19) and a.shape == (5, 37)            # nothing was moved


# ---- argmax workspaces ----------------------------------------------------------------------

def test_argmax_takes_a_workspace_whose_block_is_a_numpy_int():
    x = rand(3000, st.f32, 3)
    ws = ops.argmax_workspace(3000, block=1024)
    ws = ops.ArgmaxWorkspace(ws.values, ws.indices, np.int64(1024))
    assert ops.argmax(wrap(x), workspace=ws).sync().to_torch().item() == x.argmax().item()


def test_argmax_refuses_workspace_indices_of_another_length_than_its_values():
    ws = ops.ArgmaxWorkspace(st.zeros((3,)), st.zeros((4,), dtype=st.i64), 1024)
    with pytest.raises(st.ArgumentError, match="ops.argmax: the workspace holds .* indices "
                                               r"\(4,\)"):
        ops.argmax(wrap(rand(3000, st.f32, 4)), workspace=ws)


@pytest.mark.parametrize("dtype", [st.f32, st.int8, "int64"])
def test_argmax_workspace_refuses_an_index_dtype_that_is_not_int32_or_int64(dtype):
    with pytest.raises(st.ArgumentError, match="ops.argmax_workspace: the index dtype"):
        ops.argmax_workspace(64, dtype)


def test_rmsnorm_gemv_argmax_refuses_a_falsy_workspace_that_is_not_an_argmax_workspace():
    w = wrap(rand((13, 32), st.f32, 5))
    with pytest.raises(st.ArgumentError, match="workspace must be an ArgmaxWorkspace"):
        ops.rmsnorm_gemv_argmax(wrap(rand(32, st.f32, 6)), wrap(rand(32, st.f32, 7)), w,
                                workspace=[])


@pytest.mark.parametrize("values,indices", [((4,), (5,)), ((4,), (4,))])
def test_rmsnorm_gemv_argmax_refuses_workspace_buffers_of_another_length_or_dtype(values,
                                                                                  indices):
    # Second case: float16 values, where the kernel stores float32 maxima.
    dtype = st.f32 if values != indices else st.f16
    ws = ops.ArgmaxWorkspace(st.zeros(values, dtype=dtype), st.zeros(indices, dtype=st.i64), 4)
    with pytest.raises(st.ArgumentError, match="ops.rmsnorm_gemv_argmax: the workspace holds"):
        ops.rmsnorm_gemv_argmax(wrap(rand(32, st.f32, 8)), wrap(rand(32, st.f32, 9)),
                                wrap(rand((13, 32), st.f32, 10)), workspace=ws,
                                config=ops.GemvConfig(4, 16, 4, 2))


@pytest.mark.parametrize("op", ["rmsnorm_gemv", "rmsnorm_gemv_argmax"])
def test_fused_rmsnorm_gemvs_refuse_an_x_longer_than_one_tile(op):
    k = 1 << 21
    x, nw, w = st.zeros((k,)), st.zeros((k,)), st.zeros((2, k))
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: x of {k} elements .* ops.rmsnorm, "
                                               f"then ops.gemv"):
        getattr(ops, op)(x, nw, w)


@pytest.mark.parametrize("op", ["rmsnorm_gemv", "rmsnorm_gemv_argmax"])
def test_fused_rmsnorm_gemvs_refuse_an_empty_x(op):
    x, nw, w = st.zeros((0,)), st.zeros((0,)), st.zeros((2, 0))
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: x is empty"):
        getattr(ops, op)(x, nw, w)


# ---- sampling -------------------------------------------------------------------------------

def test_sample_takes_a_workspace_whose_n_and_block_are_numpy_ints():
    logits = rand(3000, st.f32, 11)
    ws = ops.sampler_workspace(3000)
    ws = ops.SamplerWorkspace(**{**vars(ws), "n": np.int64(3000), "block": np.int64(1024)})
    token = ops.sample(wrap(logits), ops.sampling_params(), ops.sampling_key(0), int32(0),
                       workspace=ws).sync()
    assert token.to_torch().item() == logits.argmax().item()


def test_sampling_key_takes_a_numpy_int_seed_as_the_int_it_holds():
    assert torch.equal(ops.sampling_key(np.int64(-3)).to_torch(),
                       ops.sampling_key(-3).to_torch())


@pytest.mark.parametrize("seed", [1.0, "7", True, None])
def test_sampling_key_refuses_a_seed_that_is_not_an_int_naming_itself(seed):
    with pytest.raises(st.ArgumentError, match="ops.sampling_key: seed must be an int"):
        ops.sampling_key(seed)


# ---- attention and caches -------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [0, -4, 3.5, "8", None, True])
def test_max_cache_positions_refuses_a_head_dim_that_is_not_a_positive_int(head_dim):
    with pytest.raises(st.ArgumentError, match="ops.max_cache_positions: head_dim must be"):
        ops.max_cache_positions(head_dim)


@pytest.mark.parametrize("head_dim", [0, 32.0, "32", None, True])
def test_early_attention_fits_refuses_a_head_dim_that_is_not_a_positive_int(head_dim):
    with pytest.raises(st.ArgumentError, match="ops.early_attention_fits: head_dim must be"):
        ops.early_attention_fits(head_dim)


def test_head_dim_checks_take_numpy_ints():
    assert ops.max_cache_positions(np.int64(128)) == ops.max_cache_positions(128)
    assert ops.early_attention_fits(np.int32(128))


def test_decode_attention_refuses_a_num_splits_that_disagrees_with_the_workspace():
    q, k, v = (wrap(rand(s, st.f32, i)) for i, s in enumerate([(4, 16), (2, 40, 16),
                                                                 (2, 40, 16)]))
    ws = ops.DecodeWorkspace.for_cache(q, k, num_splits=3)
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: the workspace .* in 2 "
                                               "splits.*omit num_splits"):
        ops.decode_attention(q, k, v, int32(20), workspace=ws, num_splits=2, block_n=16)


def test_flash_attention_refuses_a_block_m_whose_query_tile_is_over_the_element_limit():
    q, k, v = (st.zeros((1, 4096, 512)) for _ in range(3))
    with pytest.raises(st.ArgumentError, match=r"ops.flash_attention: the 4096 x 512 q "
                                               r"\(block_m x head_dim\) tile"):
        ops.flash_attention(q, k, v, block_m=4096)


def _prologue_args(d=32, hq=4, hkv=2, max_seq=8):
    qkv = wrap(rand(((hq + 2 * hkv) * d,), st.f32, 20))
    return [qkv, wrap(rand(d, st.f32, 21)), wrap(rand(d, st.f32, 22)), int32(3),
            ops.inv_freq_table(d), st.zeros((hkv, max_seq, d)), st.zeros((hkv, max_seq, d))]


COUNTED = {
    "decode_attention": lambda **kw: ops.decode_attention(
        st.zeros((4, 16)), st.zeros((2, 40, 16)), st.zeros((2, 40, 16)), int32(20), **kw),
    "decode_attention split": lambda **kw: ops.decode_attention(
        st.zeros((4, 16)), st.zeros((2, 40, 16)), st.zeros((2, 40, 16)), int32(20),
        num_splits=2, block_n=16, **kw),
    "qk_norm_rope": lambda num_stages=None, **kw: ops.qk_norm_rope(*_prologue_args()[:5], 2,
                                                                   **kw),
    "qk_norm_rope_kv_append": lambda num_stages=None, **kw: ops.qk_norm_rope_kv_append(
        *_prologue_args(), **kw),
    "qk_norm_rope_append_attention": lambda **kw: ops.qk_norm_rope_append_attention(
        *_prologue_args(), **kw),
    "qk_norm_rope_attention": lambda **kw: ops.qk_norm_rope_attention(*_prologue_args(), **kw),
    "flash_attention": lambda **kw: ops.flash_attention(
        st.zeros((2, 5, 16)), st.zeros((2, 5, 16)), st.zeros((2, 5, 16)), **kw),
}


@pytest.mark.parametrize("op", sorted(COUNTED))
def test_ops_take_numpy_ints_for_num_warps_and_num_stages(op):
    COUNTED[op](num_warps=np.int64(4), num_stages=np.int32(2)).sync()


@pytest.mark.parametrize("op", sorted(COUNTED))
def test_ops_name_themselves_for_a_num_warps_that_is_not_a_warp_count(op):
    name = op.split()[0]
    with pytest.raises(st.ArgumentError, match=f"ops.{name}: num_warps must be"):
        COUNTED[op](num_warps=3)
