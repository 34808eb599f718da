"""An interrupted wait never ends the borrows of work that may still run.

The CPU machine has no stream to wait on, so these tests give an execution a stand-in
stream whose first wait is interrupted (a KeyboardInterrupt raised as ``op.sync()`` starts
waiting) and record what is still borrowed at each later wait."""
import gc
import threading

import pytest

import safetile as st
from safetile.device import streams
from safetile.device.execution import RunContext
from safetile.kernel.kernel_op import KernelOp
from safetile.tensor import active_holds, borrows
from safetile.tensor.registry import Registry

from interrupts import entered, interrupted, is_free
from support import add, cpu_executor, holds_left, no_leftover_holds, vec

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


class InterruptedStream:
    """A stream whose first ``synchronize`` raises KeyboardInterrupt."""

    cuda_stream = 0

    def __init__(self, interrupts: int = 1):
        self.interrupts = interrupts
        self.borrowed_at_wait: list = []

    def synchronize(self):
        self.borrowed_at_wait.append(len(active_holds()))
        if self.interrupts:
            self.interrupts -= 1
            raise KeyboardInterrupt


@pytest.fixture
def stream(monkeypatch):
    s = InterruptedStream()
    monkeypatch.setattr(streams, "resolve", lambda stream=None: s)
    return s


def test_an_interrupted_sync_waits_for_the_work_before_ending_its_borrows(stream):
    op = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    with pytest.raises(KeyboardInterrupt) as e:
        op.sync()
    assert stream.borrowed_at_wait == [3, 3]       # waited again, the borrows still held
    assert active_holds() == []
    x, y, z = e.value.recovered
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_sync_hands_the_values_back_before_its_wait_and_ends_the_borrows_after(monkeypatch):
    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    seen = []

    class Stream:
        cuda_stream = 0

        def synchronize(self):
            seen.append(([h._is_live() for h in (x, y, z)], len(active_holds())))

    monkeypatch.setattr(streams, "resolve", lambda stream=None: Stream())
    x, y, z = add(x, y, z).sync()
    assert seen == [([True, True, True], 3)]
    assert active_holds() == []
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_repeated_interrupts_keep_waiting_until_the_wait_completes(monkeypatch):
    s = InterruptedStream(interrupts=3)
    monkeypatch.setattr(streams, "resolve", lambda stream=None: s)
    op = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    with pytest.raises(KeyboardInterrupt):
        op.sync()
    assert s.borrowed_at_wait == [3, 3, 3, 3]


def test_an_interrupted_graph_replay_waits_before_its_borrows_end(stream):
    x, y, out = vec(1, 2), vec(3, 4), st.empty((2,))
    g = add(x, y, out.partition((2,))).graph()
    with pytest.raises(KeyboardInterrupt):
        g.launch().sync()
    assert stream.borrowed_at_wait[-1] > 0 and len(stream.borrowed_at_wait) == 2
    assert active_holds() == []


def test_an_interrupt_between_two_restores_still_hands_every_value_back(monkeypatch):
    """An op hands its values back once: a KeyboardInterrupt landing as it restores the first
    handle must not leave that one, or those after it, moved for good."""
    restore = st.Tensor._restore_locked
    interrupts = []

    def interrupted(self):
        if not interrupts:
            interrupts.append(self)
            raise KeyboardInterrupt
        restore(self)

    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    op = add(x, y, z)
    monkeypatch.setattr(st.Tensor, "_restore_locked", interrupted)
    with pytest.raises(KeyboardInterrupt):
        op.sync()
    monkeypatch.undo()
    assert interrupts == [x]
    assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,))      # every handle is live
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]
    assert active_holds() == []


def _interrupted(code, fn):
    """``fn()`` with a KeyboardInterrupt raised as ``code`` is first entered; the interrupt."""
    e = interrupted(fn, code)
    assert isinstance(e, KeyboardInterrupt), f"{code.co_name} was never entered"
    return e


def test_an_interrupt_as_the_launch_builds_its_op_moves_nothing():
    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    e = _interrupted(KernelOp.__init__.__code__, lambda: add(x, y, z))
    assert e.recovered == (x, y, z)
    del e
    gc.collect()
    assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,))      # every handle is live
    assert active_holds() == []


def test_an_interrupt_as_an_op_starts_running_hands_its_values_back():
    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    op = add(x, y, z)
    e = _interrupted(RunContext.keeps.__code__, op.sync)
    assert e.recovered == (x, y, z)
    assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,))
    assert active_holds() == []


class _InterruptedOwnerRead(threading.local):
    """The thread's execution owner, whose first read is interrupted."""

    interrupts = 1

    @property
    def ctx(self):
        if self.interrupts:
            self.interrupts = 0
            raise KeyboardInterrupt
        return None

    @ctx.setter
    def ctx(self, value):
        pass


