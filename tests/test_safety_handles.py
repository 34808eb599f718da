"""Handles and operations cannot be copied, and nothing is lost when something fails.

Copies of a handle or an op would be owners the ownership rules do not count (a copied
Shared let try_unwrap succeed while the copy lived; a copied op ran a kernel twice and
brought a consumed Partition back). Every refused launch and every failed execution hands
each value it took back, usable, as ``error.recovered``, including values made for the call
(an inline ``t.partition(...)``); a cancelled ``await`` raises once the work is complete,
with the op's output as ``error.recovered``.
"""
import asyncio
import copy
import gc
import pickle

import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.device import aio
from safetile.tensor import active_holds
from support import add, cpu_executor, holds_left, no_leftover_holds, vec

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


def _op():
    return add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))


@pytest.mark.parametrize("make,hint", [
    (lambda: st.zeros((2,)), "st.from_torch(t.to_torch())"),
    (lambda: st.zeros((2,)).share(), "shared.clone()"),
    (lambda: st.zeros((2,)).partition((2,)), "unpartition()"),
    (_op, "Build the operation again"),
    (lambda: _op().then(lambda x, y, z: add(x, y, z)), "Build the operation again"),
    (lambda: st.zip(_op(), _op()), "Build the operation again"),
], ids=["tensor", "shared", "partition", "kernel-op", "then", "zip"])
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps],
                         ids=["copy", "deepcopy", "pickle"])
def test_handles_and_ops_cannot_be_copied_or_pickled(make, hint, how):
    value = make()
    with pytest.raises(st.errors.CopyError, match="cannot be") as e:
        how(value)
    assert hint in str(e.value)
    assert isinstance(e.value, TypeError)
    if isinstance(value, st.DeviceOp):
        value.sync()                              # the original still runs (and does not warn)


def test_a_shared_value_is_unwrapped_only_when_its_counted_handles_are_gone():
    s = st.zeros((2,)).share()
    c = s.clone()
    with pytest.raises(st.BorrowError):
        s.try_unwrap()
    c.release()
    assert s.try_unwrap().shape == (2,)


def test_a_refused_launch_moves_nothing_and_hands_the_inline_partition_back():
    x = st.zeros((8,))
    with pytest.raises(st.AliasError) as e:
        add(x.view(8), x.view(8), x.view(8).partition((4,)))
    xs, ys, zs = e.value.recovered
    assert zs.unpartition().shape == (8,)           # the inline partition is usable
    assert xs.shape == (8,) and ys.shape == (8,)


def test_a_launch_refused_by_the_type_check_hands_its_arguments_back():
    @st.kernel
    def odd(x: st.In[st.f32], z: st.Out[st.f32], n: st.Const[int]):
        z.store(x.load((0,), (n,)))
    with pytest.raises(st.KernelDefinitionError) as e:
        odd(st.zeros((4,)), st.zeros((4,)).partition((4,)), 3)
    assert e.value.recovered[1].unpartition().shape == (4,)


@st.kernel
def sub_at(j: st.In[st.i32], z: st.Out[st.f32]):
    z.store(sl.zeros(z.shape, st.f32))
    z.partition((2,)).store(sl.full((2,), 1.0, st.f32), (j.load_scalar((0,)),))


def _failing():
    return sub_at(st.from_torch(torch.tensor([9], dtype=torch.int32)),
                  st.empty((4,)).partition((4,)))


def test_a_failed_zip_hands_back_every_value_of_every_op():
    first = add(vec(1, 2), vec(3, 4), st.empty((2,)).partition((2,)))
    later = add(vec(1, 1), vec(1, 1), st.empty((2,)).partition((2,)))
    with pytest.raises(st.OutOfBoundsError) as e:
        st.zip(first, _failing(), later).sync()
    done, failed, never = e.value.recovered
    assert done[2].unpartition().to_torch().tolist() == [4.0, 6.0]
    assert failed[1].unpartition().shape == (4,)
    assert never[2].unpartition().shape == (2,)


