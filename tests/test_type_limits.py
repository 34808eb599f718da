"""The limits of the kernel type check: what one backend could not compute as the other does
(or Triton could not compile at all) is refused before a launch, as a KernelDefinitionError
naming file:line and what to write instead, and the forms it accepts compile for sm_90.
Agreement of the accepted forms on both backends: tests/differential/test_compile_time_names.py."""
import pytest

import safetile as st
import safetile.lang as sl


def x64(dtype=st.f32):
    return st.zeros((128,), dtype=dtype)


def z64(dtype=st.f32, **kw):
    return st.zeros((128,), dtype=dtype).partition((64,), **kw)


def refused(kernel, make_args, match: str) -> st.KernelDefinitionError:
    """Both backends refuse ``kernel`` with a type error at its line: the CPU executor at
    launch, the code generator before Triton sees the source."""
    with st.backend("interpret"), pytest.raises(st.KernelDefinitionError, match=match) as e:
        kernel(*make_args())
    assert "test_type_limits.py:" in str(e.value) and e.value.lineno > 0
    with pytest.raises(st.KernelDefinitionError, match=match):
        kernel.compile(*make_args())
    return e.value


def cpu(kernel, *args) -> list:
    with st.backend("interpret"):
        return kernel(*args).sync()[-1].unpartition().to_torch().tolist()


# ---- compile-time indices ----------------------------------------------------------------------

@st.kernel
def load_far(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load((2**25,), (64,)))


@st.kernel
def load_far_below(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load((-2**25,), (64,)))


@st.kernel
def prefetch_far(x: st.In[st.f32], z: st.Out[st.f32]):
    x.prefetch((2**25,), (64,))
    z.store(sl.load_like(x, z))


@pytest.mark.parametrize("kernel", [load_far, load_far_below, prefetch_far],
                         ids=["load", "load below zero", "prefetch"])
def test_a_compile_time_tile_index_whose_box_passes_int32_is_refused(kernel):
    refused(kernel, lambda: (x64(), z64()), r"past the int32 range.*sl\.full")


@st.kernel
def load_farthest(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load((2**25 - 1,), (64,), padding=2.0))


def test_the_farthest_compile_time_tile_index_within_int32_reads_padding_and_compiles():
    assert cpu(load_farthest, x64(), z64()) == [2.0] * 128
    load_farthest.compile(x64(), z64())


@st.kernel
def load_last_python_style(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load((-1,), (64,)))


def test_a_negative_compile_time_tile_index_is_refused_naming_the_last_tile():
    e = refused(load_last_python_style, lambda: (x64(), z64()),
                r"tile index -1 lies before the tensor's start.*do not count from the end")
    assert "sl.cdiv(x.shape[a], size) - 1" in str(e)


@st.kernel
def sub_store_outside(z: st.Out[st.f32]):
    z.partition((16,)).store(sl.zeros((16,), st.f32), (4,))


def test_a_compile_time_sub_tile_index_outside_the_sub_grid_is_refused():
    refused(sub_store_outside, lambda: (z64(),), r"outside the owned slab's sub-grid \(4,\)")


# ---- compile-time ints that no runtime type holds ----------------------------------------------

@st.kernel
def plus_huge(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + 10**30)


