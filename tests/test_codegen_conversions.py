"""Conversions the generated Triton code makes as the CPU executor makes them: a store into a
bool Out, an integer load's padding, and bool tensors (which have no tensor descriptor).
Proven on the sm_90 compile of this machine (TTIR) and against the interpret backend."""
import torch

import safetile as st
import safetile.lang as sl


@st.kernel
def to_bool(x: st.In[st.i32], z: st.Out[st.bool_]):
    z.store(sl.load_like(x, z))


@st.kernel
def padded(x: st.In[st.i32], z: st.Out[st.i32]):
    z.store(x.load(z.index, z.shape, 2147483647))


@st.kernel
def padded_exact(x: st.In[st.i32], z: st.Out[st.i32]):
    z.store(x.load(z.index, z.shape, 16777217))


@st.kernel
def bool_rows(x: st.In[st.bool_, 2], z: st.Out[st.i32, 2]):
    z.store(x.load(z.index, z.shape).astype(st.i32))


def ints(values, dtype=torch.int32):
    return st.from_torch(torch.tensor(values, dtype=dtype))


def out(shape, dtype, tile):
    return st.empty(shape, dtype=dtype, device="cpu").partition(tile)


def ttir(kernel, *args) -> str:
    return kernel.compile(*args).asm["ttir"]


def test_an_int_tile_stored_into_a_bool_out_is_true_where_it_is_not_zero():
    values = [0, 1, 2, 256, -1, 512]
    code = ttir(to_bool, ints(values), out((6,), st.bool_, (8,)))
    assert "arith.cmpi ne" in code and "arith.trunci" not in code
    with st.backend("interpret", seed=0):
        _, z = to_bool(ints(values), out((6,), st.bool_, (8,))).sync()
    assert z.unpartition().to_torch().tolist() == [v != 0 for v in values]


def test_an_int_loads_padding_is_the_exact_int_in_the_compiled_code():
    code = ttir(padded, ints([1, 2, 3, 4]), out((8,), st.i32, (8,)))
    assert "dense<2147483647> : tensor<8xi32>" in code and "fptosi" not in code
    code = ttir(padded_exact, ints([1, 2, 3, 4]), out((8,), st.i32, (8,)))
    assert "dense<16777217> : tensor<8xi32>" in code


def test_an_int_loads_padding_reads_the_same_on_the_cpu_executor():
    with st.backend("interpret", seed=0):
        _, z = padded_exact(ints([1, 2, 3, 4]), out((8,), st.i32, (8,))).sync()
    assert z.unpartition().to_torch().tolist() == [1, 2, 3, 4] + [16777217] * 4


def test_a_bool_input_is_loaded_without_a_tensor_descriptor():
    x = st.from_torch(torch.rand(64, 64) > 0.5)
    source = bool_rows.source(x, out((64, 64), st.i32, (32, 32)))
    assert "_st_x_d0" not in source                     # no descriptor argument
    x = st.from_torch(torch.rand(64, 64) > 0.5)
    assert ttir(bool_rows, x, out((64, 64), st.i32, (32, 32)))


@st.kernel(unsafe=True, grid=(1,))
def ptr_to_bool(p: st.Ptr[st.bool_], x: st.In[st.i32]):
    sl.store_ptr(p, sl.arange(4), x.load((0,), (4,)))


def test_an_int_tile_stored_through_a_bool_pointer_is_true_where_it_is_not_zero():
    values = [0, 1, 256, -1]
    with st.unsafe():
        code = ttir(ptr_to_bool, st.zeros((4,), dtype=st.bool_, device="cpu"), ints(values))
        with st.backend("interpret", seed=0):
            p, _ = ptr_to_bool(st.zeros((4,), dtype=st.bool_, device="cpu"), ints(values)).sync()
    assert "arith.cmpi ne" in code and "arith.trunci" not in code
    assert p.to_torch().tolist() == [v != 0 for v in values]


@st.kernel
def int_to_bf16(x: st.In[st.i32], z: st.Out[st.bf16], w: st.Out[st.bf16]):
    v = sl.load_like(x, z)
    z.store(v.astype(st.bf16))
    w.store(v)


def test_an_int_becomes_bf16_by_one_rounding_on_both_backends():
    values = [16842753, 16908287, 33685505, -16842753]      # next to bf16 midpoints
    ptx = int_to_bf16.compile(ints(values), out((4,), st.bf16, (4,)),
                              out((4,), st.bf16, (4,))).asm["ptx"]
    assert "cvt.rn.bf16.s32" in ptx
    with st.backend("interpret", seed=0):
        _, z, w = int_to_bf16(ints(values), out((4,), st.bf16, (4,)),
                              out((4,), st.bf16, (4,))).sync()
    once = [16908288.0, 16908288.0, 33816576.0, -16908288.0]   # rounded from the exact int
    assert z.unpartition().to_torch().float().tolist() == once
    assert w.unpartition().to_torch().float().tolist() == once


@st.kernel
def int64_to_bf16(x: st.In[st.i64], z: st.Out[st.bf16]):
    z.store(sl.load_like(x, z).astype(st.bf16))


def test_an_int64_past_2_to_the_53_becomes_bf16_by_one_rounding_on_both_backends():
    values = [2**60 + 2**52 + 1, -(2**60 + 2**52 + 1), 2**63 - 1, -2**63]
    ptx = int64_to_bf16.compile(ints(values, torch.int64), out((4,), st.bf16, (4,))).asm["ptx"]
    assert "cvt.rn.bf16.s64" in ptx
    with st.backend("interpret", seed=0):
        _, z = int64_to_bf16(ints(values, torch.int64), out((4,), st.bf16, (4,))).sync()
    once = [2.0**60 + 2.0**53, -(2.0**60 + 2.0**53), 2.0**63, -(2.0**63)]
    assert z.unpartition().to_torch().double().tolist() == once