def test_a_zip_refused_when_built_hands_back_every_value_it_took():
    first = _op()
    with pytest.raises(st.ExecutionError) as e:
        st.zip(first, "not an op")
    (x, y, z), other = e.value.recovered
    assert other == "not an op"
    assert x.to_torch().tolist() == [1.0, 2.0] and z.unpartition().shape == (2,)


def test_values_moved_into_an_op_by_a_failing_then_callback_come_back():
    def builds_then_fails(x, y, z):
        add(x, y, z)                                # moves x, y, z into an op ...
        raise ValueError("the callback fails")       # ... that will never run

    with pytest.raises(ValueError) as e:
        _op().then(builds_then_fails).sync()
    x, y, z = e.value.recovered
    assert x.shape == (2,) and z.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_a_cancelled_await_raises_once_the_work_is_done_with_the_values():
    seen = {}

    async def waiter(op):
        try:
            await op
        except asyncio.CancelledError as e:
            seen["recovered"] = e.recovered
            raise

    async def main():
        task = asyncio.ensure_future(waiter(_op()))
        await asyncio.sleep(0)                      # the op is submitted
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    x, y, z = seen["recovered"]
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]
    assert x.shape == (2,)


def test_a_cancelled_submit_future_gives_its_output_through_recovered():
    async def main():
        fut = st.submit(_op())
        fut.cancel()
        return await st.recovered(fut)

    x, y, z = asyncio.run(main())
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


def test_a_task_cancelled_after_its_op_completed_still_gets_the_values():
    seen, task = {}, []

    class CancelsOnCompletion(asyncio.SelectorEventLoop):
        # the timing a timeout can hit: the task is cancelled in the loop iteration where
        # its op's work completes, before the task resumes
        def call_soon_threadsafe(self, callback, *args, **kwargs):
            if getattr(callback, "__name__", "") == "_settle_all" and task:
                def settle_then_cancel():
                    callback(*args)
                    task[0].cancel()
                return super().call_soon_threadsafe(settle_then_cancel, **kwargs)
            return super().call_soon_threadsafe(callback, *args, **kwargs)

    async def waiter():
        try:
            await _op()
        except asyncio.CancelledError as e:
            seen["recovered"] = e.recovered
            raise

    async def main():
        task.append(asyncio.ensure_future(waiter()))
        with pytest.raises(asyncio.CancelledError):
            await task[0]
    loop = CancelsOnCompletion()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    x, y, z = seen["recovered"]
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


@st.kernel
def stores_outside(x: st.In[st.f32], z: st.Out[st.f32], at: int):
    z.partition(z.shape).store(sl.load_like(x, z), (at,))  # (at,) past the slab: refused


def test_a_cancelled_await_of_a_failing_op_names_its_error_as_the_cause():
    seen = {}

    async def waiter():
        try:
            await _op().then(lambda x, y, z: stores_outside(x, z, 5))
        except asyncio.CancelledError as e:
            seen["cause"], seen["recovered"] = e.__cause__, e.recovered
            raise

    async def main():
        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(main())
    assert isinstance(seen["cause"], st.OutOfBoundsError)
    assert seen["recovered"] is not None


def test_recovered_may_be_awaited_twice_and_for_a_future_cancelled_too_late():
    async def main():
        fut = st.submit(_op())
        fut.cancel()
        first, second = await aio.recovered(fut), await aio.recovered(fut)
        late = st.submit(_op())
        await asyncio.wait([late])
        assert not late.cancel()                    # it completed: nothing to cancel
        return first, second, await asyncio.wait_for(aio.recovered(late), 5)

    first, second, late = asyncio.run(main())
    assert first is second and late[2].unpartition().to_torch().tolist() == [4.0, 6.0]


def test_submit_refuses_what_is_not_an_op_at_the_call():
    async def main():
        st.submit("not an op")
    with pytest.raises(st.ExecutionError, match="takes a DeviceOp"):
        asyncio.run(main())


