"""DeviceOp combinators on the CPU executor: then, map, st.zip, first, last (shared ops:
test_device_shared.py)."""
import gc

import pytest

import safetile as st
import safetile.lang as sl
from safetile.errors import ExecutionError, MovedError
from safetile.tensor import active_holds

import support
from support import add, vec, out


@st.kernel
def scale(x: st.In[st.f32], z: st.Out[st.f32], k: float):
    z.store(sl.load_like(x, z) * k)


no_leftover_holds = support.no_leftover_holds()


def test_sync_returns_every_argument_in_parameter_order_scalars_included():
    x, z = vec(1, 2, 3, 4), out()
    rx, rz, rk = scale(x, z, 3.0).sync()
    assert rx is x and rz is z and rk == 3.0
    assert rz.unpartition().to_torch().tolist() == [3, 6, 9, 12]


def test_building_an_op_runs_nothing_until_it_is_synced():
    calls = []
    op = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out()).map(lambda *v: calls.append(v) or v)
    assert isinstance(op, st.DeviceOp) and calls == []
    _, _, z = op.sync()
    assert len(calls) == 1
    assert z.unpartition().to_torch().tolist() == [2, 2, 2, 2]


def test_then_passes_the_values_positionally_and_returns_the_next_ops_output():
    seen = []

    def next_op(x, y, z):
        seen.append((x, y, z))
        return scale(z.unpartition(), out(), 10.0)

    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    op = add(x, y, out()).then(next_op)
    s, r, k = op.sync()
    assert seen[0][0] is x and seen[0][1] is y
    assert r.unpartition().to_torch().tolist() == [20, 30, 40, 50]
    assert k == 10.0


def test_then_hands_values_back_before_the_callback_runs():
    def check_live(x, y, z):
        assert x.shape == (4,)          # a moved handle would raise MovedError here
        return add(x, y, z.unpartition().partition((2,)))

    x, y, z = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(check_live).sync()
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_then_callbacks_chain_in_order():
    x = vec(1, 1, 1, 1)
    op = scale(x, out(), 2.0)
    for _ in range(3):
        op = op.then(lambda x, z, k: scale(z.unpartition(), out(), 2.0))
    _, z, _ = op.sync()
    assert z.unpartition().to_torch().tolist() == [16, 16, 16, 16]


def test_then_callback_must_return_an_op_and_the_values_are_recovered():
    x, y, z = vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()
    with pytest.raises(ExecutionError, match="DeviceOp") as info:
        add(x, y, z).then(lambda x, y, z: 42).sync()
    assert info.value.recovered == (x, y, z)
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_map_is_a_host_transform_of_the_values():
    total = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).map(
        lambda x, y, z: float(z.unpartition().to_torch().sum())).sync()
    assert total == 14.0


def test_first_and_last_select_an_output_value():
    x = vec(1, 2, 3, 4)
    assert add(x, vec(0, 0, 0, 0), out()).first().sync() is x
    z = scale(vec(1, 2, 3, 4), out(), 1.0).map(lambda x, z, k: (z, k)).last().sync()
    assert z == 1.0


def test_first_and_last_of_an_empty_output_are_argument_errors():
    with pytest.raises(st.ArgumentError, match=r"op.first\(\) of an op whose output is empty"):
        st.zip().first().sync()
    with pytest.raises(st.ArgumentError, match=r"op.last\(\)"):
        scale(vec(1, 2, 3, 4), out(), 2.0).map(lambda *v: ()).last().sync()


def test_a_map_callback_returning_an_op_is_refused_and_the_values_come_back():
    z = out()
    with pytest.raises(st.ArgumentError, match="use op.then") as e:
        scale(vec(1, 2, 3, 4), z, 2.0).map(lambda x, p, k: scale(x, p, k)).sync()
    rx, rz, rk = e.value.recovered
    assert rz is z and rz.unpartition().to_torch().tolist() == [2, 4, 6, 8]


def test_zip_output_is_the_tuple_of_each_ops_output():
    a = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out())
    b = scale(vec(1, 2, 3, 4), out(), 2.0).last()
    (ax, ay, az), bk = st.zip(a, b).sync()
    assert az.unpartition().to_torch().tolist() == [2, 2, 2, 2]
    assert bk == 2.0


def test_zip_rejects_non_ops():
    with pytest.raises(ExecutionError, match="st.zip argument 1"):
        st.zip(add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out()), 3)


def test_an_op_runs_only_once():
    op = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out())
    op.sync()
    with pytest.raises(ExecutionError, match="already run"):
        op.sync()


def test_moved_arguments_are_unusable_until_the_op_hands_them_back():
    x = vec(1, 2, 3, 4)
    op = add(x, vec(1, 1, 1, 1), out())
    with pytest.raises(MovedError, match="kernel 'add'"):
        x.to_torch()
    op.sync()
    assert x.to_torch().tolist() == [1, 2, 3, 4]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")  # the refused op
