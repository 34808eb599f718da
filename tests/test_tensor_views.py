"""Views are separate handles over the same bytes: into_torch hands bytes to torch only when
no other live safetile handle reaches them (a launch through it would write torch's memory)."""
import threading

import pytest

import safetile as st
import safetile.lang as sl
from safetile.errors import BorrowError

from support import cpu_executor, no_leftover_holds

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


@st.kernel
def fill(z: st.Out[st.f32]):
    z.store(sl.full(z.shape, 5.0, st.f32))


def test_into_torch_is_refused_while_another_view_of_the_bytes_lives():
    t = st.zeros((8,), device="cpu")
    view = t.view((8,))
    with pytest.raises(BorrowError, match="another safetile handle views these bytes"):
        t.into_torch()
    (p,) = fill(view.partition((8,))).sync()      # both handles still usable
    assert t.to_torch().tolist() == [5.0] * 8


def test_into_torch_is_refused_while_the_base_of_a_view_lives():
    t = st.zeros((8,), device="cpu")
    with pytest.raises(BorrowError, match="Tensor\\(shape=\\(8,\\)"):
        t[2:6].into_torch()


def test_a_partition_of_a_view_keeps_the_bytes_from_torch():
    t = st.zeros((8,), device="cpu")
    part = t.slice(0, 0, 4).partition((4,))
    with pytest.raises(BorrowError, match="moved into Partition"):
        t.into_torch()
    del part


def test_into_torch_is_allowed_once_the_other_views_are_dropped():
    t = st.zeros((8,), device="cpu")
    view = t.view((2, 4))
    del t
    assert view.into_torch().shape == (2, 4)


def test_views_of_disjoint_bytes_go_to_torch_one_by_one():
    t = st.zeros((8,), device="cpu")
    low, high = t[:4], t[4:]
    del t
    a = low.into_torch()
    (p,) = fill(high.partition((4,))).sync()       # high's bytes are not torch's
    assert a.tolist() == [0.0] * 4 and p.unpartition().into_torch().tolist() == [5.0] * 4


def test_a_view_made_while_another_thread_hands_the_tensor_to_torch_is_refused(monkeypatch):
    """The view's torch tensor is made before the view joins the family that into_torch
    checks: a tensor handed to torch in between must not leave the view live over its bytes."""
    t = st.zeros((8,), device="cpu")
    made, go, got = threading.Event(), threading.Event(), {}
    wrap = st.Tensor._wrap.__func__

    def paused_wrap(cls, raw):
        view = wrap(cls, raw)
        made.set()
        go.wait(10)                                # into_torch runs on the main thread now
        return view

    def make_view():
        try:
            got["view"] = t.view((2, 4))
        except st.MovedError as e:
            got["error"] = e

    monkeypatch.setattr(st.Tensor, "_wrap", classmethod(paused_wrap))
    thread = threading.Thread(target=make_view)
    thread.start()
    assert made.wait(10)
    monkeypatch.undo()
    owned = t.into_torch()
    go.set()
    thread.join(10)
    assert "view" not in got, "a live safetile view of bytes torch now owns"
    assert "into torch" in str(got["error"])
    owned.fill_(1.0)


@pytest.mark.parametrize("index", ["torch", "numpy"])
def test_an_index_array_of_one_int_is_refused_as_advanced_indexing(index):
    import numpy as np
    import torch
    t = st.zeros((8,), device="cpu")
    one = torch.tensor([3]) if index == "torch" else np.array([3])
    with pytest.raises(st.ArgumentError, match="advanced indexing would copy"):
        t[one]                                  # torch would copy: no view of t's bytes
    assert t[torch.tensor(3)].shape == ()       # a 0-d int is an int index: a view


def test_a_tensor_wrapped_again_through_dlpack_keeps_its_bytes_from_torch():
    """st.from_dlpack(t) of a safetile Tensor is a view of t: a handle made from t's DLPack
    alias would be outside t's family, and into_torch of it would hand torch bytes that a
    launch through t then writes."""
    t = st.zeros((8,), device="cpu")
    again = st.from_dlpack(t)
    with pytest.raises(BorrowError, match="another safetile handle views these bytes"):
        again.into_torch()
    (p,) = fill(t.partition((8,))).sync()
    assert again.to_torch().tolist() == [5.0] * 8


@pytest.mark.parametrize("index", ["numpy_uint8", "torch_uint8", "sequence"])
def test_an_index_that_torch_reads_as_a_mask_or_a_list_is_refused_as_a_copy(index):
    """A 0-d uint8 index passes operator.index, but torch reads it as a mask; a sequence
    with __index__ passes it too, but torch reads it as a list of indices: both copy, and
    the handle would be a copy passing for a view of these bytes."""
    import numpy as np
    import torch

    class Pair:
        def __index__(self):
            return 0

        def __len__(self):
            return 2

        def __getitem__(self, i):
            if i < 2:
                return i
            raise IndexError(i)

    t = st.zeros((4, 4), device="cpu")
    idx = {"numpy_uint8": lambda: np.array(1, dtype=np.uint8),
           "torch_uint8": lambda: torch.tensor(1, dtype=torch.uint8),
           "sequence": Pair}[index]()
    with pytest.raises(st.ArgumentError, match="advanced indexing"):
        t[idx]
    assert t[np.uint8(1)].shape == (4,)        # a uint8 scalar is an int index: a view
