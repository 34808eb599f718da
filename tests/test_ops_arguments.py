"""Argument checks of the library ops: a wrong argument is an ArgumentError naming the op
and its own argument (and what is allowed), raised before anything is launched, never an
error from inside the library's kernels (the attention ops' other checks:
test_ops_attention_arguments.py)."""
import numpy as np
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=3)

K = 64


def norm_op(name, x, weight, eps):
    if name == "rmsnorm":
        return ops.rmsnorm(x, weight, eps)
    if name == "add_rmsnorm":
        return ops.add_rmsnorm(x, wrap(x.to_torch()), weight, eps)
    w = st.zeros((300, K), dtype=x.dtype)
    if name == "rmsnorm_gemv":
        return ops.rmsnorm_gemv(x.view(K), weight, w, eps)
    return ops.rmsnorm_gemv_argmax(x.view(K), weight, w, eps)


NORM_OPS = ["rmsnorm", "add_rmsnorm", "rmsnorm_gemv", "rmsnorm_gemv_argmax"]


# ---- RMSNorm --------------------------------------------------------------------------------

@pytest.mark.parametrize("op", NORM_OPS)
@pytest.mark.parametrize("eps", [None, "abc", "tensor", float("nan"), -1.0, float("inf"), True],
                         ids=["None", "str", "tensor", "nan", "negative", "inf", "bool"])
def test_rmsnorm_ops_refuse_an_eps_that_is_not_a_finite_number_from_0(op, eps):
    eps = st.from_torch(torch.tensor([1e-6])) if eps == "tensor" else eps
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: eps must be"):
        norm_op(op, wrap(rand((1, K), st.f32, 0)), wrap(rand(K, st.f32, 1)), eps)


NUMBER_ARGUMENTS = {
    "ops.rmsnorm: eps": lambda v: ops.rmsnorm(st.zeros((1, K)), st.ones((K,)), v),
    "ops.rope: theta": lambda v: ops.rope(st.zeros((1, 1, 8)), st.zeros((1,), dtype=st.i32),
                                          theta=v),
    "ops.flash_attention: scale": lambda v: ops.flash_attention(
        st.zeros((1, 1, 16)), st.zeros((1, 1, 16)), st.zeros((1, 1, 16)), scale=v),
    "ops.sampling_params: temperature": lambda v: ops.sampling_params(v),
    "ops.sampling_params: top_p": lambda v: ops.sampling_params(1.0, 0, v),
}


@pytest.mark.parametrize("what", list(NUMBER_ARGUMENTS))
def test_a_number_argument_given_an_int_too_large_for_a_float_is_an_argument_error(what):
    with pytest.raises(st.ArgumentError, match=f"{what}.* must be a finite number"):
        NUMBER_ARGUMENTS[what](10**400)


@pytest.mark.parametrize("op", NORM_OPS)
def test_rmsnorm_ops_take_a_numpy_eps_and_an_eps_of_0(op):
    x, w = rand((1, K), st.f32, 2), rand(K, st.f32, 3)
    for eps in (np.float32(1e-6), 0.0, 0):
        norm_op(op, wrap(x), wrap(w), eps).sync()


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm"])
def test_rmsnorm_refuses_a_norm_weight_of_another_dtype(op):
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: .*different dtypes"):
        norm_op(op, wrap(rand((2, K), st.bf16, 4)), wrap(rand(K, st.f32, 5)), 1e-6)


@pytest.mark.parametrize("op", ["rmsnorm", "softmax"])
def test_row_ops_refuse_a_0d_x(op):
    x = st.from_torch(torch.tensor(1.0))
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: x must have at least one dim"):
        ops.rmsnorm(x, st.ones((1,))) if op == "rmsnorm" else ops.softmax(x)


@pytest.mark.parametrize("op", ["rmsnorm", "add_rmsnorm"])
def test_rmsnorm_rows_longer_than_one_program_holds_name_the_op(op):
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: rows longer than 32768"):
        norm_op(op, st.zeros((1, 40000)), st.zeros((40000,)), 1e-6)