def test_starting_execution_inside_a_then_callback_raises_and_nothing_is_lost():
    inner_x = vec(5, 5, 5, 5)
    inner = scale(inner_x, out(), 1.0)
    x, y, z = vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()
    with pytest.raises(ExecutionError, match="`then` callback"):
        add(x, y, z).then(lambda *v: inner.sync()).sync()
    assert x.to_torch().tolist() == [1, 2, 3, 4]          # handed back
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")  # the refused op
def test_starting_execution_inside_a_map_callback_raises():
    other = scale(vec(1, 1, 1, 1), out(), 1.0)
    with pytest.raises(ExecutionError, match="`map` callback"):
        add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out()).map(lambda *v: other.sync()).sync()


def test_a_failed_zip_hands_back_the_arguments_of_ops_that_never_ran():
    later_x = vec(7, 7, 7, 7)
    later = scale(later_x, out(), 1.0)
    failing = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out()).then(lambda *v: None)
    with pytest.raises(ExecutionError):
        st.zip(failing, later).sync()
    assert later_x.to_torch().tolist() == [7, 7, 7, 7]


def test_then_map_need_callables():
    op = add(vec(1, 1, 1, 1), vec(1, 1, 1, 1), out())
    with pytest.raises(TypeError):
        op.then(3)
    with pytest.raises(TypeError):
        op.map(None)
    op.sync()


def test_a_chain_of_thousands_of_thens_runs_without_exhausting_the_stack():
    chain = scale(vec(1, 1, 1, 1), out(), 1.0)
    for _ in range(1500):           # deeper than Python's recursion limit
        chain = chain.then(lambda x, z, k: scale(x, z, k))
    _, z, _ = chain.sync()
    assert z.unpartition().to_torch().tolist() == [1, 1, 1, 1]


def test_a_chain_of_thousands_of_thens_and_maps_runs_and_prints_without_exhausting_the_stack():
    chain = scale(vec(1, 1, 1, 1), out(), 1.0)
    for _ in range(1500):           # each link pair deeper than Python's recursion limit
        chain = chain.then(lambda x, z, k: scale(x, z, k)).map(lambda *v: v)
    assert "links" in repr(chain)
    _, z, _ = chain.sync()
    assert z.unpartition().to_torch().tolist() == [1, 1, 1, 1]


def test_a_long_chain_of_maps_that_fails_at_its_end_hands_the_values_back():
    chain = scale(vec(1, 2, 3, 4), out(), 1.0)
    for _ in range(3000):
        chain = chain.map(lambda *v: v)
    with pytest.raises(ZeroDivisionError) as e:
        chain.map(lambda *v: 1 / 0).sync()
    x, z, _ = e.value.recovered
    assert x.to_torch().tolist() == [1, 2, 3, 4] and z.unpartition().shape == (4,)


def test_an_op_dropped_without_running_hands_its_arguments_back():
    x = vec(1, 2, 3, 4)
    op = add(x, vec(1, 1, 1, 1), out())
    with pytest.warns(st.UnrunOpWarning):
        del op
        gc.collect()
    assert x.to_torch().tolist() == [1, 2, 3, 4]
    assert active_holds() == []


def test_borrows_outlive_the_early_hand_back_until_the_execution_finishes():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    seen = {}

    def after(x, y, z):
        seen["holders"] = [h for h, *_ in active_holds()]
        t = z.unpartition()
        seen["read"] = t.to_torch().tolist()                    # same execution: allowed
        return add(x, y, t.partition((2,)))                     # same storage, same execution

    add(x, y, out()).then(after).sync()
    assert any("add" in h for h in seen["holders"])
    assert seen["read"] == [2, 3, 4, 5]
    assert active_holds() == []


def test_another_thread_cannot_write_storage_an_unfinished_execution_still_borrows():
    import threading
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    errors = []

    def after(x, y, z):
        t = z.unpartition()
        def other_thread():
            try:
                add(x, y, t.view(4).partition((2,))).sync()
            except Exception as e:               # AliasError: the first add is not finished
                errors.append(e)
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
        return add(x, y, t.partition((2,)))

    add(x, y, out()).then(after).sync()
    assert len(errors) == 1 and type(errors[0]).__name__ == "AliasError"


def test_a_long_chain_on_the_same_buffers_keeps_one_borrow_per_buffer():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    counts = []

    def again(x, y, z):
        counts.append(len(active_holds()))
        return add(x, y, z)

    op = add(x, y, out())
    for _ in range(20):
        op = op.then(again)
    op.sync()
    assert counts[-1] == counts[0] == 3          # x, y and z, held once for the execution
    assert active_holds() == []


