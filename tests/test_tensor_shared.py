"""Shared: read-only cloneable handles, try_unwrap / try_partition (safetile.tensor.shared)."""
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from safetile.errors import AliasError, BorrowError, MovedError, PartitionError
from safetile.tensor import Partition, Shared, Tensor, acquire, arange, zeros

OP_X = "kernel 'add' (examples/01.py:12), argument 'x'"


def test_share_consumes_the_tensor():
    t = zeros((8,), device="cpu")
    s = t.share()
    assert isinstance(s, Shared)
    with pytest.raises(MovedError, match="Shared"):
        t.to_torch()


def test_shared_exposes_shape_dtype_device_numel_and_a_copy():
    s = arange(6, device="cpu").share()
    assert s.shape == (6,) and s.numel == 6 and s.ndim == 1
    assert str(s.device) == "cpu" and s.dtype.name == "int64"
    c = s.to_torch()
    c[0] = 99
    assert s.to_torch().tolist() == list(range(6))


def test_clone_makes_another_handle_to_the_same_storage():
    s = zeros((8,), device="cpu").share()
    c = s.clone()
    assert c is not s
    assert c._torch.data_ptr() == s._torch.data_ptr()
    assert s.num_handles == 2


def test_try_unwrap_with_a_single_handle_returns_the_tensor_zero_copy():
    t = zeros((8,), device="cpu")
    ptr = t._torch.data_ptr()
    back = t.share().try_unwrap()
    assert isinstance(back, Tensor)
    assert back._torch.data_ptr() == ptr
    assert back.shape == (8,)


def test_try_unwrap_raises_borrow_error_while_a_clone_is_alive_then_succeeds_after_release():
    s = zeros((8,), device="cpu").share()
    c = s.clone()
    with pytest.raises(BorrowError) as e:
        s.try_unwrap()
    assert "1 other handle is alive" in str(e.value)
    assert "release" in str(e.value)
    c.release()
    assert s.try_unwrap().shape == (8,)


def test_try_partition_raises_borrow_error_naming_the_in_flight_operation():
    s = zeros((8,), device="cpu").share()
    c = s.clone()
    c._move(OP_X)
    with pytest.raises(BorrowError) as e:
        s.try_partition((4,))
    msg = str(e.value)
    assert "1 held by in-flight operation" in msg and OP_X in msg
    assert "op.sync()" in msg
    c._restore()
    c.release()
    p = s.try_partition((4,))
    assert isinstance(p, Partition) and p.grid == (2,)


def test_borrow_error_counts_idle_clones_and_in_flight_handles_separately():
    s = zeros((8,), device="cpu").share()
    idle = [s.clone(), s.clone()]
    busy = s.clone()
    busy._move(OP_X)
    with pytest.raises(BorrowError, match=r"3 other handles are alive \(2 idle clones, 1 held"):
        s.try_unwrap()
    del idle, busy


def test_the_restored_handle_is_the_same_object_and_usable():
    s = zeros((8,), device="cpu").share()
    s._move(OP_X)
    with pytest.raises(MovedError, match="argument 'x'"):
        s.shape
    s._restore()
    assert s.shape == (8,)
    assert s.try_unwrap().shape == (8,)


def test_try_unwrap_raises_borrow_error_while_an_operation_holds_a_view_of_the_storage():
    t = zeros((8,), device="cpu")
    view = t[0:4]
    s = t.share()
    hold = acquire("kernel 'sum' (s.py:2)", reads=[("x", view._torch)])
    with pytest.raises(BorrowError, match="kernel 'sum'"):
        s.try_unwrap()
    hold.release()
    assert s.try_unwrap().shape == (8,)


def test_released_handle_raises_moved_error_saying_released():
    s = zeros((8,), device="cpu").share()
    c = s.clone()
    c.release()
    with pytest.raises(MovedError, match="released"):
        c.clone()


def test_try_unwrap_consumes_the_last_handle():
    s = zeros((8,), device="cpu").share()
    s.try_unwrap()
    with pytest.raises(MovedError, match="try_unwrap"):
        s.shape


def test_dropped_clones_release_themselves():
    s = zeros((8,), device="cpu").share()
    for _ in range(3):
        s.clone()
    gc.collect()
    assert s.try_unwrap().shape == (8,)


def test_dropping_a_handle_lost_in_flight_does_not_block_forever():
    s = zeros((8,), device="cpu").share()
    c = s.clone()
    c._move(OP_X)          # an operation that is then dropped without being synced
    del c
    gc.collect()
    assert s.try_unwrap().shape == (8,)


def test_bad_tile_shape_in_try_partition_consumes_nothing():
    s = zeros((8,), device="cpu").share()
    with pytest.raises(PartitionError):
        s.try_partition((3,))
    assert s.try_partition((4,)).grid == (2,)


def test_several_in_flight_operations_may_read_one_shared_value():
    s = arange(8, device="cpu").share()
    a, b = s.clone(), s.clone()
    a._move("kernel 'f' (f.py:1), argument 'x'")
    b._move("kernel 'g' (g.py:1), argument 'x'")
    ha = acquire("kernel 'f'", reads=[("x", a._torch)])
    hb = acquire("kernel 'g'", reads=[("x", b._torch)])
    assert s.to_torch().tolist() == list(range(8))
    ha.release(), hb.release()
    a._restore(), b._restore()
    a.release(), b.release()
    assert s.try_unwrap().numel == 8


def test_concurrent_clone_and_release_keep_the_count_exact():
    s = zeros((8,), device="cpu").share()

    def churn(_):
        for _ in range(200):
            s.clone().release()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(churn, range(8)))
    assert s.num_handles == 1
    assert s.try_unwrap().shape == (8,)


def test_only_one_of_many_threads_unwraps_the_last_handle():
    s = zeros((8,), device="cpu").share()
    start = threading.Barrier(16)

    def attempt(_):
        start.wait()
        try:
            return s.try_unwrap()
        except MovedError:
            return None

    with ThreadPoolExecutor(max_workers=16) as pool:
        winners = [r for r in pool.map(attempt, range(16)) if r is not None]
    assert len(winners) == 1


def test_repr_shows_the_handle_count():
    s = zeros((2,), device="cpu").share()
    c = s.clone()
    assert "handles=2" in repr(s)
    c.release()


def test_try_partition_cannot_be_fooled_by_a_tile_size_that_releases_the_handle():
    """The tile shape's own __index__ ran between try_partition's checks: releasing the very
    handle being unwrapped there dropped the count, so the value was partitioned (made
    writable) while another clone still read it."""
    s = zeros((8,), device="cpu").share()
    clone = s.clone()

    class Releasing:
        calls = 0

        def __index__(self):
            Releasing.calls += 1
            if Releasing.calls == 1:
                s.release()
            return 4
    with pytest.raises(MovedError, match="released"):
        s.try_partition((Releasing(),))
    assert clone.num_handles == 1                       # the clone still reads the value
    with pytest.raises(AliasError, match="shared value"):   # and keeps it from writers
        acquire("a writer", writes=[("z", clone._torch)]).release()
    clone.try_partition((4,)).unpartition()
