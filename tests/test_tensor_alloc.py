"""Allocation, interop (torch, numpy, DLPack) and the graph-capture guard (safetile.tensor.alloc)."""
import threading

import numpy as np
import pytest
import torch

from safetile import dtypes
from safetile.errors import ArgumentError, GraphCaptureError
from safetile.tensor import (Tensor, allocation_forbidden, arange, default_device, empty,
                             forbid_allocation, from_dlpack, from_numpy, from_torch, full,
                             ones, randn, zeros)


@pytest.fixture
def fresh_default_device(monkeypatch):
    default_device.cache_clear()
    yield monkeypatch
    default_device.cache_clear()


# -- allocation -------------------------------------------------------------------------------

def test_zeros_ones_full_have_the_requested_values_and_default_to_float32():
    assert zeros((2, 3), device="cpu").to_torch().eq(0).all()
    assert ones(4, device="cpu").to_torch().eq(1).all()
    f = full((3,), 2.5, device="cpu")
    assert f.to_torch().tolist() == [2.5] * 3
    assert f.dtype is dtypes.float32


def test_empty_has_the_requested_shape_and_dtype():
    e = empty((5, 7), dtype=dtypes.bfloat16, device="cpu")
    assert e.shape == (5, 7) and e.dtype is dtypes.bfloat16


def test_dtype_accepts_safetile_and_torch_dtypes():
    assert zeros(2, dtype=dtypes.f16, device="cpu").dtype is dtypes.float16
    assert zeros(2, dtype=torch.int32, device="cpu").dtype is dtypes.int32


@pytest.mark.parametrize("name, alias, torch_dtype", [
    ("float32", "f32", torch.float32), ("float16", "f16", torch.float16),
    ("bfloat16", "bf16", torch.bfloat16), ("int32", "i32", torch.int32),
    ("int64", "i64", torch.int64), ("int8", None, torch.int8), ("bool_", None, torch.bool)])
def test_st_dtypes_and_their_short_aliases_allocate_their_torch_dtype(name, alias, torch_dtype):
    import safetile as st
    dt = getattr(st, name)
    if alias is not None:
        assert getattr(st, alias) is dt
    t = zeros((2,), dtype=dt, device="cpu")
    assert t.dtype is dt and t.to_torch().dtype == torch_dtype


def test_unsupported_dtypes_are_rejected():
    with pytest.raises(TypeError, match="no safetile dtype"):
        zeros(2, dtype=torch.complex64, device="cpu")
    with pytest.raises(TypeError, match="dtype must be"):
        zeros(2, dtype="float32", device="cpu")


def test_arange_forms_and_default_dtypes():
    assert arange(4, device="cpu").to_torch().tolist() == [0, 1, 2, 3]
    assert arange(2, 8, 3, device="cpu").to_torch().tolist() == [2, 5]
    assert arange(4, device="cpu").dtype is dtypes.int64
    assert arange(0, 1, 0.5, device="cpu").dtype is dtypes.float32
    assert arange(3, dtype=dtypes.f32, device="cpu").dtype is dtypes.float32


def test_arange_takes_a_shape_as_the_other_allocators_do():
    assert arange((4,), dtype=dtypes.f32, device="cpu").to_torch().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert arange(3, dtypes.i32, device="cpu").dtype is dtypes.int32    # dtype positionally


@pytest.mark.parametrize("count", [5, (5,)], ids=["count", "shape"])
def test_arange_takes_dtype_and_device_positionally_in_the_other_allocators_order(count):
    t = arange(count, dtypes.i32, "cpu")
    assert (t.dtype, t.device.type, t.to_torch().tolist()) == (dtypes.int32, "cpu", [0, 1, 2, 3, 4])
    assert arange(count, dtypes.f32, None).to_torch().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert arange(count, torch.float16, "cpu").dtype is dtypes.float16
    with pytest.raises(ArgumentError, match="device is given twice"):
        arange(count, dtypes.i32, "cpu", device="cpu")


def test_arange_takes_its_shape_by_keyword_as_the_other_allocators_do():
    assert arange(shape=(4,), dtype=dtypes.f32, device="cpu").to_torch().tolist() == \
        [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ArgumentError, match="not both"):
        arange(4, shape=(4,), device="cpu")


