"""An interrupted wait never ends the borrows of work that may still run.

The CPU machine has no stream to wait on, so these tests give an execution a stand-in
stream whose first wait is interrupted (a KeyboardInterrupt raised as ``op.sync()`` starts
waiting) and record what is still borrowed at each later wait."""
import pytest

import safetile as st
from safetile.device import streams
from safetile.tensor import active_holds

from support import add, cpu_executor, no_leftover_holds, vec

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
