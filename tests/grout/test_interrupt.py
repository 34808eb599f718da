"""A Ctrl-C during a generation leaves the engine as it was: the next request on it gives the
same tokens, and no borrow outlives the interrupted request once its stream is dropped.

A signal's KeyboardInterrupt lands where Python checks for one, at the start of a function:
these tests raise one at the first entry of a chosen function (or of one called from a chosen
caller) while a generation runs, as a Jupyter user's Ctrl-C would."""
import gc

import pytest

import grout
from safetile.device.graph import GraphLaunchOp
from safetile.device.op import DeviceOp
from safetile.device.reserve import ReservingOp
from safetile.tensor import active_holds
from safetile.tensor.ownership import LOCK, WALK

from interrupts import entered, interrupted, is_free

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


def _interrupted(work, eng, code, caller=None) -> list:
    """Run ``work`` interrupted at ``code``'s entry; the streams it made, then the interrupt."""
    # Both stay referenced, as a user's variables and a REPL's sys.last_value (with its
    # traceback) keep them, while the next request runs.
    kept: list = []
    e = interrupted(lambda: work(eng, kept), code, caller)
    if e is not None:
        kept.append(e)
    return kept


def _check_unharmed(eng, reference, kept: list, where: str) -> None:
    """Locks free, the next requests give the reference tokens, no borrow once ``kept`` goes."""
    greedy, sampled, holds = reference
    assert not WALK.here() and is_free(LOCK) and is_free(eng._lock), where
    assert eng.generate(PROMPT, max_new_tokens=6).token_ids == greedy, where
    assert _sampled(eng) == sampled, where
    kept.clear()
    gc.collect()
    assert len(active_holds()) == holds, where


def _callees(engine, caller) -> list:
    """The functions ``caller`` calls directly during one generation."""
    return entered(lambda: _generate(engine, []), lambda frame: frame.f_back is not None and
                   frame.f_back.f_code is caller)


@pytest.mark.parametrize("run", [ReservingOp._run, GraphLaunchOp._run],
                         ids=["two-launch op", "graph replay"])
def test_an_interrupt_as_an_op_starts_running_leaves_no_borrow(engine, reference, run):
    """The sampler's argmax (two launches, bytes reserved) or a decode graph's replay,
    interrupted at each function it calls as it starts running (its claim, its borrow, the
    run it owes the execution)."""
    callees = _callees(engine, run.__code__)
    landed = []
    for code in callees:
        kept = _interrupted(_generate, engine, code, run.__code__)
        landed += [code.co_name for e in kept if isinstance(e, KeyboardInterrupt)]
        _check_unharmed(engine, reference, kept, f"{code.co_name} from {run.__qualname__}")
    assert landed, f"no interrupt landed in {run.__qualname__} (callees: {callees})"


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

