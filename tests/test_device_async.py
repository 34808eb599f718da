"""sync and await on the CPU executor: await runs off the loop thread; errors come back."""
import asyncio
import gc
import time

import pytest
import torch

import safetile as st
import safetile.lang as sl
from safetile.errors import ArgumentError, ExecutionError, OutOfBoundsError

import support
from support import add, vec, out


@st.kernel
def spin(x: st.In[st.f32], z: st.Out[st.f32], n: int):
    acc = sl.load_like(x, z)
    for i in range(n):
        acc = acc * 0.5 + 1.0
    z.store(acc)


@st.kernel(unsafe=True, grid=(1,))
def poke(p: st.Ptr[st.f32], at: int):
    sl.store_ptr(p, sl.arange(4) + at, sl.zeros((4,), st.f32))


no_leftover_holds = support.no_leftover_holds()


def test_await_returns_the_recovered_values():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)

    async def main():
        return await add(x, y, out())

    rx, ry, z = asyncio.run(main())
    assert rx is x and ry is y
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_await_does_not_block_the_event_loop():
    ticks = []

    async def ticker(stop):
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.002)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        values = await spin(st.ones((64,)), st.empty((64,)).partition((1,)), 400)
        elapsed = time.perf_counter() - t0
        stop.set()
        await task
        return values, elapsed, t0

    (_, z, _), elapsed, t0 = asyncio.run(main())
    during = [t for t in ticks if t0 < t < t0 + elapsed]
    assert elapsed > 0.05                       # the kernel is long enough to matter
    assert len(during) >= 5, f"only {len(during)} ticks during {elapsed:.3f} s"
    assert torch.allclose(z.unpartition().to_torch(), torch.full((64,), 2.0), atol=1e-3)


def test_many_ops_awaited_concurrently_all_complete():
    async def one(i):
        _, _, z = await add(vec(i, i, i, i), vec(1, 1, 1, 1), out())
        return z.unpartition().to_torch()[0].item()

    async def main():
        return await asyncio.gather(*(one(i) for i in range(20)))

    assert asyncio.run(main()) == [i + 1 for i in range(20)]


def test_an_error_inside_an_awaited_op_reaches_the_awaiter_with_the_values_recovered():
    t = st.zeros((4,))
    with st.unsafe():
        op = poke(t, 10)

    async def main():
        await op

    with pytest.raises(OutOfBoundsError, match="outside 'p'") as info:
        asyncio.run(main())
    assert info.value.recovered == (t, 10)
    assert t.to_torch().tolist() == [0, 0, 0, 0]          # ownership restored


def test_an_error_inside_a_synced_op_restores_ownership():
    t = st.zeros((4,))
    with st.unsafe():
        op = poke(t, 10)
    with pytest.raises(OutOfBoundsError):
        op.sync()
    t.partition((2,))                                     # live again: can be moved


def test_an_error_in_a_then_chain_hands_back_the_earlier_values_too():
    x, y, z = vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()
    t = st.zeros((4,))

    def bad(x, y, z):
        with st.unsafe():
            return poke(t, 10)

    with pytest.raises(OutOfBoundsError):
        add(x, y, z).then(bad).sync()
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]
    assert t.to_torch().tolist() == [0, 0, 0, 0]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")  # the refused op
def test_execution_inside_a_then_callback_raises_under_await_too():
    other = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out())

    async def main():
        await add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out()).then(lambda *v: other.sync())

    with pytest.raises(ExecutionError, match="`then` callback"):
        asyncio.run(main())


def test_sync_accepts_an_explicit_stream_argument():
    # Without CUDA there are no streams: stream=None is the default policy.
    _, _, z = add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), out()).sync(stream=None)
    assert z.unpartition().to_torch().tolist() == [3, 3, 3, 3]


@pytest.mark.parametrize("stream", [3, "default", object()], ids=["int", "str", "object"])
def test_sync_refuses_a_stream_that_is_not_a_cuda_stream_and_leaves_the_op_runnable(stream):
    op = add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), out())
    with pytest.raises(st.ArgumentError, match="torch.cuda.Stream"):
        op.sync(stream=stream)
    _, _, z = op.sync()
    assert z.unpartition().to_torch().tolist() == [3, 3, 3, 3]


def test_sync_refuses_a_subclass_of_a_cuda_stream_whose_wait_could_end_early():
    """A subclass's synchronize() (or cuda_stream) is its own: one that waits for nothing
    would end the borrows, and hand the values back, while the work still runs."""
    import torch

    class NoWait(torch.cuda.Stream):
        def synchronize(self):
            pass
    op = add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), out())
    with pytest.raises(st.ArgumentError, match="a subclass of torch.cuda.Stream"):
        op.sync(stream=object.__new__(NoWait))          # (no CUDA here to construct one)
    _, _, z = op.sync()
    assert z.unpartition().to_torch().tolist() == [3, 3, 3, 3]