@st.kernel
def store_huge(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(10**30)


@st.kernel
def huge_beside_a_runtime_value(x: st.In[st.f32], z: st.Out[st.f32]):
    a, b = z.index[0], 10**30
    z.store(sl.load_like(x, z) + a)


@pytest.mark.parametrize("kernel", [plus_huge, store_huge, huge_beside_a_runtime_value],
                         ids=["arithmetic", "store", "tuple"])
def test_a_compile_time_int_past_int64_meeting_a_runtime_value_is_refused(kernel):
    refused(kernel, lambda: (x64(), z64()), r"does not fit in 64 bits.*1e30")


@st.kernel
def bool_below_2_31(x: st.In[st.bool_], z: st.Out[st.i32]):
    z.store((sl.load_like(x, z) < 2**31).astype(st.i32))


@st.kernel
def range_past_2_31(x: st.In[st.bool_], z: st.Out[st.i32]):
    acc = sl.zeros(z.shape, st.i32)
    for i in range(2**31, 2**31 + 2):
        acc = acc + 1
    z.store(acc)


@st.function
def two_to_the_31():
    return 2**31


@st.kernel
def helper_returns_2_31(x: st.In[st.bool_], z: st.Out[st.i64]):
    z.store(sl.zeros(z.shape, st.i64) + two_to_the_31())


@pytest.mark.parametrize("kernel", [bool_below_2_31, range_past_2_31, helper_returns_2_31],
                         ids=["meets a bool tile", "range bound", "helper result"])
def test_a_compile_time_int_in_the_uint32_range_taking_its_own_type_is_refused(kernel):
    # Triton types an int in [2**31, 2**32) uint32 on its own: the language has no such type
    out = st.i64 if kernel is helper_returns_2_31 else st.i32
    refused(kernel, lambda: (x64(st.bool_), z64(out)), r"\[2\*\*31, 2\*\*32\).*st\.int64")


@st.kernel
def int64_below_2_31(x: st.In[st.i64], z: st.Out[st.i32]):
    z.store((sl.load_like(x, z) < 2**31).astype(st.i32))


def test_a_compile_time_int_in_the_uint32_range_meeting_an_int64_tile_takes_its_type():
    assert cpu(int64_below_2_31, x64(st.i64), z64(st.i32)) == [1] * 128
    int64_below_2_31.compile(x64(st.i64), z64(st.i32))


# ---- assignments -------------------------------------------------------------------------------

@st.kernel
def unpack_one(z: st.Out[st.i32]):
    i, = z.index
    n, = z.shape
    z.store(sl.arange(n) + i)


def test_unpacking_a_one_entry_tile_index_and_shape_compiles():
    assert cpu(unpack_one, z64(st.i32)) == list(range(64)) + list(range(1, 65))
    unpack_one.compile(z64(st.i32))


@st.kernel
def unpack_nested(z: st.Out[st.i32, 2]):
    (a, (m, n)) = (z.index[0], z.shape)
    z.store(sl.zeros((m, n), st.i32) + a)


def test_nested_unpacking_is_refused():
    refused(unpack_nested, lambda: (st.zeros((8, 8), dtype=st.i32).partition((4, 4)),),
            "unpack one level")


@st.kernel
def chained(z: st.Out[st.i32]):
    a = b = z.index[0]
    z.store(sl.zeros(z.shape, st.i32) + a + b)


def test_a_chained_assignment_is_refused():
    refused(chained, lambda: (z64(st.i32),), "one target per assignment")


@st.kernel
def shape_alias(z: st.Out[st.f32]):
    s = z.shape
    z.store(sl.zeros(s, st.f32) + 1)


def test_a_tile_shape_held_in_a_name_compiles():
    shape_alias.compile(z64())


# ---- shapes and indices ------------------------------------------------------------------------

@st.kernel
def last_dim(x: st.In[st.i32, 2], z: st.Out[st.i32, 2]):
    z.store(sl.zeros(z.shape, st.i32) + x.shape[-1] + z.shape[-1] + z.index[-1])


def test_a_negative_shape_index_counts_from_the_end_and_compiles():
    args = (lambda: (st.zeros((3, 5), dtype=st.i32),
                     st.zeros((4, 4), dtype=st.i32).partition((4, 2))))
    assert cpu(last_dim, *args())[0] == [7, 7, 8, 8]
    last_dim.compile(*args())


@st.kernel
def full_of_an_int_shape(z: st.Out[st.f32]):
    z.store(sl.full(64, 1.0, st.f32))


@st.kernel
def zeros_of_an_int_shape(z: st.Out[st.f32]):
    z.store(sl.zeros(64, st.f32) + 1.0)


@pytest.mark.parametrize("kernel", [full_of_an_int_shape, zeros_of_an_int_shape],
                         ids=["full", "zeros"])
def test_a_bare_int_shape_of_full_or_zeros_is_refused(kernel):
    # Triton's tl.full and tl.zeros take a shape tuple only (an int is "not iterable")
    refused(kernel, lambda: (z64(),), r"shape `64` must be a tuple: write \(64,\)")


@st.kernel
def reshaped_to_an_int(z: st.Out[st.f32]):
    z.store(sl.reshape(sl.zeros((8, 8), st.f32) + 2.0, 64))


@st.kernel
def broadcast_to_an_int(z: st.Out[st.f32]):
    z.store(sl.broadcast_to(sl.zeros((1,), st.f32) + 3.0, 64))


def test_reshape_and_broadcast_to_an_int_shape_run_on_the_cpu_as_they_compile():
    assert cpu(reshaped_to_an_int, z64()) == [2.0] * 128
    assert cpu(broadcast_to_an_int, z64()) == [3.0] * 128
    reshaped_to_an_int.compile(z64())
    broadcast_to_an_int.compile(z64())


@st.kernel
def complex_power(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + (-8.0) ** 0.5)


def test_a_compile_time_power_with_a_complex_value_is_refused():
    refused(complex_power, lambda: (x64(), z64()), r"\(-8\.0\) \*\* 0\.5` is complex")


@st.kernel
def bool_tuple_index(z: st.Out[st.i32]):
    z.store(sl.zeros(z.shape, st.i32) + z.shape[True])


def test_a_bool_tuple_index_is_refused():
    refused(bool_tuple_index, lambda: (z64(st.i32),), "index a tuple with a compile-time int")


@st.kernel
def inline_sub_shape(z: st.Out[st.i32]):
    z.store(sl.zeros(z.shape, st.i32) + z.partition((16,)).shape[-1])


def test_the_shape_of_an_inline_sub_partition_compiles():
    assert cpu(inline_sub_shape, z64(st.i32)) == [16] * 128
    inline_sub_shape.compile(z64(st.i32))


@st.kernel
def index_in_a_name(x: st.In[st.f32], z: st.Out[st.f32]):
    i = (z.index[0],)
    z.store(x.load(i, (64,)))


def test_a_one_entry_index_held_in_a_name_compiles():
    index_in_a_name.compile(x64(), z64())


@st.kernel
def arange_of_a_tuple(z: st.Out[st.i32]):
    z.store(sl.arange((64,)))


def test_sl_arange_of_a_tuple_is_refused():
    refused(arange_of_a_tuple, lambda: (z64(st.i32),), "sl.arange takes one compile-time int")


@st.kernel
def float_axis(z: st.Out[st.i32]):
    z.store(sl.zeros(z.shape, st.i32) + sl.num_blocks(0.0))


def test_a_float_launch_axis_is_refused():
    refused(float_axis, lambda: (z64(st.i32),), "the launch axis must be 0, 1 or 2")


@st.kernel
def second_axis_of_a_persistent_launch(z: st.Out[st.i32]):
    for t in z.tiles():
        t.store(sl.zeros(t.shape, st.i32) + sl.bid(1))


@st.function
def tile_number():
    return sl.bid(0)


@st.kernel
def bid_in_a_helper(z: st.Out[st.i32]):
    z.store(sl.zeros(z.shape, st.i32) + tile_number())


def test_a_second_launch_axis_of_a_persistent_launch_is_refused():
    # Its programs are numbered on axis 0, each iterating over tiles: bid(1) would be 0.
    refused(second_axis_of_a_persistent_launch, lambda: (z64(st.i32, persistent=2),),
            "a persistent launch runs its programs on one axis")


def test_bid_in_a_helper_of_a_kernel_over_an_out_grid_is_refused():
    # (the helper's own generated function would not know the program's tile)
    refused(bid_in_a_helper, lambda: (z64(st.i32),),
            r"pass z.index\[k\] \(or sl.bid\(k\)\) to the helper")


@st.kernel(unsafe=True)
def second_axis_of_a_grid(p: st.Ptr[st.i32]):
    sl.store_ptr(p, sl.zeros((1,), st.i32) + sl.bid(1) * sl.num_blocks(0) + sl.bid(0),
                 sl.zeros((1,), st.i32) + sl.num_blocks(1))


def test_a_second_launch_axis_counts_programs_of_a_grid_option():
    with st.backend("interpret"), st.unsafe():
        (p,) = second_axis_of_a_grid.options(grid=(2, 3))(st.zeros((6,), dtype=st.i32)).sync()
    assert p.to_torch().tolist() == [3] * 6


# ---- persistent loops --------------------------------------------------------------------------

@st.kernel
def nested_tiles(z: st.Out[st.i32]):
    for t in z.tiles():
        for u in z.tiles():
            u.store(sl.zeros(u.shape, st.i32) + 1)


@pytest.mark.parametrize("persistent", [2, None], ids=["persistent", "one tile a program"])
def test_nested_tiles_loops_are_refused(persistent):
    kw = {"persistent": persistent} if persistent else {}
    refused(nested_tiles, lambda: (st.zeros((256,), dtype=st.i32).partition((64,), **kw),),
            r"a `tiles\(\)` loop inside another")


@st.kernel
def tiles_with_an_argument(z: st.Out[st.i32]):
    for t in z.tiles(2):
        t.store(sl.zeros(t.shape, st.i32))


def test_tiles_with_an_argument_is_refused():
    refused(tiles_with_an_argument, lambda: (z64(st.i32, persistent=1),), "takes no arguments")


# ---- call arguments ----------------------------------------------------------------------------

@st.kernel
def unknown_keyword(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load((0,), (64,), bogus=1))


def test_an_unknown_keyword_argument_is_refused():
    refused(unknown_keyword, lambda: (x64(), z64()), "has no parameter `bogus`")


@st.kernel
def positional_by_name(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.exp(x=sl.load_like(x, z)))


def test_a_positional_parameter_passed_by_name_is_refused():
    refused(positional_by_name, lambda: (x64(), z64()), r"sl\.exp\(x\) takes `x` positionally")


@st.kernel
def missing_index(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(x.load())


def test_a_missing_argument_is_refused_with_the_signature():
    refused(missing_index, lambda: (x64(), z64()),
            r"x\.load\(index, shape, padding=0\): missing a required argument: 'index'")


@st.kernel
def extra_argument(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.exp(sl.load_like(x, z), 2.0))


def test_an_extra_argument_is_refused():
    refused(extra_argument, lambda: (x64(), z64()), "too many positional arguments")


@st.kernel
def astype_by_name(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z).astype(dtype=st.f32))


def test_astype_by_keyword_is_refused():
    refused(astype_by_name, lambda: (x64(), z64()), "astype takes one dtype")


@st.kernel
def by_name(x: st.In[st.f32], z: st.Out[st.i32]):
    s = x.load_scalar(index=(0,), padding=2.0) + sl.sum(x.load(index=(0,), shape=(64,)), axis=0)
    z.store(sl.full(z.shape, s, dtype=st.i32))


def test_the_keyword_arguments_both_backends_take_compile():
    assert cpu(by_name, x64(), z64(st.i32)) == [0] * 128
    by_name.compile(x64(), z64(st.i32))


@st.kernel
def padding_in_a_name(x: st.In[st.f32], z: st.Out[st.f32]):
    p = 2.0
    z.store(x.load((5,), (64,), padding=p))


def test_a_padding_held_in_a_name_compiles():
    assert cpu(padding_in_a_name, x64(), z64()) == [2.0] * 128
    padding_in_a_name.compile(x64(), z64())


@st.kernel
def narrow_matmul(a: st.In[st.f16, 2], z: st.Out[st.f32, 2]):
    z.store(sl.matmul(a.load((0, 0), (16, 8)), a.load((0, 0), (8, 16))))


def test_a_narrow_matmul_is_refused_under_its_own_name():
    refused(narrow_matmul, lambda: (st.randn((16, 16), dtype=st.f16),
                                    st.empty((16, 16)).partition((16, 16))),
            "sl.matmul needs K >= 16")
