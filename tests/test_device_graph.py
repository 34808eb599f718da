"""Graphs on the CPU executor: op.graph(), st.graph_scope(), replay, update, capture rules."""
import asyncio

import pytest

import safetile as st
import safetile.lang as sl
from safetile.errors import AliasError, ExecutionError, GraphCaptureError

import support
from support import add, vec


@st.kernel
def inc(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


no_leftover_holds = support.no_leftover_holds()


def test_recording_runs_nothing_and_each_replay_runs_the_launches():
    z = st.zeros((4,)).partition((2,))
    g = inc(z).graph()
    t = g.output[0].unpartition()              # the same storage the graph writes
    assert t.to_torch().tolist() == [0, 0, 0, 0]
    for _ in range(3):
        g.launch().sync()
    assert t.to_torch().tolist() == [3, 3, 3, 3]


def test_graph_output_is_the_recorded_ops_output():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    g = add(x, y, st.empty((4,)).partition((2,))).graph()
    rx, ry, z = g.launch().sync()
    assert (rx, ry, z) == g.output and rx is x
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_replay_can_be_awaited_and_chained_with_then():
    z = st.zeros((4,)).partition((2,))
    g = inc(z).graph()
    g.launch().then(lambda z: g.launch()).sync()

    async def main():
        return await g.launch()

    (z,) = asyncio.run(main())
    assert z.unpartition().to_torch().tolist() == [3, 3, 3, 3]


def test_borrows_end_between_records_so_a_write_then_a_read_works():
    x = vec(1, 2, 3, 4)
    z = st.zeros((4,))
    w = st.empty((4,))
    with st.graph_scope() as s:
        (zp,) = s.record(inc(z.partition((2,))))
        z = zp.unpartition()
        _, z, wp = s.record(add(x, z, w.partition((2,))))
    s.launch().sync()
    assert wp.unpartition().to_torch().tolist() == [2, 3, 4, 5]
    assert len(s.graph.records) == 2 and len(s.graph.output) == 2


def test_allocating_inside_a_graph_scope_raises():
    with st.graph_scope():
        with pytest.raises(GraphCaptureError, match="allocates inside st.graph_scope"):
            st.zeros((4,))


def test_recording_an_op_that_allocates_raises_and_hands_the_values_back():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    op = add(x, y, st.empty((4,)).partition((2,))).then(
        lambda x, y, z: add(x, y, st.empty((4,)).partition((2,))))
    with pytest.raises(GraphCaptureError):
        op.graph()
    assert x.to_torch().tolist() == [1, 2, 3, 4]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")  # the refused op
def test_starting_execution_inside_a_then_callback_while_recording_raises():
    other = inc(st.zeros((4,)).partition((2,)))
    z = st.zeros((4,))
    with pytest.raises(ExecutionError, match="`then` callback"):
        with st.graph_scope() as s:
            s.record(inc(z.partition((2,))).then(lambda z: other.sync()))


def test_update_rebinds_the_inputs_baked_into_the_graph():
    y = vec(1, 1, 1, 1)
    g = add(vec(1, 2, 3, 4), y, st.empty((4,)).partition((2,))).graph()
    _, y, z = g.launch().sync()
    g.update(add(vec(10, 20, 30, 40), y, z.unpartition().partition((2,))))
    _, _, z = g.launch().sync()
    assert z.unpartition().to_torch().tolist() == [11, 21, 31, 41]


def test_update_with_a_different_structure_raises():
    g = inc(st.zeros((4,)).partition((2,))).graph()
    with pytest.raises(GraphCaptureError, match="structure"):
        g.update(inc(st.zeros((8,)).partition((2,))))


def test_a_replay_inside_a_recording_inlines_the_graphs_launches():
    z = st.zeros((4,)).partition((2,))
    inner = inc(z).graph()
    with st.graph_scope() as s:
        s.record(inner.launch())
        s.record(inner.launch())
    s.launch().sync()
    assert len(s.graph.records) == 2
    assert inner.output[0].unpartition().to_torch().tolist() == [2, 2, 2, 2]


def test_a_replay_runs_once_per_launch_op():
    g = inc(st.zeros((4,)).partition((2,))).graph()
    op = g.launch()
    op.sync()
    with pytest.raises(ExecutionError, match="already run"):
        op.sync()


def test_an_empty_scope_gives_a_graph_that_does_nothing():
    with st.graph_scope() as s:
        pass
    assert s.launch().sync() == ()


def test_launching_before_the_scope_closes_raises():
    with st.graph_scope() as s:
        with pytest.raises(GraphCaptureError, match="still recording"):
            s.launch()



def test_running_an_op_inside_a_scope_raises_and_leaves_it_to_record():
    z = st.zeros((4,)).partition((2,))
    with st.graph_scope() as s:
        op = inc(z)
        with pytest.raises(GraphCaptureError, match=r"record it with s\.record\(op\)"):
            op.sync()
        (z,) = s.record(op)                   # nothing was lost: the same op records
    s.launch().sync()
    assert z.unpartition().to_torch().tolist() == [1, 1, 1, 1]


def test_an_inline_op_refused_inside_a_scope_names_its_values_as_recovered():
    t = st.zeros((4,))
    with pytest.raises(GraphCaptureError) as e:
        with st.graph_scope():
            inc(t.partition((2,))).sync()
    (z,) = e.value.recovered
    with pytest.warns(st.UnrunOpWarning):
        del e                                 # the traceback held the op: now it is dropped
    assert z.unpartition().to_torch().tolist() == [0, 0, 0, 0]


def test_awaiting_an_op_inside_a_scope_raises():
    z = st.zeros((4,)).partition((2,))

    async def main():
        with st.graph_scope() as s:
            op = inc(z)
            with pytest.raises(GraphCaptureError, match="outside the graph"):
                await op
            return s.record(op)
    (z,) = asyncio.run(main())
    assert z.unpartition().to_torch().tolist() == [0, 0, 0, 0]


def test_a_replay_rewrites_values_shared_while_recording_before_the_launches_that_read_them():
    # Each add reads, as a Shared value, the vector the previous one wrote (a decode step).
    cur, one = vec(1, 2, 3, 4), vec(1, 1, 1, 1).share()
    bufs = [st.empty((4,)) for _ in range(3)]
    with st.graph_scope() as s:
        for buf in bufs:
            _, one, zp = s.record(add(cur.share(), one, buf.partition((2,))))
            cur = zp.unpartition()
    for _ in range(2):
        s.launch().sync()
    assert cur.to_torch().tolist() == [4, 5, 6, 7]


def test_a_replay_may_not_rewrite_a_value_shared_after_recording():
    g = inc(st.zeros((4,)).partition((2,))).graph()
    shared = g.output[0].unpartition().share()
    with pytest.raises(AliasError, match="shared value"):
        g.launch().sync()
    assert shared.try_unwrap().to_torch().tolist() == [0, 0, 0, 0]


def test_only_values_a_record_wrote_before_they_were_shared_are_the_graphs_own():
    written, untouched = st.zeros((4,)), vec(1, 2, 3, 4)
    z = st.empty((4,))
    with st.graph_scope() as s:
        (wp,) = s.record(inc(written.partition((2,))))
        mine = wp.unpartition().share()
        other = untouched.share()
        s.record(add(mine, other, z.partition((2,))))
    own = s.graph._own_shared
    assert mine._core.hold in own and other._core.hold not in own


def test_a_value_shared_and_unwrapped_while_recording_leaves_no_borrow_to_the_graph():
    # Share, read, take back, write again: the decode pattern of a weight updated in place.
    w, one, outs = st.zeros((4,)), vec(1, 1, 1, 1), [st.empty((4,)) for _ in range(2)]
    with st.graph_scope() as s:
        for out in outs:
            (wp,) = s.record(inc(w.partition((2,))))
            shared = wp.unpartition().share()
            s.record(add(shared, one, out.partition((2,))))
            w = shared.try_unwrap()
    assert s.graph._own_shared == frozenset()
    s.launch().sync()
    assert w.to_torch().tolist() == [2, 2, 2, 2]


def test_a_value_shared_in_a_callback_cannot_be_written_later_in_the_same_execution():
    x = vec(1, 2, 3, 4)
    kept = []

    def share_then_write(xp):
        t = xp.unpartition()
        kept.append(t.share())
        view = st.from_torch(kept[0]._torch)           # another handle on the same bytes
        return inc(view.partition((2,)))

    with pytest.raises(AliasError, match="shared value.*try_unwrap"):
        inc(x.partition((2,))).then(share_then_write).sync()


def test_a_host_replay_refuses_a_tensor_moved_to_other_memory_through_a_torch_alias():
    import torch
    xt, zt = torch.zeros(4), torch.zeros(4)
    x, z = st.from_torch(xt), st.from_torch(zt).partition((2,))
    with st.graph_scope() as s:
        x, _, z = s.record(add(x, vec(1, 1, 1, 1), z))
    zt.untyped_storage().resize_(64)                     # its bytes move to a new block
    with pytest.raises(GraphCaptureError, match=r"'z' was moved \(its storage resized"):
        s.launch().sync()
    assert xt.tolist() == [0, 0, 0, 0]                   # nothing ran


def test_a_dtype_or_storage_set_through_the_callers_torch_tensor_does_not_reach_the_handle():
    import torch
    zt = torch.zeros(4)
    g = inc(st.from_torch(zt).partition((2,))).graph()
    g.launch().sync()
    zt.data = zt.view(torch.int32)                       # the caller's tensor, not the handle's
    zt.set_(torch.zeros(4, dtype=torch.int32).untyped_storage(), 0, (4,), (1,))
    (z,) = g.launch().sync()
    assert z.unpartition().to_torch().tolist() == [2.0, 2.0, 2.0, 2.0]


def test_update_with_a_different_structure_hands_the_new_values_back_as_recovered():
    g = inc(st.zeros((4,)).partition((2,))).graph()
    z = st.zeros((8,))
    with pytest.raises(GraphCaptureError, match="structure") as e:
        g.update(inc(z.partition((2,))))
    (zp,) = e.value.recovered
    assert zp.unpartition() is z


def test_an_update_whose_record_fails_hands_back_the_values_of_every_op():
    first, second = inc(st.zeros((4,)).partition((2,))), \
        add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), st.empty((4,)).partition((2,)))
    with st.graph_scope() as s:
        s.record(first)
        s.record(second)
    g = s.graph
    x, z = vec(1, 1, 1, 1), st.empty((4,))
    failing = inc(st.zeros((4,)).partition((2,))).then(lambda z: "not an op")
    later = add(x, vec(1, 1, 1, 1), z.partition((2,)))
    with pytest.raises(ExecutionError) as e:
        g.update(failing, later)
    (zf,), (rx, _, rz) = e.value.recovered
    assert rx is x and x.to_torch().tolist() == [1, 1, 1, 1]
    assert rz.unpartition() is z and zf.unpartition().shape == (4,)


