"""Code that a garbage collection runs in the middle of a borrow check never sees or changes the
borrows half-updated.

A collection may start at any allocation, also while a launch checks its borrows against the
ones in flight and files its own, and it runs whatever finalizers (``__del__``) and weakref or
gc callbacks the collected objects have. A user's finalizer may use safetile (sync an op on
drop, launch, read or view a value): each would check or change the borrow registry (or a
family of views) while a launch or ``into_torch`` on the same thread is halfway through it.
Ending a borrow waits for the walk to end; taking or checking one, or making a view, is
refused (``ExecutionError``).
"""
import gc

import pytest

import safetile as st
import safetile.tensor.tensor as tensor_module
from safetile.tensor import active_holds, registry, replayed

from support import add, cpu_executor, no_leftover_holds, vec

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


class _InCycle:
    """Garbage of a reference cycle whose finalizer calls ``act()`` (and keeps what it gave)."""

    def __init__(self, act, got: list):
        self.act, self.got, self.cycle = act, got, self

    def __del__(self):
        try:
            self.got.append(self.act())
        except Exception as e:
            self.got.append(e)


@pytest.fixture
def collect_inside(monkeypatch):
    """``arm(cls, method)``: the next call of ``cls.method`` (a registry step that allocates)
    first runs a full collection, as an allocation there could."""
    def arm(cls, method):
        original = getattr(cls, method)
        armed = [True]

        def collecting(self, *args, **kwargs):
            if armed:
                armed.clear()
                gc.collect()
            return original(self, *args, **kwargs)
        monkeypatch.setattr(cls, method, collecting)
    gc.collect()
    gc.disable()
    yield arm
    gc.enable()


def _small_writes(n: int) -> list:
    return [add(vec(1.0), vec(1.0), st.zeros((1,)).partition((1,))) for _ in range(n)]


@pytest.mark.parametrize("in_flight", [0, 5], ids=["scanned", "indexed"])
def test_a_launch_in_a_finalizer_run_inside_a_registration_is_refused(collect_inside, in_flight):
    # The finalizer's launch writes the bytes the outer launch is filing: it must not be
    # checked against a registry that lacks the outer launch's borrow.
    buf = st.zeros((64,))
    others = _small_writes(in_flight)
    got = []
    _InCycle(lambda: add(vec(*[5.0] * 32), vec(*[5.0] * 32), buf[0::2].partition((32,))), got)
    collect_inside(registry.Registry, "add")
    outer = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[0::2].partition((32,)))
    (inner,) = got
    assert isinstance(inner, st.ExecutionError) and "inside a borrow check" in str(inner)
    for op in [outer, *others]:
        op.sync()


def test_an_op_synced_in_a_finalizer_run_inside_a_registration_ends_its_borrow_after_it(
        collect_inside):
    # The fifth hold in flight makes the registry build its address index; the finalizer's
    # sync ended a borrow under that build, which then failed half-way and left the later
    # write of `buf` unindexed, so a second write of the same bytes was let through.
    others = _small_writes(3)
    buf = st.zeros((64,))
    first = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[1::2].partition((32,)))
    got = []
    _InCycle(others[-1].sync, got)
    collect_inside(registry.Index, "add")
    fifth = add(vec(1.0), vec(1.0), st.zeros((1,)).partition((1,)))
    assert len(got) == 1 and isinstance(got[0], tuple)          # the sync itself ran
    with pytest.raises(st.AliasError, match="held by in-flight kernel 'add'"):
        add(vec(*[1.0] * 32), vec(*[7.0] * 32), buf[1::2].partition((32,)))
    for op in [first, fifth, *others[:-1]]:
        op.sync()
    assert active_holds() == []


def test_a_host_read_in_a_finalizer_run_inside_a_registration_is_refused(collect_inside):
    # Half-way through the index build the in-flight write of `buf` is not indexed yet: the
    # finalizer's copy of those bytes passed the check (on the GPU, a read of memory a
    # kernel is writing).
    others = _small_writes(3)
    buf = st.zeros((64,))
    view = buf[1::2]
    first = add(vec(*[1.0] * 32), vec(*[2.0] * 32), buf[1::2].partition((32,)))
    got = []
    _InCycle(view.to_torch, got)
    collect_inside(registry.Index, "add")
    fifth = add(vec(1.0), vec(1.0), st.zeros((1,)).partition((1,)))
    (read,) = got
    assert isinstance(read, st.ExecutionError) and "inside a borrow check" in str(read)
    for op in [first, fifth, *others]:
        op.sync()



def test_a_view_made_in_a_finalizer_run_inside_into_torch_s_scan_of_the_views_is_refused(
        collect_inside, monkeypatch):
    # The scan reads a snapshot of the family; a view joining it meanwhile was missed, and
    # stayed a live safetile handle over the bytes into_torch then gave torch.
    base = st.zeros((8,))
    low, high = base[0:4], base[4:8]
    del base
    got = []
    _InCycle(lambda: low.view(4), got)
    overlaps = tensor_module.overlaps

    def collecting(a, b):
        monkeypatch.setattr(tensor_module, "overlaps", overlaps)
        gc.collect()                            # as the extents' allocation could
        return overlaps(a, b)
    monkeypatch.setattr(tensor_module, "overlaps", collecting)
    owned = low.into_torch()
    (view,) = got
    assert isinstance(view, st.ExecutionError) and "inside a borrow check" in str(view)
    owned.fill_(1.0)
    assert high.to_torch().tolist() == [0.0] * 4


def test_a_graph_recorded_in_a_finalizer_run_inside_into_torch_s_scan_of_the_graphs_is_refused(
        monkeypatch):
    # The scan reads a snapshot of the live graphs; a graph recorded meanwhile (reading the
    # tensor, which its record handed back) was missed, and replayed memory torch then owned.
    kept = add(vec(1.0), vec(2.0), st.empty((1,)).partition((1,))).graph()
    t = vec(1.0, 2.0)
    got = []
    overlap = replayed._overlap

    def collecting(a, b):
        monkeypatch.setattr(replayed, "_overlap", overlap)
        gc.collect()                            # as the exact check's allocations could
        return overlap(a, b)
    monkeypatch.setattr(replayed, "_overlap", collecting)
    gc.collect()
    gc.disable()
    try:
        _InCycle(lambda: add(t, vec(3.0, 4.0), st.empty((2,)).partition((2,))).graph(), got)
        owned = t.into_torch()
    finally:
        gc.enable()
    (graph,) = got
    assert isinstance(graph, st.ExecutionError) and "inside a borrow check" in str(graph)
    assert owned.tolist() == [1.0, 2.0]
    kept.launch().sync()
