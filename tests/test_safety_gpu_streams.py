"""On the GPU, memory an execution uses is never touched out of its stream's order.

A ``then`` callback runs while the execution's launches may still run; its host copies and
hand-offs to torch count those launches as ordered before them, which holds on the
execution's stream: one that switched streams first waits for it. A CUDA graph replays the
addresses it recorded, so a storage resized through a torch alias since then is refused.
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl

pytestmark = pytest.mark.gpu


@st.kernel
def fma(x: st.In[st.f32], z: st.Out[st.f32], a: float):
    z.store(z.load() * a + sl.load_like(x, z))


def _slow_stream() -> None:
    """Delay what the current stream runs next by a few tens of milliseconds."""
    torch.cuda._sleep(100_000_000)


@pytest.mark.parametrize("how", ["to_torch", "into_torch"])
def test_a_callback_on_another_stream_sees_what_the_launch_before_it_wrote(how):
    other, seen = torch.cuda.Stream(), []

    def read(x, z, a):
        t = z.unpartition()
        with torch.cuda.stream(other):
            seen.append(t.to_torch() if how == "to_torch" else t.into_torch().clone())
            other.synchronize()
        return fma(x, st.zeros((4096,), device="cuda").partition((1024,)), 1.0)

    x = st.ones((4096,), device="cuda")
    z = st.zeros((4096,), device="cuda").partition((1024,))
    torch.cuda.synchronize()
    _slow_stream()                          # the launch below starts late
    fma(x, z, 2.0).then(read).sync()
    assert torch.equal(seen[0], torch.ones(4096, device="cuda"))


def test_a_cuda_graph_refuses_to_replay_memory_a_storage_resize_moved():
    base = torch.zeros(4096, device="cuda")
    g = fma(st.ones((4096,), device="cuda"), st.from_torch(base).partition((1024,)), 1.0).graph()
    storage = base.untyped_storage()
    storage.resize_(storage.nbytes() * 2)  # a new block: the recorded one is freed
    with pytest.raises(st.GraphCaptureError, match="moved or freed"):
        g.launch().sync()


def test_a_cuda_graph_replays_while_its_storages_stay_put():
    base = torch.zeros(4096, device="cuda")
    g = fma(st.ones((4096,), device="cuda"), st.from_torch(base).partition((1024,)), 1.0).graph()
    g.launch().sync()
    g.launch().sync()
    assert torch.equal(base, torch.full((4096,), 2.0, device="cuda"))
