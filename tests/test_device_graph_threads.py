"""A graph scope shared by threads: records from several threads, and a block ending while
another thread's record runs."""
import threading

import pytest

import safetile as st
from safetile.errors import GraphCaptureError

import support
from support import add, vec, out

no_leftover_holds = support.no_leftover_holds()


def test_threads_joined_inside_the_block_record_into_one_scope():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    outs = [out() for _ in range(4)]
    with st.graph_scope() as s:
        workers = [threading.Thread(target=lambda o=o: s.record(add(x, y, o))) for o in outs]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert len(s.graph.records) == 4 and len(s.graph.output) == 4
    s.launch().sync()
    assert all(o.unpartition().to_torch().tolist() == [2, 3, 4, 5] for o in outs)


def end_block_during_a_record():
    """End a scope's block while another thread's record is inside a `then` callback;
    returns (the block's error, the record's outcome, the record's output partitions)."""
    x, y, first, second = vec(1, 2, 3, 4), vec(1, 1, 1, 1), out(), out()
    inside, release, outcome = threading.Event(), threading.Event(), {}

    def pause(x, y, z):
        inside.set()
        release.wait(5)
        return add(x, y, second)

    def record():
        try:
            outcome["output"] = s.record(add(x, y, first).then(pause))
        except GraphCaptureError as e:
            outcome["error"] = e

    worker = threading.Thread(target=record)
    try:
        with st.graph_scope() as s:
            worker.start()
            inside.wait(5)
    except GraphCaptureError as e:
        block_error = e
    else:
        block_error = None
    release.set()
    worker.join()
    return block_error, s, outcome, (first, second)


def test_a_scope_whose_block_ends_while_another_thread_records_makes_no_graph():
    block_error, s, _, _ = end_block_during_a_record()
    assert block_error is not None and "running on another thread" in str(block_error)
    assert "join them inside it" in str(block_error)
    assert s.graph is None and not s.recording


def test_a_record_running_when_its_scope_ends_fails_and_hands_its_values_back():
    _, s, outcome, (first, second) = end_block_during_a_record()
    assert "output" not in outcome
    error = outcome["error"]
    assert "closed on another thread while this record ran" in str(error)
    rx, _, rz = error.recovered
    assert rx.to_torch().tolist() == [1, 2, 3, 4] and rz is second
    # nothing keeps the record's memory from torch: no graph will replay it
    first.unpartition().into_torch()
    second.unpartition().into_torch()


def test_a_record_after_a_scope_ended_on_another_thread_is_refused():
    with st.graph_scope() as s:
        pass
    z, errors = out(), []

    def record():
        try:
            s.record(add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), z))
        except GraphCaptureError as e:
            errors.append(e)
    worker = threading.Thread(target=record)
    worker.start()
    worker.join()
    assert "is closed" in str(errors[0]) and errors[0].recovered[2] is z


def test_a_replay_inlined_while_another_thread_updates_the_graph_records_the_launches_it_checked(
        monkeypatch):
    from safetile.kernel.kernel_op import KernelOp
    x, y, z1, z2 = vec(1, 2, 3, 4), vec(1, 1, 1, 1), out(), out()
    g = add(x, y, z1).graph()
    old = g.records
    x, y, _ = g.output
    check = KernelOp.borrow
    updated = []

    def update_meanwhile(self, reason):           # another thread updates the graph between
        if not updated:                           # the inlining's check and its recording
            updated.append(True)
            worker = threading.Thread(target=lambda: g.update(add(x, y, z2)))
            worker.start()
            worker.join()
        return check(self, reason)
    monkeypatch.setattr(KernelOp, "borrow", update_meanwhile)
    with st.graph_scope() as s:
        s.record(g.launch())
    assert s.graph.records == old and g.records != old


