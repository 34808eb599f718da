"""Index arithmetic that cannot wrap: each quantity is int64, or proved to fit int32 at
partition()/launch, or guarded in the generated code (lang/semantics.py, Indices and limits).

The generated source runs under Triton's interpreter (``backends.run_interpreter``), which
computes int32 arithmetic as the GPU does (it has no bounds checks: every access here stays
inside small tensors). ``tests/test_gpu_index_limits.py`` writes sentinels around tensors of
the largest accepted shapes on the GPU.
"""
import pytest
import torch

import backends as be
import safetile as st
import safetile.lang as sl
from safetile.lang.semantics import MAX_DIM, MAX_PROGRAMS


@st.kernel
def coordinates(z: st.Out[st.i32, 2]):
    z.store(sl.full(z.shape, sl.bid(0) * 100 + sl.bid(1), st.i32))


def test_a_grouped_order_with_a_huge_group_is_the_map_of_one_group_in_the_generated_code():
    # G * grid[1] was computed in int32: with G = 2**31 - 1 it wrapped, two programs wrote one
    # tile and others none. A group of at least grid[0] rows is one group: the same map.
    shape, tile = (6, 40), (2, 8)

    def args():                          # unwritten elements would keep the -1
        return [st.full(shape, -1, dtype=st.i32).partition(tile, order="grouped",
                                                          group_size=2**31 - 1)]
    src = coordinates.source(*args())
    assert "_st_gw = 3 * _st_g1" in src               # the group clamped to grid[0] = 3
    (got,) = be.run_interpreter(coordinates, args(), 0, 1)
    rows, cols = torch.arange(6)[:, None] // 2, torch.arange(40)[None, :] // 8
    want = (rows * 100 + cols).int()
    assert torch.equal(got, want)
    with st.backend("interpret"):
        (z,) = coordinates(*args()).sync()
    assert torch.equal(z.unpartition().to_torch(), want)


