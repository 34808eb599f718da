"""ops.rmsnorm and ops.add_rmsnorm on the CPU executor, against Qwen3's RMSNorm in torch.

The reference is transformers' Qwen3RMSNorm: fp32 math, the normalized value rounded to the
input dtype, then multiplied by the weight. Only the order of the row sum may differ.
"""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap

DTYPES, IDS = support.FLOAT_DTYPES, support.FLOAT_IDS
TOL = {st.f32: 1e-5, st.f16: 1e-3, st.bf16: 8e-3}


cpu_executor = support.cpu_executor(seed=2)


def qwen3_rmsnorm(x, weight, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def close(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rmsnorm_matches_qwen3_on_a_row_length_that_is_not_a_power_of_two(dtype):
    x, w = rand((5, 300), dtype, 0), rand(300, dtype, 1)
    z = ops.rmsnorm(wrap(x), wrap(w), 1e-6).sync()
    assert z.dtype is dtype
    close(z.to_torch(), qwen3_rmsnorm(x, w, 1e-6), dtype)


def test_short_rows_share_a_program_and_the_row_count_need_not_divide_it():
    x, w = rand((37, 64), st.f32, 2), rand(64, st.f32, 3)   # 37 rows, 64 rows per program
    z = ops.rmsnorm(wrap(x), wrap(w), 1e-5).sync()
    close(z.to_torch(), qwen3_rmsnorm(x, w, 1e-5), st.f32)


def test_rmsnorm_normalizes_the_last_dim_of_3d_and_1d_inputs():
    x3, x1, w = rand((2, 3, 128), st.bf16, 4), rand(128, st.bf16, 5), rand(128, st.bf16, 6)
    z3 = ops.rmsnorm(wrap(x3), wrap(w)).sync()
    z1 = ops.rmsnorm(wrap(x1), wrap(w)).sync()
    assert z3.shape == (2, 3, 128) and z1.shape == (128,)
    close(z3.to_torch(), qwen3_rmsnorm(x3, w, 1e-6), st.bf16)
    close(z1.to_torch(), qwen3_rmsnorm(x1, w, 1e-6), st.bf16)


def test_rmsnorm_reads_a_strided_view():
    qkv = rand((4, 3 * 64), st.f32, 7)
    w = rand(64, st.f32, 8)
    z = ops.rmsnorm(wrap(qkv).slice(1, 64, 128), wrap(w)).sync()
    close(z.to_torch(), qwen3_rmsnorm(qkv[:, 64:128], w, 1e-6), st.f32)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_add_rmsnorm_returns_the_rounded_sum_and_its_norm(dtype):
    x, r, w = rand((3, 200), dtype, 9), rand((3, 200), dtype, 10), rand(200, dtype, 11)
    total, z = ops.add_rmsnorm(wrap(x), wrap(r), wrap(w), 1e-6).sync()
    assert torch.equal(total.to_torch(), x + r)
    close(z.to_torch(), qwen3_rmsnorm(x + r, w, 1e-6), dtype)


def test_add_rmsnorm_writes_into_given_buffers():
    x, r, w = rand((2, 64), st.f32, 12), rand((2, 64), st.f32, 13), rand(64, st.f32, 14)
    out, res = st.empty((2, 64), device="cpu"), st.empty((2, 64), device="cpu")
    total, z = ops.add_rmsnorm(wrap(x), wrap(r), wrap(w), out=out, residual_out=res).sync()
    assert total is res and z is out
    assert torch.equal(res.to_torch(), x + r)


def test_the_residual_sum_cannot_overwrite_an_input():
    x, r, w = wrap(rand((2, 64), st.f32, 0)), wrap(rand((2, 64), st.f32, 1)), wrap(rand(64, st.f32, 2))
    with pytest.raises(st.AliasError):
        ops.add_rmsnorm(x, r, w, residual_out=r)


def test_the_weight_must_match_the_last_dim():
    with pytest.raises(ValueError, match="weight"):
        ops.rmsnorm(wrap(rand((2, 64), st.f32, 0)), wrap(rand(32, st.f32, 1)))