def test_arange_of_a_one_axis_shape_takes_a_step_as_a_count_does():
    assert arange((6,), step=2, device="cpu").to_torch().tolist() == [0, 2, 4]
    assert arange(shape=(6,), step=2, device="cpu").to_torch().tolist() == [0, 2, 4]


def test_arange_of_a_shape_of_several_axes_counts_in_row_major_order():
    assert arange((2, 3), device="cpu").to_torch().tolist() == [[0, 1, 2], [3, 4, 5]]
    t = arange(shape=(2, 1, 2), dtype=dtypes.bf16, device="cpu")
    assert (t.dtype, t.to_torch().tolist()) == (dtypes.bfloat16, [[[0.0, 1.0]], [[2.0, 3.0]]])
    assert arange((0, 4), device="cpu").shape == (0, 4)


@pytest.mark.parametrize("args, kwargs", [(((2, 3),), {"step": 2}), (((),), {}),
                                          (((2, -1),), {}), (((2.0, 3),), {})],
                         ids=["step", "no-axis", "negative", "float-size"])
def test_arange_of_a_shape_refuses_a_step_no_axis_and_bad_sizes(args, kwargs):
    with pytest.raises(ArgumentError):
        arange(*args, device="cpu", **kwargs)


@pytest.mark.parametrize("args", [("4",), (None,), (4, "8"), (True,)])
def test_arange_refuses_what_is_not_a_count_or_a_shape(args):
    with pytest.raises(ArgumentError, match="st.arange"):
        arange(*args, device="cpu")


def test_arange_refuses_a_range_past_an_integer_dtype():
    with pytest.raises(ArgumentError, match=r"outside st.int8's range \[-128, 127\]"):
        arange(300, dtype=dtypes.int8)
    assert arange(-128, 128, dtype=dtypes.int8).to_torch()[[0, -1]].tolist() == [-128, 127]


def test_numpy_scalars_serve_as_counts_and_shapes():
    assert arange(np.int64(4)).to_torch().tolist() == [0, 1, 2, 3]
    assert arange(np.float32(1.5), dtype=dtypes.float32).to_torch().tolist() == [0.0, 1.0]
    assert zeros(np.int64(3), device="cpu").shape == (3,)
    assert zeros(6, device="cpu").view(np.int64(6)).shape == (6,)


def test_a_numpy_array_or_torch_tensor_of_ints_serves_as_a_shape():
    assert zeros(np.array([2, 3]), device="cpu").shape == (2, 3)
    assert zeros(torch.tensor([2, 3]), device="cpu").shape == (2, 3)
    assert zeros((4, 4), device="cpu").partition(np.array([2, 2])).grid == (2, 2)


def test_arange_of_an_integer_dtype_refuses_fractional_bounds():
    with pytest.raises(ArgumentError, match="an integer dtype takes integer bounds and step"):
        arange(0, 2.5, 0.5, dtype=dtypes.int32)


def test_from_dlpack_refuses_a_read_only_or_negatively_strided_array():
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ArgumentError, match="read-only"):
        from_dlpack(frozen)
    with pytest.raises(ArgumentError, match="negative strides"):
        from_dlpack(np.zeros(4, np.float32)[::-1])


@pytest.mark.parametrize("wrap", [from_torch, from_dlpack], ids=["from_torch", "from_dlpack"])
def test_reading_a_tensor_whose_storage_shrank_through_torch_is_an_argument_error(wrap):
    raw = torch.zeros(64)
    t = wrap(raw)
    raw.untyped_storage().resize_(0)
    with pytest.raises(ArgumentError, match="reaches past the end of its storage"):
        t.to_torch()


def test_randn_with_a_seed_is_reproducible_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected_global = torch.rand(1)
    torch.manual_seed(123)
    a = randn((64,), seed=7, device="cpu").to_torch()
    b = randn((64,), seed=7, device="cpu").to_torch()
    assert torch.equal(a, b)
    assert torch.equal(torch.rand(1), expected_global)
    assert not torch.equal(a, randn((64,), seed=8, device="cpu").to_torch())


