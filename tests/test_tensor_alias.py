"""Aliasing XOR mutability: storage overlap and in-flight borrows (safetile.tensor.borrows)."""
import re
import time

import pytest
import torch

from safetile.errors import AliasError, BorrowError
from safetile.tensor import (acquire, active_holds, check_host_read, check_host_write,
                             from_torch, overlaps, zeros)
from safetile.tensor import borrows

ADD = "kernel 'add' (examples/01.py:12)"


@pytest.fixture(autouse=True)
def no_leftover_holds():
    yield
    assert active_holds() == [], "a test leaked a borrow hold"


def launch(reads=(), writes=(), holder=ADD):
    """What the launcher does: acquire, 'run', release."""
    hold = acquire(holder, reads=list(reads), writes=list(writes))
    hold.release()


# -- one launch: an output must not overlap another argument ---------------------------------

def test_same_tensor_as_input_and_output_raises_alias_error_naming_both_arguments():
    t = zeros((1024,), device="cpu")
    with pytest.raises(AliasError) as e:
        launch(reads=[("x", t._torch)], writes=[("z", t._torch)])
    msg = str(e.value)
    assert msg.startswith(f"{ADD}: Out 'z' overlaps In 'x'")
    assert "same storage, bytes [0, 4096) and [0, 4096)" in msg
    assert "pass a copy or non-overlapping slices" in msg


def test_overlapping_slices_raise_alias_error_with_byte_ranges():
    base = zeros((1000,), device="cpu")
    x, z = base[0:600], base[400:1000]
    with pytest.raises(AliasError, match=r"bytes \[1600, 4000\) and \[0, 2400\)"):
        launch(reads=[("x", x._torch)], writes=[("z", z._torch)])


def test_reshape_of_the_same_storage_raises_alias_error():
    t = zeros((64,), device="cpu")
    m = t.reshape(8, 8)
    with pytest.raises(AliasError, match="Out 'z' overlaps In 'x'"):
        launch(reads=[("x", t._torch)], writes=[("z", m._torch)])


def test_transposed_view_overlaps_its_base():
    t = zeros((8, 8), device="cpu")
    tt = from_torch(t._torch.t())
    with pytest.raises(AliasError):
        launch(reads=[("x", tt._torch)], writes=[("z", t._torch)])


def test_torch_view_wrapped_separately_through_from_torch_raises_alias_error():
    storage = torch.zeros(100)
    whole = from_torch(storage)
    part = from_torch(storage[10:20])
    with pytest.raises(AliasError, match="Out 'z' overlaps In 'x'"):
        launch(reads=[("x", part._torch)], writes=[("z", whole._torch)])


def test_two_overlapping_outputs_raise_alias_error():
    base = zeros((16,), device="cpu")
    with pytest.raises(AliasError, match="Out 'a' overlaps Out 'b'"):
        launch(writes=[("a", base[0:10]._torch), ("b", base[8:16]._torch)])


def test_writing_the_left_half_from_the_right_half_is_accepted():
    base = zeros((1024,), device="cpu")
    launch(reads=[("x", base[512:]._torch)], writes=[("z", base[:512]._torch)])


def test_interleaved_even_and_odd_columns_are_accepted():
    base = zeros((64, 64), device="cpu")
    launch(reads=[("x", base[:, 0::2]._torch)], writes=[("z", base[:, 1::2]._torch)])


def test_several_inputs_may_overlap_each_other():
    t = zeros((32,), device="cpu")
    out = zeros((32,), device="cpu")
    launch(reads=[("x", t._torch), ("y", t[4:20]._torch)], writes=[("z", out._torch)])


def test_verbatim_labels_are_used_for_non_identifier_names():
    t = zeros((8,), device="cpu")
    with pytest.raises(AliasError, match="Ptr 'p' overlaps In 'x'"):
        launch(reads=[("x", t._torch)], writes=[("Ptr 'p'", t._torch)])


# -- in-flight holds ------------------------------------------------------------------------

def test_writing_storage_an_in_flight_operation_reads_raises_alias_error_naming_it():
    t = zeros((64,), device="cpu")
    hold = acquire(ADD, reads=[("x", t._torch)])
    try:
        with pytest.raises(AliasError) as e:
            launch(writes=[("z", t[8:16]._torch)], holder="kernel 'fill' (f.py:3)")
        msg = str(e.value)
        assert "kernel 'fill' (f.py:3): Out 'z' overlaps In 'x' held by in-flight " + ADD in msg
        assert "op.sync()" in msg
    finally:
        hold.release()


def test_reading_storage_an_in_flight_operation_writes_raises_alias_error():
    t = zeros((64,), device="cpu")
    with acquire(ADD, writes=[("z", t._torch)]):
        with pytest.raises(AliasError, match="In 'y' overlaps Out 'z' held by in-flight"):
            launch(reads=[("y", t[0:1]._torch)], holder="kernel 'sum'")


def test_two_in_flight_operations_may_read_the_same_storage():
    t = zeros((64,), device="cpu")
    with acquire("kernel 'a'", reads=[("x", t._torch)]):
        with acquire("kernel 'b'", reads=[("x", t._torch)]):
            assert len(active_holds()) == 2


def test_the_snapshot_of_borrows_names_their_bytes_but_hands_out_no_tensor():
    t = zeros((64,), device="cpu")
    with acquire("kernel 'a'", writes=[("z", t._torch)]):
        [(holder, name, write, where)] = active_holds()
    lo = t._torch.data_ptr()
    assert (holder, name, write) == ("in-flight kernel 'a'", "z", True)
    assert where == f"cpu [{lo:#x}, {lo + 256:#x})"


