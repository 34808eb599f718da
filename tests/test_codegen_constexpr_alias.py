"""A local name bound once to a tile-shape constant stays a Triton constexpr.

Triton 3.6 makes a plain local alias of a constexpr (``n = _st_z_t0``) a runtime value, so a
tile shape built from it fails to compile (``arange's arguments must be of type
tl.constexpr``). Kernels naturally write ``BM = z.shape[0]``; the code generator annotates
such names ``tl.constexpr``. These tests compile for sm_90 without a GPU.
"""
import pytest

import safetile as st
import safetile.lang as sl


@st.kernel
def copy_by_alias(x: st.In[st.f32], z: st.Out[st.f32]):
    n = z.shape[0]
    z.store(x.load(z.index, (n,)))


@st.kernel
def rebound(x: st.In[st.f32], z: st.Out[st.f32], k: int):
    n = sl.full((), 4, st.i32)
    if k > 0:
        n = k
    z.store(x.load(z.index, z.shape) * n)


@st.kernel
def rebound_constant(x: st.In[st.f32], z: st.Out[st.f32], k: int):
    n = 4
    if k > 0:
        n = k
    z.store(x.load(z.index, z.shape) * n)


def test_alias_of_a_tile_dimension_compiles_for_sm90():
    x = st.zeros((256,), device="cpu")
    z = st.empty((256,), device="cpu").partition((64,))
    assert "n: tl.constexpr = _st_z_t0" in copy_by_alias.source(x, z)
    compiled = copy_by_alias.compile(x, z)
    assert "ld.global" in compiled.asm["ptx"]


def test_a_name_bound_twice_stays_a_runtime_value():
    x = st.zeros((256,), device="cpu")
    z = st.empty((256,), device="cpu").partition((64,))
    src = rebound.source(x, z, 3)
    assert "n = tl.full((), 4, tl.int32)" in src and "n: tl.constexpr" not in src
    rebound.compile(x, z, 3)


def test_a_compile_time_value_rebound_in_a_runtime_if_is_refused():
    # Triton keeps the compile-time 4 after the `if` whatever k is (a silent miscompile), so
    # the type check refuses the kernel on both backends.
    x = st.zeros((256,), device="cpu")
    z = st.empty((256,), device="cpu").partition((64,))
    with pytest.raises(st.KernelDefinitionError, match="'n' holds the compile-time value 4"):
        rebound_constant.source(x, z, 3)
    with st.backend("interpret"), pytest.raises(st.KernelDefinitionError) as e:
        rebound_constant(x, z, 3)
    x, z, _ = e.value.recovered                  # nothing was moved: every value comes back
    z.unpartition()


@st.kernel
def not_below(z: st.Out[st.bool_], n: int):
    z.store(~(n < 255))


@pytest.mark.parametrize("n, stored", [(1, 0), (3, None)])
def test_inverting_a_bool_holds_when_triton_makes_an_int_argument_a_constant(n, stored):
    # Triton compiles an int argument equal to 1 as a Python constant: `~(1 < 255)` must be
    # False there too (Python's ~True is -2, which a bool store would keep as True)
    z = st.empty((16,), dtype=st.bool_, device="cpu").partition((16,))
    ttir = not_below.compile(z, n).asm["ttir"]
    if stored is not None:
        assert f"arith.constant dense<{stored}> : tensor<16xi8>" in ttir
    (z, _) = not_below(z, n).sync()
    assert not z.unpartition().to_torch().any()