def test_randn_rejects_integer_dtypes():
    with pytest.raises(TypeError, match="floating"):
        randn(3, dtype=dtypes.int32, device="cpu")


def test_default_device_follows_the_environment(fresh_default_device):
    fresh_default_device.setenv("SAFETILE_DEVICE", "cpu")
    assert default_device() == torch.device("cpu")
    assert zeros(2).device == torch.device("cpu")


def test_default_device_is_cuda_only_when_available(fresh_default_device):
    fresh_default_device.delenv("SAFETILE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device().type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("call", [
    lambda: zeros(4, device="cuda"), lambda: ones(4, device="cuda:0"),
    lambda: full(4, 1.0, device="cuda"), lambda: empty(4, device="cuda"),
    lambda: arange(4, device="cuda"), lambda: randn(4, device="cuda", seed=1),
    lambda: from_numpy(np.zeros(4, np.float32), device="cuda"),
])
def test_a_cuda_device_without_cuda_is_an_argument_error(call):
    with pytest.raises(ArgumentError, match="no CUDA device is available.*device='cpu'"):
        call()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_a_cuda_default_device_without_cuda_is_an_argument_error(fresh_default_device):
    fresh_default_device.setenv("SAFETILE_DEVICE", "cuda")
    with pytest.raises(ArgumentError, match="no CUDA device is available"):
        zeros(2)


@pytest.mark.skipif(torch.xpu.is_available(), reason="this machine has an XPU device")
@pytest.mark.parametrize("call", [lambda: zeros(4, device="xpu"),
                                  lambda: from_numpy(np.zeros(4, np.float32), device="xpu")],
                         ids=["zeros", "from_numpy"])
def test_a_device_this_machine_lacks_is_an_argument_error(call):
    with pytest.raises(ArgumentError, match="no 'xpu' device is available.*device='cpu'"):
        call()


# -- interop ----------------------------------------------------------------------------------

def test_from_torch_is_zero_copy():
    src = torch.arange(12.0).reshape(3, 4)
    t = from_torch(src)
    assert isinstance(t, Tensor)
    assert t._torch.data_ptr() == src.data_ptr()
    assert t.stride() == (4, 1)


def test_from_torch_keeps_a_torch_view_zero_copy_with_its_strides():
    src = torch.arange(12.0).reshape(3, 4)[:, 1:3]
    t = from_torch(src)
    assert t._torch.data_ptr() == src.data_ptr() and not t.is_contiguous()


def test_from_torch_detaches_tensors_that_require_grad():
    src = torch.ones(3, requires_grad=True)
    t = from_torch(src)
    assert not t._torch.requires_grad and t._torch.data_ptr() == src.data_ptr()


def test_from_torch_rejects_non_tensors_and_sparse_layouts():
    with pytest.raises(TypeError):
        from_torch([1, 2, 3])
    with pytest.raises(TypeError, match="strided"):
        from_torch(torch.eye(3).to_sparse())


class _Elsewhere(torch.Tensor):
    """A torch subclass whose methods misreport where its bytes are."""

    def data_ptr(self):
        return torch.Tensor.data_ptr(self) + (1 << 40)

    def is_contiguous(self, *args, **kwargs):
        return False


def test_from_torch_wraps_a_torch_subclass_as_a_plain_tensor_over_the_same_storage():
    src = torch.arange(8.0)
    t = from_torch(src.as_subclass(_Elsewhere))
    plain = t.into_torch()
    assert type(plain) is torch.Tensor and plain.data_ptr() == src.data_ptr()


@pytest.mark.parametrize("derive", [
    lambda t: t.view(2, 4), lambda t: t.reshape(4, 2), lambda t: t.slice(0, 2, 6),
    lambda t: t[1:], lambda t: t.partition((4,)).unpartition(),
    lambda t: t.share().try_unwrap()], ids=["view", "reshape", "slice", "getitem",
                                             "partition", "share"])
def test_views_of_a_wrapped_torch_subclass_stay_plain_torch_tensors(derive):
    t = from_torch(torch.arange(8.0).as_subclass(_Elsewhere))
    view = derive(t)
    del t                                  # (into_torch is refused while another view lives)
    assert type(view.into_torch()) is torch.Tensor