def test_recording_into_a_closed_scope_raises_and_hands_the_op_back():
    with st.graph_scope() as s:
        pass
    z = st.zeros((4,))
    with pytest.raises(GraphCaptureError, match="closed") as e:
        s.record(inc(z.partition((2,))))
    (zp,) = e.value.recovered
    assert zp.unpartition() is z


def test_a_scope_whose_block_raised_is_closed_and_refuses_later_records():
    z = st.zeros((4,))
    with pytest.raises(ValueError):
        with st.graph_scope() as s:
            s.record(inc(z.partition((2,))))
            raise ValueError("the block fails")
    with pytest.raises(GraphCaptureError, match="closed") as e:
        s.record(inc(st.zeros((4,)).partition((2,))))
    assert e.value.recovered[0].unpartition().shape == (4,)
    with pytest.raises(GraphCaptureError, match="block raised, so it made no graph"):
        s.launch()


def test_a_failed_record_leaves_none_of_its_launches_in_the_graph():
    z = st.zeros((4,))
    first = inc(z.partition((2,)))
    failing = inc(st.zeros((4,)).partition((2,))).then(lambda z: "not an op")
    with st.graph_scope() as s:
        with pytest.raises(ExecutionError) as e:
            s.record(st.zip(first, failing))
    assert s.graph.records == ()
    s.launch().sync()
    (zp,), _ = e.value.recovered
    assert zp.unpartition().to_torch().tolist() == [0, 0, 0, 0]     # the replay left it alone


