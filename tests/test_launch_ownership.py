"""Ownership across the launch boundary, shown through real kernel launches (CPU executor).

A launch moves every handle into the returned op; sync hands the same handles back in
parameter order and in the form they went in. Overlap between an Out and any other argument is
refused before anything runs, whichever way the overlap arose.
"""
import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.errors import AliasError, BorrowError, LaunchError, MovedError


@pytest.fixture(autouse=True)
def cpu_executor():
    with st.backend("interpret", seed=0):
        yield


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], factor: float):
    z.store(sl.load_like(x, z) * factor)


@st.kernel(unsafe=True)
def copy_raw(x: st.In[st.f32], p: st.Ptr[st.f32], n: int):
    offs = sl.bid(0) * 16 + sl.arange(16)
    sl.store_ptr(p, offs, x.load(sl.bid(0), 16), mask=offs < n)


def test_values_come_back_as_the_same_handles_in_parameter_order():
    x, z = st.randn((64,)), st.empty((64,)).partition((16,))
    op = scale(x, z, 2.0)
    x2, z2, f = op.sync()
    assert x2 is x and z2 is z and f == 2.0
    assert isinstance(z2, st.Partition)


def test_a_shared_input_comes_back_as_the_same_shared_handle():
    s = st.randn((64,)).share()
    s2, z, _ = scale(s, st.empty((64,)).partition((16,)), 1.0).sync()
    assert s2 is s and isinstance(s2, st.Shared)


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


def test_one_shared_handle_may_feed_several_in_parameters_of_a_launch():
    s = st.full((64,), 2.0).share()
    op = add(s, s, st.empty((64,)).partition((16,)))
    with pytest.raises(MovedError, match="kernel 'add'"):
        s.shape
    x, y, z = op.sync()
    assert x is s and y is s and s.num_handles == 1
    assert z.unpartition().to_torch().tolist() == [4.0] * 64
    assert s.try_unwrap().shape == (64,)


def test_a_relaunch_with_one_shared_handle_for_several_in_parameters_moves_it_once():
    s, z = st.full((64,), 2.0).share(), st.empty((64,)).partition((16,))
    for _ in range(3):                                   # the cached launch plan's path too
        s, _, z = add(s, s, z).sync()
    assert s.num_handles == 1 and s.try_unwrap().shape == (64,)


def test_every_moved_handle_names_the_kernel_until_sync():
    x, z = st.randn((64,)), st.empty((64,)).partition((16,))
    op = scale(x, z, 3.0)
    for handle in (x, z):
        with pytest.raises(MovedError, match="kernel 'scale'"):
            handle.shape
    op.sync()
    assert x.shape == (64,) and z.grid == (4,)


class _Elsewhere(torch.Tensor):
    """A torch subclass that misreports where its bytes are."""

    def data_ptr(self):
        return torch.Tensor.data_ptr(self) + (1 << 40)


def test_a_torch_subclass_misreporting_its_address_still_overlaps_its_storage():
    t = torch.zeros(64)
    x, z = st.from_torch(t), st.from_torch(t.as_subclass(_Elsewhere))
    with pytest.raises(AliasError, match="'z'.*'x'|'x'.*'z'"):
        scale(x, z.partition((16,)), 1.0)


def test_same_tensor_as_input_and_output_is_refused_before_launch():
    t = st.from_torch(torch.randn(64))
    view = st.from_torch(t._torch)                       # a second handle on the same storage
    with pytest.raises(AliasError, match="'z'.*'x'|'x'.*'z'"):
        scale(view, t.partition((16,)), 1.0)
    assert view.shape == (64,)                            # nothing was moved


def test_overlapping_slice_as_input_is_refused():
    t = st.randn((64,))
    window = t.slice(0, 8, 40)
    with pytest.raises(AliasError):
        scale(window, t.partition((16,)), 1.0)


def test_reshape_of_the_output_storage_as_input_is_refused():
    t = st.randn((8, 8))
    flat = t.reshape(64)
    with pytest.raises(AliasError):
        scale(flat, t.reshape(64).partition((16,)), 1.0)


def test_torch_view_that_came_in_through_from_torch_is_refused():
    base = torch.randn(64)
    out = st.from_torch(base)
    alias = st.from_torch(base[16:48])
    with pytest.raises(AliasError):
        scale(alias, out.partition((16,)), 1.0)


def test_left_half_written_from_the_right_half_runs_and_is_correct():
    base = torch.randn(128)
    t = st.from_torch(base.clone())
    left, right = t.slice(0, 0, 64), t.slice(0, 64, 128)
    right, left, _ = scale(right, left.partition((16,)), 2.0).sync()
    result = t.to_torch()
    assert torch.equal(result[:64], base[64:] * 2.0) and torch.equal(result[64:], base[64:])


def test_a_raw_pointer_needs_a_contiguous_buffer():
    x = st.randn((32,))
    strided = st.zeros((64,)).slice(0, 0, 64, step=2)
    with st.unsafe(), pytest.raises(LaunchError, match="contiguous"):
        copy_raw.options(grid=(2,))(x, strided, 32)


