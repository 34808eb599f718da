"""Arguments of @st.function helpers: scalar parameters pass, views do not."""
import pytest
import torch

import safetile as st
import safetile.lang as sl


@st.function
def _scaled(t, k):
    return t * k


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(_scaled(sl.load_like(x, z), k))


def test_a_scalar_parameter_can_be_passed_to_a_function():
    t = torch.arange(10, dtype=torch.float32)
    with st.backend("interpret"):
        _, z, _ = scale(st.from_torch(t.clone()), st.empty((10,), device="cpu").partition((8,)),
                        2.5).sync()
    assert torch.equal(z.unpartition().to_torch(), t * 2.5)


def test_a_view_cannot_be_passed_to_a_function():
    with pytest.raises(st.KernelDefinitionError, match="views"):
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(_scaled(x, 2.0))
