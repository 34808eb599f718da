"""The launcher checks every argument before anything runs, and converts nothing implicitly.

Each mismatch raises LaunchError naming the kernel and the parameter; the arguments are not
moved, so the caller can fix the call and try again with the same handles.
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def scale(x: st.In[st.f32, 2], z: st.Out[st.f32, 2], factor: float, reps: int):
    t = sl.load_like(x, z)
    for k in range(reps):
        t = t * factor
    z.store(t)


@st.kernel
def pair(x: st.In[st.f32], z: st.Out[st.f32], w: st.Out[st.f32]):
    z.store(sl.load_like(x, z))
    w.store(sl.load_like(x, w))


@st.kernel
def typed_const(x: st.In[st.f32], z: st.Out[st.f32], BLOCK: st.Const[int]):
    z.store(sl.load_like(x, z))


@pytest.fixture(autouse=True)
def cpu_executor():
    with st.backend("interpret"):
        yield


def x2(dtype=st.f32, shape=(8, 8)):
    return st.zeros(shape, dtype=dtype, device="cpu")


def z2(dtype=st.f32, shape=(8, 8), tile=(4, 4)):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile)


def test_dtype_mismatch_is_not_converted():
    x = x2(st.bf16)
    with pytest.raises(st.LaunchError, match=r"kernel 'scale'.*parameter 'x'.*dtype st\.bfloat16"):
        scale(x, z2(), 2.0, 1)
    assert x.to_torch().dtype == torch.bfloat16        # not moved, not converted


def test_out_dtype_mismatch():
    with pytest.raises(st.LaunchError, match=r"parameter 'z'.*dtype"):
        scale(x2(), z2(st.f16), 2.0, 1)


def test_rank_mismatch():
    with pytest.raises(st.LaunchError, match=r"parameter 'x'.*rank 1"):
        scale(st.zeros((8,), device="cpu"), z2(), 2.0, 1)


def test_tensor_where_a_partition_is_needed():
    with pytest.raises(st.LaunchError, match=r"parameter 'z'.*expects an st.Partition, got an st.Tensor"):
        scale(x2(), x2(), 2.0, 1)


def test_partition_where_an_in_is_needed():
    with pytest.raises(st.LaunchError, match=r"parameter 'x'.*unpartition\(\)"):
        scale(z2(), z2(), 2.0, 1)


def test_int_where_a_float_scalar_is_accepted_but_a_string_is_not():
    _, z, factor, _ = scale(x2(), z2(), 2, 1).sync()
    assert factor == 2.0 and isinstance(factor, float)
    with pytest.raises(st.LaunchError, match=r"parameter 'factor'.*expects a float, got str"):
        scale(x2(), z2(), "2", 1)


def test_float_where_an_int_scalar_is_needed():
    with pytest.raises(st.LaunchError, match=r"parameter 'reps'.*expects an int, got float"):
        scale(x2(), z2(), 2.0, 1.0)


def test_bool_is_not_an_int():
    with pytest.raises(st.LaunchError, match=r"parameter 'reps'.*expects an int, got bool"):
        scale(x2(), z2(), 2.0, True)


def test_const_of_the_wrong_type():
    with pytest.raises(st.LaunchError, match=r"parameter 'BLOCK'.*st.Const\[int\] got float"):
        typed_const(st.zeros((8,), device="cpu"),
                    st.empty((8,), device="cpu").partition((4,)), 4.0)


@st.kernel
def zeros_of(z: st.Out[st.f32], d: st.Const[st.DType]):
    z.store(sl.zeros(z.shape, d).astype(st.f32) + 1)


def test_a_dtype_constant_takes_a_torch_dtype_as_allocation_does():
    (z, d) = zeros_of(st.zeros((4,)).partition((4,)), torch.float16).sync()
    assert d is st.float16 and z.unpartition().to_torch().tolist() == [1.0] * 4
    with pytest.raises(st.LaunchError, match="torch.float64 has no safetile dtype"):
        zeros_of(st.zeros((4,)).partition((4,)), torch.float64)


@st.kernel
def scaled_by(x: st.In[st.f32], z: st.Out[st.f32], k: st.Const[int | float]):
    z.store(sl.load_like(x, z) * k)


@st.kernel
def summed_arange(z: st.Out[st.f32], n: st.Const[int | float]):
    z.store(sl.zeros(z.shape, st.f32) + sl.sum(sl.arange(n).astype(st.f32), 0))


@st.kernel
def filled(z: st.Out[st.f32], v: st.Const[float | bool]):
    z.store(sl.full(z.shape, v, st.f32))


@st.kernel
def ones_of(z: st.Out[st.f32], d: st.Const[st.DType | bool]):
    z.store(sl.zeros(z.shape, st.f32) + 1)


def z4():
    return st.empty((4,), device="cpu").partition((4,))


def test_a_union_const_takes_a_value_of_each_of_its_kinds():
    for k in (3, 2.5):
        _, z, _ = scaled_by(st.ones((4,), device="cpu"), z4(), k).sync()
        assert z.unpartition().to_torch().tolist() == [float(k)] * 4


def test_a_union_const_keeps_the_kind_of_the_value_passed():
    *_, k = scaled_by(st.ones((4,), device="cpu"), z4(), 3).sync()
    assert k == 3 and type(k) is int
    *_, k = scaled_by(st.ones((4,), device="cpu"), z4(), 3.0).sync()
    assert k == 3.0 and type(k) is float


def test_an_int_given_to_a_union_const_without_int_becomes_a_float():
    z, v = filled(z4(), 2).sync()
    assert v == 2.0 and type(v) is float
    assert z.unpartition().to_torch().tolist() == [2.0] * 4


def test_an_int_too_large_for_a_float_const_is_a_launch_error():
    with pytest.raises(st.LaunchError, match=r"parameter 'v'.*does not fit in a float"):
        filled(z4(), 10**400)


def test_a_union_const_refuses_a_value_of_another_kind():
    with pytest.raises(st.LaunchError, match=r"parameter 'k'.*st.Const\[int \| float\] got str"):
        scaled_by(st.ones((4,), device="cpu"), z4(), "3")


def test_a_bool_is_not_an_int_or_float_in_a_union_const():
    with pytest.raises(st.LaunchError, match=r"parameter 'k'.*st.Const\[int \| float\] got bool"):
        scaled_by(st.ones((4,), device="cpu"), z4(), True)


def test_the_body_types_a_union_const_by_the_kind_of_its_value():
    z, _ = summed_arange(z4(), 4).sync()                 # an int sizes the arange
    assert z.unpartition().to_torch().tolist() == [6.0] * 4
    with pytest.raises(st.KernelDefinitionError, match="got the compile-time value 4.0"):
        summed_arange(z4(), 4.0)                        # 4.0 == 4, but it is a float


def test_a_union_const_gives_a_variant_per_value_and_kind():
    for v in (2, 2.0, 3, 2):
        scaled_by.source(st.ones((4,), device="cpu"), z4(), v)
    assert sorted((a.value, a.value_type.__name__) for key in scaled_by._launches.variants
                  for a in key.args if a.kind == "Const") == [
        (2, "float"), (2, "int"), (3, "int")]


def test_a_union_const_with_st_dtype_takes_a_dtype_or_its_other_kind():
    assert ones_of(z4(), torch.float16).sync()[1] is st.float16
    assert ones_of(z4(), True).sync()[1] is True
    with pytest.raises(st.LaunchError, match=r"parameter 'd'.*st.Const\[DType \| bool\] got int"):
        ones_of(z4(), 1)


def test_out_grids_must_agree():
    x = st.zeros((8,), device="cpu")
    z = st.empty((8,), device="cpu").partition((4,))
    w = st.empty((8,), device="cpu").partition((2,))
    with pytest.raises(st.LaunchError, match=r"Out grids disagree.*'z' has grid \(2,\).*'w' has grid \(4,\)"):
        pair(x, z, w)


def test_missing_and_extra_arguments():
    with pytest.raises(st.LaunchError, match=r"missing argument\(s\) \['reps'\]"):
        scale(x2(), z2(), 2.0)
    with pytest.raises(st.LaunchError, match=r"takes 4 arguments, got 5"):
        scale(x2(), z2(), 2.0, 1, 0)
    with pytest.raises(st.LaunchError, match=r"no parameter 'bogus'"):
        scale(x2(), z2(), 2.0, 1, bogus=3)


@pytest.mark.gpu
def test_arguments_on_different_devices():
    x = st.from_torch(torch.empty((8, 8), device="cuda"))
    with pytest.raises(st.LaunchError, match=r"different devices.*'x' on cuda:0.*'z' on cpu"):
        scale(x, z2(), 2.0, 1)


def test_triton_backend_rejects_cpu_tensors():
    with st.backend("triton"):
        with pytest.raises(st.LaunchError, match=r"triton backend runs on CUDA tensors"):
            scale(x2(), z2(), 2.0, 1)


def test_a_failed_launch_moves_nothing():
    x, z = x2(), z2()
    with pytest.raises(st.LaunchError):
        scale(x, z, 2.0, "one")
    x, z, _, _ = scale(x, z, 2.0, 1).sync()             # the same handles launch fine
    assert torch.equal(z.unpartition().to_torch(), torch.zeros(8, 8))


def test_an_out_may_be_a_strided_slice_of_a_larger_buffer():
    buffer = st.from_torch(torch.full((12, 16), 7.0))
    inner = buffer.slice(0, 0, 8).slice(1, 0, 8)             # strides (16, 1): not contiguous
    x, z, _, _ = scale(st.ones((8, 8), device="cpu"), inner.partition((4, 4)), 3.0, 1).sync()
    expected = torch.full((12, 16), 7.0)
    expected[:8, :8] = 3.0
    assert torch.equal(buffer.to_torch(), expected)


def test_an_out_whose_elements_overlap_is_rejected():
    repeated = st.from_torch(torch.zeros(1, 8).expand(8, 8))  # stride 0: rows share memory
    with pytest.raises(st.LaunchError, match=r"parameter 'z'.*overlapping elements"):
        scale(x2(), repeated.partition((4, 4)), 2.0, 1)


def test_a_tensor_whose_offsets_pass_2_to_the_31_is_refused_before_launch():
    # The shape and strides of a 12 GB tensor over 4 bytes (numpy's as_strided checks no
    # bounds): the launch refuses it before anything reads it.
    import numpy as np
    wide = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (3, 1 << 20), (4 << 30, 4))
    with pytest.raises(st.LaunchError, match="2\\*\\*31"):
        scale(st.from_dlpack(wide), z2(), 1.0, 1)


def test_a_persistent_partition_needs_a_kernel_that_iterates_its_tiles():
    z = st.empty((8, 8), device="cpu").partition((4, 4), persistent=2)
    with pytest.raises(st.LaunchError, match="tiles\\(\\)"):
        scale(x2(), z, 1.0, 1)


def test_the_same_handle_twice_is_refused_with_a_hint():
    x = x2()
    with pytest.raises(st.LaunchError, match="same handle.*'x'.*'y'.*share it"):
        add2(x, x, z2())
    assert x.shape == (8, 8)                             # nothing was moved


@st.kernel
def add2(x: st.In[st.f32, 2], y: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@pytest.mark.parametrize("opts,message", [
    (dict(num_warps=3), "num_warps must be 1, 2, 4, 8, 16 or 32"),
    (dict(num_warps="4"), "num_warps must be"),
    (dict(num_stages=0), r"num_stages must be an int in \[1, 64\]"),
    (dict(loop_stages=2.0), r"loop_stages must be an int in \[1, 64\]"),
    (dict(pdl=1), "pdl must be True or False"),
    (dict(bogus=1), "unknown launch option"),
])
def test_bad_launch_options_are_refused_when_given(opts, message):
    with pytest.raises(st.ArgumentError, match=message):
        pair.options(**opts)


def test_bad_launch_options_in_the_decorator_are_refused_too():
    with pytest.raises(st.ArgumentError, match="num_warps"):
        @st.kernel(num_warps=5)
        def k(x: st.In[st.f32], z: st.Out[st.f32]):
            z.store(sl.load_like(x, z))


class AlwaysEqual(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__


class AlwaysAtLeast(int):
    def __ge__(self, other):
        return True


@pytest.mark.parametrize("opts", [dict(num_warps=AlwaysEqual(3)),
                                  dict(num_stages=AlwaysAtLeast(-5)),
                                  dict(loop_stages=AlwaysAtLeast(0))])
def test_int_subclass_options_are_checked_by_their_int_values(opts):
    with pytest.raises(st.ArgumentError, match="must be"):
        pair.options(**opts)


def test_int_subclass_options_are_kept_as_plain_ints():
    k = pair.options(num_warps=AlwaysEqual(4), num_stages=AlwaysAtLeast(2))
    assert [type(v) for v in k.opts.values()] == [int, int]
    assert dict(k.opts) == {"num_warps": 4, "num_stages": 2}


@pytest.mark.parametrize("grid", [{4}, {4: "x"}, (n for n in (4,))])
def test_a_grid_without_an_axis_order_is_refused(grid):
    @st.kernel(unsafe=True)
    def poke(p: st.Ptr[st.f32]):
        sl.store_ptr(p, sl.arange(4), sl.full((4,), 1.0, st.f32))
    with st.unsafe(), pytest.raises(st.LaunchError, match="grid must be 1 to 3 positive ints"):
        poke.options(grid=grid)(st.zeros((4,), device="cpu"))


def test_source_and_compile_check_the_grid_as_a_launch_does():
    @st.kernel(unsafe=True)
    def poke(p: st.Ptr[st.f32]):
        sl.store_ptr(p, sl.arange(4), sl.full((4,), 1.0, st.f32))
    for call in (poke.options(grid=(0,)).source, poke.options(grid=(2**31,)).compile):
        with pytest.raises(st.LaunchError, match="grid"):
            call(st.zeros((4,), device="cpu"))


def counter():
    @st.kernel(unsafe=True)
    def count(p: st.Ptr[st.f32]):
        sl.atomic_add(p, sl.arange(1), sl.full((1,), 1.0, st.f32))
    return count


def programs_run(kernel, grid):
    """How many programs ``kernel`` ran with ``grid``, or None if the launch was refused."""
    try:
        with st.unsafe():
            (p,) = kernel.options(grid=grid)(st.zeros((1,), device="cpu")).sync()
    except st.LaunchError:
        return None
    return int(p.to_torch().item())


@pytest.mark.parametrize("first,second", [((True,), (1,)), ((2,), (2.0,)), ((2.0,), (2,))])
def test_grids_that_compare_equal_but_differ_in_type_are_checked_apart(first, second):
    k = counter()
    programs_run(k, first)
    assert programs_run(k, second) == programs_run(counter(), second)
