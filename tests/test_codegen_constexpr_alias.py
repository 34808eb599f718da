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


@st.kernel
def wraps_past_int32(z: st.Out[st.bool_], n: int):
    z.store((n + 2147483647) < 0)


@st.kernel
def rounds_in_fp32(z: st.Out[st.f32], n: int):
    z.store((n + 16777216.0) - 16777216.0)


@st.kernel
def root_of_a_length(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.full(z.shape, sl.sqrt(x.shape[0] * 4.0), st.f32))


def folded(kernel, *args) -> str:
    """The constant the compiled kernel stores (Triton folded the whole expression)."""
    ttir = kernel.compile(*args).asm["ttir"]
    return ttir[ttir.rfind("tt.func public"):].split("arith.constant dense<")[1].split(">")[0]


def one_out(dtype):
    return st.empty((16,), dtype=dtype, device="cpu").partition((16,))


def test_an_int_argument_equal_to_one_keeps_int32_wrapping():
    assert folded(wraps_past_int32, one_out(st.bool_), 1) == "1"          # True, as on the CPU
    (z, _) = wraps_past_int32(one_out(st.bool_), 1).sync()
    assert z.unpartition().to_torch().all()


def test_an_int_argument_equal_to_one_keeps_fp32_rounding():
    assert folded(rounds_in_fp32, one_out(st.f32), 1) == "0.000000e+00"
    (z, _) = rounds_in_fp32(one_out(st.f32), 1).sync()
    assert not z.unpartition().to_torch().any()


def test_an_in_length_of_one_is_an_int32_value_the_math_helpers_take():
    x = st.ones((1,), device="cpu")             # Triton's math on a Python 1 would not compile
    assert folded(root_of_a_length, x, one_out(st.f32)) == "2.000000e+00"
    _, z = root_of_a_length(x, one_out(st.f32)).sync()
    assert z.unpartition().to_torch()[0].item() == 2.0