def test_an_interrupt_as_a_sync_starts_leaves_the_thread_free_to_run_ops(monkeypatch):
    op = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    monkeypatch.setattr(borrows, "_owner", _InterruptedOwnerRead())
    with pytest.raises(KeyboardInterrupt):
        op.sync()
    monkeypatch.undo()
    x, y, z = op.sync()                    # neither run nor marked as running
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_an_interrupt_as_a_sync_finishes_still_hands_every_value_back():
    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    op = add(x, y, z)
    e = _interrupted(RunContext.finish.__code__, op.sync)
    assert e.recovered == (x, y, z)
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]
    assert active_holds() == []


def test_an_interrupted_hand_back_between_then_steps_still_hands_the_values_back():
    x, y, z = vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))
    op = add(x, y, z).then(lambda a, b, c: add(a, b, c))
    _interrupted(KernelOp._hand_back.__code__, op.sync)
    assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,))
    assert active_holds() == []


def test_an_interrupted_end_of_a_borrow_still_ends_it():
    op = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    _interrupted(borrows.Hold.release.__code__, op.sync)
    assert active_holds() == []


def test_an_interrupt_as_a_borrow_leaves_the_registry_still_ends_it():
    op = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    _interrupted(Registry.remove.__code__, op.sync)
    assert active_holds() == []


def _launch_and_sync():
    add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))).sync()


def _then_chain():
    add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))).then(add).sync()


def _many_in_flight():
    """Six ops in flight (their borrows kept in the registry's address index), one of them
    reading a Shared value (a lasting borrow), then each synced."""
    w = st.randn((2,), device="cpu").share()
    ops = [add(w.clone(), vec(1, 2), st.empty((2,)).partition((2,)))]
    ops += [add(vec(i, 2), vec(3, 4), st.empty((2,)).partition((2,))) for i in range(5)]
    for op in ops:
        op.sync()


def _shared_value_lifecycle():
    """A value shared, cloned, read by a launch, its clones released, then unwrapped."""
    w = st.randn((4,), device="cpu").share()
    c = w.clone()
    c, _, _ = add(c, vec(1, 2, 3, 4), st.empty((4,)).partition((4,))).sync()
    c.release()
    w.clone().release()
    w.try_unwrap()


@pytest.mark.parametrize("work", [_launch_and_sync, _then_chain, _many_in_flight,
                                  _shared_value_lifecycle])
def test_an_interrupt_anywhere_in_a_launch_leaves_the_lock_free_and_launches_working(work):
    from safetile.tensor.ownership import LOCK, WALK
    root = st.__file__.rsplit("/", 1)[0]
    for code in entered(work, lambda frame: frame.f_code.co_filename.startswith(root)):
        interrupted(work, code)
        where = f"interrupted at {code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        assert not WALK.here(), where
        assert is_free(LOCK), where
        _launch_and_sync()                     # neither refused nor blocked
        if active_holds():
            assert holds_left() == [], where   # (values in a cycle go only with a collection)



def _live(values) -> bool:
    """Whether none of ``values`` is moved away."""
    try:
        for v in values:
            v.shape
    except st.MovedError:
        return False
    return True


def _triple():
    return vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,))


def test_an_interrupt_anywhere_in_a_graph_record_leaves_its_scope_recording():
    """Interrupted at each function a record enters, with a ``then`` callback that gives up
    the scope's turn while it runs: the turn is free after, and the scope still records."""
    root = st.__file__.rsplit("/", 1)[0]
    first, second = _triple(), _triple()
    with st.graph_scope() as probe:
        codes = entered(lambda: probe.record(add(*first).then(add)),
                        lambda frame: frame.f_code.co_filename.startswith(root))
    del probe
    for code in codes:
        where = f"interrupted at {code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        first, second = _triple(), _triple()
        with st.graph_scope() as scope:
            interrupted(lambda: scope.record(add(*first).then(add)), code)
            assert is_free(scope._lock), where
            scope.record(add(*second))
        _, _, z = scope.launch().sync()[-1]
        assert z.unpartition().to_torch().tolist() == [4.0, 6.0], where
        del scope, first, second, z
        assert holds_left() == [], where


@pytest.mark.parametrize("code, caller", [
    (borrows.borrow_again.__code__, None),
    (borrows.Hold.release.__code__, borrows.borrow_again.__code__),
    (Registry.remove.__code__, borrows.Hold.release.__code__)],
    ids=["borrow_again", "the old reservation's release", "its registry removal"])
def test_an_interrupt_as_a_reservation_is_checked_again_ends_old_and_new(code, caller):
    """An op of two launches built in one execution's callback and run in another borrows
    its reservation again as it starts (the new one made before the old one ends);
    interrupted there, neither stays held."""
    from safetile import ops
    x, ws = st.randn((300,)), ops.argmax_workspace(300)
    z = st.empty((1,), dtype=st.i64)
    built = []
    first = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    first.map(lambda *out: built.append(ops.argmax(x, workspace=ws, out=z)) or out).sync()
    e = interrupted(built.pop().sync, code, caller)
    assert isinstance(e, KeyboardInterrupt)
    del e
    gc.collect()
    assert active_holds() == []
    ops.argmax(x, workspace=ws, out=z).sync()         # every byte of it is free again
    assert z.to_torch().item() == x.to_torch().argmax().item()


