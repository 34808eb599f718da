"""ops.embedding on the CPU executor: gathers table rows at device-resident token ids."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import wrap


cpu_executor = support.cpu_executor(seed=6)


@pytest.mark.parametrize("dtype", [st.f32, st.f16, st.bf16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_embedding_matches_torch(dtype, id_dtype):
    table = torch.randn(100, 70, generator=torch.Generator().manual_seed(0)).to(dtype.torch)
    ids = torch.tensor([5, 99, 0, 5, 42], dtype=id_dtype)
    z = ops.embedding(wrap(ids), wrap(table)).sync()
    assert z.shape == (5, 70) and z.dtype is dtype
    assert torch.equal(z.to_torch(), torch.nn.functional.embedding(ids, table))


def test_rows_wider_than_one_tile_are_split_across_programs():
    table = torch.randn(10, 5000)
    ids = torch.tensor([3, 7], dtype=torch.int32)
    z = ops.embedding(wrap(ids), wrap(table)).sync()
    assert torch.equal(z.to_torch(), table[ids.long()])


def test_an_id_outside_the_vocabulary_reads_zeros():
    table = torch.randn(10, 8)
    ids = torch.tensor([-1, 10, 2], dtype=torch.int32)
    z = ops.embedding(wrap(ids), wrap(table)).sync().to_torch()
    assert torch.equal(z[:2], torch.zeros(2, 8)) and torch.equal(z[2], table[2])


def test_a_recorded_lookup_follows_the_token_buffer():
    table = torch.randn(16, 8)
    token = torch.tensor([1], dtype=torch.int64)
    out = st.empty((1, 8), device="cpu")
    g = ops.embedding(st.from_torch(token), wrap(table), out=out).graph()
    g.launch().sync()
    assert torch.equal(out.to_torch()[0], table[1])
    token[0] = 9
    g.launch().sync()
    assert torch.equal(out.to_torch()[0], table[9])