@pytest.mark.parametrize("op", ["rmsnorm", "softmax"])
def test_row_ops_name_themselves_for_an_x_they_cannot_view_as_rows(op):
    x = st.from_torch(torch.randn(4, 6, K).transpose(0, 1))
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: x of shape"):
        ops.rmsnorm(x, st.ones((K,))) if op == "rmsnorm" else ops.softmax(x)


def test_rmsnorm_names_itself_for_an_out_it_cannot_view_as_rows():
    out = st.from_torch(torch.zeros(K, 2, 3).permute(2, 1, 0))
    with pytest.raises(st.ArgumentError, match="ops.rmsnorm: out"):
        ops.rmsnorm(st.zeros((3, 2, K)), st.ones((K,)), out=out)


# ---- softmax ---------------------------------------------------------------------------------

def test_softmax_refuses_rows_longer_than_one_tile_with_an_argument_error():
    with pytest.raises(st.ArgumentError, match=r"ops.softmax: rows longer than 1048576"):
        ops.softmax(st.zeros((1, 2**20 + 1)))


@pytest.mark.parametrize("chunk", [3, 0, -4, True])
def test_softmax_refuses_a_chunk_that_is_not_a_power_of_two(chunk):
    with pytest.raises(st.ArgumentError, match="ops.softmax: chunk must be a power of two"):
        ops.softmax(st.zeros((2, 20)), one_pass_max=8, chunk=chunk)


# ---- argmax ---------------------------------------------------------------------------------

def test_argmax_refuses_an_empty_x():
    with pytest.raises(st.ArgumentError, match="ops.argmax: x is empty"):
        ops.argmax(st.zeros((0,)))


@pytest.mark.parametrize("block", [0, 1000, -1, True])
def test_argmax_refuses_a_block_that_is_not_a_power_of_two(block):
    with pytest.raises(st.ArgumentError, match="ops.argmax: block must be a power of two"):
        ops.argmax(st.zeros((3000,)), block=block)
    with pytest.raises(st.ArgumentError, match="argmax_workspace: block must be a power"):
        ops.argmax_workspace(3000, block=block)


class _TwoFacedInt(int):
    """An int that compares as 64 but converts to 3 (``int()`` of it)."""

    def __int__(self):
        return 3

    __index__ = __int__


def test_a_tile_size_is_checked_as_the_int_the_op_uses():
    with pytest.raises(st.ArgumentError, match="ops.argmax: block must be a power of two"):
        ops.argmax(st.zeros((3000,)), block=_TwoFacedInt(64))


def test_argmax_takes_a_numpy_int_block():
    t = rand(3000, st.f32, 6)
    assert ops.argmax(wrap(t), block=np.int64(256)).sync().to_torch().item() == t.argmax()


def test_argmax_says_a_shared_x_must_be_1d():
    with pytest.raises(st.ArgumentError, match=r"ops.argmax: a Shared x must be 1-D"):
        ops.argmax(st.zeros((1, 100)).share())


def test_argmax_never_picks_a_nan_and_all_nans_give_0():
    t = rand(3000, st.f32, 7)
    t[t.argmax()] = float("nan")
    t[2500] = float("nan")
    finite = torch.where(t.isnan(), -torch.inf, t)
    assert ops.argmax(wrap(t)).sync().to_torch().item() == finite.argmax()
    assert ops.argmax(st.full((3000,), float("nan"))).sync().to_torch().item() == 0


def test_rmsnorm_gemv_argmax_refuses_an_empty_vocabulary():
    with pytest.raises(st.ArgumentError, match="ops.rmsnorm_gemv_argmax: w has no rows"):
        ops.rmsnorm_gemv_argmax(st.ones((K,)), st.ones((K,)), st.zeros((0, K)))


@pytest.mark.parametrize("how,named", [("token", "token's dtype"), ("dtype", "dtype")])
def test_rmsnorm_gemv_argmax_names_itself_and_the_argument_for_a_float_token(how, named):
    kw = dict(token=st.empty((1,))) if how == "token" else dict(dtype=st.f32)
    with pytest.raises(st.ArgumentError, match=f"ops.rmsnorm_gemv_argmax: {named} must be st.i32"):
        ops.rmsnorm_gemv_argmax(st.ones((K,)), st.ones((K,)), st.zeros((300, K)), **kw)


