"""Replays of a graph on the CPU executor: inlined into another recording, refused, updated
with the wrong number of ops, and the names an op's users reach for on a graph."""
import threading

import pytest

import safetile as st
from safetile.errors import AliasError, BorrowError, GraphCaptureError

import support
from support import add, vec


@st.kernel
def inc(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


no_leftover_holds = support.no_leftover_holds()


def _counter():
    """A graph that adds one to a zeroed buffer, and a second handle of that buffer."""
    t = st.zeros((4,))
    alias = t.view((4,))
    return inc(t.partition((2,))).graph(), alias


def test_an_inlined_replay_keeps_its_borrows_until_its_record_ends():
    g, alias = _counter()
    with pytest.raises(BorrowError, match="only when it is replayed"):
        g.launch().map(lambda p: alias.to_torch()).graph()
    assert alias.to_torch().tolist() == [0, 0, 0, 0]


def test_an_inlined_replay_keeps_another_threads_record_off_its_bytes_until_its_record_ends():
    g, alias = _counter()
    scratch = st.zeros((4,)).partition((2,))
    seen = []

    def other_thread(s):
        try:
            s.record(inc(alias.partition((2,))))
        except AliasError as e:
            seen.append(e)
            e.recovered[0].unpartition()

    def callback(z):
        th = threading.Thread(target=other_thread, args=(s,))
        th.start()
        th.join()
        return inc(scratch)

    with st.graph_scope() as s:
        s.record(g.launch().then(callback))
    assert len(seen) == 1 and "inlined" in str(seen[0])


def test_an_inlined_replay_lets_later_launches_of_its_record_write_its_bytes():
    g, alias = _counter()
    g2 = g.launch().then(lambda z: inc(z)).graph()
    g2.launch().sync()
    assert alias.to_torch().tolist() == [2, 2, 2, 2]


def test_a_refused_replay_recovers_the_graphs_output():
    g, alias = _counter()
    shared = alias.share()                      # a read borrow for the value's life
    with pytest.raises(AliasError) as info:
        g.launch().sync()
    assert info.value.recovered == g.output
    shared.release()


def test_update_of_a_scope_graph_takes_one_op_per_record():
    z1, z2 = st.zeros((4,)).partition((2,)), st.zeros((4,)).partition((2,))
    with st.graph_scope() as s:
        s.record(inc(z1))
        s.record(inc(z2))
    before = s.graph.output
    w1, w2 = st.zeros((4,)).partition((2,)), st.zeros((4,)).partition((2,))
    with pytest.raises(GraphCaptureError, match="takes 2 op") as info:
        s.graph.update(st.zip(inc(w1), inc(w2)))
    assert info.value.recovered == (((w1,), (w2,)),)
    assert s.graph.output == before
    assert w1.unpartition().to_torch().tolist() == [0, 0, 0, 0]


def test_update_of_an_op_graph_takes_one_op():
    g = st.zip(inc(st.zeros((4,)).partition((2,))),
               inc(st.zeros((4,)).partition((2,)))).graph()
    w1, w2 = st.zeros((4,)).partition((2,)), st.zeros((4,)).partition((2,))
    with pytest.raises(GraphCaptureError, match="takes 1 op") as info:
        g.update(inc(w1), inc(w2))
    assert info.value.recovered == ((w1,), (w2,))
    g.update(st.zip(inc(w1), inc(w2)))
    g.launch().sync()
    assert w2.unpartition().to_torch().tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("name", ["sync", "run", "replay", "result"])
def test_an_op_method_on_a_graph_says_to_replay_it_with_launch(name):
    g = add(vec(1, 2), vec(1, 1), st.empty((2,)).partition((2,))).graph()
    with pytest.raises(AttributeError, match=r"g\.launch\(\)\.sync\(\)"):
        getattr(g, name)