def test_a_tile_grid_that_would_wrap_is_refused_at_partition():
    # (1, 2**31 - 1) int8 in tiles of 1024: tl.cdiv(n, 1024) wrapped and the last program
    # wrote 2 GiB before the tensor. Dimensions stop at MAX_DIM (so n + tile < 2**31).
    big = torch.empty(1, dtype=torch.int8).expand(1, 2**31 - 1)
    with pytest.raises(st.PartitionError, match="over the 2146435072 elements"):
        st.from_torch(big).partition((1, 1024))
    ok = torch.empty(1, dtype=torch.int8).expand(1, MAX_DIM)
    p = st.from_torch(ok).partition((1, 1024))
    assert p.grid == (1, MAX_DIM // 1024)


def test_a_launch_with_a_dimension_past_the_limit_is_refused():
    @st.kernel
    def head(x: st.In[st.int8, 1], z: st.Out[st.int8, 1]):
        z.store(x.load((0,), z.shape))
    x = st.from_torch(torch.zeros(1, dtype=torch.int8).expand(MAX_DIM + 1))
    with st.backend("interpret"), pytest.raises(st.LaunchError, match="a dimension over") as e:
        head(x, st.empty((8,), dtype=st.int8).partition((8,)))
    assert e.value.recovered[0] is x                      # nothing was moved


@st.kernel
def gather_tile(x: st.In[st.f32, 1], idx: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
    z.store(x.load((idx.load_scalar((0,)),), z.shape, padding=-1.0))


def _gather(index: int, backend: str):
    x = st.from_torch(torch.arange(16, dtype=torch.float32))
    i = st.from_torch(torch.tensor([index], dtype=torch.int32))
    z = st.empty((4,), dtype=st.f32).partition((4,))
    if backend == "interpreter":
        return be.run_interpreter(gather_tile, [x, i, z], 2, 1)[0]
    with st.backend("interpret"):
        *_, z = gather_tile(x, i, z).sync()
    return z.unpartition().to_torch()


@pytest.mark.parametrize("index", [2**30, 2**29 + 3, -2**31, -1, 2**31 - 1])
@pytest.mark.parametrize("backend", ["interpreter", "cpu executor"])
def test_a_tile_index_whose_box_passes_int32_reads_padding_not_a_wrapped_box(index, backend):
    # i * t wrapped: index 2**30 with tile 4 read x[0:4] on the GPU
    assert _gather(index, backend).tolist() == [-1.0] * 4


@pytest.mark.parametrize("backend", ["interpreter", "cpu executor"])
def test_an_in_range_data_dependent_tile_index_still_loads_its_box(backend):
    assert _gather(3, backend).tolist() == [12.0, 13.0, 14.0, 15.0]


def test_a_data_dependent_tile_index_is_guarded_in_masked_and_tma_loads():
    @st.kernel
    def rows(x: st.In[st.f32, 2], idx: st.In[st.i32, 1], z: st.Out[st.f32, 2]):
        r = idx.load_scalar((0,))
        z.store(x.load((r, 0), z.shape) + x.load(z.index, z.shape))
    x = st.zeros((64, 64), device="cpu")
    i = st.from_torch(torch.tensor([1], dtype=torch.int32))
    z = st.empty((64, 64), device="cpu").partition((16, 64))
    src = rows.source(x, i, z)
    assert "_st_tmacoord(r, 16)" in src and "(_st_i0) * 16" in src   # guarded, owned stays plain
    plain = rows.options(tma=False).source(x, i, z)
    assert "_st_iload2(" in plain and "_st_load2(" in plain
    assert ".target sm_90" in rows.compile(x, i, z).asm["ptx"]


@st.kernel
def sub_store(j: st.In[st.i32, 1], z: st.Out[st.f32, 1]):
    z.store(sl.zeros(z.shape, st.f32))
    z.partition((2,)).store(sl.full((2,), 7.0, st.f32), (j.load_scalar((0,)),))


@pytest.mark.parametrize("j", [-2**31, 2**31 - 1, -1, 4])
def test_a_sub_index_outside_the_slab_stores_nothing_on_the_gpu_and_is_reported_on_the_cpu(j):
    # -2**31 * 2 wrapped to sub-tile 0 on the GPU
    idx = torch.tensor([j], dtype=torch.int32)
    (got,) = be.run_interpreter(sub_store, [st.from_torch(idx), st.empty((8,)).partition((8,))],
                                1, 1)
    assert got.tolist() == [0.0] * 8
    with st.backend("interpret"), pytest.raises(st.OutOfBoundsError, match="sub-tile index"):
        sub_store(st.from_torch(idx), st.empty((8,)).partition((8,))).sync()


def test_an_in_range_sub_index_stores_its_sub_tile_on_both_backends():
    idx = torch.tensor([2], dtype=torch.int32)
    (got,) = be.run_interpreter(sub_store, [st.from_torch(idx), st.empty((8,)).partition((8,))],
                                1, 1)
    assert got.tolist() == [0, 0, 0, 0, 7, 7, 0, 0]
    with st.backend("interpret"):
        _, z = sub_store(st.from_torch(idx), st.empty((8,)).partition((8,))).sync()
    assert z.unpartition().to_torch().tolist() == [0, 0, 0, 0, 7, 7, 0, 0]


def test_launch_and_partition_limits_are_typed_errors():
    with pytest.raises(st.PartitionError, match="over Triton's limit of 1048576"):
        st.zeros((8,)).partition((2**36,))
    with pytest.raises(st.PartitionError, match="programs one launch may have"):
        st.from_torch(torch.zeros(1, 1).expand(2**16, 2**16)).partition((1, 1))
    assert MAX_PROGRAMS == 2**31 - 1
    with pytest.raises(st.PartitionError, match="tile counter"):
        st.from_torch(torch.zeros(1).expand(2**31 - 2**20)).partition((1,), persistent=2**21)


@st.kernel
def scaled(x: st.In[st.f32], z: st.Out[st.f32], n: int, s: float):
    z.store(sl.load_like(x, z) * s + n)


def test_scalar_arguments_outside_their_kernel_types_are_typed_errors():
    x = st.zeros((8,))
    with st.backend("interpret"):
        with pytest.raises(st.LaunchError, match="does not fit in int32"):
            scaled(x, st.empty((8,)).partition((8,)), 2**31, 1.0)
        with pytest.raises(st.LaunchError, match="does not fit in a float"):
            scaled(x, st.empty((8,)).partition((8,)), 1, 10**400)
        # a Python float beyond fp32 is rounded to fp32, as the GPU receives it
        *_, z, _, _ = scaled(x, st.empty((8,)).partition((8,)), 0, 1e300).sync()
    assert torch.isnan(z.unpartition().to_torch()).all()          # 0 * inf
