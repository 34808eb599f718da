"""The memory a graph may replay stays safetile's: ``into_torch`` is refused for the bytes a
live graph's launches touch, and for those an open graph scope's recorded launches read or write, from
the record until the graph is dropped (CPU executor). A graph cannot be copied: a copy
would replay that memory after the graph itself was dropped and the bytes handed to torch.
DLPack export, an alias of the same bytes, is refused as into_torch is."""
import copy
import gc
import pickle

import pytest
import torch

import safetile as st
from safetile.device import graph as graph_module

import support
from support import add, vec


@st.kernel
def inc(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


no_leftover_holds = support.no_leftover_holds()


def test_memory_a_live_graph_replays_is_not_handed_to_torch():
    g = add(vec(1, 2), vec(3, 4), st.zeros((2,)).partition((2,))).graph()
    g.launch().sync()
    x, _, z = g.output
    out, inp = z.unpartition(), x
    with pytest.raises(st.BorrowError, match="replays launches that write this memory"):
        out.into_torch()
    with pytest.raises(st.BorrowError, match="replays launches that read this memory"):
        inp.into_torch()
    del g, x, z
    gc.collect()
    assert out.into_torch().tolist() == [4.0, 6.0] and inp.into_torch().tolist() == [1.0, 2.0]


def test_an_updated_graph_keeps_its_new_memory_from_torch_and_frees_the_old():
    g = add(vec(1, 2), vec(3, 4), st.zeros((2,)).partition((2,))).graph()
    _, _, old = g.output
    g.update(add(vec(5, 6), vec(7, 8), st.zeros((2,)).partition((2,))))
    g.launch().sync()
    _, _, new = g.output
    with pytest.raises(st.BorrowError, match="replays launches that write this memory"):
        new.unpartition().into_torch()
    assert old.unpartition().into_torch().tolist() == [0.0, 0.0]


def test_memory_a_live_graph_replays_is_not_exported_through_dlpack():
    g = add(vec(1, 2), vec(3, 4), st.zeros((2,)).partition((2,))).graph()
    _, _, z = g.output
    out = z.unpartition()
    with pytest.raises(st.BorrowError, match="replays launches that write this memory"):
        torch.from_dlpack(out)
    del g, z
    gc.collect()
    assert torch.from_dlpack(out).tolist() == [0.0, 0.0]


def test_the_elements_a_graph_does_not_touch_may_be_handed_to_torch():
    buf = st.zeros((8,))
    even, odd = buf[0::2], buf[1::2]
    del buf                                   # (into_torch is refused while it views them)
    g = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), even.partition((4,))).graph()
    assert odd.into_torch().tolist() == [0.0] * 4
    (even,) = g.output[2:]
    with pytest.raises(st.BorrowError):
        even.unpartition().into_torch()
    del g


@pytest.mark.parametrize("hand_out", [lambda t: t.into_torch(), lambda t: t.__dlpack__()],
                         ids=["into_torch", "dlpack"])
def test_memory_a_recorded_launch_writes_is_not_handed_to_torch_before_the_scope_closes(hand_out):
    buf = st.zeros((4,))
    with st.graph_scope() as s:
        (p,) = s.record(inc(buf.partition((2,))))
        out = p.unpartition()
        with pytest.raises(st.BorrowError, match="recorded a launch that writes this memory"):
            hand_out(out)
    s.launch().sync()
    assert out.to_torch().tolist() == [1.0] * 4          # still safetile's, and the graph's


@pytest.mark.parametrize("read", [lambda t: t.to_torch(), lambda t: t.numpy(),
                                  lambda t: t[1:].to_torch(), lambda t: t.share().to_torch()],
                         ids=["to_torch", "numpy", "a view", "shared"])
def test_memory_a_recorded_launch_writes_is_not_read_on_the_host_before_a_replay(read):
    # The launch has not run: the bytes read now would pass for its result.
    buf = st.full((4,), -7.0)
    with st.graph_scope() as s:
        (p,) = s.record(inc(buf.partition((2,))))
        out = p.unpartition()
        with pytest.raises(st.BorrowError, match="runs only when the graph is replayed"):
            read(out)


def test_memory_a_recorded_launch_writes_is_read_on_the_host_after_a_replay():
    buf = st.full((4,), -7.0)
    with st.graph_scope() as s:
        (p,) = s.record(inc(buf.partition((2,))))
    s.launch().sync()
    assert p.unpartition().to_torch().tolist() == [-6.0] * 4


def test_memory_a_recorded_launch_only_reads_may_be_read_on_the_host_in_the_scope():
    x, z = vec(1, 2), st.zeros((2,))
    with st.graph_scope() as s:
        xs, _, zp = s.record(add(x, vec(3, 4), z.partition((2,))))
        assert xs.to_torch().tolist() == [1.0, 2.0]
    s.launch().sync()
    assert zp.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_memory_a_recorded_launch_reads_is_not_handed_to_torch_before_the_scope_closes():
    x, z = vec(1, 2), st.zeros((2,))
    with st.graph_scope() as s:
        xs, _, zp = s.record(add(x, vec(3, 4), z.partition((2,))))
        with pytest.raises(st.BorrowError, match="recorded a launch that reads this memory"):
            xs.into_torch()
    s.launch().sync()
    assert zp.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_memory_an_earlier_launch_of_a_record_reads_is_not_handed_to_torch_in_its_callback():
    def hand_over(x, y, z):
        with pytest.raises(st.BorrowError, match="reads these bytes at every replay"):
            x.into_torch()
        return inc(z)
    g = add(vec(1, 2), vec(3, 4), st.zeros((2,)).partition((2,))).then(hand_over).graph()
    g.launch().sync()


def test_a_scope_whose_block_failed_keeps_no_memory_from_torch():
    buf = st.zeros((4,))
    with pytest.raises(RuntimeError, match="block failed"):
        with st.graph_scope() as s:
            (p,) = s.record(inc(buf.partition((2,))))
            raise RuntimeError("block failed")
    assert p.unpartition().into_torch().tolist() == [0.0] * 4


def test_memory_an_op_graph_records_is_not_handed_to_torch_while_the_graph_is_made(monkeypatch):
    buf = st.zeros((4,))
    view = buf.view((4,))
    tried = []
    make = graph_module.Graph

    def graph(*args, **kw):                 # the capture: seconds on a GPU, another thread
        try:                                # may run meanwhile
            view.into_torch()
            tried.append("handed to torch")
        except st.BorrowError:
            tried.append("refused")
        return make(*args, **kw)

    monkeypatch.setattr(graph_module, "Graph", graph)
    g = inc(buf.partition((2,))).graph()
    assert tried == ["refused"]
    del g


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps],
                         ids=["copy", "deepcopy", "pickle"])
def test_a_graph_cannot_be_copied_so_no_copy_replays_memory_handed_to_torch(how):
    g = add(vec(1, 2), vec(3, 4), st.zeros((2,)).partition((2,))).graph()
    with pytest.raises(st.errors.CopyError, match="cannot be"):
        how(g)


def test_a_graph_scope_cannot_be_copied():
    x, y, z = vec(1, 2), vec(3, 4), st.zeros((2,))
    with st.graph_scope() as s:
        with pytest.raises(st.errors.CopyError, match="cannot be"):
            copy.copy(s)
        s.record(add(x, y, z.partition((2,))))
    s.launch().sync()