def test_submit_refuses_a_stream_that_is_not_a_cuda_stream_before_starting_the_op():
    op = add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), out())

    async def main():
        with pytest.raises(st.ArgumentError, match="torch.cuda.Stream"):
            st.submit(op, stream=3)
        return await op

    _, _, z = asyncio.run(main())
    assert z.unpartition().to_torch().tolist() == [3, 3, 3, 3]


def test_submit_returns_an_asyncio_future_that_gather_waits_on_directly():
    async def main():
        futs = [st.submit(add(vec(i, i, i, i), vec(1, 1, 1, 1), out())) for i in range(8)]
        assert all(asyncio.isfuture(f) for f in futs)
        return await asyncio.gather(*futs)

    results = asyncio.run(main())
    assert [z.unpartition().to_torch().tolist()[0] for _, _, z in results] == \
        [i + 1 for i in range(8)]


def test_submit_needs_a_running_loop_and_moves_nothing_without_one():
    x = vec(1, 2, 3, 4)
    op = add(x, vec(1, 1, 1, 1), out())
    with pytest.raises(st.ExecutionError, match="running event loop"):
        st.submit(op)
    rx, _, _ = op.sync()              # the op was not consumed: it still runs once
    assert rx is x


def test_an_awaited_op_keeps_the_backend_and_unsafe_marking_of_the_awaiting_code():
    buf = st.ones((8,))
    seeds = []

    def then_poke(x, y, z):
        from safetile import backends
        seeds.append(backends.current().seed)
        return poke(buf, 0)                         # unsafe: needs the caller's st.unsafe()

    async def main():
        with st.unsafe(), st.backend("interpret", seed=7):
            return await add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(then_poke)

    p, at = asyncio.run(main())
    assert seeds == [7] and at == 0
    assert p.to_torch().tolist() == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.filterwarnings("ignore::safetile.BlockingSyncWarning")   # sync in a coroutine
@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")        # the refused op
def test_submit_inside_a_then_callback_raises_and_starts_nothing():
    other_x = vec(5, 5, 5, 5)
    other = add(other_x, vec(1, 1, 1, 1), out())
    x, z = vec(1, 2, 3, 4), out()

    def submit_there(x, y, z):
        st.submit(other)
        return add(x, y, z)

    async def main():
        add(x, vec(1, 1, 1, 1), z).then(submit_there).sync()

    with pytest.raises(ExecutionError, match="cannot start execution.*inside a running `then`"):
        asyncio.run(main())
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]     # handed back
    assert other.values[0] is other_x and not other._consumed      # never started
    other.sync()


def test_submit_inside_a_then_callback_of_an_awaited_op_names_the_re_entrancy():
    other = add(vec(5, 5, 5, 5), vec(1, 1, 1, 1), out())

    def submit_there(x, y, z):
        st.submit(other)
        return add(x, y, z)

    async def main():
        return await add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(submit_there)
    with pytest.raises(ExecutionError, match="cannot start execution.*inside a running `then`"):
        asyncio.run(main())
    other.sync()


def test_a_shared_op_awaited_by_two_tasks_runs_once_and_reaches_both():
    # As on the GPU, where both run on the loop thread's stream in order: the second
    # consumer's execution starts once the first's has finished.
    s = spin(st.ones((64,)), st.empty((64,)).partition((1,)), 40).shared()
    longer = s.then(lambda x, z, n: spin(x, st.empty((64,)).partition((1,)), 40))

    async def main():
        return await asyncio.gather(longer.map(lambda x, z, n: "first"), s.last())

    first, n = asyncio.run(main())
    assert first == "first" and n == 40


# ---- a graph scope belongs to the task that opened it ----------------------------------------

def scope_open_across_an_await(other):
    """Run ``other()`` in another task while a task keeps a graph scope (which records a
    write of ``x``) open across an await; returns ``(graph, x, what other returned)``."""
    x = st.zeros((4,))

    async def recorder(ready, done):
        with st.graph_scope() as s:
            s.record(add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), x.view((4,)).partition((2,))))
            ready.set()
            await done.wait()
        return s.graph

    async def bystander(ready, done):
        await ready.wait()
        try:
            return await other(x)
        finally:
            done.set()

    async def main():
        ready, done = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(recorder(ready, done), bystander(ready, done))

    graph, result = asyncio.run(main())
    return graph, x, result


