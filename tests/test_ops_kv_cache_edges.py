"""The KV-cache appends at device positions outside the cache, and their argument checks.

A position is a device value, so no launch can refuse it: a position past the cache writes
nothing (the owned slab's rows past the tensor are masked off); the CPU executor raises
``OutOfBoundsError`` only for a position outside the owned slab.
"""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as i32
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=4)


@pytest.mark.parametrize("pos", [48, 63])
def test_kv_append_past_the_cache_inside_the_owned_slab_writes_nothing(pos):
    # 48 rows: one program owns a slab of 64, so 48..63 pass the slab's bounds check.
    kc, vc = rand((2, 48, 16), st.f32, 1), rand((2, 48, 16), st.f32, 2)
    k, v = ops.kv_append(wrap(rand((2, 16), st.f32, 3)), wrap(rand((2, 16), st.f32, 4)),
                         i32(pos), wrap(kc), wrap(vc)).sync()
    assert torch.equal(k.to_torch(), kc) and torch.equal(v.to_torch(), vc)


@pytest.mark.parametrize("pos,rows", [(-2, [0, 1]), (46, [46, 47]), (-100, []), (100, [])])
def test_kv_append_many_drops_the_rows_outside_the_cache(pos, rows):
    kc = rand((2, 48, 16), st.f32, 5)
    new = rand((2, 4, 16), st.f32, 6)
    k, _ = ops.kv_append_many(wrap(new), wrap(new), i32(pos), wrap(kc), wrap(kc)).sync()
    want = kc.clone()
    for r in rows:
        want[:, r] = new[:, r - pos]
    assert torch.equal(k.to_torch(), want)


@pytest.mark.parametrize("many", [False, True], ids=["kv_append", "kv_append_many"])
def test_kv_append_refuses_a_head_dim_of_0(many):
    new = st.zeros((2, 3, 0) if many else (2, 0))
    append = ops.kv_append_many if many else ops.kv_append
    with pytest.raises(st.ArgumentError, match="head_dim 0 must be a power of two"):
        append(new, new, i32(1), st.zeros((2, 20, 0)), st.zeros((2, 20, 0)))


@pytest.mark.parametrize("many", [False, True], ids=["kv_append", "kv_append_many"])
def test_kv_appends_refuse_a_head_dim_over_one_tile(many):
    d = 2**21
    new = st.zeros((1, 1, d) if many else (1, d))
    append = ops.kv_append_many if many else ops.kv_append
    with pytest.raises(st.ArgumentError, match=f"head_dim {d} must be a power of two up to"):
        append(new, new, i32(0), st.zeros((1, 1, d)), st.zeros((1, 1, d)))
