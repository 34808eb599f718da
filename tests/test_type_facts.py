"""The type check's facts are sound: a value is known to lie in [0, bound] only where every
path and every loop iteration keeps it there (the generated code divides such values with
Triton's truncating `//`), index entries cannot wrap in a narrow type, and a statement the
type check cannot handle is a KernelDefinitionError naming file:line."""
import pytest

import safetile as st
import safetile.lang as sl
from safetile.lang import semantics as S


def z4():
    return st.zeros((4,), dtype=st.i32).partition((4,))


def stored(kernel, *args) -> int:
    with st.backend("interpret"):
        out = kernel(z4(), *args).sync()
    return out[0].unpartition().to_torch()[0].item()


@st.kernel
def either_branch(z: st.Out[st.i32], n: int):
    a = z.index[0] if n > 0 else sl.full((), -7, st.i32)
    z.store(sl.zeros(z.shape, st.i32) + a // 2)


def test_a_conditional_value_is_bounded_only_if_both_branches_are():
    assert stored(either_branch, 0) == -4
    assert "_st_floordiv(a, 2)" in either_branch.source(z4(), 0)


@st.kernel
def ceiling_then_wrap(z: st.Out[st.i32]):
    v = sl.cdiv(sl.arange(2), 2)                    # [0, 1]: one past 1 // 2
    big = v * 2147483647 + v * 2147483647          # [0, -2] after the wrap
    z.store(big // 3)


def test_a_ceiling_division_is_bounded_by_its_ceiling():
    def z2():
        return st.zeros((2,), dtype=st.i32).partition((2,))
    with st.backend("interpret"):
        (z,) = ceiling_then_wrap(z2()).sync()
    assert z.unpartition().to_torch().tolist() == [0, -1]
    assert "_st_floordiv(big, 3)" in ceiling_then_wrap.source(z2())


@st.kernel
def shifted_past_width(x: st.In[st.i32], z: st.Out[st.i32], k: st.Const[int]):
    z.store(sl.load_like(x, z) << k)


@pytest.mark.parametrize("k", [32, -1])
def test_a_constant_shift_outside_the_width_uses_the_guarded_shift(k):
    x = st.from_torch(__import__("torch").tensor([1, 2, 3, 4], dtype=__import__("torch").int32))
    assert "_st_shl(" in shifted_past_width.source(x, z4(), k)


@st.kernel
def counts_past_int32(z: st.Out[st.i32], n: int):
    a = z.index[0] * 0 + 2147483640
    for i in range(n):
        a = a + 1
    z.store(sl.zeros(z.shape, st.i32) + a // 3)


def test_a_loop_carried_value_that_keeps_growing_loses_its_bound():
    assert stored(counts_past_int32, 20) == (2147483660 - 2**32) // 3
    assert "_st_floordiv(a, 3)" in counts_past_int32.source(z4(), 20)


@st.function
def half(a):
    return a // 2


@st.kernel
def halves(z: st.Out[st.i32]):
    b = half(z.index[0])
    z.store(sl.zeros(z.shape, st.i32) + half(sl.full((), -7, st.i32)) + b)


def test_a_helper_called_with_a_bounded_and_an_unbounded_value_is_typed_for_each():
    assert stored(halves) == -4
    src = halves.source(z4())
    assert "return (a // 2)" in src and "return _st_floordiv(a, 2)" in src


@st.kernel
def int8_sub_tile(z: st.Out[st.f32]):
    j = sl.full((), 2, st.int8)
    z.partition((64,)).store(sl.zeros((64,), st.f32), (j,))


@st.kernel
def int8_tile(x: st.In[st.f32], z: st.Out[st.f32]):
    j = sl.full((), 2, st.int8)
    z.store(x.load((j,), (64,)))


@pytest.mark.parametrize("kernel, args", [
    (int8_sub_tile, lambda: (st.zeros((1024,)).partition((256,)),)),
    (int8_tile, lambda: (st.zeros((384,)), st.zeros((128,)).partition((64,))))],
    ids=["sub-tile index", "tile index"])
def test_an_int8_index_entry_is_refused_with_the_conversion_to_make(kernel, args):
    with pytest.raises(st.KernelDefinitionError, match=r"int32 or int64 scalar.*"
                                                        r"\.astype\(st\.int32\)") as e:
        kernel(*args())
    assert "test_type_facts.py:" in str(e.value)


@st.kernel
def adds(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + 1.0)


def test_a_statement_the_type_check_cannot_handle_is_a_definition_error_with_its_line(
        monkeypatch):
    def unforeseen(*args):
        raise ValueError("a rule that did not foresee this code")
    monkeypatch.setattr(S, "binary", unforeseen)
    with pytest.raises(st.KernelDefinitionError, match="could not check this statement") as e:
        adds(st.zeros((4,)), st.zeros((4,)).partition((4,)))
    assert f"test_type_facts.py:{adds.fn.__code__.co_firstlineno + 2}" in str(e.value)


@st.kernel(unsafe=True)
def axis_one(p: st.Ptr[st.i32]):
    sl.store_ptr(p, sl.zeros((1,), st.i32) + sl.bid(0),
                 sl.zeros((1,), st.i32) + sl.bid(1) * 10 + sl.num_blocks(2))


def test_the_axes_past_a_launch_grid_have_one_program_each_on_the_cpu_as_on_the_gpu():
    with st.backend("interpret"), st.unsafe():
        (p,) = axis_one.options(grid=(2,))(st.zeros((2,), dtype=st.i32)).sync()
    assert p.to_torch().tolist() == [1, 1]


@st.kernel
def zero_step(z: st.Out[st.i32]):
    acc = sl.zeros(z.shape, st.i32)
    for i in range(0, 4, 0):
        acc = acc + 1
    z.store(acc)


def test_a_range_with_a_compile_time_zero_step_is_refused():
    with pytest.raises(st.KernelDefinitionError, match="step must not be zero"):
        zero_step(z4())
