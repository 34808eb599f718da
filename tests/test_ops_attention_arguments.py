"""The attention ops' and KV appends' argument checks: a wrong argument is an ArgumentError
naming the op and the argument, raised before anything is launched."""
import numpy as np
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as i32
from support import ROPE_THETA as THETA
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=6)

HQ, HKV, S, D = 4, 2, 200, 16


def decode(q=None, k=None, **kw):
    q = wrap(rand((HQ, D), st.f32, 0)) if q is None else q
    k = wrap(rand((HKV, S, D), st.f32, 1)) if k is None else k
    return ops.decode_attention(q, k, wrap(rand(tuple(k.shape), st.f32, 2)), i32(50), **kw)


def split_workspace():
    q, k = wrap(rand((HQ, D), st.f32, 3)), wrap(rand((HKV, S, D), st.f32, 4))
    ws = ops.DecodeWorkspace.for_cache(q, k, num_splits=4)
    return ops.decode_attention_split(q, k, wrap(rand((HKV, S, D), st.f32, 5)), i32(100),
                                      ws).sync()


# ---- decode_attention_merge's out -------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype", [((8, D), st.f32), ((2, D), st.f32), ((HQ, 32), st.f32),
                                         ((2, 2, D), st.f32), ((HQ, D), st.i32)])
def test_decode_attention_merge_refuses_an_out_of_another_shape_or_dtype(shape, dtype):
    ws = split_workspace()
    with pytest.raises(st.ArgumentError, match=r"ops.decode_attention_merge: out"):
        ops.decode_attention_merge(ws, st.empty(shape, dtype=dtype))


@pytest.mark.parametrize("out", [None, "shared", "torch"])
def test_decode_attention_merge_refuses_an_out_that_is_not_a_tensor(out):
    ws = split_workspace()
    out = {"shared": st.empty((HQ, D)).share(), "torch": torch.empty(HQ, D)}.get(out)
    with pytest.raises(st.ArgumentError, match=r"ops.decode_attention_merge: out: expected"):
        ops.decode_attention_merge(ws, out)


@pytest.mark.parametrize("bf16", [False, True], ids=["f32", "bf16"])
def test_decode_attention_merge_writes_a_valid_out(bf16):
    ws = split_workspace()
    out = ops.decode_attention_merge(ws, st.empty((HQ, D), dtype=st.bf16 if bf16 else st.f32))
    assert torch.isfinite(out.sync().to_torch()).all()


@pytest.mark.parametrize("workspace", [None, "tensor"])
def test_decode_attention_split_refuses_a_workspace_that_is_not_a_decode_workspace(workspace):
    q, k = wrap(rand((HQ, D), st.f32, 6)), wrap(rand((HKV, S, D), st.f32, 7))
    ws = st.empty((HKV, 4, 2, D)) if workspace else None
    with pytest.raises(st.ArgumentError, match="workspace must be a DecodeWorkspace"):
        ops.decode_attention_split(q, k, k, i32(5), ws)


@pytest.mark.parametrize("field, value", [("rows", 1), ("num_splits", 3), ("group", 1)])
def test_a_workspace_whose_fields_were_changed_is_refused(field, value):
    q, k = wrap(rand((HQ, D), st.f32, 6)), wrap(rand((HKV, S, D), st.f32, 7))
    ws = ops.DecodeWorkspace.for_cache(q, k, num_splits=4)
    setattr(ws, field, value)
    with pytest.raises(st.ArgumentError, match="the workspace's fields disagree"):
        ops.decode_attention_split(q, k, k, i32(5), ws)
    with pytest.raises(st.ArgumentError, match="the workspace's fields disagree"):
        ops.decode_attention_merge(ws, st.empty((HQ, D)))


def workspace_calls(ws):
    """Each op that takes a workspace, called with ``ws`` (q, caches and out fit a 4-split one)."""
    q, k = wrap(rand((HQ, D), st.f32, 6)), wrap(rand((HKV, S, D), st.f32, 7))
    return {"decode_attention": lambda: ops.decode_attention(q, k, k, i32(5), workspace=ws),
            "decode_attention_split": lambda: ops.decode_attention_split(q, k, k, i32(5), ws),
            "decode_attention_merge": lambda: ops.decode_attention_merge(ws, st.empty((HQ, D)))}


