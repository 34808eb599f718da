"""What the GPU cannot compile, or would compute otherwise, the type check refuses on both
backends (a KernelDefinitionError naming file:line); what it takes, the CPU executor converts
as the GPU does (int to bf16 rounded once, as ``cvt.rn.bf16.s32``)."""
import pytest
import torch

import safetile as st
import safetile.lang as sl


def vec(values, dtype=torch.float32):
    return st.from_torch(torch.tensor(values, dtype=dtype))


def part(n, dtype=st.f32):
    return st.empty((n,), dtype=dtype).partition((n,))


@st.kernel
def broadcast_adding_an_axis(a: st.In[st.f32], z: st.Out[st.f32, 2]):
    z.store(sl.broadcast_to(a.load((0,), (4,)), (2, 4)))


@st.kernel
def broadcast_keeping_the_rank(a: st.In[st.f32], z: st.Out[st.f32, 2]):
    z.store(sl.broadcast_to(a.load((0,), (4,))[None, :], (2, 4)))


@st.kernel
def reshape_of_a_scalar(a: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.reshape(sl.sum(a.load((0,), (4,))), (1,)))


@st.kernel
def broadcast_of_a_scalar(a: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.broadcast_to(sl.sum(a.load((0,), (4,))), (1,)))


@st.kernel(unsafe=True)
def add_int8_atomically(a: st.In[st.int8], p: st.Ptr[st.int8], z: st.Out[st.int8]):
    x = sl.load_like(a, z)
    sl.atomic_add(p, sl.arange(4), x)
    z.store(x)


@st.kernel(unsafe=True)
def add_floats_into_ints(a: st.In[st.f32], p: st.Ptr[st.i32], z: st.Out[st.f32]):
    x = sl.load_like(a, z)
    sl.atomic_add(p, sl.arange(4), x)
    z.store(x)


@st.kernel(unsafe=True)
def read_with_an_other_past_int8(p: st.Ptr[st.int8], z: st.Out[st.int8]):
    z.store(sl.load_ptr(p, sl.arange(4), sl.arange(4) < 2, 300))


@st.kernel(unsafe=True)
def store_ints_into_bf16(a: st.In[st.i32], p: st.Ptr[st.bf16], z: st.Out[st.i32]):
    x = sl.load_like(a, z)
    sl.store_ptr(p, sl.arange(2), x)
    z.store(x)


@st.kernel(unsafe=True)
def add_ints_into_bf16(a: st.In[st.i32], p: st.Ptr[st.bf16], z: st.Out[st.i32]):
    x = sl.load_like(a, z)
    sl.atomic_add(p, sl.arange(2), x)
    z.store(x)


def run(kernel, *args):
    with st.unsafe(), st.backend("interpret", seed=0):
        return kernel(*args).sync()


@pytest.mark.parametrize("kernel, args, message", [
    (broadcast_adding_an_axis, lambda: (vec([1, 2, 3, 4]), st.empty((2, 4)).partition((2, 4))),
     r"keeps its rank"),
    (reshape_of_a_scalar, lambda: (vec([1, 2, 3, 4]), part(1)), r"reshape of a scalar"),
    (add_int8_atomically, lambda: (vec([1] * 4, torch.int8), st.zeros((4,), dtype=st.int8),
                                   part(4, st.int8)), r"no atomic add of st\.int8"),
    (add_floats_into_ints, lambda: (vec([1.5, -2.7, 3e9, 0.0]), st.zeros((4,), dtype=st.i32),
                                    part(4)), r"convert it explicitly"),
    (read_with_an_other_past_int8, lambda: (vec([1] * 4, torch.int8), part(4, st.int8)),
     r"300 is not a st\.int8 value"),
])
def test_what_the_gpu_would_not_compile_or_would_compute_otherwise_is_refused(
        kernel, args, message):
    with pytest.raises(st.KernelDefinitionError, match=message) as e:
        run(kernel, *args())
    assert "test_type_gpu_parity.py:" in str(e.value)


def test_a_tile_given_an_axis_first_broadcasts():
    _, z = run(broadcast_keeping_the_rank, vec([1, 2, 3, 4]), st.empty((2, 4)).partition((2, 4)))
    assert z.unpartition().to_torch().tolist() == [[1, 2, 3, 4]] * 2


def test_a_scalar_broadcasts_to_a_tile():
    _, z = run(broadcast_of_a_scalar, vec([1, 2, 3, 4]), part(1))
    assert z.unpartition().to_torch().tolist() == [10]


@pytest.mark.parametrize("kernel", [store_ints_into_bf16, add_ints_into_bf16])
def test_ints_written_through_a_bf16_pointer_round_once_as_the_gpu_converts_them(kernel):
    # 2**24 + 2**16 + 1: through fp32 it rounds to 2**24 first, then stays there in bf16.
    _, p, _ = run(kernel, vec([16842753, 16842753], torch.int32), st.zeros((2,), dtype=st.bf16),
                  part(2, st.i32))
    assert p.to_torch().float().tolist() == [16908288.0, 16908288.0]


@pytest.mark.parametrize("kernel, args", [
    (broadcast_keeping_the_rank, lambda: (vec([1, 2, 3, 4]), st.empty((2, 4)).partition((2, 4)))),
    (broadcast_of_a_scalar, lambda: (vec([1, 2, 3, 4]), part(1))),
])
def test_the_forms_the_refusals_point_to_compile_for_the_gpu(kernel, args):
    assert kernel.compile(*args()).asm["ptx"]


@st.kernel(unsafe=True)
def read_bf16_with_an_int_other(p: st.Ptr[st.bf16], z: st.Out[st.bf16]):
    z.store(sl.load_ptr(p, sl.arange(4), sl.arange(4) < 2, 16842753))


def test_load_ptrs_other_becomes_the_pointers_dtype_through_fp32_on_both_backends():
    # 2**24 + 2**16 + 1 through fp32 is 2**24 + 2**16, a tie in bf16 that rounds to 2**24.
    args = lambda: (st.zeros((4,), dtype=st.bf16), part(4, st.bf16))  # noqa: E731
    with st.unsafe():
        assert "other=tl.full((), 16842752.0, tl.float32).to(tl.bfloat16)" in \
            read_bf16_with_an_int_other.source(*args())
        assert read_bf16_with_an_int_other.compile(*args()).asm["ptx"]
    _, z = run(read_bf16_with_an_int_other, *args())
    assert z.unpartition().to_torch().float().tolist() == [0, 0, 16777216.0, 16777216.0]
