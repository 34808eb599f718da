"""ops.qk_norm_rope_attend on the CPU executor: the caches of ops.qk_norm_rope_kv_append and
the output of ops.decode_attention (one split) over the first pos + 1 positions, in one
kernel; and attention as torch computes it from Qwen3's normed, rotated q and k."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap
from test_ops_fused_qk_rope import SHAPE_IDS, SHAPES, THETA, hf_reference, inputs, pos_tensor

cpu_executor = support.cpu_executor(seed=5)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
TOL = {st.f32: 1e-5, st.bf16: 2e-2}
MAX_SEQ = 40


def rel_err(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def attend(qkv, qw, kw, kc, vc, p, d, **kw_):
    return ops.qk_norm_rope_attend(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                   ops.inv_freq_table(d, THETA, "cpu"), wrap(kc), wrap(vc),
                                   **kw_).sync()


def two_kernels(qkv, qw, kw, kc, vc, p, d, block_n):
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(
        wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p), ops.inv_freq_table(d, THETA, "cpu"),
        wrap(kc), wrap(vc)).sync()
    out = ops.decode_attention(q, k_cache, v_cache, pos_tensor(p), length_offset=1,
                               num_splits=1, block_n=block_n).sync()
    return out, k_cache, v_cache


@pytest.mark.parametrize("p", [0, 15, 16, 23, MAX_SEQ - 1], ids=lambda p: f"pos{p}")
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_equals_the_prologue_then_one_kernel_attention(dtype, p):
    qkv, qw, kw, kc, vc = inputs(8, 2, 64, dtype, max_seq=MAX_SEQ, seed=p)
    out, k_cache, v_cache = attend(qkv, qw, kw, kc, vc, p, 64, block_n=16)
    want, k_ref, v_ref = two_kernels(qkv, qw, kw, kc, vc, p, 64, 16)
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())
    assert out.shape == (8, 64) and out.dtype is dtype
    # the scores sum the two rotated halves' products apart: fp32 rounding, then the dtype's
    assert rel_err(out.to_torch(), want.to_torch()) < (1e-6 if dtype is st.f32 else 1e-2)


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_matches_attention_over_qwen3_normed_rotated_q_and_k_in_torch(dtype, hq, hkv, d):
    p = 29
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, dtype, max_seq=MAX_SEQ, seed=70)
    out, _, _ = attend(qkv, qw, kw, kc, vc, p, d)
    q, k_new, v_new = hf_reference(qkv, qw, kw, p, hq, hkv, d)
    k = torch.cat([kc[:, :p], k_new[:, None]], 1).double().repeat_interleave(hq // hkv, 0)
    v = torch.cat([vc[:, :p], v_new[:, None]], 1).double().repeat_interleave(hq // hkv, 0)
    scores = torch.einsum("hd,hnd->hn", q.double(), k) / d ** 0.5
    want = torch.einsum("hn,hnd->hd", torch.softmax(scores, -1), v)
    assert rel_err(out.to_torch(), want) < TOL[dtype]


def test_out_is_written_and_handed_back():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=8, seed=80)
    given = st.empty((4, 32), device="cpu")
    out, _, _ = attend(qkv, qw, kw, kc, vc, 3, 32, out=given)
    assert out is given


def test_a_recorded_step_follows_the_device_position_on_replay():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=16, seed=90)
    pos_t = torch.tensor([2], dtype=torch.int32)
    k_cache, v_cache, out = wrap(kc), wrap(vc), st.empty((hq, d), device="cpu")
    g = ops.qk_norm_rope_attend(wrap(qkv), wrap(qw), wrap(kw), st.from_torch(pos_t),
                                ops.inv_freq_table(d, THETA, "cpu"), k_cache, v_cache,
                                out=out, block_n=16).graph()
    for p in (2, 7, 15):
        pos_t.fill_(p)
        got, k_cache, v_cache = g.launch().sync()
        q = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                       ops.inv_freq_table(d, THETA, "cpu"), wrap(kc.clone()),
                                       wrap(vc.clone())).sync()[0]
        want = ops.decode_attention(q, k_cache, v_cache, pos_tensor(p), length_offset=1,
                                    num_splits=1).sync()
        assert rel_err(got.to_torch(), want.to_torch()) < 1e-6


def test_a_position_outside_the_cache_raises_on_the_cpu_executor():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=8, seed=100)
    with pytest.raises(st.OutOfBoundsError):
        attend(qkv, qw, kw, kc, vc, 8, 32)


def test_a_cache_longer_than_one_program_owns_is_an_argument_error():
    d = 32
    qkv, qw, kw, _, _ = inputs(4, 2, d, st.f32, max_seq=1, seed=110)
    long = ops.max_cache_positions(d) + 1
    kc = st.empty((2, long, d), device="cpu")
    vc = st.empty((2, long, d), device="cpu")
    with pytest.raises(st.ArgumentError, match="qk_norm_rope_kv_append and ops.decode_attention"):
        ops.qk_norm_rope_attend(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(0),
                                ops.inv_freq_table(d, THETA, "cpu"), kc, vc)


def test_it_fits_head_dims_of_32_and_more_and_caches_of_one_programs_slab():
    assert ops.qk_norm_rope_attend_fits(128, ops.max_cache_positions(128))
    assert not ops.qk_norm_rope_attend_fits(128, ops.max_cache_positions(128) + 1)
    assert not ops.qk_norm_rope_attend_fits(16, 64)       # a rotated half under mma's K of 16


def test_a_head_dim_below_32_is_an_argument_error():
    qkv, qw, kw, kc, vc = inputs(4, 2, 16, st.f32, max_seq=8, seed=115)
    with pytest.raises(st.ArgumentError, match="head_dim 16 is below 32"):
        attend(qkv, qw, kw, kc, vc, 1, 16)


@pytest.mark.parametrize("block_n", [8, 48])
def test_a_key_block_not_a_power_of_two_of_at_least_16_is_an_argument_error(block_n):
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=8, seed=120)
    with pytest.raises(st.ArgumentError, match="block_n"):
        attend(qkv, qw, kw, kc, vc, 1, 32, block_n=block_n)


def test_bad_arguments_raise_the_prologues_argument_errors():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=8, seed=130)
    with pytest.raises(st.ArgumentError, match="ops.qk_norm_rope_attend: pos must be an int32"):
        ops.qk_norm_rope_attend(wrap(qkv), wrap(qw), wrap(kw),
                                wrap(torch.tensor([1], dtype=torch.int64)),
                                ops.inv_freq_table(32, THETA, "cpu"), wrap(kc), wrap(vc))
    with pytest.raises(st.ArgumentError, match="caches must both be"):
        ops.qk_norm_rope_attend(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(1),
                                ops.inv_freq_table(32, THETA, "cpu"), wrap(kc),
                                wrap(rand((2, 9, 32), st.f32, 131)))