def test_in_flight_writes_to_disjoint_halves_coexist():
    t = zeros((64,), device="cpu")
    with acquire("kernel 'a'", writes=[("z", t[:32]._torch)]):
        with acquire("kernel 'b'", writes=[("z", t[32:]._torch)]):
            pass


def test_failed_acquire_registers_nothing():
    t = zeros((8,), device="cpu")
    with pytest.raises(AliasError):
        acquire(ADD, reads=[("x", t._torch)], writes=[("z", t._torch)])
    assert active_holds() == []


def test_release_is_idempotent_and_frees_the_storage():
    t = zeros((8,), device="cpu")
    hold = acquire(ADD, writes=[("z", t._torch)])
    hold.release()
    hold.release()
    assert hold.released
    launch(writes=[("z", t._torch)])


def test_host_read_raises_borrow_error_only_for_in_flight_writes():
    t = zeros((8,), device="cpu")
    with acquire(ADD, reads=[("x", t._torch)]):
        check_host_read(t._torch, "read it")
        with pytest.raises(BorrowError, match="is reading"):
            check_host_write(t._torch, "export it")
    with acquire(ADD, writes=[("z", t._torch)]):
        with pytest.raises(BorrowError, match=re.escape(f"cannot read it: in-flight {ADD} is writing")):
            check_host_read(t[3:4]._torch, "read it")


def test_dlpack_export_raises_borrow_error_while_in_flight():
    t = zeros((8,), device="cpu")
    view = t[0:2]
    with acquire(ADD, writes=[("z", t._torch)]):
        with pytest.raises(BorrowError, match="DLPack"):
            torch.from_dlpack(view)


# -- the overlap predicate --------------------------------------------------------------------

def test_overlaps_same_tensor():
    t = torch.zeros(10)
    assert overlaps(t, t)


def test_overlaps_is_false_for_disjoint_slices_and_true_for_shared_elements():
    t = torch.zeros(10)
    assert not overlaps(t[:5], t[5:])
    assert overlaps(t[:6], t[5:])


def test_empty_tensors_never_overlap():
    t = torch.zeros(10)
    assert not overlaps(t[3:3], t)
    assert not overlaps(t, t[3:3])


def test_different_devices_never_overlap():
    assert not overlaps(torch.zeros(4, device="meta"), torch.zeros(4))


def test_separate_allocations_do_not_overlap():
    assert not overlaps(torch.zeros(100), torch.zeros(100))


def test_exact_check_distinguishes_interleaved_from_touching_strided_views():
    t = torch.zeros(8, 8)
    assert not overlaps(t[:, 0::2], t[:, 1::2])
    assert overlaps(t[:, 0::2], t[:, 2::4])
    assert not overlaps(t[0::2], t[1::2])


def test_exact_check_handles_different_element_sizes():
    raw = torch.zeros(16, dtype=torch.int8)
    as_i32 = raw.view(torch.int32)                 # 4 int32 over the same 16 bytes
    assert overlaps(raw[5:6], as_i32[1::2])        # byte 5 is in int32 #1
    assert overlaps(raw[8:12], as_i32[0::2])       # bytes 8..11 are int32 #2
    assert not overlaps(raw[4:8], as_i32[0::2])    # bytes 4..7 are int32 #1 only


def test_stride_zero_expanded_views_are_checked_exactly():
    t = torch.zeros(8)
    rep = t[2:3].expand(4)                         # one element, repeated
    assert overlaps(rep, t[2:3])
    assert not overlaps(rep, t[3:8])


def test_huge_strided_views_are_conservatively_overlapping():
    tt = torch.zeros(2 * borrows.EXACT_LIMIT + 4, dtype=torch.int8)
    assert overlaps(tt[0::2], tt[1::2])            # too many to enumerate: conservative


def test_disjoint_extents_are_decided_quickly():
    a, b = torch.zeros(1 << 20), torch.zeros(1 << 20)
    held = [torch.zeros(16) for _ in range(64)]
    holds = [acquire(f"kernel 'k{i}'", reads=[("x", h)]) for i, h in enumerate(held)]
    try:
        start = time.perf_counter()
        for _ in range(200):
            acquire(ADD, reads=[("x", a)], writes=[("z", b)]).release()
        per_call = (time.perf_counter() - start) / 200
    finally:
        for h in holds:
            h.release()
    assert per_call < 1e-3, per_call


def test_a_launch_that_would_write_bytes_the_host_is_copying_is_refused(monkeypatch):
    import threading
    import safetile as st
    import safetile.lang as sl

    @st.kernel
    def fill(z: st.Out[st.f32]):
        z.store(sl.full(z.shape, 1.0, st.f32))
    t = st.zeros((16,), device="cpu")
    whole, part = t.view(-1), t.slice(0, 4, 12).partition((8,))
    refused, clone = [], torch.Tensor.clone

    def clone_while_another_thread_launches(self, *args, **kwargs):
        def launch():
            try:
                fill(part).sync()
            except AliasError as e:
                refused.append(str(e))
        worker = threading.Thread(target=launch)
        worker.start()
        worker.join()
        return clone(self, *args, **kwargs)
    monkeypatch.setattr(torch.Tensor, "clone", clone_while_another_thread_launches)
    copy = whole.to_torch()
    monkeypatch.undo()
    assert copy.tolist() == [0.0] * 16
    assert len(refused) == 1 and "a host copy" in refused[0]


def test_a_host_copy_leaves_no_borrow_behind():
    import safetile as st
    t = st.zeros((4,), device="cpu")
    t.to_torch()
    t.numpy()
    t.share().to_torch()
    assert active_holds() == []
