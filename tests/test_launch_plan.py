"""Launch plans (kernel/plan.py) and the borrow index: a cached result is reused only while it
provably applies, and every per-launch check still runs on the fast path."""
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import safetile as st
import safetile.lang as sl
from safetile import backends
from safetile.tensor import active_holds, borrows


@st.kernel
def add(x: st.In[st.f32], y: st.In[st.f32], z: st.Out[st.f32]):
    z.store(sl.load_like(x, z) + sl.load_like(y, z))


@st.kernel
def axpy(x: st.In[st.f32], z: st.Out[st.f32], a: float):
    z.store(sl.load_like(x, z) * a)


@pytest.fixture(autouse=True)
def _no_leaks():
    yield
    assert active_holds() == [], "a test leaked a borrow hold"


def _cached(kernel, *args):
    return kernel._launches.plan(args, backends.current())


def test_a_repeat_launch_reuses_the_plan_and_other_handles_do_not():
    x, y, z = st.ones((8,)), st.ones((8,)), st.empty((8,)).partition((4,))
    x, y, z = add(x, y, z).sync()
    assert _cached(add, x, y, z) is not None
    assert _cached(add, y, x, z) is None                       # positions matter
    assert _cached(add, x, st.ones((8,)), z) is None


def test_repartitioning_with_another_tile_shape_never_reuses_a_stale_plan():
    x, y = st.arange(10, dtype=st.f32), st.ones((10,))
    z = st.full((10,), -1.0).partition((8,))
    x, y, z = add(x, y, z).sync()
    x, y, z = add(x, y, z).sync()                              # the cached plan: grid (2,)
    z = z.unpartition().partition((2,))                        # same tensor, new Partition
    assert _cached(add, x, y, z) is None
    op = add(x, y, z)
    assert op.grid == (5,)
    x, y, z = op.sync()
    assert torch.equal(z.unpartition().to_torch(), torch.arange(10.0) + 1)


def test_a_moved_handle_still_raises_on_the_fast_path():
    x, y, z = st.ones((8,)), st.ones((8,)), st.empty((8,)).partition((4,))
    x, y, z = add(x, y, z).sync()
    assert _cached(add, x, y, z) is not None
    in_flight = add(x, y, z)                                   # moves all three
    with pytest.raises(st.MovedError, match="kernel 'add'"):
        add(x, y, z)
    x, y, z = in_flight.sync()
    s = x.share()                                              # moved into a Shared value
    with pytest.raises(st.MovedError, match="Shared"):
        add(x, y, z)
    x = s.try_unwrap()
    add(x, y, z).sync()


def test_the_same_handle_twice_is_refused_after_a_cached_launch_and_nothing_stays_moved():
    x, y, z = st.ones((8,)), st.ones((8,)), st.empty((8,)).partition((4,))
    x, y, z = add(x, y, z).sync()
    with pytest.raises(st.LaunchError, match="same handle"):
        add(x, x, z)
    x, y, z = add(x, y, z).sync()                              # nothing was left moved or held


def test_a_storage_moved_through_a_torch_alias_invalidates_the_plan():
    base = torch.arange(16, dtype=torch.float32)
    x = st.from_torch(base)
    y, z = st.ones((16,)), st.empty((16,)).partition((8,))
    x, y, z = add(x, y, z).sync()
    assert _cached(add, x, y, z) is not None
    base.as_strided_((8,), (2,))               # the caller's tensor only: the handle keeps its
    assert _cached(add, x, y, z) is not None   # own view of the storage
    base.untyped_storage().resize_(4096)       # the shared storage: its bytes move
    assert _cached(add, x, y, z) is None
    x, y, z = add(x, y, z).sync()
    assert torch.equal(z.unpartition().to_torch(), torch.arange(16.0) + 1)


def test_scalars_must_be_the_same_value_of_the_same_type():
    x, z = st.ones((4,)), st.empty((4,)).partition((4,))
    x, z, a = axpy(x, z, 2.0).sync()
    assert _cached(axpy, x, z, 2.0) is not None
    assert _cached(axpy, x, z, 3.0) is None
    assert _cached(axpy, x, z, 2) is None                      # an int is converted: no reuse
    x, z, a = axpy(x, z, 0.0).sync()
    assert _cached(axpy, x, z, -0.0) is None
    x, z, a = axpy(x, z, 2).sync()
    assert type(a) is float and a == 2.0                       # the recovered value is the float


