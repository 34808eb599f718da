"""Move semantics of Tensor and Partition handles (safetile.tensor.ownership)."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from safetile import dtypes
from safetile.errors import ArgumentError, BorrowError, IndexOutOfRangeError, MovedError
from safetile.tensor import Partition, Tensor, acquire, arange, from_torch, zeros

KERNEL_ARG = "kernel 'add' (examples/01.py:12), argument 'z'"


def test_tensor_cannot_be_constructed_directly():
    with pytest.raises(TypeError, match="st.from_torch"):
        Tensor(torch.zeros(3))


def test_tensor_properties_describe_the_wrapped_torch_tensor():
    t = zeros((4, 8), device="cpu")
    assert t.shape == (4, 8)
    assert t.dtype is dtypes.float32
    assert t.device == torch.device("cpu")
    assert t.numel == 32
    assert t.ndim == 2


def test_partition_consumes_the_tensor_and_the_error_says_where_it_went():
    t = zeros((1024,), device="cpu")
    p = t.partition((256,))
    with pytest.raises(MovedError) as e:
        t.shape
    msg = str(e.value)
    assert "Tensor(shape=(1024,), float32)" in msg
    assert "moved into Partition(grid=(4,), tile_shape=(256,))" in msg
    assert ".unpartition()" in msg
    assert isinstance(p, Partition)


def test_every_public_tensor_method_raises_moved_error_after_a_move():
    t = zeros((16,), device="cpu")
    t.partition((4,))
    uses = [lambda: t.shape, lambda: t.dtype, lambda: t.device, lambda: t.numel,
            lambda: t.ndim, t.to_torch, t.numpy, t.into_torch, lambda: t.partition((4,)),
            t.share, lambda: t.view(4, 4), lambda: t.reshape(4, 4), lambda: t.slice(0, 0, 2),
            lambda: t[0], lambda: t.__dlpack__(), t.__dlpack_device__]
    for use in uses:
        with pytest.raises(MovedError):
            use()


def test_unpartition_gives_the_same_tensor_back_usable_again():
    t = arange(10, device="cpu")
    p = t.partition((4,))
    back = p.unpartition()
    assert back is t
    assert back.to_torch().tolist() == list(range(10))


def test_unpartition_consumes_the_partition():
    p = zeros((8,), device="cpu").partition((4,))
    p.unpartition()
    with pytest.raises(MovedError, match="moved into unpartition\\(\\)"):
        p.grid


def test_moving_into_an_operation_names_kernel_file_line_and_argument():
    t = zeros((1024,), device="cpu")
    t._move(KERNEL_ARG)
    with pytest.raises(MovedError) as e:
        t.numpy()
    msg = str(e.value)
    assert "cannot call .numpy()" in msg
    assert f"was moved into {KERNEL_ARG}" in msg
    assert "op.sync()" in msg and "await op" in msg


def test_restore_makes_a_moved_handle_usable_again():
    t = zeros((4,), device="cpu")
    t._move(KERNEL_ARG)
    t._restore()
    assert t.shape == (4,)


def test_moving_twice_raises_moved_error_naming_the_first_destination():
    t = zeros((4,), device="cpu")
    t._move(KERNEL_ARG)
    with pytest.raises(MovedError, match="kernel 'add'"):
        t._move("kernel 'mul' (x.py:3), argument 'y'")


def test_partition_after_share_raises_moved_error_naming_the_shared_value():
    t = zeros((4,), device="cpu")
    t.share()
    with pytest.raises(MovedError, match="Shared"):
        t.partition((4,))


def test_partition_handle_moves_into_an_operation_and_comes_back():
    p = zeros((8,), device="cpu").partition((4,))
    p._move(KERNEL_ARG)
    with pytest.raises(MovedError, match="argument 'z'"):
        p.unpartition()
    p._restore()
    assert p.unpartition().shape == (8,)


def test_into_torch_consumes_and_returns_the_same_storage():
    src = torch.arange(6.0)
    t = from_torch(src)
    out = t.into_torch()
    assert out.data_ptr() == src.data_ptr()
    with pytest.raises(MovedError, match="into_torch"):
        t.shape


def test_to_torch_and_numpy_return_copies():
    t = arange(4, device="cpu")
    c = t.to_torch()
    c[0] = 100
    n = t.numpy()
    n[1] = 100
    assert t.to_torch().tolist() == [0, 1, 2, 3]
    assert c.data_ptr() != t._torch.data_ptr()


def test_numpy_of_bfloat16_is_float32():
    t = from_torch(torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    n = t.numpy()
    assert str(n.dtype) == "float32" and n.tolist() == [1.5, -2.0]


def test_views_do_not_consume_the_base_and_share_storage():
    t = arange(12, device="cpu")
    v = t.view(3, 4)
    r = t.reshape((2, 6))
    s = t.slice(0, 2, 8, 2)
    row = v[1]
    assert t.shape == (12,)
    assert v.shape == (3, 4) and r.shape == (2, 6)
    assert s.to_torch().tolist() == [2, 4, 6]
    assert row.to_torch().tolist() == [4, 5, 6, 7]
    assert v._torch.data_ptr() == t._torch.data_ptr()
    assert row._torch.data_ptr() == t._torch.data_ptr() + 4 * 8


def test_view_infers_minus_one():
    assert arange(12, device="cpu").view(-1, 3).shape == (4, 3)


def test_reshape_that_would_copy_raises_a_clear_error():
    t = arange(12, device="cpu").view(3, 4)
    cols = t[:, 1:3]
    with pytest.raises(ValueError, match="without copying") as e:
        cols.reshape(6)
    assert "Use .reshape" not in str(e.value)      # (torch's advice is the copy refused here)


def test_getitem_rejects_advanced_indexing_which_would_copy():
    t = arange(6, device="cpu")
    with pytest.raises(TypeError, match="advanced indexing"):
        t[torch.tensor([0, 2])]


def test_slice_rejects_non_positive_steps():
    with pytest.raises(ValueError, match="positive"):
        arange(6, device="cpu").slice(0, 0, 6, 0)


@pytest.mark.parametrize("index", [lambda t: t.slice(5), lambda t: t.slice(-3), lambda t: t[100],
                                   lambda t: t[0, 0, 0], lambda t: t[:, -9],
                                   lambda t: t[2 ** 70], lambda t: t[0, -2 ** 64]],
                         ids=["slice-dim", "slice-negative-dim", "getitem-index",
                              "getitem-too-many", "getitem-negative-index",
                              "getitem-past-int64", "getitem-negative-past-int64"])
def test_an_index_outside_the_tensor_raises_index_out_of_range_error(index):
    t = zeros((8, 8), device="cpu")
    with pytest.raises(IndexOutOfRangeError, match="out of range|too many"):
        index(t)


@pytest.mark.parametrize("index", [
    lambda t: t.slice(0, 0, 8, 1.5), lambda t: t.slice(0, step="a"), lambda t: t.slice(0, 1.5),
    lambda t: t.slice("0"), lambda t: t[0:8:1.5], lambda t: t[0.5:], lambda t: t[True]],
    ids=["slice-float-step", "slice-str-step", "slice-float-start", "slice-str-dim",
         "getitem-float-step", "getitem-float-start", "getitem-bool"])
def test_a_slice_bound_step_or_index_that_is_not_an_int_raises_argument_error(index):
    t = zeros((8, 8), device="cpu")
    with pytest.raises(ArgumentError, match="int"):
        index(t)


def test_iterating_a_tensor_gives_views_of_its_rows_and_stops_at_the_end():
    rows = list(arange(6, device="cpu").view(3, 2))
    assert [r.to_torch().tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]


def test_repr_shows_shape_dtype_device_and_state():
    t = zeros((2, 3), device="cpu")
    assert repr(t) == "Tensor(shape=(2, 3), dtype=st.float32, device=cpu)"
    t._move(KERNEL_ARG)
    assert "moved into kernel 'add'" in repr(t)


def test_host_read_of_a_view_raises_borrow_error_while_an_operation_writes_it():
    base = zeros((8, 8), device="cpu")
    row = base[2]
    hold = acquire("kernel 'fill' (f.py:3)", writes=[("z", base._torch)])
    try:
        with pytest.raises(BorrowError, match="kernel 'fill'"):
            row.to_torch()
        with pytest.raises(BorrowError, match="kernel 'fill'"):
            row.numpy()
    finally:
        hold.release()
    assert row.to_torch().shape == (8,)


def test_host_read_is_allowed_while_an_operation_only_reads_the_storage():
    base = zeros((8,), device="cpu")
    view = base[0:4]
    with acquire("kernel 'sum'", reads=[("x", base._torch)]):
        assert view.to_torch().tolist() == [0.0] * 4


def test_into_torch_raises_borrow_error_while_an_operation_reads_the_storage():
    base = zeros((8,), device="cpu")
    view = base[0:4]
    with acquire("kernel 'sum'", reads=[("x", base._torch)]):
        with pytest.raises(BorrowError, match="reading"):
            view.into_torch()
    del base                                  # (into_torch is refused while it views them)
    assert view.into_torch().shape == (4,)


def test_exactly_one_of_many_threads_partitions_a_tensor():
    for _ in range(5):
        t = zeros((64,), device="cpu")
        start = threading.Barrier(32)

        def attempt(_):
            start.wait()
            try:
                return t.partition((16,))
            except MovedError:
                return None

        with ThreadPoolExecutor(max_workers=32) as pool:
            results = list(pool.map(attempt, range(32)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert winners[0].grid == (4,)


def test_exactly_one_of_many_threads_moves_a_tensor_into_an_operation():
    t = zeros((64,), device="cpu")
    start = threading.Barrier(16)

    def attempt(i):
        start.wait()
        try:
            t._move(f"kernel 'k{i}' (t.py:1), argument 'z'")
            return i
        except MovedError:
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = [r for r in pool.map(attempt, range(16)) if r is not None]
    assert len(results) == 1
    assert t._moved_to == f"kernel 'k{results[0]}' (t.py:1), argument 'z'"


@pytest.mark.parametrize("shape", [2 ** 70, (2 ** 63,), (-2 ** 70, 1)])
def test_a_view_with_a_dimension_past_int64_is_an_argument_error(shape):
    t = zeros((4, 4), device="cpu")
    with pytest.raises(ArgumentError, match="past int64"):
        t.view(shape)
    with pytest.raises(ArgumentError, match="past int64"):
        t.reshape(shape)
    assert t.shape == (4, 4)                   # not consumed