@pytest.mark.parametrize("how,named", [("out", "out's dtype"), ("dtype", "dtype")])
def test_argmax_names_the_argument_whose_dtype_is_not_an_index(how, named):
    kw = dict(out=st.empty((1,))) if how == "out" else dict(dtype=st.f32)
    with pytest.raises(st.ArgumentError, match=f"ops.argmax: {named} must be st.i32 or st.i64"):
        ops.argmax(st.ones((64,)), **kw)


@pytest.mark.parametrize("op", ["gemv_add", "rmsnorm_gemv", "silu_mul_gemv_add",
                                "rmsnorm_gemv_argmax"])
def test_a_fused_gemv_given_a_prefetch_config_names_itself(op):
    from safetile.ops.gemv import GemvConfig
    cfg = GemvConfig(bn=16, bk=64, num_warps=4, num_stages=2, prefetch=1)
    w = st.ones((32, K))
    args = {"gemv_add": (w, st.ones((K,)), st.ones((32,))),
            "rmsnorm_gemv": (st.ones((K,)), st.ones((K,)), w),
            "silu_mul_gemv_add": (w, st.ones((2, K)), st.ones((32,))),
            "rmsnorm_gemv_argmax": (st.ones((K,)), st.ones((K,)), w)}[op]
    with pytest.raises(st.ArgumentError, match=rf"ops\.{op}: config\.prefetch is not supported"):
        getattr(ops, op)(*args, config=cfg)


# ---- products --------------------------------------------------------------------------------

@pytest.mark.parametrize("out_dtype", ["float32", torch.float16, st.i32])
def test_matrix_products_refuse_an_out_dtype_that_is_not_a_float_st_dtype(out_dtype):
    with pytest.raises(st.ArgumentError, match="ops.matmul: out_dtype must be"):
        ops.matmul(st.zeros((8, 16)), st.zeros((16, 12)), out_dtype=out_dtype)
    with pytest.raises(st.ArgumentError, match="ops.gemv: out_dtype must be"):
        ops.gemv(st.zeros((8, 16)), st.zeros((16,)), out_dtype=out_dtype)


@pytest.mark.parametrize("field,value", [("split_k", 0), ("bk", 0), ("bk", 48), ("bk", 8),
                                         ("bm", 3), ("bn", 0), ("group_size", 0),
                                         ("num_stages", 0), ("head_rows", -1),
                                         ("flatten", "no"), ("pdl", "yes"), ("tail", 3),
                                         ("num_warps", 3), ("num_warps", 64),
                                         ("num_stages", 65)])
def test_matmul_config_refuses_a_field_the_kernels_cannot_take(field, value):
    args = dict(bm=16, bn=16, bk=16, num_warps=4, num_stages=2)
    with pytest.raises(st.ArgumentError, match=f"MatmulConfig: {field}"):
        ops.MatmulConfig(**{**args, field: value})


@pytest.mark.parametrize("field,value", [("bn", 3), ("bk", 0), ("bk", 12), ("head", 1),
                                         ("prefetch", -1), ("num_stages", 0), ("tma", "no"),
                                         ("num_warps", 3), ("num_warps", 64),
                                         ("num_stages", 65)])
def test_gemv_config_refuses_a_field_the_kernels_cannot_take(field, value):
    args = dict(bn=4, bk=16, num_warps=4, num_stages=2)
    with pytest.raises(st.ArgumentError, match=f"GemvConfig: {field}"):
        ops.GemvConfig(**{**args, field: value})


# ---- rope and element-wise -------------------------------------------------------------------

@pytest.mark.parametrize("theta", [0.0, -1.0, float("nan"), float("inf"), "1e6", True])
def test_rope_refuses_a_theta_that_is_not_a_positive_finite_number(theta):
    with pytest.raises(st.ArgumentError, match="ops.inv_freq_table: theta must be"):
        ops.inv_freq_table(16, theta)
    with pytest.raises(st.ArgumentError, match="ops.rope: theta must be"):
        ops.rope(st.zeros((5, 3, 16)), st.from_torch(torch.arange(5)), theta=theta)


