"""``x.prefetch(index, shape)``: an L2 prefetch hint on an In view.

A prefetch delivers no value into the program, so it cannot observe memory and cannot race;
under ``pdl=True`` the leading prefetches (and the index arithmetic they need) are issued
before the grid-dependency wait, so a kernel's first input blocks stream while the previous
kernel finishes. Only In views may be prefetched, only as statements of their own; the CPU
executor checks the call and does nothing.
"""
import re

import pytest
import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def rowsum(x: st.In[st.bf16, 2], n: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
    i = z.index[0]
    for p in range(2):
        x.prefetch((i, p), (z.shape[0], 128))
    acc = sl.zeros((z.shape[0], 128), st.f32)
    for k in range(sl.cdiv(x.shape[1], 128)):
        acc += x.load((i, k), (z.shape[0], 128)).astype(st.f32)
    z.store(sl.sum(acc, 1) * n.load_scalar((0,)).astype(st.f32))


def _args(rows=64, cols=300):
    return (st.randn((rows, cols), dtype=st.bf16, device="cpu"),
            st.from_torch(torch.tensor([3], dtype=torch.int32)),
            st.empty((rows,), device="cpu").partition((16,)))


def _body(src: str) -> list[str]:
    return [ln.strip() for ln in src.split("def rowsum(")[1].split("\n")[1:]]


def test_prefetch_is_issued_before_the_pdl_wait_and_loads_after_it():
    body = _body(rowsum.options(pdl=True).source(*_args()))
    pre = body.index("_st_gdc_wait()")
    assert any(ln.startswith("_st_prefetch2(_st_x_ptr") for ln in body[:pre])
    assert body[pre + 1] == "_st_gdc_launch_dependents()"
    assert not any("_st_load" in ln or "_st_scalar" in ln or "_st_store" in ln
                   for ln in body[:pre])


def test_without_prefetch_the_wait_stays_first():
    @st.kernel
    def plain(x: st.In[st.f32], z: st.Out[st.f32]):
        i = z.index[0]
        z.store(x.load((i,), z.shape) * 2.0)
    src = plain.options(pdl=True).source(st.randn((100,), device="cpu"),
                                         st.empty((100,), device="cpu").partition((32,)))
    assert src.split("def plain(")[1].split("\n")[1].strip() == "_st_gdc_wait()"


def test_a_prefetch_after_a_load_stays_after_the_wait():
    @st.kernel
    def late(x: st.In[st.f32, 1], n: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
        m = n.load_scalar((0,))
        x.prefetch((m,), z.shape)
        z.store(x.load((m,), z.shape))
    src = late.options(pdl=True).source(st.randn((100,), device="cpu"),
                                        st.from_torch(torch.tensor([1], dtype=torch.int32)),
                                        st.empty((100,), device="cpu").partition((32,)))
    body = src.split("def late(")[1]
    assert body.index("_st_gdc_wait()") < body.index("_st_scalar1") < body.index("_st_prefetch1")


def test_prefetch_compiles_for_sm90_before_griddepcontrol_wait():
    ck = rowsum.options(pdl=True).compile(*_args())
    ptx = ck.asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert "prefetch.global.L2" in ptx[:wait]
    assert "prefetch.global.L2" not in ptx[wait:]
    first_access = min(m.start() for m in re.finditer(r"\bld\.global|\bst\.global", ptx))
    assert wait < first_access
    # Predicated per lane: lanes outside the tensor touch no address.
    assert re.search(r"@p prefetch\.global\.L2", ptx)


def test_prefetch_lowers_to_one_point_per_line():
    # A 128-wide bf16 row is 256 bytes: two 128-byte lines, so two points per row.
    src = rowsum.source(*_args())
    assert "_st_x_s1, i, p, _st_z_t0, 128, 64)" in src
    assert "tl.arange(0, t1 // STEP) * STEP" in src


def test_cpu_executor_treats_prefetch_as_a_no_op():
    x, n, z = _args(cols=300)
    want = x.to_torch().float().sum(1) * 3
    with st.backend("interpret", seed=2):
        x, n, z = rowsum.options(pdl=True)(x, n, z).sync()
    assert torch.allclose(z.unpartition().to_torch(), want, rtol=1e-5, atol=1e-3)


def test_cpu_executor_checks_the_prefetch_call():
    @st.kernel
    def wrong_rank(x: st.In[st.f32, 2], z: st.Out[st.f32, 1]):
        x.prefetch((z.index[0],), (16,))
        z.store(sl.zeros(z.shape, st.f32))
    with st.backend("interpret", seed=0), \
            pytest.raises(st.KernelDefinitionError, match="prefetch of 'x'"):
        wrong_rank(st.randn((16, 16), device="cpu"),
                   st.empty((16,), device="cpu").partition((16,))).sync()


def test_prefetch_of_an_out_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            z.prefetch()
            z.store(sl.load_like(x, z))
    assert ei.value.rule == "prefetch" and "only In views" in str(ei.value)


def test_prefetch_of_a_sub_partition_is_rejected():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            s = z.partition((8,))
            s.prefetch((0,))
            z.store(sl.load_like(x, z))
    assert ei.value.rule == "call"


def test_prefetch_has_no_value():
    with pytest.raises(st.KernelDefinitionError) as ei:
        @st.kernel
        def bad(x: st.In[st.f32], z: st.Out[st.f32]):
            t = x.prefetch(z.index, z.shape)
            z.store(t)
    assert ei.value.rule == "prefetch" and "statement of its own" in str(ei.value)