def test_an_int_passed_for_a_float_reuses_its_plan_and_comes_back_as_the_float():
    x, z = st.ones((4,)), st.empty((4,)).partition((4,))
    x, z, a = axpy(x, z, 3).sync()
    assert _cached(axpy, x, z, 3) is not None                  # matched as the int passed
    assert _cached(axpy, x, z, 3.0) is None
    for _ in range(2):                                         # through the cached plan
        x, z, a = axpy(x, z, 3).sync()
        assert type(a) is float and a == 3.0
    assert z.unpartition().to_torch().tolist() == [3.0] * 4


def test_a_launch_with_a_numpy_scalar_is_not_cached_and_keeps_the_plan_before_it():
    import numpy as np
    x, z = st.ones((4,)), st.empty((4,)).partition((4,))
    x, z, a = axpy(x, z, 2.0).sync()
    x, z, a = axpy(x, z, np.float64(2.0)).sync()
    assert type(a) is float and a == 2.0
    assert _cached(axpy, x, z, np.float64(2.0)) is None
    assert _cached(axpy, x, z, 2.0) is not None


def test_a_plan_is_not_reused_under_another_backend_choice():
    x, y, z = st.ones((8,)), st.ones((8,)), st.empty((8,)).partition((4,))
    with st.backend("interpret", seed=1):
        x, y, z = add(x, y, z).sync()
        assert _cached(add, x, y, z) is not None
    with st.backend("interpret", seed=2):
        assert _cached(add, x, y, z) is None


def test_an_overlapping_write_is_refused_with_a_thousand_holds_in_flight():
    triples = [(st.randn((16,)), st.randn((16,)), st.empty((16,)).partition((16,)))
               for _ in range(1000)]
    ops = [add(*t) for t in triples]                           # 3000 borrows in flight
    victim = ops[637].values[2]._torch                         # an Out held by op 637
    with pytest.raises(st.AliasError, match="held by in-flight kernel 'add'"):
        add(st.ones((16,)), st.ones((16,)), st.from_torch(victim[4:12]).partition((8,)))
    with pytest.raises(st.AliasError):                         # reading it is refused too
        add(st.from_torch(victim), st.ones((16,)), st.empty((16,)).partition((16,)))
    with pytest.raises(st.BorrowError):
        st.from_torch(victim).to_torch()
    held_in = ops[5].values[0]._torch                          # an In: reads may share it
    x, y, z = add(st.from_torch(held_in), st.ones((16,)), st.empty((16,)).partition((16,))).sync()
    for op in ops:
        op.sync()


@settings(deadline=None, max_examples=60)
@given(hs.lists(hs.tuples(hs.integers(0, 1 << 16), hs.integers(1, 1 << 12), hs.booleans()),
                min_size=0, max_size=40),
       hs.tuples(hs.integers(0, 1 << 16), hs.integers(1, 1 << 12), hs.booleans()))
def test_the_borrow_index_finds_exactly_the_conflicts_a_scan_finds(held, query):
    """Many holds (index mode) over one byte buffer: a new borrow is refused iff a brute-force
    interval scan finds a conflict (a write conflicts with anything, a read with writes)."""
    buf = torch.zeros((1 << 16) + (1 << 12), dtype=torch.uint8)
    holds, accepted = [], []
    try:
        for i, (lo, n, write) in enumerate(held):
            t = buf[lo:lo + n]
            try:
                holds.append(borrows.acquire(f"k{i}", **{"writes" if write else "reads": [("a", t)]}))
                accepted.append((lo, lo + n, write))
            except st.AliasError:
                pass
        lo, n, write = query
        expect = any(a < lo + n and lo < b and (write or w) for a, b, w in accepted)
        t = buf[lo:lo + n]
        try:
            borrows.acquire("q", **{"writes" if write else "reads": [("a", t)]}).release()
            got = False
        except st.AliasError:
            got = True
        assert got == expect
    finally:
        random.shuffle(holds)
        for h in holds:
            h.release()


def test_a_dtype_set_through_the_callers_torch_tensor_leaves_the_cached_launch_as_it_was():
    base = torch.ones(8, dtype=torch.float32)
    x, y, z = st.from_torch(base), st.ones((8,)), st.empty((8,)).partition((4,))
    x, y, z = add(x, y, z).sync()
    base.data = base.view(torch.int32)          # the caller's tensor, not the handle's view
    assert _cached(add, x, y, z) is not None and x.dtype is st.f32
    x, y, z = add(x, y, z).sync()
    assert z.unpartition().to_torch().tolist() == [2.0] * 8