def record_from_a_callback_that_waits_for_another_thread(fail: bool):
    """Record ``add(x, y, first).then(f)`` where ``f`` waits (bounded) for another thread's
    record into the same scope, then returns ``add(x, y, second)``, or raises when ``fail``;
    returns (the scope, what happened: the launches by name, ...)."""
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    first, second, other = out(), out(), out()
    seen = {"first": add(x, y, first), "other": add(vec(10, 10, 10, 10), vec(1, 1, 1, 1), other)}

    def wait_for_another_record(x, y, z):
        worker = threading.Thread(daemon=True, target=lambda: seen.setdefault(
            "other output", s.record(seen["other"])))
        worker.start()
        worker.join(10)                           # bounded: a deadlock fails, not hangs
        seen["waited out"] = worker.is_alive()
        if fail:
            raise ValueError("after the other record")
        seen["second"] = add(x, y, second)
        return seen["second"]

    with st.graph_scope() as s:
        try:
            s.record(seen["first"].then(wait_for_another_record))
        except ValueError as e:
            seen["error"] = e
    return s, seen, (first, second, other)


def test_a_record_whose_callback_waits_for_another_threads_record_does_not_deadlock():
    s, seen, (first, second, other) = record_from_a_callback_that_waits_for_another_thread(
        fail=False)
    assert seen["waited out"] is False
    # the other thread's launch falls between the record's own, in recorded order
    assert s.graph.records == (seen["first"], seen["other"], seen["second"])
    s.launch().sync()
    assert second.unpartition().to_torch().tolist() == [2, 3, 4, 5]
    assert other.unpartition().to_torch().tolist() == [11, 11, 11, 11]


def test_a_failed_record_drops_its_own_launches_around_another_threads_record():
    s, seen, (first, second, other) = record_from_a_callback_that_waits_for_another_thread(
        fail=True)
    assert seen["waited out"] is False
    rx, _, rz = seen["error"].recovered
    assert rz is first and rx.to_torch().tolist() == [1, 2, 3, 4]
    assert s.graph.records == (seen["other"],) and s.graph.output == (seen["other output"],)
    # what it was recorded after is gone: it launches in plain order
    assert seen["other"].serial
    s.launch().sync()
    assert other.unpartition().to_torch().tolist() == [11, 11, 11, 11]



def test_a_shared_op_whose_record_failed_is_refused_after_another_threads_record():
    other = add(vec(10, 10, 10, 10), vec(1, 1, 1, 1), out())

    def let_the_other_thread_record(*values):
        worker = threading.Thread(target=lambda: s.record(other))
        worker.start()
        worker.join(10)
        return values

    def fail(*values):
        raise ValueError("the record fails after the shared op ran")

    shared = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).map(let_the_other_thread_record).shared()
    with st.graph_scope() as s:
        with pytest.raises(ValueError) as failed:
            s.record(shared.then(fail))
        assert s.records == (other,)              # only the other thread's launch is left
        with pytest.raises(st.ExecutionError, match="ran in a record that failed"):
            s.record(shared.last())
    assert failed.value.recovered[2] is not None  # its values came back with the error


def test_a_shared_op_stays_recorded_when_another_threads_record_fails_around_it():
    appended, ran = threading.Event(), threading.Event()
    other = add(vec(10, 10, 10, 10), vec(1, 1, 1, 1), out())

    def fail_once_the_shared_op_ran(*values):
        appended.set()                            # its launch is recorded; now it waits
        ran.wait(10)
        raise ValueError("the other record fails after the shared op ran")

    def record_other():
        with pytest.raises(ValueError):
            s.record(other.then(fail_once_the_shared_op_ran))

    def let_the_other_thread_record_first(*values):
        worker.start()
        appended.wait(10)
        return values

    worker = threading.Thread(target=record_other)
    first = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out())
    shared = first.map(let_the_other_thread_record_first).shared()
    with st.graph_scope() as s:
        s.record(shared.last())
        ran.set()
        worker.join(10)
        assert s.records == (first,)              # the shared op's own launch is kept
        s.record(shared.last())
    s.launch().sync()
    assert s.graph.output[0].unpartition().to_torch().tolist() == [2, 3, 4, 5]
