"""ops.copy and ops.add_scalar on the CPU executor: every supported dtype, against torch."""
import numpy as np
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import wrap

cpu_executor = support.cpu_executor(seed=2)

DTYPES = [st.f32, st.f16, st.bf16, st.i32, st.i64]
IDS = [d.name for d in DTYPES]


def values(dtype) -> torch.Tensor:
    t = torch.arange(-3, 7).to(dtype.torch)
    if dtype in st.floats:
        t[0], t[1] = -0.0, float("nan")
    return t


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_copy_copies_every_supported_dtype_bit_for_bit(dtype):
    t = values(dtype)
    out = ops.copy(wrap(t), st.empty((10,), dtype=dtype)).sync().to_torch()
    assert out.view(torch.uint8).equal(t.view(torch.uint8))       # -0.0 and NaN too


@pytest.mark.parametrize("dtype", [st.f32, st.f16, st.bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("value", [1, -3, 2**24 + 1, 2**31, 70000, 0.1, np.int64(5),
                                   np.float32(1.5)])
def test_add_scalar_adds_an_int_or_a_float_to_a_float_tensor_as_torch_does(dtype, value):
    t = torch.tensor([0.0, 1.0, 256.0, -2.5, 1e4]).to(dtype.torch)
    got = ops.add_scalar(wrap(t), value).sync().to_torch()
    assert torch.equal(got, (t.float() + float(np.float32(value))).to(dtype.torch))


@pytest.mark.parametrize("dtype", [st.i32, st.i64], ids=["i32", "i64"])
def test_add_scalar_adds_an_int_to_an_int_tensor(dtype):
    t = torch.tensor([0, 1, -7, 2**20]).to(dtype.torch)
    assert torch.equal(ops.add_scalar(wrap(t), np.int64(-9)).sync().to_torch(), t - 9)


@pytest.mark.parametrize("dtype", [st.i32, st.i64], ids=["i32", "i64"])
def test_add_scalar_says_what_to_do_with_an_int_past_int32_for_an_int_tensor(dtype):
    with pytest.raises(st.ArgumentError, match=r"ops.add_scalar: value 2147483648 .*steps") as e:
        ops.add_scalar(st.zeros((3,), dtype=dtype), 2**31)
    assert "Const" not in str(e.value)


def test_add_scalar_refuses_an_int_too_large_for_a_float_for_a_float_tensor():
    with pytest.raises(st.ArgumentError, match="ops.add_scalar: value .* too large for a float"):
        ops.add_scalar(st.zeros((3,)), 10**400)


@pytest.mark.parametrize("dtype", [st.int8, st.bool_], ids=["int8", "bool"])
def test_copy_refuses_int8_and_bool_with_the_supported_dtypes(dtype):
    x = st.zeros((4,), dtype=dtype)
    with pytest.raises(st.ArgumentError, match="ops.copy: .*float32, float16, bfloat16, int32"):
        ops.copy(x, st.empty((4,), dtype=dtype))


@pytest.mark.parametrize("op", ["copy", "add"])
def test_elementwise_ops_write_a_transposed_out(op):
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    target = st.from_torch(torch.zeros(3, 4).T)                     # (4, 3), strides (1, 4)
    if op == "copy":
        got = ops.copy(wrap(x), target).sync()
        want = x
    else:
        got = ops.add(wrap(x), wrap(y), out=target).sync()
        want = x + y
    assert got.stride() == (1, 4) and torch.equal(got.to_torch(), want)


def test_an_elementwise_op_says_a_shared_input_must_be_1d_or_2d():
    s = st.zeros((2, 3, 4)).share()
    with pytest.raises(st.ArgumentError, match="ops.add: a Shared input of shape"):
        ops.add(s, s.clone())


def test_an_elementwise_out_that_cannot_be_viewed_as_rows_is_named():
    out = st.from_torch(torch.zeros(4, 2, 3).transpose(0, 2))         # (3, 2, 4), strided
    with pytest.raises(st.ArgumentError, match="ops.add: out"):
        ops.add(st.zeros((3, 2, 4)), st.zeros((3, 2, 4)), out=out)
