"""safetile.lang on the CPU executor, continued: partitions of every rank, loops and branches,
gathers, sub-partition stores of the owned slab, @st.function helpers and the refusals of
mixed or float conditions (see test_lang_ops.py for the conventions)."""
import pytest
import torch

import safetile as st
import safetile.lang as sl

from lang_cases import DTYPES, DTYPE_IDS, In, Out, assert_close, rand, result, rounded
from lang_cases import cpu_executor  # noqa: F401  (the autouse fixture)


# ---- partitions of every rank, loops, branches --------------------------------------------------

@st.kernel
def scale_copy(x: st.In[st.floats], z: st.Out[st.floats]):
    z.store(sl.load_like(x, z) * 2.0 + 1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape,tile", [((37,), (8,)), ((7, 10), (4, 4)), ((3, 5, 6), (2, 4, 4))],
                         ids=["1d", "2d", "3d"])
def test_partitions_of_rank_1_2_3_with_edge_tiles(shape, tile, dtype):
    x = rand(shape, dtype, 13)
    _, z = scale_copy(In(x), Out(shape, dtype, tile)).sync()
    expected = rounded(rounded(x.float() * 2.0, dtype).float() + 1.0, dtype)
    assert torch.equal(result(z), expected)


@st.kernel
def row_sums_scaled(x: st.In[st.floats, 2], z: st.Out[st.f32, 2], BC: st.Const[int],
                    scale: float):
    i = z.index[0]
    acc = sl.zeros((z.shape[0], BC), st.f32)
    for k in range(sl.cdiv(x.shape[1], BC)):
        acc = acc + x.load((i, k), (z.shape[0], BC)).astype(st.f32)
    if scale != 1.0:
        acc = acc * scale
    z.store(sl.sum(acc, 1)[:, None])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_for_loop_carries_a_tile_and_if_tests_a_scalar(dtype, scale):
    x = rand((6, 37), dtype, 14)
    _, z, _, _ = row_sums_scaled(In(x), Out((6, 1), st.f32, (4, 1)), 8, scale).sync()
    torch.testing.assert_close(result(z)[:, 0], x.float().sum(1) * scale, rtol=1e-5, atol=1e-5)


@st.kernel
def parity(z: st.Out[st.i32]):
    if sl.bid(0) % 2 == 0:
        z.store(sl.full(z.shape, 10, st.i32))
    else:
        z.store(sl.full(z.shape, 20, st.i32))


def test_if_else_on_the_program_id():
    z, = parity(Out((16,), st.i32, (4,))).sync()
    expected = torch.tensor([10, 20, 10, 20], dtype=torch.int32).repeat_interleave(4)
    assert torch.equal(result(z), expected)


# ---- gathers ------------------------------------------------------------------------------------