def test_a_then_callback_returning_an_op_that_already_ran_hands_back_its_values():
    done = _op()
    done.sync()
    with pytest.raises(st.ExecutionError, match="already run") as e:
        _op().then(lambda x, y, z: done).sync()
    x, y, z = e.value.recovered
    assert z.unpartition().to_torch().tolist() == [4.0, 6.0]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")   # dropped unrun on purpose
@pytest.mark.parametrize("clones", [1, 2])
def test_an_unrun_op_collected_in_a_cycle_with_its_shared_clones_hands_back_the_rest(clones):
    # The collector may finalize the clones (which only the op holds) before the op: the
    # op must still hand back every argument that is not a released clone.
    s, y = vec(1, 2).share(), vec(3, 4)
    z = st.empty((2,)).partition((2,))
    op = add(s.clone(), s.clone() if clones == 2 else y, z)
    cycle = [op]
    cycle.append(cycle)
    del op, cycle
    gc.collect()
    assert y.to_torch().tolist() == [3.0, 4.0]
    assert z.unpartition().shape == (2,)
    assert s.try_unwrap().to_torch().tolist() == [1.0, 2.0]     # the clones are gone


def _fails_in_callback():
    return add(vec(1, 1), vec(1, 1), st.empty((2,)).partition((2,))).then(
        lambda *v: "not an op")


def test_a_failed_zip_hands_back_the_values_of_a_shared_op_that_never_ran():
    x = vec(5, 6)
    never = add(x, vec(1, 1), st.empty((2,)).partition((2,))).shared()
    with pytest.raises(st.ExecutionError) as e:
        st.zip(_fails_in_callback(), never).sync()
    _, (rx, ry, rz) = e.value.recovered
    assert rx is x and x.to_torch().tolist() == [5.0, 6.0]
    assert rz.unpartition().shape == (2,)


def test_a_zip_whose_middle_op_fails_hands_back_the_values_of_every_op():
    first = _op()
    never = _op().shared()
    with pytest.raises(st.ExecutionError) as e:
        st.zip(first, _fails_in_callback(), never).sync()
    done, (fx, fy, fz), (nx, ny, nz) = e.value.recovered
    assert done[2].unpartition().to_torch().tolist() == [4.0, 6.0]
    assert fz.unpartition().to_torch().tolist() == [2.0, 2.0]
    assert nx.to_torch().tolist() == [1.0, 2.0] and nz.unpartition().shape == (2,)


def test_a_shared_op_abandoned_by_a_failed_execution_refuses_its_other_consumers():
    never = _op().shared()
    with pytest.raises(st.ExecutionError):
        st.zip(_fails_in_callback(), never).sync()
    with pytest.raises(st.ExecutionError, match="never ran") as e:
        never.sync()
    x, y, z = e.value.recovered
    assert x.to_torch().tolist() == [1.0, 2.0] and z.unpartition().shape == (2,)


def test_a_failed_record_hands_back_the_values_of_a_shared_op_that_never_ran():
    failing, never = _fails_in_callback(), _op().shared()
    with st.graph_scope() as s:
        with pytest.raises(st.ExecutionError) as e:
            s.record(st.zip(failing, never))
    x, y, z = e.value.recovered[1]
    assert x.to_torch().tolist() == [1.0, 2.0] and z.unpartition().shape == (2,)


def _dropped_in_a_cycle(op) -> None:
    """Leave ``op`` unrun and reachable only through a reference cycle (garbage for the
    collector's next pass)."""
    cycle = [op]
    cycle.append(cycle)


