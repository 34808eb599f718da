"""An op runs once, and an execution that fails hands every value back at once: combinators
over a shared op, ops abandoned by a failure, errors raised inside `then` callbacks."""
import gc
import threading

import pytest

import safetile as st
import safetile.lang as sl
from safetile.errors import ExecutionError, LaunchError, MovedError
from safetile.tensor import active_holds

import support
from support import add, vec, out


@st.kernel
def inc(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(sl.load_like(x, z) * k)


no_leftover_holds = support.no_leftover_holds()


def _shared_sum():
    return add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).shared()


def test_a_then_over_a_shared_op_runs_once():
    calls = []
    t = _shared_sum().then(lambda x, y, z: calls.append(z) or inc(z))
    (z,) = t.sync()
    with pytest.raises(ExecutionError, match="has already run"):
        t.sync()
    assert len(calls) == 1
    assert z.unpartition().to_torch().tolist() == [3, 4, 5, 6]


def test_a_map_over_a_shared_op_runs_once():
    calls = []
    m = _shared_sum().map(lambda *v: calls.append(v) or len(v))
    assert m.sync() == 3
    with pytest.raises(ExecutionError, match="has already run"):
        m.sync()
    assert len(calls) == 1


def test_a_zip_over_a_shared_op_runs_once():
    z = st.zip(_shared_sum())
    z.sync()
    with pytest.raises(ExecutionError, match="has already run"):
        z.sync()


def test_an_inner_link_of_a_then_chain_over_a_shared_op_runs_once():
    calls = []
    first = _shared_sum().then(lambda x, y, z: calls.append(1) or inc(z))
    second = first.then(lambda z: inc(z))
    second.sync()
    with pytest.raises(ExecutionError, match="has already run"):
        first.sync()
    assert calls == [1]


def test_an_op_abandoned_by_a_failed_execution_says_it_never_ran():
    b = inc(st.zeros((4,)).partition((2,)))
    with pytest.raises(ExecutionError) as info:
        st.zip(add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(lambda *v: 42), b).sync()
    (p,) = info.value.recovered[1]
    with pytest.raises(ExecutionError, match="never ran.*build the op again"):
        b.sync()
    with pytest.raises(ExecutionError, match="never ran"):
        b.graph()
    assert p.unpartition().to_torch().tolist() == [0, 0, 0, 0]


def test_a_launch_refused_inside_a_then_callback_recovers_the_callbacks_values_and_its_own():
    def callback(x, y, z):
        wrong = st.zeros((4,), dtype=st.i32).partition((2,))
        return st.zip(scale(x, wrong, 2.0), inc(z))

    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    with pytest.raises(LaunchError, match="dtype") as info:
        add(x, y, out()).then(callback).sync()
    (rx, ry, z), (lx, wrong, k) = info.value.recovered
    assert rx is x and ry is y and lx is x and k == 2.0
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]
    assert wrong.unpartition().dtype == st.i32


def test_a_value_a_then_callback_moved_into_a_handle_of_its_own_is_recovered():
    def callback(x, y, z):
        return scale(x, z.unpartition().partition((4,)), "not a float")

    with pytest.raises(LaunchError) as info:
        add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(callback).sync()
    _, (_, mine, _) = info.value.recovered
    assert mine.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_an_error_raised_inside_a_map_callback_recovers_the_values_the_callback_was_given():
    def callback(x, y, z):
        raise ValueError("bad value")

    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    with pytest.raises(ValueError) as info:
        add(x, y, out()).map(callback).sync()
    rx, ry, z = info.value.recovered
    assert rx is x and ry is y and z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_map_refused_while_its_shared_op_is_in_flight_elsewhere_runs_once_that_ends():
    shared = _shared_sum()
    inside, go = threading.Event(), threading.Event()

    def slow(x, y, z):
        inside.set()
        go.wait(5)
        return inc(z)

    other = threading.Thread(target=lambda: shared.then(slow).sync())
    other.start()
    inside.wait(5)
    m = shared.map(lambda x, y, z: z.unpartition().to_torch().tolist())
    with pytest.raises(ExecutionError, match="another thread"):
        m.sync()
    go.set()
    other.join()
    assert m.sync() == [3, 4, 5, 6]


def test_an_op_a_callback_built_but_that_never_ran_is_abandoned_when_the_chain_fails():
    kept = st.zeros((4,)).partition((2,))

    def callback(x, y, z):
        later = inc(kept)                       # reachable only from the closure below
        failing = scale(x, out(), 2.0).then(lambda *v: 1 / 0)
        return failing.then(lambda *v: later)

    with pytest.raises(ZeroDivisionError):
        add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(callback).sync()
    assert active_holds() == []                 # while the error (and the closure) lives
    assert kept.unpartition().to_torch().tolist() == [0, 0, 0, 0]


def test_an_op_built_in_a_then_callback_and_moved_in_stays_moved_when_the_chain_succeeds():
    kept = st.zeros((4,)).partition((2,))
    stash = []

    def callback(x, y, z):
        stash.append(inc(kept))                 # to run later, outside this chain
        return inc(z)

    add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(callback).sync()
    with pytest.raises(MovedError):
        kept.unpartition()
    (p,) = stash.pop().sync()
    gc.collect()
    assert p.unpartition().to_torch().tolist() == [1, 1, 1, 1]


def test_an_interrupt_as_a_chain_abandons_what_its_callback_built_still_hands_it_back():
    from interrupts import interrupted
    from safetile.kernel.kernel_op import KernelOp
    kept = st.zeros((4,)).partition((2,))

    def callback(x, y, z):
        later = inc(kept)
        return scale(x, out(), 2.0).then(lambda *v: 1 / 0).then(lambda *v: later)

    e = interrupted(lambda: add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(callback).sync(),
                    KernelOp._release.__code__)
    assert isinstance(e, KeyboardInterrupt)
    del e
    gc.collect()
    assert kept.unpartition().to_torch().tolist() == [0, 0, 0, 0]
