"""ops.softmax on the CPU executor, against torch.softmax in fp32: the one-pass kernel and the
chunked two-pass (online max and sum) kernel for long rows."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import wrap

DTYPES, IDS = support.FLOAT_DTYPES, support.FLOAT_IDS
TOL = {st.f32: 1e-6, st.f16: 1e-3, st.bf16: 8e-3}


cpu_executor = support.cpu_executor(seed=5)


def rand(shape, dtype, seed, scale=4.0):
    return support.rand(shape, dtype, seed, scale)


def close(got, x, dtype):
    want = torch.softmax(x.float(), dim=-1)
    torch.testing.assert_close(got.float(), want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rows_that_fit_one_tile(dtype):
    x = rand((37, 300), dtype, 0)
    z = ops.softmax(wrap(x)).sync()
    assert z.dtype is dtype
    close(z.to_torch(), x, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_long_rows_are_walked_in_chunks_with_an_online_max(dtype):
    x = rand((3, 1000), dtype, 1)                    # 8 chunks of 128, the last one partial
    x[1, 900] = 60.0                                 # the max arrives late: the sum is rescaled
    z = ops.softmax(wrap(x), one_pass_max=256, chunk=128).sync()
    close(z.to_torch(), x, dtype)


def test_a_1d_input_is_one_row():
    x = rand(50, st.f32, 2)
    z = ops.softmax(wrap(x)).sync()
    assert z.shape == (50,)
    close(z.to_torch(), x, st.f32)


def test_rows_sum_to_one_and_minus_infinity_gets_zero_probability():
    x = rand((2, 20), st.f32, 3)
    x[0, 5] = float("-inf")
    z = ops.softmax(wrap(x), one_pass_max=8, chunk=8).sync().to_torch()
    assert z[0, 5] == 0
    torch.testing.assert_close(z.sum(-1), torch.ones(2))


@pytest.mark.parametrize("one_pass_max", [8, 64])          # the chunked kernel, the one-pass
def test_a_row_whose_first_chunks_are_all_minus_infinity_matches_torch(one_pass_max):
    x = rand((2, 27), st.f32, 4)
    x[0, :16] = float("-inf")                              # two whole chunks of 8
    z = ops.softmax(wrap(x), one_pass_max=one_pass_max, chunk=8).sync().to_torch()
    torch.testing.assert_close(z, torch.softmax(x, -1))