def _collections_at_each_allocation_of_the_next_step():
    """For a spread of allocation counts: a fresh 64-element buffer whose even elements an
    unrun op (dropped in a cycle) writes, and ``arm()``, which makes the collector run that
    many allocations later, inside whatever the caller does next (a launch's borrow check)."""
    threshold = gc.get_threshold()
    try:
        for allocations in range(20, 80, 3):
            gc.collect(0)            # the cycle made next is the youngest garbage there is
            gc.disable()
            buf = st.zeros((64,))
            _dropped_in_a_cycle(add(vec(*[1.0] * 32), vec(*[1.0] * 32),
                                    buf[0::2].partition((32,))))

            def arm(n=allocations):
                gc.set_threshold(gc.get_count()[0] + n)
                gc.enable()
            yield buf, arm
            gc.set_threshold(*threshold)
    finally:
        gc.set_threshold(*threshold)
        gc.enable()


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")     # the dropped op's
@pytest.mark.parametrize("in_flight", [1, 4], ids=["scanned", "indexed"])
def test_a_collection_during_a_borrow_check_cannot_hide_an_in_flight_write(in_flight):
    # The collected op's finalizer hands its borrows back; run inside the check's walk of
    # the held borrows, it must not change them under the walk.
    for buf, arm in _collections_at_each_allocation_of_the_next_step():
        first = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[1::2].partition((32,)))
        others = [add(vec(1.0), vec(1.0), st.zeros((1,)).partition((1,)))
                  for _ in range(in_flight - 1)]
        arm()
        with pytest.raises(st.AliasError):
            add(vec(*[1.0] * 32), vec(*[7.0] * 32), buf[1::2].partition((32,)))
        for op in [first, *others]:
            op.sync()


@pytest.mark.filterwarnings("error::safetile.UnrunOpWarning",
                            "ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_finalizer_that_raises_after_a_borrow_check_leaves_every_borrow_accounted(capsys):
    # With warnings as errors, the collected op's UnrunOpWarning is raised from its
    # finalizer, which the check ran once its walk ended: reported, never raised into the
    # launch, and the launch's own borrows still end with it.
    for buf, arm in _collections_at_each_allocation_of_the_next_step():
        arm()
        _, _, z = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[1::2].partition((32,))).sync()
        assert holds_left() == [] and z.unpartition().to_torch().tolist() == [3.0] * 32
    assert "UnrunOpWarning" in capsys.readouterr().err


@st.kernel
def increment(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


def test_a_shared_value_collected_while_its_graph_is_made_exempts_nothing(monkeypatch):
    # The value's last handle is garbage of a cycle; a collection while the graph reads
    # what its launches touch releases the value's borrow under it.
    from safetile.kernel.kernel_op import KernelOp
    accesses = KernelOp._accesses

    def collecting(self):
        found = accesses(self)
        gc.collect()
        return found
    written, x, y, z = st.zeros((4,)), vec(1, 2, 3, 4), vec(1, 1, 1, 1), st.empty((4,))
    gc.disable()
    try:
        with st.graph_scope() as scope:
            (part,) = scope.record(increment(written.partition((2,))))
            _dropped_in_a_cycle(part.unpartition().share())
            out = scope.record(add(x, y, z.partition((2,))))
            monkeypatch.setattr(KernelOp, "_accesses", collecting)
    finally:
        gc.enable()
    monkeypatch.undo()
    scope.launch().sync()
    assert out[2].unpartition().to_torch().tolist() == [2.0, 3.0, 4.0, 5.0]


@pytest.mark.filterwarnings("error::safetile.UnrunOpWarning")
def test_a_finalizer_failure_with_no_stderr_to_report_on_leaves_the_launch_whole(monkeypatch):
    import io
    import sys
    from safetile.tensor import registry
    overlap, collected = registry._overlap, []

    def collecting(a, b):                 # a collection at an allocation inside the walk
        if not collected:
            collected.append(gc.collect())
        return overlap(a, b)
    gc.disable()
    try:
        buf = st.zeros((64,))
        _dropped_in_a_cycle(add(vec(*[1.0] * 32), vec(*[1.0] * 32),
                                buf[0::2].partition((32,))))
        monkeypatch.setattr(registry, "_overlap", collecting)
        closed = io.StringIO()
        closed.close()
        monkeypatch.setattr(sys, "stderr", closed)
        op = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[1::2].partition((32,)))
    finally:
        gc.enable()
    monkeypatch.undo()
    assert collected and op.sync()[2].unpartition().to_torch().tolist() == [3.0] * 32
    assert active_holds() == []