def test_a_raw_pointer_is_held_exclusively_while_in_flight():
    x, p = st.randn((32,)), st.zeros((32,))
    with st.unsafe():
        op = copy_raw.options(grid=(2,))(x, p, 32)
    with pytest.raises(MovedError):
        p.to_torch()
    x, p, _ = op.sync()
    assert torch.equal(p.to_torch(), x.to_torch())


def test_a_view_made_before_share_cannot_write_the_shared_value():
    t = st.zeros((64,))
    early_view = t.view(64)
    s = t.share()
    with pytest.raises(AliasError, match="shared value.*try_unwrap"):
        scale(st.randn((64,)), early_view.partition((16,)), 1.0)
    assert s.to_torch().abs().sum() == 0


def test_the_storage_is_writable_again_once_the_shared_value_is_unwrapped():
    t = st.zeros((64,))
    early_view = t.view(64)
    s = t.share()
    back = s.try_unwrap()
    x, z, _ = scale(st.ones((64,)), early_view.partition((16,)), 2.0).sync()
    assert back.to_torch().tolist() == [2.0] * 64


def test_a_graph_cannot_replay_into_storage_that_was_shared_since_it_was_recorded():
    x, z = st.ones((64,)), st.zeros((64,)).partition((16,))
    g = scale(x, z, 2.0).graph()
    shared = g.output[1].unpartition().share()
    with pytest.raises(AliasError, match="shared value"):
        g.launch().sync()
    assert shared.to_torch().abs().sum() == 0


def test_an_op_built_in_another_executions_callback_is_checked_again_where_it_runs():
    # Built inside the first execution's callback, the op's borrows were checked with that
    # execution's own in-flight work set aside; run elsewhere, it must be checked again.
    from safetile.tensor import borrows
    x, z, w = st.randn((64,)), st.empty((64,)), st.randn((64,))
    kept = []

    def build(*_):
        # stands for work of this execution still writing w when the op runs elsewhere
        writer = borrows.acquire("the first execution's writer", writes=[("w", w._torch)])
        writer.owner = borrows.current_owner()            # work this execution has run
        kept.append(writer)
        kept.append(scale(w, st.empty((64,)).partition((16,)), 3.0))

    scale(x, z.partition((16,)), 2.0).map(build).sync()
    writer, op = kept
    with pytest.raises(AliasError, match="the first execution's writer"):
        op.sync()
    writer.release()
    assert op.values[0] is w and torch.equal(w.to_torch(), w._torch)   # handed back


def test_an_op_checked_again_where_it_runs_keeps_its_bytes_borrowed_until_checked(monkeypatch):
    # Between the first check and the second no other thread may take the bytes (hand them
    # to torch): the borrows the op was built with end only once the new ones hold.
    from safetile.tensor import borrows
    x, z, w = st.randn((64,)), st.empty((64,)), st.randn((64,))
    out = st.empty((64,))
    tried = []
    kept = []
    real_register = borrows.register

    def register(*args, **kw):
        try:
            out.view((64,)).into_torch()
            tried.append("handed to torch")
        except BorrowError:
            tried.append("refused")
        return real_register(*args, **kw)

    def build(*_):
        kept.append(scale(w, out.view((64,)).partition((16,)), 3.0))

    scale(x, z.partition((16,)), 2.0).map(build).sync()
    monkeypatch.setattr(borrows, "register", register)
    kept[0].sync()
    assert tried == ["refused"]                      # checked again once, the bytes held


def test_a_callback_cannot_share_bytes_that_an_op_it_built_will_write():
    # The op built in the callback has not run: its write is not ordered before the share,
    # so the Shared value would be written while it is shared.
    t = st.zeros((64,))
    view = t.view(64)

    def write_then_share(x, z, k):
        op = scale(x, t.partition((16,)), 2.0)
        view.share()
        return op

    with pytest.raises(AliasError, match="kernel 'scale'.*built in this callback"):
        scale(st.ones((64,)), st.empty((64,)).partition((16,)), 1.0).then(
            write_then_share).sync()
    assert view.to_torch().abs().sum() == 0                  # nothing was written


@pytest.mark.parametrize("access", [lambda v: v.to_torch(), lambda v: v.into_torch(),
                                    lambda v: v.__dlpack__()],
                         ids=["to_torch", "into_torch", "dlpack"])
def test_a_callback_cannot_touch_bytes_that_an_op_it_built_will_write(access):
    t = st.zeros((64,))
    view = t.view(64)

    def write_then_touch(x, z, k):
        op = scale(x, t.partition((16,)), 2.0)
        access(view)
        return op

    with pytest.raises(BorrowError, match="kernel 'scale'.*built in this callback"):
        scale(st.ones((64,)), st.empty((64,)).partition((16,)), 1.0).then(
            write_then_touch).sync()
    assert view.to_torch().abs().sum() == 0


