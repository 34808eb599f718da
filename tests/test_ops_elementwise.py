"""ops.add, ops.mul, ops.silu_mul and the unsafe add twin on the CPU executor, against torch.

Element-wise results round once to the dtype, as torch does, so they must match exactly.
"""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap
from safetile.ops.unsafe_twins import add_unsafe

DTYPES, IDS = support.FLOAT_DTYPES, support.FLOAT_IDS


cpu_executor = support.cpu_executor(seed=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_add_matches_torch_on_a_length_that_does_not_divide_the_tile(dtype):
    x, y = rand(1000, dtype, 0), rand(1000, dtype, 1)
    z = ops.add(wrap(x), wrap(y), block=256).sync()
    assert torch.equal(z.to_torch(), x + y)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_mul_matches_torch(dtype):
    x, y = rand(777, dtype, 2), rand(777, dtype, 3)
    z = ops.mul(wrap(x), wrap(y), block=128).sync()
    assert torch.equal(z.to_torch(), x * y)


def test_a_contiguous_nd_input_keeps_its_shape():
    x, y = rand((3, 5, 7), st.f32, 4), rand((3, 5, 7), st.f32, 5)
    z = ops.add(wrap(x), wrap(y), block=64).sync()
    assert z.shape == (3, 5, 7)
    assert torch.equal(z.to_torch(), x + y)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_silu_mul_is_computed_in_fp32_and_rounded_once(dtype):
    g, u = rand((4, 300), dtype, 6), rand((4, 300), dtype, 7)
    z = ops.silu_mul(wrap(g), wrap(u), block=256).sync()
    gf = g.float()
    assert torch.equal(z.to_torch(), (gf * torch.sigmoid(gf) * u.float()).to(dtype.torch))


def test_silu_mul_reads_the_strided_halves_of_a_fused_projection():
    fused = rand((3, 2 * 200), st.bf16, 8)
    t = wrap(fused)
    z = ops.silu_mul(t.slice(1, 0, 200), t.slice(1, 200, 400), block=128).sync()
    want = torch.nn.functional.silu(fused[:, :200].float()) * fused[:, 200:].float()
    assert z.shape == (3, 200)
    torch.testing.assert_close(z.to_torch().float(), want, rtol=8e-3, atol=1e-5)


def test_out_receives_the_result_and_its_handle_stays_usable():
    x, y = rand(300, st.f32, 9), rand(300, st.f32, 10)
    out = st.empty((300,), device="cpu")
    z = ops.add(wrap(x), wrap(y), out=out).sync()
    assert z is out
    assert torch.equal(out.to_torch(), x + y)


def test_one_tensor_may_feed_both_inputs_and_stays_usable():
    t = rand(100, st.f32, 11)
    x = wrap(t)
    z = ops.add(x, x).sync()
    assert torch.equal(z.to_torch(), t + t)
    assert torch.equal(x.to_torch(), t)


def test_writing_into_an_input_is_an_alias_error():
    x, y = wrap(rand(100, st.f32, 12)), wrap(rand(100, st.f32, 13))
    with pytest.raises(st.AliasError):
        ops.add(x, y, out=x)


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="shape"):
        ops.add(wrap(rand(10, st.f32, 0)), wrap(rand(11, st.f32, 0)))


def test_dtypes_are_never_converted_implicitly():
    with pytest.raises(TypeError, match="dtypes"):
        ops.mul(wrap(rand(10, st.f32, 0)), wrap(rand(10, st.bf16, 0)))


def test_out_must_have_the_result_dtype():
    with pytest.raises(ValueError, match="dtype"):
        ops.add(wrap(rand(10, st.f32, 0)), wrap(rand(10, st.f32, 1)),
                out=st.empty((10,), dtype=st.bf16, device="cpu"))


def test_the_unsafe_twin_computes_the_same_sum():
    x, y = rand(1000, st.f32, 14), rand(1000, st.f32, 15)
    with st.unsafe():
        z = add_unsafe(wrap(x), wrap(y), block=256).sync()
    assert torch.equal(z.to_torch(), x + y)


def test_the_unsafe_twin_needs_an_unsafe_block_at_the_call_site():
    with pytest.raises(st.UnsafeError):
        add_unsafe(wrap(rand(10, st.f32, 0)), wrap(rand(10, st.f32, 1)))


def test_bad_op_arguments_raise_a_typed_safetile_error():
    from safetile.errors import ArgumentError, SafetileError
    with pytest.raises(ArgumentError) as info:
        ops.add(wrap(rand(8, st.f32, 0)), rand(8, st.f32, 1))       # a torch tensor, unwrapped
    assert isinstance(info.value, SafetileError) and "st.from_torch" in str(info.value)