@pytest.mark.parametrize("head_dim", [-4, 0, 7, 8.0, True])
def test_inv_freq_table_refuses_a_head_dim_that_is_not_a_positive_even_int(head_dim):
    with pytest.raises(st.ArgumentError, match="ops.inv_freq_table: head_dim must be"):
        ops.inv_freq_table(head_dim)


@pytest.mark.parametrize("op", ["inv_freq_table", "rope"])
def test_rope_ops_refuse_a_head_dim_over_one_tile(op):
    call = {"inv_freq_table": lambda: ops.inv_freq_table(2**40),
            "rope": lambda: ops.rope(st.zeros((1, 1, 2**21)), st.zeros((1,), dtype=st.i32))}
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: head_dim must be .*1048576"):
        call[op]()


@pytest.mark.parametrize("op", ["add", "silu_mul", "add_scalar", "copy"])
@pytest.mark.parametrize("block", [3, 0, 2**21, True])
def test_elementwise_ops_refuse_a_block_that_is_not_a_power_of_two_tile(op, block):
    x = st.zeros((100,))
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: block must be a power of two"):
        if op == "add_scalar":
            ops.add_scalar(x, 1, block=block)
        elif op == "copy":
            ops.copy(x, st.empty((100,)), block=block)
        else:
            getattr(ops, op)(x, st.zeros((100,)), block=block)


@pytest.mark.parametrize("num_warps", [[4], 4.0, "4"], ids=["list", "float", "str"])
def test_elementwise_ops_refuse_a_num_warps_that_is_not_a_warp_count(num_warps):
    x = wrap(rand(64, st.f32, 0))
    ops.add(x, x, num_warps=4).sync()                      # a cached copy for 4 warps
    with pytest.raises(st.ArgumentError, match="num_warps"):
        ops.add(x, x, num_warps=num_warps)


@pytest.mark.parametrize("field", ["values", "indices"])
def test_argmax_refuses_a_workspace_buffer_that_is_not_a_tensor(field):
    ws = ops.argmax_workspace(64, device="cpu", block=16)
    bad = ops.ArgmaxWorkspace(**{**vars(ws), field: getattr(ws, field).share()})
    with pytest.raises(st.ArgumentError, match=f"workspace.{field}.*st.Tensor"):
        ops.argmax(wrap(rand(64, st.f32, 1)), workspace=bad)


def test_rmsnorm_gemv_argmax_refuses_a_workspace_buffer_that_is_not_a_tensor():
    w = wrap(rand((64, 32), st.f32, 2))
    ws = ops.gemv_argmax_workspace(w)
    bad = ops.ArgmaxWorkspace(ws.values.share(), ws.indices, ws.block)
    with pytest.raises(st.ArgumentError, match="workspace.values.*st.Tensor"):
        ops.rmsnorm_gemv_argmax(wrap(rand(32, st.f32, 3)), wrap(rand(32, st.f32, 4)), w,
                                workspace=bad)


@pytest.mark.parametrize("field", ["stats", "values", "states"])
def test_sample_refuses_a_workspace_buffer_that_is_not_a_tensor(field):
    ws = ops.sampler_workspace(64, device="cpu")
    fields = dict(vars(ws))
    fields[field] = (ws.states[0].share(), ws.states[1]) if field == "states" else \
        getattr(ws, field).share()
    with pytest.raises(st.ArgumentError, match=f"workspace.{field}.*st.Tensor"):
        ops.sample(wrap(rand(64, st.f32, 5)), ops.sampling_params(1.0, device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32),
                   workspace=type(ws)(**fields))


def test_sample_and_rmsnorm_gemv_argmax_refuse_a_workspace_of_another_kind():
    w = wrap(rand((64, 32), st.f32, 6))
    with pytest.raises(st.ArgumentError, match="workspace must be"):
        ops.rmsnorm_gemv_argmax(wrap(rand(32, st.f32, 7)), wrap(rand(32, st.f32, 8)), w,
                                workspace=ops.sampler_workspace(64, device="cpu"))
    with pytest.raises(st.ArgumentError, match="workspace must be"):
        ops.sample(wrap(rand(64, st.f32, 9)), ops.sampling_params(1.0, device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32),
                   workspace=ops.argmax_workspace(64, device="cpu"))


