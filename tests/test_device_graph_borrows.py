"""Graphs: what a replay borrows, and what it runs (exactly the recorded launches)."""
import threading
import time

import numpy as np
import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.errors import ExecutionError

import support
from support import vec


@st.kernel
def inc(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


no_leftover_holds = support.no_leftover_holds()


@st.kernel
def copy(x: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z))


def test_a_replay_borrows_every_byte_it_writes_when_one_memory_has_two_storages():
    buf = torch.zeros(4096)
    small = st.from_dlpack(torch.utils.dlpack.to_dlpack(buf[:16]))   # 64 bytes, same address
    big = st.from_dlpack(torch.utils.dlpack.to_dlpack(buf))          # the whole buffer
    q = st.zeros((16,))
    with st.graph_scope() as s:
        s.record(copy(small, q.partition((16,))))
        s.record(inc(big.partition((16,))))
    _, writes = s.graph._borrow_plan()
    assert max(view.numel() for _, view in writes) == 4096 * 4     # all of buf, not 64 bytes


def test_a_replay_borrows_only_the_bytes_its_launches_touch():
    t = st.zeros((32,))
    first, second = t.slice(0, 0, 16), t.slice(0, 16, 32).share()
    g = inc(first.partition((16,))).graph()
    g.launch().sync()                         # the shared second half is not written
    (z,) = g.output
    assert z.unpartition().to_torch().tolist() == [1.0] * 16
    second.release()


def test_a_replay_borrows_touching_spans_of_one_kind_as_one_view():
    x, out = st.randn((64,)), st.zeros((64,))        # each read and written as 8 slices
    with st.graph_scope() as s:
        for i in range(0, 64, 8):
            s.record(copy(x.slice(0, i, i + 8), out.slice(0, i, i + 8).partition((8,))))
    reads, writes = s.graph._borrow_plan()
    assert [v.numel() for _, v in reads] == [256] and [v.numel() for _, v in writes] == [256]


def test_a_replay_keeps_a_read_span_apart_from_the_write_span_it_touches():
    t = st.randn((32,))
    with st.graph_scope() as s:
        s.record(copy(t.slice(0, 16, 32), t.slice(0, 0, 16).partition((16,))))
    reads, writes = s.graph._borrow_plan()
    assert [v.numel() for _, v in reads] == [64] and [v.numel() for _, v in writes] == [64]


def test_a_buffer_written_beside_shared_weights_leaves_them_read_in_a_replay():
    t = st.randn((48,))
    weights, table = t.slice(0, 0, 32).share(), t.slice(0, 32, 48)    # one storage
    a, b = st.zeros((16,)), st.zeros((32,))
    with st.graph_scope() as s:
        table, _ = s.record(copy(table, a.partition((16,))))
        s.record(inc(table.partition((16,))))
        weights, _ = s.record(copy(weights, b.partition((32,))))
    s.launch().sync()                       # the table's write leaves the weights read
    reads, writes = s.graph._borrow_plan()
    assert 128 in [v.numel() for _, v in reads] and 64 in [v.numel() for _, v in writes]
    weights.release()


def test_records_from_two_threads_keep_each_others_launches():
    x, y = vec(1, 1, 1, 1), vec(2, 2, 2, 2)
    pa, pb = st.zeros((4,)).partition((2,)), st.zeros((4,)).partition((2,))
    done = {}

    def fails_slowly(y, pb):
        time.sleep(0.2)
        raise ValueError("boom")
    with st.graph_scope() as s:
        def b():
            try:
                s.record(copy(y, pb).then(fails_slowly))
            except ValueError as e:
                done["b"] = e.recovered

        def a():
            time.sleep(0.05)
            done["a"] = s.record(copy(x, pa))
        threads = [threading.Thread(target=b), threading.Thread(target=a)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    s.launch().sync()
    _, za = done["a"]
    assert len(s.graph.records) == 1 and za.unpartition().to_torch().tolist() == [1, 1, 1, 1]


def test_a_shared_op_whose_first_record_failed_is_not_consumed_later_without_its_launch():
    so = copy(vec(1, 1, 1, 1), st.zeros((4,)).partition((2,))).shared()

    def fails(x, p):
        raise ValueError("first consumer fails")
    with pytest.raises(ExecutionError, match="ran in a record that failed"):
        with st.graph_scope() as s:
            with pytest.raises(ValueError):
                s.record(so.then(fails))
            s.record(so.map(lambda x, p: p))


def test_a_replay_borrows_all_it_writes_when_no_one_storage_holds_it():
    arr = np.zeros(16, np.float32)
    a, b = st.from_dlpack(arr[0:10]), st.from_dlpack(arr[6:16])     # two storages, overlapping
    with st.graph_scope() as s:
        s.record(inc(a.partition((2,))))
        s.record(inc(b.partition((2,))))
    _, writes = s.graph._borrow_plan()
    assert sum(view.numel() for _, view in writes) == 64             # bytes [0, 64), once


def test_a_graph_s_recorded_launches_cannot_be_edited():
    z = st.zeros((4,)).partition((2,))
    with st.graph_scope() as s:
        s.record(inc(z))
        assert isinstance(s.records, tuple)         # a snapshot: appending changes nothing
    g = s.graph
    with pytest.raises(AttributeError):
        g.records.append(g.records[0])
    with pytest.raises(AttributeError):
        g.records = g.records * 2
    g.launch().sync()                               # one launch, as recorded
    assert g.output[0][0].unpartition().to_torch().tolist() == [1, 1, 1, 1]