@st.kernel
def embedding(ids: st.In[st.i32, 1], table: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    t, j = z.index
    row = ids.load_scalar((t,))
    z.store(table.load((row, j), (1, z.shape[1])))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gather_rows_at_data_dependent_indices(dtype):
    table = rand((11, 20), dtype, 15)
    ids = torch.tensor([3, 0, 10, 3, 7], dtype=torch.int32)
    _, _, z = embedding(In(ids), In(table), Out((5, 20), dtype, (1, 8))).sync()
    assert torch.equal(result(z), table[ids.long()])


def test_gather_outside_the_table_reads_the_padding():
    table = rand((4, 8), st.f32, 20)
    ids = torch.tensor([1, -1, 4, 2], dtype=torch.int32)      # rows -1 and 4 do not exist
    _, _, z = embedding(In(ids), In(table), Out((4, 8), st.f32, (1, 8))).sync()
    expected = torch.zeros(4, 8)
    expected[0], expected[3] = table[1], table[2]
    assert torch.equal(result(z), expected)


# ---- sub-partitions of the owned slab -----------------------------------------------------------

@st.kernel
def sub_copy(x: st.In[st.floats, 2], z: st.Out[st.floats, 2]):
    i = z.index[0]
    rows = z.partition((2, z.shape[1]))
    for j in range(4):
        rows.store(x.load((i * 4 + j, 0), (2, z.shape[1])) * 2.0, (j, 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sub_partition_stores_fill_the_owned_slab(dtype):
    x = rand((20, 16), dtype, 16)                           # last slab (rows 16..23) is partial
    _, z = sub_copy(In(x), Out((20, 16), dtype, (8, 16))).sync()
    assert torch.equal(result(z), rounded(x.float() * 2.0, dtype))


@st.kernel
def sub_scatter(x: st.In[st.floats, 2], perm: st.In[st.i32, 1], z: st.Out[st.floats, 2]):
    i = z.index[0]
    rows = z.partition((2, z.shape[1]))
    for j in range(4):
        k = perm.load_scalar((j,))
        rows.store(x.load((i * 4 + j, 0), (2, z.shape[1])), (k, 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_sub_partition_store_at_a_data_dependent_sub_index(dtype):
    x = rand((16, 8), dtype, 17)
    perm = [3, 0, 2, 1]
    _, _, z = sub_scatter(In(x), In(torch.tensor(perm, dtype=torch.int32)),
                          Out((16, 8), dtype, (8, 8))).sync()
    expected = torch.empty_like(x)
    for slab in range(2):
        for j, k in enumerate(perm):
            dst, src = slab * 8 + 2 * k, slab * 8 + 2 * j
            expected[dst:dst + 2] = x[src:src + 2]
    assert torch.equal(result(z), expected)


def test_sub_partition_store_outside_the_slab_raises_out_of_bounds():
    x = rand((16, 8), st.f32, 18)
    perm = torch.tensor([3, 0, 4, 1], dtype=torch.int32)      # sub-grid of a slab is 4 rows
    op = sub_scatter(In(x), In(perm), Out((16, 8), st.f32, (8, 8)))
    with pytest.raises(st.OutOfBoundsError) as ei:
        op.sync()
    msg = str(ei.value)
    assert "kernel 'sub_scatter'" in msg and "program" in msg
    assert "sub-tile index (4, 0)" in msg and "owned slab" in msg


@st.kernel
def sub_wider_than_slab(z: st.Out[st.f32]):
    z.partition((16,)).store(sl.full((16,), 1.0, st.f32) + z.index[0], (0,))


def test_sub_tile_overhanging_the_slab_is_clipped_to_it():
    # Slabs of 8 with a sub-tile of 16: its second half covers the next program's slab,
    # which this program must not write.
    z, = sub_wider_than_slab(Out((16,), st.f32, (8,))).sync()
    expected = torch.tensor([1.0] * 8 + [2.0] * 8)
    assert torch.equal(result(z), expected)


# ---- @st.function helpers -----------------------------------------------------------------------

@st.function
def gelu_tanh(t):
    inner = 0.7978845608 * (t + 0.044715 * t * t * t)
    return 0.5 * t * (1.0 + sl.tanh(inner))


@st.function
def gelu_in_fp32(t):
    return gelu_tanh(t.astype(st.f32))


@st.kernel
def gelu(x: st.In[st.floats], z: st.Out[st.floats]):
    z.store(gelu_in_fp32(sl.load_like(x, z)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_st_function_helpers_call_each_other_from_a_kernel(dtype):
    x = rand((30,), dtype, 19)
    _, z = gelu(In(x), Out((30,), dtype, (16,))).sync()
    ref = torch.nn.functional.gelu(x.float(), approximate="tanh")
    assert_close(result(z), rounded(ref, dtype), dtype)


@st.kernel
def scatter_inline(x: st.In[st.f32], idx: st.In[st.i32], z: st.Out[st.f32]):
    j = idx.load_scalar((z.index[0],))
    z.partition((4,)).store(x.load(z.index[0], 4), (j,))


def test_the_inline_sub_partition_store_of_the_design_works_and_compiles():
    x = st.from_torch(torch.arange(8.0))
    idx = st.from_torch(torch.tensor([2, 1], dtype=torch.int32))
    x, idx, z = scatter_inline(x, idx, st.zeros((32,)).partition((16,))).sync()
    got = z.unpartition().to_torch()
    want = torch.zeros(32)
    want[8:12], want[20:24] = torch.arange(4.0), torch.arange(4.0, 8.0)
    assert torch.equal(got, want)
    ptx = scatter_inline.compile(x, idx, st.zeros((32,)).partition((16,))).asm["ptx"]
    assert "st.global" in ptx


def test_tile_sizes_that_are_not_powers_of_two_are_refused_on_the_cpu_as_on_the_gpu():
    @st.kernel
    def odd(x: st.In[st.f32], z: st.Out[st.f32], n: st.Const[int]):
        z.store(sl.zeros(z.shape, st.f32) + sl.sum(x.load(0, n), 0))

    # a compile-time size known only at launch: refused by the per-variant type check, on
    # the CPU as it would be on the GPU (a literal size fails at definition already)
    with pytest.raises(st.KernelDefinitionError, match=r"test_lang_ops_control.py:\d+: \[type\] load "
                                                       r"shape \(3,\): tile sizes must be powers"):
        odd(st.randn((8,)), st.zeros((8,)).partition((8,)), 3).sync()


def test_a_python_number_meeting_a_half_tile_is_rounded_to_the_tiles_type_first():
    @st.kernel
    def times(x: st.In[st.f16], z: st.Out[st.f16]):
        z.store(sl.load_like(x, z) * 100000.0)     # 1e5 is inf in fp16, as on the GPU

    x = st.from_torch(torch.tensor([0.0, 1e-3, -2.0, 0.5], dtype=torch.float16))
    x, z = times(x, st.empty((4,), dtype=st.f16).partition((4,))).sync()
    got = z.unpartition().to_torch()
    assert torch.isnan(got[0]) and got[1] == float("inf") and got[2] == float("-inf")


def test_max_and_maximum_skip_nan_as_the_gpu_does():
    @st.kernel
    def nan_max(x: st.In[st.f32, 2], z: st.Out[st.f32, 2]):
        t = sl.load_like(x, z)
        m = sl.max(t, 1)
        z.store(sl.maximum(t, 0.5) + m[:, None] * 0.0 + sl.broadcast_to(m[:, None], z.shape))

    nan = float("nan")
    x = st.from_torch(torch.tensor([[1.0, nan, 3.0, 2.0], [nan, nan, nan, nan]]))
    x, z = nan_max(x, st.empty((2, 4)).partition((2, 4))).sync()
    got = z.unpartition().to_torch()
    assert got[0].tolist() == [4.0, 3.5, 6.0, 5.0]     # maximum(nan, 0.5) = 0.5; max skips nan
    assert torch.isnan(got[1]).all()                  # a row of NaN has a NaN max


@st.kernel
def select_by_float(x: st.In[st.f32], z: st.Out[st.f32]):
    t = sl.load_like(x, z)
    z.store(sl.where(t, t, 0.0))


@st.kernel
def select_by_int(x: st.In[st.i32], z: st.Out[st.i32]):
    t = sl.load_like(x, z)
    z.store(sl.where(t, t, 7))


def test_where_refuses_a_float_condition_with_the_comparison_to_write():
    with pytest.raises(st.KernelDefinitionError, match=r"condition is a st.float32 tile of shape \(4,\): it takes a bool condition"):
        select_by_float(st.ones((4,)), st.empty((4,)).partition((4,))).sync()


def test_where_refuses_an_int_condition_too():
    x = st.from_torch(torch.tensor([0, 3, 0, -1], dtype=torch.int32))
    with pytest.raises(st.KernelDefinitionError, match=r"condition is a st.int32 tile"):
        select_by_int(x, st.empty((4,), dtype=st.i32).partition((4,))).sync()