def test_decode_attention_refuses_a_workspace_buffer_that_is_not_a_tensor():
    q, k = wrap(rand((4, 16), st.f32, 10)), wrap(rand((2, 64, 16), st.f32, 11))
    ws = ops.DecodeWorkspace.for_cache(q, k, num_splits=2, block_n=16)
    ws.lse = ws.lse.share()
    with pytest.raises(st.ArgumentError, match="workspace.lse.*st.Tensor"):
        ops.decode_attention(q, k, wrap(rand((2, 64, 16), st.f32, 12)),
                             st.from_torch(torch.tensor([40], dtype=torch.int32)), block_n=16,
                             num_splits=2, workspace=ws)


@pytest.mark.parametrize("call", ["gemv", "rmsnorm_gemv", "gemv_add", "silu_mul_gemv_add",
                                  "matmul"])
def test_a_config_that_is_not_a_config_object_is_an_argument_error(call):
    w, x = wrap(rand((32, K), st.f32, 1)), wrap(rand((K,), st.f32, 2))
    calls = {"gemv": lambda c: ops.gemv(w, x, config=c),
             "rmsnorm_gemv": lambda c: ops.rmsnorm_gemv(x, wrap(rand((K,), st.f32, 3)), w, config=c),
             "gemv_add": lambda c: ops.gemv_add(w, x, wrap(rand((32,), st.f32, 4)), config=c),
             "silu_mul_gemv_add": lambda c: ops.silu_mul_gemv_add(
                 w, wrap(rand((2 * K,), st.f32, 5)), wrap(rand((32,), st.f32, 6)), config=c),
             "matmul": lambda c: ops.matmul(wrap(rand((4, K), st.f32, 7)), w, weight=True, config=c)}
    for bad in ({}, {"bn": 4}, "default"):
        with pytest.raises(st.ArgumentError, match=rf"ops.{call}: config must be an ops\."):
            calls[call](bad)


@pytest.mark.parametrize("weight", [1, "yes", None])
def test_matmul_weight_is_a_flag(weight):
    with pytest.raises(st.ArgumentError, match="ops.matmul: weight must be True or False"):
        ops.matmul(wrap(rand((4, K), st.f32, 1)), wrap(rand((K, 8), st.f32, 2)), weight=weight)


@pytest.mark.parametrize("num_warps", [0, 3, 64])
def test_elementwise_num_warps_must_be_a_power_of_two_up_to_32(num_warps):
    with pytest.raises(st.ArgumentError, match="ops.add: num_warps must be a power of two"):
        ops.add(wrap(rand((64,), st.f32, 1)), wrap(rand((64,), st.f32, 2)), num_warps=num_warps)


@pytest.mark.parametrize("make", ["inv_freq_table", "sampling_params", "sampling_key", "rope"])
def test_ops_that_allocate_their_tables_are_refused_inside_a_graph_scope(make):
    x, out = wrap(rand((4, 2, 8), st.f32, 1)), st.empty((4, 2, 8), device="cpu")
    pos = st.from_torch(torch.arange(4, dtype=torch.int32))
    calls = {"inv_freq_table": lambda: ops.inv_freq_table(8, device="cpu"),
             "sampling_params": lambda: ops.sampling_params(0.5, device="cpu"),
             "sampling_key": lambda: ops.sampling_key(7, device="cpu"),
             "rope": lambda: ops.rope(x, pos, out=out)}           # its default table
    with pytest.raises(st.GraphCaptureError, match="allocates inside st.graph_scope"):
        with st.graph_scope():
            calls[make]()


