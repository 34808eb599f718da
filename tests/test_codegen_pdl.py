"""The ``pdl=True`` launch option: programmatic dependent launch stays race-free because every
program waits for the previous grids before anything else."""
import re

import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def scale_kernel(x: st.In[st.f32], n: st.In[st.i32, 1], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) * n.load_scalar((0,)).astype(st.f32))


def _args():
    return (st.randn((1000,), device="cpu"), st.from_torch(torch.tensor([3], dtype=torch.int32)),
            st.empty((1000,), device="cpu").partition((256,)))


def test_pdl_waits_before_anything_and_then_lets_the_next_grid_launch():
    src = scale_kernel.options(pdl=True).source(*_args())
    body = src.split("def scale_kernel(")[1].split("\n")[1:]
    assert body[0].strip() == "_st_gdc_wait()"
    assert body[1].strip() == "_st_gdc_launch_dependents()"
    assert "gdc" not in scale_kernel.source(*_args())


def test_pdl_compiles_for_sm90_with_the_wait_before_the_first_global_access():
    ck = scale_kernel.options(pdl=True).compile(*_args())
    assert ck.metadata.launch_pdl
    ptx = ck.asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    first_access = min(m.start() for m in re.finditer(r"\bld\.global|\bst\.global", ptx))
    assert wait < first_access
    assert "griddepcontrol.launch_dependents" in ptx
    plain = scale_kernel.compile(*_args())
    assert not plain.metadata.launch_pdl and "griddepcontrol" not in plain.asm["ptx"]


def test_pdl_kernels_compute_the_same_on_the_cpu_executor():
    x, n, z = _args()
    want = x.to_torch() * 3
    with st.backend("interpret", seed=1):
        _, _, z = scale_kernel.options(pdl=True)(x, n, z).sync()
    assert torch.equal(z.unpartition().to_torch(), want)