def test_a_callback_cannot_build_an_op_reading_bytes_that_an_op_it_built_will_write():
    # As outside callbacks: the two would be ordered only in the order they are run.
    t = st.zeros((64,))
    view = t.view(64)

    def write_then_read(x, z, k):
        return st.zip(scale(x, t.partition((16,)), 2.0),
                      scale(view, st.empty((64,)).partition((16,)), 1.0))

    with pytest.raises(AliasError, match="built in this callback.*chained after"):
        scale(st.ones((64,)), st.empty((64,)).partition((16,)), 1.0).then(
            write_then_read).sync()
    assert view.to_torch().abs().sum() == 0


def test_a_callback_may_read_bytes_that_the_op_before_it_wrote():
    t = st.zeros((64,))
    view = t.view(64)
    seen = []

    def read_then_write_again(x, z, k):
        seen.append(view.to_torch().sum().item())        # ordered after that op: allowed
        return scale(x, z, 3.0)

    scale(st.ones((64,)), t.partition((16,)), 2.0).then(read_then_write_again).sync()
    assert seen == [128.0] and view.to_torch().sum().item() == 192.0



def _take_back_on_another_thread_while_this_execution_writes(take):
    """Share, in a `then` callback, bytes the execution still writes (ordered after that
    write on its stream), and call ``take(shared)`` (try_unwrap / try_partition) from another
    thread, which that in-flight write blocks. Returns the tensor, the Shared value and what
    the other thread raised."""
    import threading
    t = st.zeros((64,))
    box = {}

    def callback(x, zp, _):
        box["shared"] = shared = zp.unpartition().share()

        def other_thread():
            try:
                take(shared)
            except Exception as e:                        # noqa: BLE001 (the test reports it)
                box["error"] = e
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        return scale(x, st.empty((64,)).partition((16,)), 1.0)

    scale(st.full((64,), 5.0), t.view(64).partition((16,)), 1.0).then(callback).sync()
    return t, box["shared"], box.get("error")


TAKE_BACK = pytest.mark.parametrize("take", [lambda s: s.try_unwrap(),
                                             lambda s: s.try_partition((16,))],
                                    ids=["try_unwrap", "try_partition"])


@TAKE_BACK
def test_taking_back_a_shared_value_an_in_flight_op_writes_raises_borrow_error(take):
    _, shared, error = _take_back_on_another_thread_while_this_execution_writes(take)
    assert isinstance(error, BorrowError), repr(error)
    assert "kernel 'scale'" in str(error)
    assert shared.num_handles == 1
    take(shared)                                          # nothing is in flight now


@TAKE_BACK
def test_a_shared_value_that_could_not_be_taken_back_keeps_its_bytes_read_only(take):
    t, shared, error = _take_back_on_another_thread_while_this_execution_writes(take)
    assert error is not None
    with pytest.raises(AliasError, match="shared value"):
        scale(st.full((64,), 9.0), t.view(64).partition((16,)), 1.0)
    assert shared.to_torch().tolist() == [5.0] * 64
    assert take(shared) is not None                       # nothing is in flight now


def test_an_op_kept_after_it_ran_does_not_keep_a_clone_it_was_given():
    s = st.randn((8,), seed=0).share()
    op = scale(s.clone(), st.zeros((8,)).partition((4,)), 2.0)
    xs, p, _ = op.sync()
    del xs                                    # the caller drops the clone it got back
    assert s.try_unwrap().shape == (8,)       # though `op` is still alive
    assert p.unpartition().to_torch().abs().sum() > 0


def test_an_op_kept_after_a_then_chain_lets_its_borrowed_tensors_go_only_to_its_hold():
    x, z = st.randn((64,), seed=1), st.zeros((64,))
    first = scale(x, z.partition((16,)), 2.0)
    kept = []

    def next_op(x, p, f):
        kept.append(first)                    # the first op outlives its hand-back
        return scale(x, st.zeros((64,)).partition((16,)), 3.0)
    x, p2, _ = first.then(next_op).sync()
    assert kept[0].values == () and not st.tensor.active_holds()


@TAKE_BACK
def test_taking_back_a_shared_handle_an_unsynced_op_holds_raises_borrow_error(take):
    """The handle itself is in the op (not a clone): the op still holds the value, which
    ``try_unwrap`` / ``try_partition`` report as ``BorrowError``; the handle is moved, so
    the error is a ``MovedError`` too. Nothing is consumed."""
    s = st.full((64,), 2.0).share()
    op = scale(s, st.empty((64,)).partition((16,)), 1.0)
    with pytest.raises(BorrowError, match="kernel 'scale'") as e:
        take(s)
    assert isinstance(e.value, MovedError) and isinstance(e.value, st.HeldInFlightError)
    s2, _, _ = op.sync()
    assert s2 is s and s.num_handles == 1
    assert take(s) is not None


@TAKE_BACK
def test_taking_back_a_shared_handle_a_library_op_holds_raises_borrow_error(take):
    from safetile import ops
    s = st.full((64,), 2.0).share()
    op = ops.add(s, s)
    with pytest.raises(BorrowError, match="add"):
        take(s)
    assert op.sync().to_torch().tolist() == [4.0] * 64
    assert take(s) is not None
