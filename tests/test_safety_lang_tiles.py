"""A persistent partition's owned tiles exist only inside ``for t in z.tiles():``: every
access of an owned tile outside that loop (a store, a load, ``sl.load_like``, a sub-tile
store or load) is refused by the per-variant type check, with file:line, before either
backend moves or runs anything, as ``z.index`` there already was."""
import pytest
import torch

import safetile as st
import safetile.lang as sl
from lang_cases import cpu_executor  # noqa: F401  (autouse: the CPU executor)


def _args():
    return (st.zeros((64,), device="cpu"),
            st.zeros((64,), device="cpu").partition((8,), persistent=3))


@st.kernel
def store_after_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    for t in z.tiles():
        t.store(2.0)
    z.store(1.0)


@st.kernel
def store_before_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(1.0)
    for t in z.tiles():
        t.store(2.0)


@st.kernel
def load_before_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    a = z.load()
    for t in z.tiles():
        t.store(a)


@st.kernel
def load_like_before_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    a = sl.load_like(x, z)
    for t in z.tiles():
        t.store(a)


@st.kernel
def sub_store_before_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    s = z.partition((4,))
    s.store(1.0, (0,))
    for t in z.tiles():
        s.store(2.0, (1,))


@st.kernel
def inline_sub_load_after_the_loop(x: st.In[st.f32], z: st.Out[st.f32]):
    for t in z.tiles():
        t.store(2.0)
    a = z.partition((4,)).load((0,))


OUTSIDE = [store_after_the_loop, store_before_the_loop, load_before_the_loop,
           load_like_before_the_loop, sub_store_before_the_loop, inline_sub_load_after_the_loop]


@pytest.mark.parametrize("kernel", OUTSIDE, ids=lambda k: k.name)
def test_an_owned_tile_access_outside_the_tiles_loop_of_a_persistent_partition_is_a_definition_error(
        kernel):
    for run in (lambda: kernel.source(*_args()), lambda: kernel(*_args()).sync()):
        with pytest.raises(st.KernelDefinitionError) as e:
            run()
        assert str(e.value).startswith(f"{__file__}:") and e.value.rule == "type"
        assert "tiles()" in str(e.value)


@st.kernel
def sub_bound_before_and_used_inside(x: st.In[st.f32], z: st.Out[st.f32]):
    s = z.partition((4,))
    for t in z.tiles():
        s.store(x.load_at((t.index[0] * 8,), (4,)), (0,))
        s.store(x.load_at((t.index[0] * 8 + 4,), (4,)) + 1.0, (1,))


def test_a_sub_partition_bound_before_the_loop_is_used_inside_it():
    assert "_st_substore1" in sub_bound_before_and_used_inside.source(*_args())
    x = st.from_torch(torch.arange(64, dtype=torch.float32))
    z = st.zeros((64,), device="cpu").partition((8,), persistent=3)
    _, z = sub_bound_before_and_used_inside(x, z).sync()
    got = z.unpartition().to_torch()
    assert got[:4].tolist() == [0.0, 1.0, 2.0, 3.0] and got[4:8].tolist() == [5.0, 6.0, 7.0, 8.0]
