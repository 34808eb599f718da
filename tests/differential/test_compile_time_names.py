"""Names bound to compile-time values, unpacking and negative shape indices mean one thing on
both backends: each kernel runs on the CPU executor and as generated Triton (Triton's
interpreter), and the results must be equal (lang/semantics.py: a name bound to a
compile-time value is that value, however it was bound)."""
import torch

import backends as be
import safetile as st
import safetile.lang as sl


def both(kernel, make_args, n_in: int) -> torch.Tensor:
    cpu = be.run_cpu(kernel, make_args(), n_in, 1)[0]
    generated = be.run_interpreter(kernel, make_args(), n_in, 1)[0]
    assert torch.equal(cpu, generated), (cpu, generated)
    return cpu


@st.kernel
def rebound_int(x: st.In[st.int8], z: st.Out[st.int8]):
    c = 3
    c = 5
    z.store((sl.load_like(x, z) + c) // 2)


def test_a_name_rebound_to_a_compile_time_int_meets_an_int8_tile_as_int8():
    # 127 + 5 wraps in int8 (-124 // 2 == -62); as a runtime int32 it would give 66
    got = both(rebound_int, lambda: (st.from_torch(torch.full((64,), 127, dtype=torch.int8)),
                                     st.empty((64,), dtype=st.int8).partition((64,))), 1)
    assert got.tolist() == [-62] * 64


@st.kernel
def float_name(x: st.In[st.f16], z: st.Out[st.f32]):
    c = 0.1
    z.store(sl.zeros(z.shape, st.f32) + sl.sum(sl.load_like(x, z) * c))


def test_a_name_bound_to_a_compile_time_float_meets_a_half_tile_as_half():
    # each product is rounded to fp16 and the fp16 sum rounded back to fp16 (6.3984375);
    # an fp32 product would give 6.4
    got = both(float_name, lambda: (st.from_torch(torch.ones(64, dtype=torch.float16)),
                                    st.empty((64,)).partition((64,))), 1)
    assert got.tolist() == [6.3984375] * 64


@st.kernel
def counted(z: st.Out[st.i32]):
    n = 16
    n += 16
    z.store(sl.zeros(z.shape, st.i32) + sl.sum(sl.arange(n)))


def test_a_compile_time_value_updated_in_place_stays_a_tile_size():
    got = both(counted, lambda: (st.empty((64,), dtype=st.i32).partition((64,)),), 0)
    assert got.tolist() == [sum(range(32))] * 64


@st.kernel
def unpacked(x: st.In[st.i32, 2], z: st.Out[st.i32, 2]):
    i, j = z.index
    m, n = z.shape
    r, = (x.shape[-1],)
    z.store(sl.zeros((m, n), st.i32) + i * 100 + j * 10 + r)


def test_unpacked_tile_indices_shapes_and_one_entry_tuples_agree():
    got = both(unpacked, lambda: (st.zeros((3, 5), dtype=st.i32),
                                  st.empty((4, 8), dtype=st.i32).partition((2, 4))), 1)
    assert got[::2, ::4].tolist() == [[5, 15], [105, 115]]


@st.kernel
def from_the_end(x: st.In[st.i32, 2], z: st.Out[st.i32, 2]):
    z.store(sl.zeros(z.shape, st.i32) + x.shape[-1] * 1000 + x.shape[-2] +
            z.shape[-1] * 100 + z.index[-1] * 10)


def test_negative_shape_and_index_entries_count_from_the_end():
    got = both(from_the_end, lambda: (st.zeros((3, 5), dtype=st.i32),
                                      st.empty((4, 8), dtype=st.i32).partition((2, 4))), 1)
    assert got[0, ::4].tolist() == [5403, 5413]
