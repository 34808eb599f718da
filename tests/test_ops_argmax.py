"""ops.argmax (two stages) on the CPU executor, against torch.argmax, ties included."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap


cpu_executor = support.cpu_executor(seed=7)


@pytest.mark.parametrize("dtype", [st.f32, st.f16, st.bf16], ids=["f32", "f16", "bf16"])
def test_argmax_matches_torch_on_a_length_that_does_not_divide_the_block(dtype):
    x = rand(5000, dtype, 0)
    z = ops.argmax(wrap(x), block=256).sync()
    assert z.shape == (1,) and z.dtype is st.i64
    assert z.to_torch()[0] == torch.argmax(x)


def test_ties_go_to_the_lowest_index_within_and_across_blocks():
    x = rand(1000, st.f32, 1)
    x[[700, 130, 131, 999]] = 50.0                   # blocks of 128: 130 and 131 share block 1
    z = ops.argmax(wrap(x), block=128).sync()
    assert z.to_torch()[0] == 130 == torch.argmax(x)


def test_the_max_in_the_last_partial_block():
    x = rand(1000, st.bf16, 2)
    x[-1] = 100.0
    assert ops.argmax(wrap(x), block=128).sync().to_torch()[0] == 999


def test_int32_output_and_a_row_of_logits():
    x = rand(300, st.f32, 3)
    z = ops.argmax(wrap(x.view(1, 300)), dtype=st.i32, block=64).sync()
    assert z.dtype is st.i32 and z.to_torch()[0] == torch.argmax(x)


def test_with_out_and_workspace_nothing_is_allocated_when_recording():
    x = rand(600, st.f32, 4)
    ws = ops.argmax_workspace(600, st.i32, device="cpu", block=128)
    out = st.empty((1,), dtype=st.i32, device="cpu")
    with st.graph_scope() as scope:
        scope.record(ops.argmax(wrap(x), out=out, workspace=ws))
    scope.graph.launch().sync()
    assert out.to_torch()[0] == torch.argmax(x)


def test_a_workspace_of_the_wrong_size_is_rejected():
    ws = ops.argmax_workspace(100, device="cpu", block=64)
    with pytest.raises(ValueError, match="workspace"):
        ops.argmax(wrap(rand(1000, st.f32, 5)), workspace=ws)


def test_without_a_workspace_it_allocates_so_it_cannot_be_recorded():
    x = wrap(rand(600, st.f32, 6))
    with pytest.raises(st.GraphCaptureError):
        with st.graph_scope() as scope:
            scope.record(ops.argmax(x))
