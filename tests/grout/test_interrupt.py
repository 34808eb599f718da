"""A Ctrl-C during a generation leaves the engine as it was: the next request on it gives the
same tokens, and no borrow outlives the interrupted request once its stream is dropped.

A signal's KeyboardInterrupt lands where Python checks for one, at the start of a function:
these tests raise one at the first entry of a chosen function (or of one called from a chosen
caller) while a generation runs, as a Jupyter user's Ctrl-C would."""
import gc
import sys
import threading

import pytest

import grout
from safetile.device.execution import RunContext
from safetile.device.graph import GraphLaunchOp
from safetile.device.op import DeviceOp
from safetile.device.reserve import ReservingOp
from safetile.tensor import active_holds
from safetile.tensor.ownership import LOCK, WALK

PROMPT = [5, 17, 33, 2, 9]
SEED = 7


@pytest.fixture(scope="module")
def engine(checkpoints):
    """A float32 engine of the "tied" checkpoint, its decode graphs recorded."""
    path, _ = checkpoints["tied"]
    eng = grout.load(path, device="cpu", dtype="float32", max_seq_len=64, progress=False)
    yield eng
    del eng
    gc.collect()


@pytest.fixture(scope="module")
def reference(engine):
    """(greedy tokens, seeded sampled tokens) of PROMPT, and the borrows the engine keeps."""
    greedy = engine.generate(PROMPT, max_new_tokens=6).token_ids
    sampled = _sampled(engine)
    gc.collect()
    return greedy, sampled, len(active_holds())


def _sampled(eng):
    return eng.generate(PROMPT, max_new_tokens=6, temperature=0.8, seed=SEED).token_ids


def _generate(eng, kept: list):
    eng.generate(PROMPT, max_new_tokens=6)


def _outside_finalizers(frame) -> bool:
    while frame is not None and frame.f_code.co_name != "__del__":
        frame = frame.f_back
    return frame is None


def _interrupt_at(code, caller=None):
    """A tracer raising KeyboardInterrupt at ``code``'s first entry (from ``caller``, if given)."""
    # Not inside a __del__: Python reports an exception raised in a finalizer, never raises it.
    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code and _outside_finalizers(frame) and (
                caller is None or frame.f_back.f_code is caller):
            sys.settrace(None)
            raise KeyboardInterrupt
    return tracer


def _interrupted(work, eng, code, caller=None) -> list:
    """Run ``work`` interrupted at ``code``'s entry; the streams it made, then the interrupt."""
    # Both stay referenced, as a user's variables and a REPL's sys.last_value (with its
    # traceback) keep them, while the next request runs.
    kept: list = []
    outer = sys.gettrace()
    # One raised in a finalizer or a weakref callback is reported, not raised: dropped here,
    # so that the report keeps no frame (nor its values) alive.
    hook, sys.unraisablehook = sys.unraisablehook, lambda unraisable: None
    sys.settrace(_interrupt_at(code, caller))
    try:
        work(eng, kept)
    except KeyboardInterrupt as e:
        kept.append(e)
    finally:
        sys.settrace(outer)
        sys.unraisablehook = hook
    return kept


def _free(lock) -> bool:
    """Whether another thread can take ``lock`` now."""
    got = []

    def take():
        if lock.acquire(timeout=5):
            got.append(True)
            lock.release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return bool(got)


def _check_unharmed(eng, reference, kept: list, where: str) -> None:
    """Locks free, the next requests give the reference tokens, no borrow once ``kept`` goes."""
    greedy, sampled, holds = reference
    assert not WALK.here() and _free(LOCK) and _free(eng._lock), where
    assert eng.generate(PROMPT, max_new_tokens=6).token_ids == greedy, where
    assert _sampled(eng) == sampled, where
    kept.clear()
    gc.collect()
    assert len(active_holds()) == holds, where


def test_an_interrupt_as_a_two_launch_op_starts_running_leaves_no_borrow(engine, reference):
    """The sampler's argmax (two launches, bytes reserved) interrupted as ctx owes the end."""
    kept = _interrupted(_generate, engine, RunContext.at_finish.__code__,
                        ReservingOp._run.__code__)
    _check_unharmed(engine, reference, kept, "at_finish from ReservingOp._run")


def test_an_interrupt_as_a_graph_replay_starts_running_leaves_no_borrow(engine, reference):
    kept = _interrupted(_generate, engine, RunContext.at_finish.__code__,
                        GraphLaunchOp._run.__code__)
    _check_unharmed(engine, reference, kept, "at_finish from GraphLaunchOp._run")


def test_an_interrupt_kept_with_its_traceback_leaves_the_next_request_unblocked(engine,
                                                                             reference):
    """Interrupted as the prefill chains a launch: the one built before it is never run."""
    from grout.runner import run_steps
    kept = _interrupted(_generate, engine, DeviceOp.then.__code__, run_steps.__code__)
    assert isinstance(kept[-1], KeyboardInterrupt)
    _check_unharmed(engine, reference, kept, "DeviceOp.then from run_steps")


def test_an_interrupted_logits_call_kept_with_its_traceback_leaves_the_next_unblocked(engine):
    from grout.runner import run_steps
    expected = engine.logits(PROMPT)
    kept = _interrupted(lambda eng, _: eng.logits(PROMPT), engine, DeviceOp.then.__code__,
                        run_steps.__code__)
    assert isinstance(kept[-1], KeyboardInterrupt)
    assert engine.logits(PROMPT).equal(expected)