@st.kernel
def bump(z: st.Out[st.i32 | st.i64], v: int):
    z.store(z.load() + v)


@st.kernel
def copy_i32(x: st.In[st.i32], z: st.Out[st.i32]):
    z.store(sl.load_like(x, z))


def test_a_wider_dtype_set_through_the_callers_alias_does_not_widen_the_handle():
    buf = torch.zeros(24, dtype=torch.int32)
    alias = buf[8:16]
    z = st.from_torch(alias).partition((4,))
    z, _ = bump(z, 1).sync()
    # int64 over the same address through the caller's tensor: the handle keeps buf[8:16]
    alias.data = torch.empty(0, dtype=torch.int64).set_(buf.untyped_storage(), 4, (8,), (1,))
    reader = copy_i32(st.from_torch(buf[16:24]), st.empty((8,), dtype=st.i32).partition((8,)))
    z, _ = bump(z, 1).sync()                    # no overlap with the reader's bytes
    reader.sync()
    assert buf.tolist() == [0] * 8 + [2] * 8 + [0] * 8


class Int(int):
    """An int subclass whose comparisons would lie to a range check."""

    def __lt__(self, other):
        return True

    def __le__(self, other):
        return True


@st.kernel
def scale_int(x: st.In[st.f32], z: st.Out[st.f32], k: int):
    z.store(sl.load_like(x, z) * k)


@pytest.mark.parametrize("k", [3, 16, 17])
def test_an_int_subclass_argument_launches_as_its_plain_value(k):
    for value in (1, Int(k)):                    # the plain 1 leaves its binary cached
        x, z, got = scale_int(st.ones((4,)), st.empty((4,)).partition((4,)), value).sync()
        assert type(got) is int and got == int.__int__(value)
        assert z.unpartition().to_torch().tolist() == [float(got)] * 4


def test_an_int_subclass_out_of_the_int32_range_is_refused():
    with pytest.raises(st.LaunchError, match="does not fit in int32"):
        scale_int(st.ones((4,)), st.empty((4,)).partition((4,)), Int(2**40))


class Float(float):
    """A float subclass whose conversion would report another value."""

    def __float__(self):
        return 42.0


@st.kernel
def scale_float(x: st.In[st.f32], z: st.Out[st.f32], a: float, b: st.Const[float]):
    z.store(sl.load_like(x, z) * a + b)


def test_a_float_subclass_argument_launches_as_its_plain_value():
    x, z, a, b = scale_float(st.ones((4,)), st.empty((4,)).partition((4,)), Float(2.0),
                             Float(0.5)).sync()
    assert (type(a), a, type(b), b) == (float, 2.0, float, 0.5)
    assert z.unpartition().to_torch().tolist() == [2.5] * 4


def test_a_tensor_past_the_end_of_its_shrunk_storage_is_refused():
    t = torch.zeros(1024)
    z = st.from_torch(t).partition((256,))
    t.untyped_storage().resize_(16)
    with pytest.raises(st.LaunchError, match="past the end of its storage"):
        axpy(st.ones((1024,)), z, 2.0)


@st.kernel
def scaled_shift(x: st.In[st.f32], z: st.Out[st.f32], a: float, n: int, k: st.Const[int]):
    z.store(sl.load_like(x, z) * a + n + k)


@pytest.mark.parametrize("launches", [1, 2])       # the second through the cached plan
def test_numpy_scalars_pass_as_the_numbers_they_hold(launches):
    import numpy as np
    for _ in range(launches):
        x, z, a, n, k = scaled_shift(st.ones((4,), device="cpu"),
                                     st.zeros((4,), device="cpu").partition((4,)),
                                     np.float32(2.0), np.int64(3), np.int32(1)).sync()
    assert z.unpartition().to_torch().tolist() == [6.0] * 4
    assert (type(a), type(n), type(k)) == (float, int, int)


def test_a_numpy_array_of_one_element_is_not_a_scalar_argument():
    import numpy as np
    with pytest.raises(st.LaunchError, match="expects an int"):
        scaled_shift(st.ones((4,), device="cpu"), st.zeros((4,), device="cpu").partition((4,)),
                     2.0, np.array([3]), 1)


def test_a_numpy_bool_is_not_an_int_argument():
    import numpy as np
    with pytest.raises(st.LaunchError, match="expects an int"):
        scaled_shift(st.ones((4,), device="cpu"), st.zeros((4,), device="cpu").partition((4,)),
                     2.0, np.bool_(True), 1)