def test_a_graph_inlined_after_a_value_was_shared_in_the_scope_may_not_write_it():
    # Recorded directly, the write is refused (the value is read-only from its share on);
    # inlined from another graph it must be refused alike, or replays rewrite the value.
    x = st.zeros((4,))
    inner = inc(x.view((4,)).partition((2,))).graph()
    with st.graph_scope() as s:
        s.record(inc(x.view((4,)).partition((2,))))         # written before the share
        shared = x.view((4,)).share()
        with pytest.raises(AliasError, match="shared value") as e:
            s.record(inner.launch())
        assert e.value.recovered is inner.output
    assert len(s.graph.records) == 1
    s.launch().sync()
    assert shared.to_torch().tolist() == [1, 1, 1, 1]


def test_a_graph_that_reads_a_value_shared_in_the_scope_may_be_inlined():
    x, z = vec(1, 2, 3, 4), st.empty((4,))
    inner = add(x.view((4,)), vec(1, 1, 1, 1), z.view((4,)).partition((2,))).graph()
    with st.graph_scope() as s:
        shared = x.view((4,)).share()
        s.record(inner.launch())
    s.launch().sync()
    assert z.to_torch().tolist() == [2, 3, 4, 5] and shared.to_torch()[0] == 1


def test_update_is_refused_while_a_replay_of_the_graph_is_in_flight():
    # The replay's execution stays open (its callback waits), so the replay still borrows
    # the recorded buffers and will hand back the recorded output.
    import threading
    z = st.zeros((4,))
    g = inc(z.view((4,)).partition((2,))).graph()
    started, gate = threading.Event(), threading.Event()

    def hold_open(zp):
        started.set()
        gate.wait(10)
        return inc(st.zeros((4,)).partition((2,)))

    async def main():
        fut = st.submit(g.launch().then(hold_open))
        while not started.is_set():
            await asyncio.sleep(0.001)
        new = st.zeros((4,))
        try:
            with pytest.raises(GraphCaptureError, match="in flight") as e:
                g.update(inc(new.view((4,)).partition((2,))))
        finally:
            gate.set()
        (zp,) = e.value.recovered
        assert zp.unpartition().to_torch().tolist() == [0, 0, 0, 0]
        await fut
        return g.output

    (zp,) = asyncio.run(main())
    assert z.to_torch().tolist() == [1, 1, 1, 1]
    g.update(inc(zp))                           # once the replay is done, update works