def test_from_torch_wraps_a_parameter_as_a_plain_detached_tensor():
    param = torch.nn.Parameter(torch.ones(3))
    plain = from_torch(param).into_torch()
    assert type(plain) is torch.Tensor and not plain.requires_grad
    assert plain.data_ptr() == param.data_ptr()


def test_from_dlpack_wraps_a_torch_subclass_as_a_plain_tensor():
    src = torch.arange(4.0)
    plain = from_dlpack(src.as_subclass(_Elsewhere)).into_torch()
    assert type(plain) is torch.Tensor and plain.data_ptr() == src.data_ptr()


def test_from_torch_refuses_a_subclass_that_will_not_become_a_plain_tensor():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.zeros(4)                              # no memory behind it
    with pytest.raises(ArgumentError, match="plain torch.Tensor"):
        from_torch(fake)


def test_from_torch_refuses_a_view_with_torchs_lazy_negation_bit():
    negated = torch.tensor([1 + 2j, 3 + 4j]).conj().imag      # reads -2, -4; holds 2, 4
    assert negated.is_neg()
    with pytest.raises(ArgumentError, match="resolve_neg"):
        from_torch(negated)
    assert from_torch(negated.resolve_neg()).to_torch().tolist() == [-2.0, -4.0]


def test_from_torch_refuses_a_nested_tensor_with_argument_error():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # torch: nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ArgumentError, match="nested"):
        from_torch(nested)


@pytest.mark.parametrize("make", [lambda: from_torch(torch.zeros(4, device="meta")),
                                  lambda: zeros((4,), device="meta")], ids=["from_torch", "zeros"])
def test_the_meta_device_is_refused_with_argument_error(make):
    with pytest.raises(ArgumentError, match="meta"):
        make()


def test_numpys_default_float64_is_refused_with_the_conversion_to_make():
    with pytest.raises(ArgumentError, match=r"astype\(np.float32\)"):
        from_numpy(np.zeros(3))


def test_from_numpy_copies_the_array():
    a = np.arange(6, dtype=np.float32)
    t = from_numpy(a, device="cpu")
    a[0] = 100
    assert t.to_torch().tolist() == [0, 1, 2, 3, 4, 5]
    assert t.dtype is dtypes.float32


def test_dlpack_export_to_torch_is_zero_copy():
    t = arange(8, device="cpu")
    other = torch.from_dlpack(t)
    assert other.data_ptr() == t._torch.data_ptr()
    assert t.shape == (8,)                      # exporting does not consume


def test_dlpack_export_to_numpy():
    t = arange(5, dtype=dtypes.int32, device="cpu")
    assert np.from_dlpack(t).tolist() == [0, 1, 2, 3, 4]


def test_dlpack_device_reports_the_device():
    from torch.utils.dlpack import DLDeviceType
    assert zeros(2, device="cpu").__dlpack_device__() == (DLDeviceType.kDLCPU, 0)


def test_from_dlpack_imports_numpy_arrays_zero_copy():
    a = np.arange(6, dtype=np.float32)
    t = from_dlpack(a)
    assert t._torch.data_ptr() == a.ctypes.data


def test_dlpack_round_trip_keeps_values_and_storage():
    t = randn((4, 4), seed=0, device="cpu")
    back = from_dlpack(t)
    assert back._torch.data_ptr() == t._torch.data_ptr()
    assert torch.equal(back.to_torch(), t.to_torch())


# -- the graph-capture guard -----------------------------------------------------------------

@pytest.mark.parametrize("fn,call", [
    ("zeros", lambda: zeros(4, device="cpu")),
    ("ones", lambda: ones(4, device="cpu")),
    ("full", lambda: full(4, 1.0, device="cpu")),
    ("empty", lambda: empty(4, device="cpu")),
    ("arange", lambda: arange(4, device="cpu")),
    ("randn", lambda: randn(4, device="cpu")),
    ("from_numpy", lambda: from_numpy(np.zeros(4), device="cpu")),
])
def test_allocation_inside_a_graph_scope_raises_graph_capture_error(fn, call):
    with forbid_allocation("st.graph_scope()"):
        with pytest.raises(GraphCaptureError) as e:
            call()
    assert str(e.value) == (
        f"st.{fn}() allocates inside st.graph_scope(); replay must not depend on allocation "
        f"addresses: allocate buffers before the scope and partition them inside it")