def four_splits():
    return ops.DecodeWorkspace(HKV, HQ // HKV, D, 4, device="cpu")


@pytest.mark.parametrize("op", ["decode_attention", "decode_attention_split",
                                "decode_attention_merge"])
@pytest.mark.parametrize("field, value", [("group", 2.0), ("rows", 16.0), ("num_splits", "4"),
                                          ("num_splits", None)])
def test_a_workspace_count_that_is_not_an_int_is_refused_naming_the_field(op, field, value):
    ws = four_splits()
    setattr(ws, field, value)
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: workspace.{field} must be an int"):
        workspace_calls(ws)[op]()


@pytest.mark.parametrize("op", ["decode_attention", "decode_attention_split",
                                "decode_attention_merge"])
def test_a_workspace_whose_constructor_never_ran_is_an_argument_error(op):
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: workspace.group must be an int"):
        workspace_calls(object.__new__(ops.DecodeWorkspace))[op]()


@pytest.mark.parametrize("op", ["decode_attention", "decode_attention_split",
                                "decode_attention_merge"])
@pytest.mark.parametrize("field", ["partial", "lse"])
def test_a_workspace_buffer_that_is_not_float32_is_refused_naming_the_buffer(op, field):
    ws = four_splits()
    setattr(ws, field, st.zeros(tuple(getattr(ws, field).shape), dtype=st.bf16))
    with pytest.raises(st.ArgumentError, match=rf"ops.{op}: workspace.{field} must be "
                                               rf"st.float32, got st.bfloat16"):
        workspace_calls(ws)[op]()


def test_a_workspace_whose_split_count_is_a_numpy_int_runs_as_that_int():
    q, k, v = (wrap(rand(s, st.f32, i)) for i, s in enumerate([(HQ, D), (HKV, S, D),
                                                                 (HKV, S, D)]))
    want = ops.decode_attention(q, k, v, i32(150), workspace=four_splits()).sync()
    ws = four_splits()
    ws.num_splits = np.int64(4)
    got = ops.decode_attention(q, k, v, i32(150), workspace=ws).sync()
    assert torch.equal(got.to_torch(), want.to_torch())
    split = ops.decode_attention_split(q, k, v, i32(150), ws).sync()
    assert torch.equal(ops.decode_attention_merge(split, st.empty((HQ, D))).sync().to_torch(),
                       want.to_torch())


def test_decode_attention_split_names_the_workspace_buffers_that_overlap():
    ws = four_splits()
    ws.lse = ws.partial.view(-1).slice(0, 0, HKV * 4 * 2).view(HKV, 4, 2, 1)
    q, k = wrap(rand((HQ, D), st.f32, 6)), wrap(rand((HKV, S, D), st.f32, 7))
    with pytest.raises(st.AliasError, match="ops.decode_attention_split: the output "
                                            "workspace.partial overlaps the output "
                                            "workspace.lse"):
        ops.decode_attention_split(q, k, k, i32(5), ws)


@pytest.mark.parametrize("block_n", ["64", 0, 8, 48])
def test_for_cache_refuses_a_block_n_that_is_not_a_power_of_two_from_16(block_n):
    with pytest.raises(st.ArgumentError, match="DecodeWorkspace.for_cache: block_n must be a "
                                               "power of two"):
        ops.DecodeWorkspace.for_cache(st.zeros((HQ, D)), st.zeros((HKV, S, D)), block_n=block_n)


# ---- decode_attention options ----------------------------------------------------------------

def test_decode_attention_takes_numpy_ints_for_counts_and_sizes():
    got = decode(num_splits=np.int64(2), block_n=np.int64(32),
                 length_offset=np.int64(1)).sync().to_torch()
    want = decode(num_splits=2, block_n=32, length_offset=1).sync().to_torch()
    assert torch.equal(got, want)


@pytest.mark.parametrize("name,value", [("cyclic", "no"), ("pdl", "yes"), ("masked", 1),
                                        ("early", "x"), ("trigger_early", 0)])
def test_decode_attention_refuses_a_truthy_non_bool_option(name, value):
    with pytest.raises(st.ArgumentError, match=f"ops.decode_attention: {name} must be True"):
        decode(num_splits=2, **{name: value})


@pytest.mark.parametrize("splits", [None, 1, 4])
def test_decode_attention_of_no_q_heads_gives_an_empty_result_for_any_split_count(splits):
    out = decode(q=st.zeros((0, D)), num_splits=splits).sync()
    assert out.shape == (0, D)


@pytest.mark.parametrize("value", [True, 2.0, 0, -1])
def test_decode_attention_refuses_a_num_splits_that_is_not_a_positive_int(value):
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: num_splits"):
        decode(num_splits=value)


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("value", [48, 8, -64, 0, True])
def test_decode_attention_refuses_a_block_n_that_is_not_a_power_of_two_from_16(splits, value):
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: block_n must be a power"):
        decode(num_splits=splits, block_n=value)


@pytest.mark.parametrize("value", [True, 1.0, 2**40])
def test_decode_attention_refuses_a_length_offset_that_is_not_an_int32_int(value):
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: length_offset"):
        decode(length_offset=value)


@pytest.mark.parametrize("value", ["abc", True, float("nan"), float("inf")])
def test_attention_ops_refuse_a_scale_that_is_not_a_finite_number(value):
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: scale"):
        decode(scale=value)
    x = wrap(rand((2, 16, 16), st.f32, 8))
    with pytest.raises(st.ArgumentError, match="ops.flash_attention: scale"):
        ops.flash_attention(x, x, x, scale=value)


def test_attention_ops_refuse_a_head_dim_below_16():
    with pytest.raises(st.ArgumentError, match="ops.decode_attention: head_dim 8"):
        decode(q=wrap(rand((HQ, 8), st.f32, 9)), k=wrap(rand((HKV, S, 8), st.f32, 10)))
    x = wrap(rand((2, 16, 8), st.f32, 11))
    with pytest.raises(st.ArgumentError, match="ops.flash_attention: head_dim 8"):
        ops.flash_attention(x, x, x)


@pytest.mark.parametrize("kw", [dict(block_m=48), dict(block_m=0), dict(block_n=8),
                                dict(block_n=0), dict(block_m=np.int64(12))])
def test_flash_attention_refuses_a_block_that_is_not_a_power_of_two_from_16(kw):
    x = wrap(rand((2, 16, 16), st.f32, 12))
    with pytest.raises(st.ArgumentError, match=f"ops.flash_attention: {next(iter(kw))} must"):
        ops.flash_attention(x, x, x, **kw)


def test_flash_attention_takes_numpy_ints_for_block_sizes():
    t = rand((2, 16, 16), st.f32, 13)
    got = ops.flash_attention(wrap(t), wrap(t), wrap(t), block_m=np.int64(16)).sync()
    want = ops.flash_attention(wrap(t), wrap(t), wrap(t), block_m=16).sync()
    assert torch.equal(got.to_torch(), want.to_torch())


# ---- KV appends and the decode prologue ------------------------------------------------------

@pytest.mark.parametrize("many", [False, True], ids=["kv_append", "kv_append_many"])
def test_kv_append_refuses_a_shared_cache(many):
    new = st.zeros((2, 3, 16) if many else (2, 16))
    append = ops.kv_append_many if many else ops.kv_append
    with pytest.raises(st.ArgumentError, match="k_cache: expected an st.Tensor.*read-only"):
        append(new, new, i32(1), st.zeros((2, 20, 16)).share(), st.zeros((2, 20, 16)))


@pytest.mark.parametrize("many", [False, True], ids=["kv_append", "kv_append_many"])
@pytest.mark.parametrize("value", [True, 0, 3, -8, 2**20])
def test_kv_append_refuses_a_block_s_that_is_not_a_power_of_two_tile(many, value):
    new = st.zeros((2, 3, 16) if many else (2, 16))
    append = ops.kv_append_many if many else ops.kv_append
    with pytest.raises(st.ArgumentError, match="block_s must be a power of two"):
        append(new, new, i32(1), st.zeros((2, 20, 16)), st.zeros((2, 20, 16)), block_s=value)


PROLOGUES = {
    "qk_norm_rope_kv_append": lambda a, **kw: ops.qk_norm_rope_kv_append(*a, **kw),
    "qk_norm_rope_append_attention":
        lambda a, **kw: ops.qk_norm_rope_append_attention(*a, **kw),
    "qk_norm_rope": lambda a, **kw: ops.qk_norm_rope(*a[:5], 2, **kw),
    "qk_norm_rope_attention": lambda a, **kw: ops.qk_norm_rope_attention(*a, **kw),
}


def prologue_args():
    a = support.prologue_arguments(max_seq=16, seed=14)
    return [wrap(a[n]) for n in ("qkv", "q_norm_weight", "k_norm_weight", "pos")] + \
        [ops.inv_freq_table(32, THETA, "cpu"), wrap(a["k_cache"]), wrap(a["v_cache"])]


@pytest.mark.parametrize("op", sorted(PROLOGUES))
@pytest.mark.parametrize("eps", [None, "abc", -1.0, float("nan"), True])
def test_decode_prologues_refuse_an_eps_that_is_not_a_finite_number_from_0(op, eps):
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: eps"):
        PROLOGUES[op](prologue_args(), eps=eps)


@pytest.mark.parametrize("op", sorted(PROLOGUES))
@pytest.mark.parametrize("name", ["pdl", "trigger_early"])
def test_decode_prologues_refuse_a_truthy_non_bool_option(op, name):
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: {name} must be True"):
        PROLOGUES[op](prologue_args(), **{name: "yes"})


@pytest.mark.parametrize("name", ["pdl", "trigger_early"])
def test_kv_append_refuses_a_truthy_non_bool_option(name):
    new = st.zeros((2, 16))
    with pytest.raises(st.ArgumentError, match=f"ops.kv_append: {name} must be True"):
        ops.kv_append(new, new, i32(1), st.zeros((2, 20, 16)), st.zeros((2, 20, 16)),
                      **{name: "no"})


@pytest.mark.parametrize("op", ["qk_norm_rope_kv_append", "qk_norm_rope_append_attention"])
@pytest.mark.parametrize("cache", ["k_cache", "v_cache"])
def test_decode_prologues_that_append_refuse_a_shared_cache(op, cache):
    args = prologue_args()
    at = 5 if cache == "k_cache" else 6
    args[at] = args[at].share()
    with pytest.raises(st.ArgumentError, match=f"ops.{op}: {cache}: expected an st.Tensor"):
        PROLOGUES[op](args)
    args[at].release()


def test_the_prologue_that_only_reads_the_caches_takes_them_shared():
    args = prologue_args()
    args[5], args[6] = args[5].share(), args[6].share()
    q, k_new = PROLOGUES["qk_norm_rope_attention"](args).sync()
    assert q.shape[1] == 32