def test_a_new_buffer_in_a_chain_is_borrowed_until_the_execution_finishes():
    x, y = vec(1, 2, 3, 4), vec(1, 1, 1, 1)
    seen = []

    def into_new(x, y, z):
        return add(x, y, out())                  # z2: bytes the execution did not hold yet

    def look(x, y, z2):
        seen.append(sorted(name for _, name, _, _ in active_holds()))
        return add(x, y, z2.unpartition().partition((2,)))

    add(x, y, out()).then(into_new).then(look).sync()
    assert seen[0].count("z") == 2               # the first z and the new one, both held


def test_another_thread_meets_the_borrow_of_a_strided_view_after_its_op_was_collected():
    # The op writing every other element of `base` is handed back, dropped and collected
    # two callbacks later; its borrow lasts until the execution finishes all the same.
    import threading
    base = st.zeros((8,))
    errors = []

    def write_strided(x, y, z):
        return add(x, y, base.slice(0, 0, 8, 2).partition((2,)))

    def drop_it(x, y, strided):
        return add(x, y, out())

    def read_elsewhere(x, y, z):
        def other_thread():
            try:
                base.to_torch()
            except Exception as e:
                errors.append(e)
        gc.collect()
        th = threading.Thread(target=other_thread)
        th.start()
        th.join()
        return add(x, y, z)

    add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(write_strided).then(drop_it).then(
        read_elsewhere).sync()
    assert [type(e).__name__ for e in errors] == ["BorrowError"]
    assert "kernel 'add'" in str(errors[0])
    assert base.to_torch().tolist() == [2, 0, 3, 0, 4, 0, 5, 0]


class _NoSignature:
    """A callable whose signature inspect cannot read (it raises TypeError)."""
    __signature__ = "unreadable"

    def __call__(self, *values):
        raise TypeError("raised inside the callback")


@pytest.mark.parametrize("kind", ["then", "map"])
def test_a_callback_without_a_readable_signature_raises_its_own_error_with_the_values(kind):
    x = vec(1, 2, 3, 4)
    op = add(x, vec(1, 1, 1, 1), out())
    with pytest.raises(TypeError, match="raised inside the callback") as e:
        getattr(op, kind)(_NoSignature()).sync()
    rx, _, rz = e.value.recovered
    assert rx is x and rz.unpartition().to_torch().tolist() == [2, 3, 4, 5]


@pytest.mark.filterwarnings("ignore::safetile.UnrunOpWarning")  # the refused op
def test_an_async_then_callback_is_named_as_one_and_the_values_come_back():
    import warnings

    async def next_op(x, y, z):
        return add(x, y, z)

    x = vec(1, 2, 3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ExecutionError, match="coroutine function.*plain def") as e:
            add(x, vec(1, 1, 1, 1), out()).then(next_op).sync()
        gc.collect()
    assert e.value.recovered[0] is x
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_an_async_map_callback_is_refused_when_the_map_is_built_and_the_op_can_still_run():
    async def total(x, y, z):
        return z

    x = vec(1, 2, 3, 4)
    op = add(x, vec(1, 1, 1, 1), out())
    with pytest.raises(ExecutionError, match="`map` callback total is a coroutine function.*"
                                             "plain def that returns its value") as e:
        op.map(total)
    assert e.value.recovered[0] is x
    _, _, z = op.sync()
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_partial_of_an_async_def_is_refused_when_the_then_is_built():
    import functools

    async def next_op(k, x, y, z):
        return add(x, y, z)

    op = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out())
    with pytest.raises(ExecutionError, match="coroutine function"):
        op.then(functools.partial(next_op, 1))
    _, _, z = op.sync()
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_a_kernel_passes_as_a_then_callback():
    x, y, z = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).then(add).sync()
    assert z.unpartition().to_torch().tolist() == [2, 3, 4, 5]


def test_an_async_then_callback_is_refused_when_the_then_is_built():
    async def next_op(x, y, z):
        return add(x, y, z)

    op = add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out())
    with pytest.raises(ExecutionError, match="`then` callback next_op is a coroutine function"):
        op.then(next_op)
    op.sync()


def test_a_map_callback_returning_a_coroutine_is_refused_and_the_values_come_back():
    import warnings

    async def later(*values):
        return values

    x = vec(1, 2, 3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ExecutionError, match="`map` callback <lambda> returned an "
                                                 "awaitable \\(coroutine\\)") as e:
            add(x, vec(1, 1, 1, 1), out()).map(lambda *v: later(*v)).sync()
        gc.collect()
    rx, _, rz = e.value.recovered
    assert rx is x and rz.unpartition().to_torch().tolist() == [2, 3, 4, 5]
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_a_map_callback_may_return_a_future_as_its_value():
    import asyncio
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
        assert add(vec(1, 2, 3, 4), vec(1, 1, 1, 1), out()).map(lambda *v: future).sync() \
            is future
    finally:
        loop.close()