def test_allocation_guard_nests_and_lifts():
    assert allocation_forbidden() is None
    with forbid_allocation("outer"):
        with forbid_allocation("inner"):
            assert allocation_forbidden() == "inner"
        assert allocation_forbidden() == "outer"
    assert allocation_forbidden() is None
    assert zeros(1, device="cpu").shape == (1,)


def test_allocation_guard_is_thread_local():
    seen = []
    with forbid_allocation("st.graph_scope()"):
        th = threading.Thread(target=lambda: seen.append(zeros(2, device="cpu").shape))
        th.start()
        th.join()
    assert seen == [(2,)]


def test_wrapping_existing_memory_is_allowed_inside_a_graph_scope():
    buf = torch.zeros(4)
    with forbid_allocation("st.graph_scope()"):
        assert from_torch(buf).shape == (4,)


@pytest.mark.parametrize("value", [1.9, -0.5, float("nan"), float("inf"), np.float32(1.9),
                                   torch.tensor(2.5)])
def test_full_refuses_a_value_an_integer_dtype_cannot_hold_exactly(value):
    with pytest.raises(ArgumentError, match="not a value of the integer dtype"):
        full((3,), value, dtype=dtypes.int32)


def test_full_takes_an_integral_float_for_an_integer_dtype():
    assert full((2,), 3.0, dtype=dtypes.int8).to_torch().tolist() == [3, 3]


@pytest.mark.parametrize("value,dtype", [(2**31, dtypes.int32), (-2**63 - 1, dtypes.int64),
                                         (300, dtypes.int8)])
def test_full_names_the_range_an_integer_dtype_cannot_hold(value, dtype):
    with pytest.raises(ArgumentError, match=rf"{value} is out of {dtype}'s range \["):
        full((2,), value, dtype=dtype)


def test_full_rounds_an_int64_value_to_float32_once_as_torch_does():
    value = 2**60 + 2**36 + 1
    assert full((1,), value).to_torch().item() == torch.full((1,), value, dtype=torch.float32).item()


@pytest.mark.parametrize("value", [np.int64(300), 300.0], ids=["numpy int", "integral float"])
def test_full_names_the_range_for_any_integral_value(value):
    with pytest.raises(ArgumentError, match=r"is out of st\.int8's range"):
        full((2,), value, dtype=dtypes.int8)


def test_full_refuses_a_numpy_complex_value():
    with pytest.raises(ArgumentError, match="is complex"):
        full((2,), np.complex64(1j))


def test_full_takes_an_int_past_int64_as_the_float_it_rounds_to():
    assert full((1,), 2**70).to_torch().item() == float(2**70)


def test_full_refuses_a_complex_value_saying_so():
    with pytest.raises(ArgumentError, match="1j is complex"):
        full((2,), 1j)


def test_a_zero_tensor_without_memory_is_refused_when_wrapped():
    """torch._efficientzerotensor has address 0 and no storage: every later check of it
    failed with torch's untyped RuntimeError."""
    with pytest.raises(ArgumentError, match="ZeroTensor"):
        from_torch(torch._efficientzerotensor((8,)))


def test_in_place_metadata_changes_through_the_callers_torch_tensor_leave_the_handle_as_it_was():
    base = torch.arange(4.0)
    t = from_torch(base)
    base.unsqueeze_(0)
    base.as_strided_((4,), (0,))
    assert t.shape == (4,) and t.to_torch().tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("value", [[1.0, 2.0], 3.0], ids=["list", "float"])
def test_from_dlpack_of_a_python_value_says_what_it_takes(value):
    with pytest.raises(ArgumentError, match="expected a DLPack producer.*got"):
        from_dlpack(value)


def test_from_dlpack_of_an_array_dlpack_cannot_carry_is_an_argument_error():
    with pytest.raises(ArgumentError, match="st.from_dlpack: .*byte order"):
        from_dlpack(np.arange(4, dtype=">f4"))