def test_a_graphs_own_shared_result_that_could_not_be_unwrapped_during_a_replay_stays_shared():
    import threading
    x = st.zeros((4,))
    with st.graph_scope() as s:
        s.record(inc(x.view(4).partition((2,))))
        shared = x.view(4).share()                  # the graph's own result
    started, proceed = threading.Event(), threading.Event()

    def hold_the_replay_open(*out):                 # runs while the replay's writes are held
        started.set()
        proceed.wait(10)
        return out

    async def main():
        fut = st.submit(s.launch().map(hold_the_replay_open))
        while not started.is_set():
            await asyncio.sleep(0.001)
        try:
            with pytest.raises(st.BorrowError, match="graph replay"):
                shared.try_unwrap()
        finally:
            proceed.set()
        await fut

    asyncio.run(main())
    with pytest.raises(AliasError, match="shared value"):
        inc(x.view(4).partition((2,)))
    assert shared.try_unwrap().to_torch().tolist() == [1, 1, 1, 1]


def test_a_replay_is_a_device_op_that_can_itself_be_captured():
    z = st.zeros((4,)).partition((2,))
    g = inc(z).graph()
    outer = g.launch().graph()                 # the replay recorded into a new graph
    t = outer.output[0].unpartition()
    outer.launch().sync()
    outer.launch().sync()
    assert t.to_torch().tolist() == [2, 2, 2, 2]


def test_a_callback_cannot_read_bytes_a_recorded_launch_writes_only_when_replayed():
    t = st.zeros((4,))
    alias = t.view((4,))                                 # the same bytes, another handle
    z = t.partition((2,))
    with pytest.raises(st.BorrowError, match="only when it is replayed") as e:
        inc(z).map(lambda p: alias.to_torch()).graph()
    (p,) = e.value.recovered
    assert p is z and p.unpartition().to_torch().tolist() == [0, 0, 0, 0]   # never written


def test_a_callback_may_read_bytes_no_recorded_launch_writes():
    x = vec(1, 2, 3, 4)
    g = inc(st.zeros((4,)).partition((2,))).map(lambda p: (p, x.to_torch().tolist())).graph()
    assert g.output[1] == [1, 2, 3, 4]


def test_a_callback_may_copy_but_not_hand_to_torch_bytes_a_recorded_launch_only_reads():
    # Every replay reads them again: handed to torch, they would be torch's while it does.
    def inspect(x, y, z):
        with pytest.raises(st.BorrowError, match="reads these bytes at every replay"):
            x.into_torch()
        return x.to_torch().tolist(), z
    x = vec(1, 2, 3, 4)
    g = add(x, vec(1, 1, 1, 1), st.empty((4,)).partition((2,))).map(inspect).graph()
    assert g.output[0] == [1, 2, 3, 4]