def test_another_task_may_allocate_while_a_scope_is_open_across_an_await():
    async def allocate(x):
        return st.zeros((2,)).shape
    assert scope_open_across_an_await(allocate)[2] == (2,)


def test_another_task_may_await_ops_while_a_scope_is_open_across_an_await():
    async def run(x):
        _, _, z = await add(vec(1, 2), vec(1, 1), st.empty((2,)).partition((1,)))
        return z.unpartition().to_torch().tolist()
    assert scope_open_across_an_await(run)[2] == [2, 3]


def test_a_value_another_task_shares_meanwhile_is_not_the_graphs_own():
    async def share(x):
        return x.view((4,)).share()
    graph, x, shared = scope_open_across_an_await(share)
    with pytest.raises(st.AliasError, match="shared value"):
        graph.launch().sync()
    assert shared.to_torch().tolist() == [0, 0, 0, 0]


def test_a_task_started_inside_a_scope_is_not_part_of_it():
    x = st.zeros((4,))

    async def bystander():
        await asyncio.sleep(0)
        return st.zeros((2,)).shape, x.view((4,)).share()

    async def main():
        with st.graph_scope() as s:
            s.record(add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), x.view((4,)).partition((2,))))
            result = await asyncio.create_task(bystander())
        return s.graph, result

    graph, (shape, shared) = asyncio.run(main())
    assert shape == (2,)
    with pytest.raises(st.AliasError, match="shared value"):
        graph.launch().sync()


def test_a_record_made_by_another_task_still_refuses_allocation():
    x = st.zeros((4,))
    op = add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), x.partition((2,))).then(
        lambda *_: add(vec(1, 1, 1, 1), vec(2, 2, 2, 2), st.empty((4,)).partition((2,))))

    async def main():
        with st.graph_scope() as s:
            async def record():
                s.record(op)
            with pytest.raises(st.GraphCaptureError, match="allocates inside"):
                await asyncio.create_task(record())
        return s.graph

    assert asyncio.run(main()).records == ()


def test_await_inside_a_graph_scope_is_refused_naming_await():
    op = add(vec(1, 2), vec(1, 1), out(2))

    async def main():
        with st.graph_scope():
            with pytest.raises(st.GraphCaptureError, match="^await op inside st.graph_scope"):
                await op
    asyncio.run(main())
    _, _, z = op.sync()                       # refused before it started: it still runs
    assert z.unpartition().to_torch().tolist() == [2, 3]


def test_submit_without_a_running_loop_raises_and_names_the_ops_values():
    x, z = vec(1, 2, 3, 4), out()
    op = add(x, vec(1, 1, 1, 1), z)
    with pytest.raises(ExecutionError, match="needs a running event loop") as e:
        st.submit(op)
    assert e.value.recovered[0] is x and e.value.recovered[2] is z
    _, _, z = op.sync()                       # the op did not start: it still runs
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_cancelled_await_of_a_failing_op_lets_go_of_its_values_once_the_task_is_gone():
    # The error's traceback reaches the frames that delivered it: the outcome kept for a
    # cancelled future must not keep that future (and so itself and the values) alive.
    def fail(*values):
        raise ValueError("in the callback")

    async def main():
        x = st.ones((4,)).share()

        async def awaiter(op):
            return await op

        task = asyncio.create_task(awaiter(add(x.clone(), vec(1, 1, 1, 1), out()).map(fail)))
        await asyncio.sleep(0)                # the task has submitted the op
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        assert type(info.value.__cause__) is ValueError
        del task, info
        # The worker thread that ran the op lets go of its frames once it is joined.
        await asyncio.get_running_loop().shutdown_default_executor()
        gc.collect()
        return x.try_unwrap()                 # no clone is left alive

    assert asyncio.run(main()).to_torch().tolist() == [1, 1, 1, 1]


def test_an_await_refused_by_a_shut_down_executor_names_the_ops_values_and_leaves_it_runnable():
    x, z = vec(1, 2, 3, 4), out()
    op = add(x, vec(1, 1, 1, 1), z)

    async def main():
        await asyncio.get_running_loop().shutdown_default_executor()
        with pytest.raises(RuntimeError, match="shutdown") as e:
            await op
        return e.value

    error = asyncio.run(main())
    assert error.recovered[0] is x and error.recovered[2] is z
    _, _, z = op.sync()                       # the op did not start: it still runs
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("what", ["op", "task"])
def test_recovered_of_anything_but_a_submitted_future_says_what_to_pass(what):
    async def main():
        op = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out())
        fut = op if what == "op" else asyncio.ensure_future(op)
        try:
            with pytest.raises(ArgumentError, match=r"made by st\.submit\(op\)"):
                await st.recovered(fut)
        finally:
            await fut

    asyncio.run(main())
