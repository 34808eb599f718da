"""A storage shrunk through a torch alias the user kept is never read or written past its end.

``untyped_storage().resize_(n)`` reallocates the storage under every tensor that views it, and
the allocator may hand the smaller block the address the old one had: a check that compares
only the data pointer (a cached launch plan, a host replay's layout check) then takes the
tensor for unchanged. Every path that reads or writes a handle's bytes, or hands them out,
refuses a tensor that reaches past the end of its storage.
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl

from support import cpu_executor, no_leftover_holds

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], a: float):
    z.store(sl.load_like(x, z) * a)


def shrink_at_the_same_address(t: torch.Tensor, tries: int = 20000) -> None:
    """Shrink ``t``'s storage (below what ``t`` spans) until the allocator hands the new block
    ``t``'s old address; skips the test if it never does."""
    p0, s = t.data_ptr(), t.untyped_storage()
    for i in range(tries):
        s.resize_(16 + (i % 7) * 16)
        if t.data_ptr() == p0:
            return
    pytest.skip("the allocator never reused the address")


def test_a_cached_launch_refuses_an_output_whose_storage_shrank_at_the_same_address():
    t = torch.zeros(1024)
    x, z, a = scale(st.ones((1024,)), st.from_torch(t).partition((256,)), 2.0).sync()
    shrink_at_the_same_address(t)               # same pointer, shape, strides and dtype
    with pytest.raises(st.LaunchError, match="past the end of its storage"):
        scale(x, z, a)
    assert z.shape == (1024,)                   # refused before anything moved


def test_a_cached_launch_refuses_an_input_whose_storage_shrank_at_the_same_address():
    t = torch.ones(1024)
    x, z, a = scale(st.from_torch(t), st.empty((1024,)).partition((256,)), 2.0).sync()
    shrink_at_the_same_address(t)
    with pytest.raises(st.LaunchError, match="past the end of its storage"):
        scale(x, z, a)


@pytest.mark.parametrize("copy", ["to_torch", "numpy"])
def test_a_shared_value_whose_storage_shrank_is_not_copied_past_its_end(copy):
    t = torch.zeros(1 << 16)
    s = st.from_torch(t).share()
    t.untyped_storage().resize_(16)             # 16 bytes left of 256 KiB
    with pytest.raises(st.ArgumentError, match="past the end of its storage"):
        getattr(s, copy)()


def test_a_host_replay_refuses_a_tensor_whose_storage_shrank_at_the_same_address():
    t = torch.zeros(1024)
    g = scale(st.ones((1024,)), st.from_torch(t).partition((256,)), 2.0).graph()
    g.launch().sync()
    shrink_at_the_same_address(t)
    with pytest.raises(st.GraphCaptureError, match="past the end of its storage"):
        g.launch().sync()


def test_dlpack_export_refuses_a_tensor_whose_storage_shrank():
    t = torch.zeros(1 << 16)
    h = st.from_torch(t)
    t.untyped_storage().resize_(16)
    with pytest.raises(st.ArgumentError, match="past the end of its storage"):
        torch.from_dlpack(h)                    # a capsule of 256 KiB over a 16-byte block


def test_a_collective_refuses_a_buffer_whose_storage_shrank():
    t = torch.zeros(1 << 16)
    buf = st.from_torch(t)
    t.untyped_storage().resize_(16)
    with pytest.raises(st.ArgumentError, match="past the end of its storage") as e:
        st.all_reduce(buf)                      # checked before the process group is asked
    assert e.value.recovered is buf
