"""ops.qk_norm_rope_append_attention on the CPU executor: the prologue and one-split decode
attention in one kernel, equal to ops.qk_norm_rope_kv_append then ops.decode_attention."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as pos_tensor
from support import PROLOGUE_SHAPE_IDS as SHAPE_IDS
from support import PROLOGUE_SHAPES as SHAPES
from support import ROPE_THETA as THETA
from support import prologue_chain as chain
from support import prologue_inputs, wrap

cpu_executor = support.cpu_executor(seed=5)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
# The fused scores sum the two rotated halves' products: fp32 summation order only, but
# in bf16 P is rounded against a running max that may differ in its last bit.
TOL = {st.f32: 1e-5, st.bf16: 2e-2}


def inputs(hq, hkv, d, dtype, max_seq=80, seed=0):
    return prologue_inputs(hq, hkv, d, dtype, max_seq, seed)


def fused(qkv, qw, kw, kc, vc, p, d, **kw_args):
    return ops.qk_norm_rope_append_attention(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                             ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                             wrap(vc), **kw_args).sync()


def torch_attention(q, k_cache, v_cache, p):
    """fp32 attention of q (Hq, D) over rows 0..p of the caches (Hkv, S, D)."""
    group = q.shape[0] // k_cache.shape[0]
    k = k_cache[:, :p + 1].float().repeat_interleave(group, 0)
    v = v_cache[:, :p + 1].float().repeat_interleave(group, 0)
    w = torch.softmax(torch.einsum("hd,hnd->hn", q.float(), k) / q.shape[1] ** 0.5, -1)
    return torch.einsum("hn,hnd->hd", w, v)


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("p", [0, 63, 64, 77])
def test_equals_the_prologue_then_one_split_attention(dtype, hq, hkv, d, p):
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, dtype)
    out, k_cache, v_cache = fused(qkv, qw, kw, kc, vc, p, d)
    want, k_ref, v_ref = chain(qkv, qw, kw, kc, vc, p, d)
    assert out.shape == (hq, d) and out.dtype is dtype
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())
    torch.testing.assert_close(out.to_torch().float(), want.to_torch().float(),
                               rtol=TOL[dtype], atol=TOL[dtype])


def test_attends_the_appended_row_and_no_row_past_it():
    hq, hkv, d, p = 8, 2, 64, 40
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, seed=10)
    kc[:, p + 1:], vc[:, p + 1:] = float("nan"), float("nan")
    q_rot, k_ref, v_ref = ops.qk_norm_rope_kv_append(
        wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p), ops.inv_freq_table(d, THETA, "cpu"),
        wrap(kc.clone()), wrap(vc.clone())).sync()
    out, _, _ = fused(qkv, qw, kw, kc, vc, p, d)
    want = torch_attention(q_rot.to_torch(), k_ref.to_torch(), v_ref.to_torch(), p)
    assert torch.isfinite(out.to_torch()).all()
    torch.testing.assert_close(out.to_torch(), want, rtol=1e-5, atol=1e-5)


def test_writes_into_a_given_output_and_returns_it():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, seed=20)
    given = st.empty((hq, d), st.f32)
    out, _, _ = fused(qkv, qw, kw, kc, vc, 9, d, out=given)
    want, _, _ = chain(qkv, qw, kw, kc, vc, 9, d)
    assert out is given
    torch.testing.assert_close(given.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)


def test_a_recorded_step_follows_the_device_position_on_replay():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=48, seed=30)
    pos_t = torch.tensor([0], dtype=torch.int32)
    k_cache, v_cache, out = wrap(kc.clone()), wrap(vc.clone()), st.empty((hq, d), st.f32)
    g = ops.qk_norm_rope_append_attention(wrap(qkv), wrap(qw), wrap(kw), st.from_torch(pos_t),
                                          ops.inv_freq_table(d, THETA, "cpu"), k_cache,
                                          v_cache, out=out).graph()
    for p in (3, 17, 47):
        pos_t.fill_(p)
        got, k_cache, v_cache = g.launch().sync()
        want, k_ref, _ = chain(qkv, qw, kw, k_cache.to_torch().clone(),
                               v_cache.to_torch().clone(), p, d)
        assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
        torch.testing.assert_close(got.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)


def test_a_position_outside_the_cache_raises_on_the_cpu_executor():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=16, seed=40)
    with pytest.raises(st.OutOfBoundsError):
        fused(qkv, qw, kw, kc, vc, 16, 32)


def test_a_cache_longer_than_one_program_owns_is_refused():
    d = 32
    longest = ops.max_cache_positions(d)
    assert ops.prologue_attention_fits(d, longest)
    qkv, qw, kw, kc, vc = inputs(2, 1, d, st.f32, max_seq=longest + 1, seed=50)
    with pytest.raises(st.ArgumentError, match="more than one program owns"):
        fused(qkv, qw, kw, kc, vc, 3, d)


def test_a_head_dim_below_32_is_refused():
    qkv, qw, kw, kc, vc = inputs(4, 2, 16, st.f32, max_seq=16, seed=55)
    assert not ops.prologue_attention_fits(16, 16) and ops.prologue_attention_fits(32, 16)
    with pytest.raises(st.ArgumentError, match="head_dim 16 is below 32"):
        fused(qkv, qw, kw, kc, vc, 3, 16)


@pytest.mark.parametrize("change,match", [
    (dict(pos=torch.tensor([1], dtype=torch.int64)), "pos must be an int32"),
    (dict(qkv=torch.ones(5 * 32)), "qkv must hold"),
    (dict(v_cache=torch.ones(2, 9, 32)), "caches must both be"),
])
def test_bad_arguments_raise_argument_errors(change, match):
    args = support.prologue_arguments(max_seq=16, seed=60)
    args.update(change)
    with pytest.raises(st.ArgumentError, match=match):
        ops.qk_norm_rope_append_attention(**{k: wrap(v) for k, v in args.items()})


def test_a_block_size_that_is_not_a_power_of_two_is_refused():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=16, seed=70)
    with pytest.raises(st.ArgumentError, match="block_n must be a power of two"):
        fused(qkv, qw, kw, kc, vc, 3, 32, block_n=48)


def test_a_block_size_whose_key_tile_is_over_the_element_limit_is_refused():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=16, seed=71)
    with pytest.raises(st.ArgumentError, match=r"qk_norm_rope_append_attention: block_n must "
                                                r"be a power of two in \[16, 32768\]"):
        fused(qkv, qw, kw, kc, vc, 3, 32, block_n=1 << 16)