def allocating_calls() -> dict:
    """Ops given every buffer but one, which they would allocate (made before a scope)."""
    x, v = wrap(rand((4, 2, 8), st.f32, 1)), wrap(rand((300,), st.f32, 2))
    pos, i64 = st.from_torch(torch.arange(4, dtype=torch.int32)), st.empty((1,), dtype=st.i64)
    q, k = wrap(rand((4, 16), st.f32, 3)), wrap(rand((2, 200, 16), st.f32, 4))
    w, i32 = wrap(rand((300, K), st.f32, 5)), st.empty((1,), dtype=st.i32)
    params, key = ops.sampling_params(0.5, device="cpu"), ops.sampling_key(1, device="cpu")
    logits, attn, rotated = st.empty((300,)), st.empty((4, 16)), st.empty((4, 2, 8))
    return {
        "ops.add: out": lambda: ops.add(x, x),
        "ops.rope: inv_freq": lambda: ops.rope(x, pos, out=rotated),
        "ops.argmax: workspace": lambda: ops.argmax(v, out=i64),
        "ops.sample: workspace": lambda: ops.sample(v, params, key, i32, out=i32),
        "ops.decode_attention: workspace": lambda: ops.decode_attention(
            q, k, k, i32, out=attn, num_splits=2),
        "ops.rmsnorm_gemv_argmax: workspace": lambda: ops.rmsnorm_gemv_argmax(
            wrap(rand(K, st.f32, 6)), wrap(rand(K, st.f32, 7)), w, logits=logits, token=i64),
    }


@pytest.mark.parametrize("what", list(allocating_calls()))
def test_an_op_that_would_allocate_inside_a_graph_scope_names_what_to_pass(what):
    call = allocating_calls()[what]
    with pytest.raises(st.GraphCaptureError, match=f"{what} was not given: .* pass it"):
        with st.graph_scope():
            call()


@pytest.mark.parametrize("make", ["inv_freq_table", "sampling_params", "sampling_key"])
def test_a_bad_device_for_a_table_is_an_argument_error(make):
    calls = {"inv_freq_table": lambda: ops.inv_freq_table(8, device="bogus"),
             "sampling_params": lambda: ops.sampling_params(0.5, device="bogus"),
             "sampling_key": lambda: ops.sampling_key(7, device="bogus")}
    with pytest.raises(st.ArgumentError, match="'bogus' is not a device"):
        calls[make]()


def test_attention_with_no_kv_heads_or_unhashable_options_is_an_argument_error():
    q, k = wrap(rand((4, 8, 16), st.f32, 1)), wrap(rand((2, 8, 16), st.f32, 2))
    with pytest.raises(st.ArgumentError, match="multiple of the kv heads"):
        ops.flash_attention(q, st.zeros((0, 8, 16)), st.zeros((0, 8, 16)))
    with pytest.raises(st.ArgumentError, match="num_warps must be a power of two"):
        ops.flash_attention(q, k, wrap(rand((2, 8, 16), st.f32, 3)), num_warps=[4])
    with pytest.raises(st.ArgumentError, match="n_kv_heads must be an int >= 1"):
        ops.DecodeWorkspace.for_cache(st.zeros((4, 16)), st.zeros((0, 8, 16)))
    with pytest.raises(st.ArgumentError, match=r"k_cache \(Hkv, max_seq, D\), got"):
        ops.DecodeWorkspace.for_cache(st.zeros((4, 16)), st.zeros((2, 16)))


def test_an_argmax_workspace_of_another_rank_is_refused_when_built():
    ws = ops.argmax_workspace(3000, device="cpu")
    ws.values = st.empty((3, 1), device="cpu")
    with pytest.raises(st.ArgumentError, match="ops.argmax: the workspace holds"):
        ops.argmax(wrap(rand((3000,), st.f32, 1)), workspace=ws)


def test_prologue_attention_fits_takes_ints_only():
    assert ops.prologue_attention_fits(128, 10)
    with pytest.raises(st.ArgumentError, match="head_dim must be an int"):
        ops.prologue_attention_fits("128", 10)


def test_a_cache_of_no_positions_is_an_argument_error():
    hq, hkv, d = 4, 2, 32
    args = (st.randn(((hq + 2 * hkv) * d,), device="cpu"), st.ones((d,), device="cpu"),
            st.ones((d,), device="cpu"), st.from_torch(torch.tensor([0], dtype=torch.int32)),
            ops.inv_freq_table(d, device="cpu"))
    with pytest.raises(st.ArgumentError, match="with max_seq >= 1"):
        ops.qk_norm_rope_kv_append(*args, st.zeros((hkv, 0, d)), st.zeros((hkv, 0, d)))
