"""One op synced on two threads at once runs once: the other thread is refused, whatever point
the first has reached.

A launch holds one borrow of its arguments and hands them back once. Run twice at once, the
first run to finish ends that borrow and hands the values back while the second still writes
them: the host could then hand the bytes to torch (``into_torch``) under a running launch.
"""
import sys
import threading

import pytest

import safetile as st
import safetile.lang as sl
from safetile.kernel.kernel_op import KernelOp

from support import cpu_executor, no_leftover_holds

_cpu = cpu_executor(seed=0)
_holds = no_leftover_holds()


@st.kernel
def bump(z: st.Out[st.f32]):
    z.store(z.load() + 1.0)


def _lines_run(fn) -> list:
    """The lines of ``fn`` that one plain sync of a launch runs, in order."""
    seen = set()

    def local(frame, event, arg):
        if event == "line":
            seen.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is fn.__code__ else None
    outer = sys.gettrace()                        # (a coverage or debugger tracer)
    sys.settrace(tracer)
    try:
        with st.backend("interpret", seed=0):
            bump(st.zeros((4,), device="cpu").partition((4,))).sync()
    finally:
        sys.settrace(outer)
    return sorted(seen)


def _pause_at(code, line: int, thread_name: str, reached: threading.Event,
              resume: threading.Event):
    """A trace function pausing the thread ``thread_name`` when it reaches ``line`` of ``code``."""
    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line:
            reached.set()
            resume.wait(10)
        return local

    def tracer(frame, event, arg):
        if frame.f_code is code and threading.current_thread().name == thread_name:
            return local
        return None
    return tracer


@pytest.mark.parametrize("line", _lines_run(KernelOp._run))
def test_an_op_synced_on_two_threads_at_once_runs_once(line):
    """Thread A is paused at ``line`` of the launch's run while thread B syncs the same op."""
    op = bump(st.zeros((4,), device="cpu").partition((4,)))
    reached, resume, results = threading.Event(), threading.Event(), {}

    def sync(name):
        if name == "A":                           # traced from its own start, no race
            sys.settrace(_pause_at(KernelOp._run.__code__, line, "A", reached, resume))
        try:
            results[name] = op.sync()
        except Exception as e:
            results[name] = e
        finally:
            sys.settrace(None)

    a = threading.Thread(target=sync, args=("A",), name="A")
    a.start()
    assert reached.wait(10)
    b = threading.Thread(target=sync, args=("B",), name="B")
    b.start()
    b.join(0.2)                                   # (B may wait for a lock A holds)
    resume.set()
    a.join(10)
    b.join(10)
    outcomes = sorted(type(r).__name__ for r in results.values())
    assert outcomes == ["ExecutionError", "tuple"], results
    (z,) = next(r for r in results.values() if isinstance(r, tuple))
    assert z.unpartition().to_torch().tolist() == [1.0] * 4      # the kernel ran once
