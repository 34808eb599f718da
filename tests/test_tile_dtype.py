"""``t.dtype`` in kernel bodies: the element type of a tile, usable with ``astype``."""
import pytest
import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def scale_in_fp32(x: st.In[st.floats], z: st.Out[st.floats]):
    raw = sl.load_like(x, z)
    z.store((raw.astype(st.f32) * 3.0).astype(raw.dtype))


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
def test_astype_back_to_a_loaded_tiles_dtype_rounds_like_torch(dtype):
    t = torch.randn(100, generator=torch.Generator().manual_seed(0)).to(dtype.torch)
    with st.backend("interpret"):
        _, z = scale_in_fp32(st.from_torch(t.clone()), st.empty((100,), dtype=dtype,
                                                                device="cpu").partition((64,))).sync()
    assert torch.equal(z.unpartition().to_torch(), (t.float() * 3.0).to(dtype.torch))


def test_the_generated_triton_spells_tile_dtype_as_tensor_dtype():
    src = scale_in_fp32.source(st.zeros((8,), device="cpu"),
                               st.empty((8,), device="cpu").partition((8,)))
    assert ".dtype)" in src


def test_other_tile_attributes_are_still_rejected():
    with pytest.raises(st.KernelDefinitionError, match="dtype"):
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z).device)
