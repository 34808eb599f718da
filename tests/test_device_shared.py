"""Shared ops (``op.shared()``) on the CPU executor: one run, however many consumers, and
consumers on other threads."""
import threading

import pytest

import safetile as st
import safetile.lang as sl
from safetile.errors import ExecutionError

import support
from support import add, vec, out


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(sl.load_like(x, z) * k)


no_leftover_holds = support.no_leftover_holds()


def test_shared_runs_once_however_many_consumers():
    runs = []

    def count(*values):
        runs.append(1)
        return values

    s = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).map(count).shared()
    left, right = st.zip(s.map(lambda x, y, z: z), s.map(lambda x, y, z: x)).sync()
    assert len(runs) == 1
    assert left.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_shared_consumers_can_run_in_separate_executions():
    runs = []
    s = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).map(
        lambda *v: runs.append(1) or v).shared()
    z1 = s.last().sync()
    z2 = s.last().sync()
    assert z1 is z2 and len(runs) == 1


def test_a_shared_op_consumed_by_its_own_callback_raises_instead_of_waiting_for_itself():
    ref = []
    so = scale(vec(1, 2, 3, 4), out(), 1.0).then(lambda x, z, k: ref[0]).shared()
    ref.append(so)
    with pytest.raises(ExecutionError, match="consumed by its own run"):
        so.sync()


@pytest.mark.parametrize("consumer", ["itself", "then"])
def test_a_shared_op_is_refused_to_another_thread_until_the_execution_that_ran_it_finishes(
        consumer):
    inside, release, errors = threading.Event(), threading.Event(), []
    s = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).shared()
    # `then` hands the values on to a later launch of the same, unfinished execution
    first = s if consumer == "itself" else s.then(
        lambda x, y, z: add(x, y, out()).map(lambda *v: (x, y, z)))

    class Pausing(st.DeviceOp):                  # work after the shared op, same execution
        def _run(self, ctx):
            self._take()
            inside.set()
            release.wait(5)
            return ()
    worker = threading.Thread(target=lambda: st.zip(first, Pausing()).sync())
    worker.start()
    assert inside.wait(5)
    try:
        s.last().sync()
    except ExecutionError as e:
        errors.append(str(e))
    release.set()
    worker.join()
    assert len(errors) == 1 and "has not finished" in errors[0]
    z = s.last().sync()                          # once it finished, its values are back
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_shared_op_running_on_another_thread_refuses_a_consumer_at_once_instead_of_waiting():
    # The run's own callback waits for the other thread: a consumer that waited for the run
    # to end would never end (nor would the run).
    seen, ref = {}, []

    def consume_elsewhere_and_wait(x, y, z):
        def consume():
            try:
                ref[0].last().sync()
            except ExecutionError as e:
                seen["error"] = str(e)
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        t.join(5)
        seen["waited"] = t.is_alive()
        return add(x, y, z)

    s = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(consume_elsewhere_and_wait).shared()
    ref.append(s)
    _, _, z = s.sync()
    assert seen["waited"] is False
    assert "is running in an execution of another thread" in seen["error"]
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]