def test_a_record_interrupted_as_it_finishes_keeps_nothing_it_handed_back_from_torch():
    x, y, z = _triple()
    with st.graph_scope() as scope:
        e = _interrupted(RunContext.finish.__code__, lambda: scope.record(add(x, y, z)))
        x, y, z = e.recovered
        assert scope.count() == 0
        z.unpartition().into_torch()           # no recorded launch writes it any more


def test_an_unwrap_interrupted_as_the_shared_borrow_ends_hands_the_tensor_over():
    s = st.randn((4,)).share()
    e = interrupted(s.try_unwrap, borrows.Hold.release.__code__)
    assert isinstance(e, KeyboardInterrupt)
    assert e.recovered.shape == (4,) and active_holds() == []


def test_a_try_partition_interrupted_as_it_partitions_hands_the_tensor_over():
    s = st.randn((4,)).share()
    e = _interrupted(st.Tensor.partition.__code__, lambda: s.try_partition((2,)))
    assert e.recovered.partition((2,)).grid == (2,)


def test_a_record_interrupted_before_it_starts_names_the_values_its_op_keeps():
    from safetile.device.scope import _Turn
    x, y, z = _triple()
    with st.graph_scope() as scope:
        op = add(x, y, z)
        e = _interrupted(_Turn.take.__code__, lambda: scope.record(op))
        assert e.recovered == (x, y, z) and scope.count() == 0
        scope.record(op)                       # the op, unrun, can still be recorded
    assert scope.count() == 1


def test_futures_left_unresolved_by_an_interrupt_as_they_settle_resolve_when_the_loop_runs():
    import asyncio
    from safetile.device import aio
    loop = asyncio.new_event_loop()
    try:
        futures = [aio._OpFuture(loop=loop) for _ in range(3)]
        done = [(f, i, None) for i, f in enumerate(futures)]
        assert isinstance(interrupted(lambda: aio._settle_all(done), aio._settle.__code__),
                          KeyboardInterrupt)
        assert not any(f.done() for f in futures)
        loop.run_until_complete(asyncio.sleep(0))
        assert [f.result() for f in futures] == [0, 1, 2]
    finally:
        loop.close()



@pytest.mark.parametrize("code", ["_new_handle", "Handle.__init__"])
def test_a_clone_interrupted_as_it_is_built_leaves_the_value_unwrappable(code):
    from safetile.tensor.ownership import Handle
    s = st.randn((4,)).share()
    where = {"_new_handle": st.Shared._new_handle.__func__.__code__,
             "Handle.__init__": Handle.__init__.__code__}[code]
    assert isinstance(interrupted(s.clone, where), KeyboardInterrupt)
    gc.collect()
    assert s.num_handles == 1                  # no handle counted that does not exist
    assert s.try_unwrap().shape == (4,) and active_holds() == []


def test_an_await_on_the_cpu_interrupted_as_its_future_settles_does_not_hang():
    import asyncio
    from safetile.device import aio
    outcome = []

    async def main():
        x, y, z = await add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
        outcome.append(z.unpartition().to_torch().tolist())

    def run():
        outcome.append(interrupted(lambda: asyncio.run(main()), aio._settle.__code__))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "asyncio.run never returned"
    assert isinstance(outcome[-1], KeyboardInterrupt)


@pytest.mark.parametrize("run", ["sync", "graph"])
def test_an_interrupt_anywhere_in_a_failing_execution_leaves_no_borrow_and_no_value_moved(run):
    """Interrupted at each function a failing execution enters, its cleanup included (an
    interrupt at the entry of a step that hands values back must not skip that step)."""
    root = st.__file__.rsplit("/", 1)[0]
    made = []

    def work():
        made[:] = _triple()
        op = add(*made).then(lambda *v: 1 / 0)
        try:
            op.sync() if run == "sync" else op.graph()
        except ZeroDivisionError:
            pass

    for code in entered(work, lambda frame: frame.f_code.co_filename.startswith(root)):
        made.clear()
        interrupted(work, code)
        where = f"interrupted at {code.co_name} ({code.co_filename}:{code.co_firstlineno})"
        if active_holds() or not _live(made):
            gc.collect()                       # (values in a cycle go only with it)
        assert active_holds() == [], where
        if len(made) == 3:                     # (made before the interrupt)
            x, y, z = made
            assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,)), where


def test_an_interrupt_as_a_zip_starts_running_hands_its_ops_values_back_at_once():
    from safetile.device.combinators import ZipOp
    x, y, z = _triple()
    op = st.zip(add(x, y, z))
    _interrupted(ZipOp._run.__code__, op.sync)
    assert (x.shape, y.shape, z.grid) == ((2,), (2,), (1,))   # no collection needed
    assert active_holds() == []
