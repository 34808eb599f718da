"""Decoding ahead (grout.decode_ahead): a stream's chunks run on a worker thread, one chunk
ahead of the reader; the tokens are those of decoding each chunk when it is needed."""
import threading
import time

import pytest

import grout
from grout.decode_ahead import DecodeAhead

PROMPT = [3, 17, 250, 41, 99, 5]
WAIT_S = 60.0                  # generous: the CPU runs a worker's chunk in milliseconds


def counting_decode(size: int, calls: list):
    """A decode of ``size`` items a chunk (fewer at the end of the budget), numbered."""
    def decode(remaining):
        calls.append(remaining)
        n = min(size, remaining)
        base = sum(min(size, r) for r in calls[:-1])
        return list(range(base, base + n))
    return decode


def wait_until(predicate) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the worker did not get there in time")
        time.sleep(0.001)


def test_chunks_come_in_order_and_stop_at_the_budget():
    calls = []
    ahead = DecodeAhead(counting_decode(3, calls), 10, threading.Lock())
    chunks = [ahead.next_chunk() for _ in range(4)]
    assert chunks == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert calls == [10, 7, 4, 1]
    with pytest.raises(RuntimeError, match="budget"):
        ahead.next_chunk()


def test_the_worker_runs_two_chunks_ahead_of_the_reader_and_no_further():
    calls = []
    ahead = DecodeAhead(counting_decode(2, calls), 100, threading.Lock())
    wait_until(lambda: len(calls) == 2)
    ahead._thread.join(timeout=0.2)            # time to run on, if it wrongly would
    assert len(calls) == 2
    assert ahead.next_chunk() == [0, 1]
    wait_until(lambda: len(calls) == 3)
    ahead._thread.join(timeout=0.2)
    assert len(calls) == 3
    ahead.stop()


def test_decode_runs_with_the_lock_held():
    lock = threading.Lock()
    held = []
    ahead = DecodeAhead(lambda remaining: held.append(lock.locked()) or [0], 2, lock)
    ahead.next_chunk(), ahead.next_chunk()
    assert held == [True, True]


def test_an_error_in_a_chunk_reaches_the_reader_in_its_place():
    def decode(remaining):
        if remaining < 4:
            raise ValueError("the device failed")
        return [remaining]
    ahead = DecodeAhead(decode, 4, threading.Lock())
    assert ahead.next_chunk() == [4]
    with pytest.raises(ValueError, match="the device failed"):
        ahead.next_chunk()


def test_no_chunk_starts_after_stop():
    lock, calls = threading.Lock(), []
    with lock:                                 # the worker waits for the engine's lock
        ahead = DecodeAhead(counting_decode(1, calls), 5, lock)
        ahead.stop()
    ahead._thread.join(WAIT_S)
    assert not ahead._thread.is_alive() and calls == []


def test_stop_returns_once_the_running_chunk_is_done():
    started, release, finished = threading.Event(), threading.Event(), []

    def decode(remaining):
        started.set()
        release.wait(WAIT_S)
        finished.append(remaining)
        return [remaining]
    ahead = DecodeAhead(decode, 3, threading.Lock())
    assert started.wait(WAIT_S)
    stopper = threading.Thread(target=ahead.stop)
    stopper.start()
    stopper.join(timeout=0.2)
    assert stopper.is_alive() and finished == []     # stop waits for the chunk
    release.set()
    stopper.join(WAIT_S)
    assert not stopper.is_alive() and finished == [3]
    ahead._thread.join(WAIT_S)
    assert not ahead._thread.is_alive()


@pytest.fixture
def eng(engines):
    e = engines["untied"]
    yield e
    e.decode_ahead = True


REQUESTS = [dict(max_new_tokens=20),
            dict(max_new_tokens=20, temperature=0.9, top_k=40, seed=11),
            dict(max_new_tokens=20, logprobs=3),
            dict(max_new_tokens=60)]                 # to the end of the 64-position cache


@pytest.mark.parametrize("request_kwargs", REQUESTS, ids=["greedy", "sampled", "logprobs",
                                                          "full_cache"])
def test_a_stream_decoded_ahead_gives_the_tokens_of_decoding_each_chunk_when_needed(
        eng, request_kwargs):
    runs = {}
    for ahead in (False, True):
        eng.decode_ahead = ahead
        pieces = list(eng.stream(PROMPT, ignore_eos=True, **request_kwargs))
        runs[ahead] = ([p.token_id for p in pieces], "".join(p.text for p in pieces),
                       [p.finish_reason for p in pieces],
                       [p.logprobs for p in pieces])
    assert runs[True] == runs[False]


def test_a_stop_string_ends_a_stream_decoded_ahead_where_it_ends_one_decoded_inline(eng):
    eng.decode_ahead = False
    full = eng.generate(PROMPT, max_new_tokens=12)
    stop = full.text[3:5]
    inline = eng.generate(PROMPT, max_new_tokens=12, stop=stop)
    eng.decode_ahead = True
    assert eng.generate(PROMPT, max_new_tokens=12, stop=stop) == inline


def test_two_chunks_decode_while_the_reader_holds_a_piece(eng):
    s = eng.stream(PROMPT, max_new_tokens=30)
    next(s)
    start, chunk = len(PROMPT), eng.runner.max_chunk
    wait_until(lambda: eng.runner.position >= start + 2 * chunk)
    time.sleep(0.2)                            # time to run on, if it wrongly would
    assert eng.runner.position == start + 2 * chunk
    s.close()


def test_an_error_on_the_worker_reaches_the_reader_and_the_engine_stays_usable(
        eng, monkeypatch):
    expected = eng.generate(PROMPT, max_new_tokens=4).token_ids

    def failing_steps(greedy, n):
        raise RuntimeError("the decode step failed")
    s = eng.stream(PROMPT, max_new_tokens=10)
    with monkeypatch.context() as m:
        m.setattr(eng.runner, "steps", failing_steps)
        next(s)
        with pytest.raises(RuntimeError, match="the decode step failed"):
            next(s)
    s.close()
    assert eng.generate(PROMPT, max_new_tokens=4).token_ids == expected


def test_closing_a_stream_with_a_chunk_running_waits_for_it(eng):
    s = eng.stream(PROMPT, max_new_tokens=40)
    next(s)
    s.close()
    position = eng.runner.position
    time.sleep(0.05)
    assert eng.runner.position == position     # nothing of that stream runs any more
    assert eng._lock.acquire(blocking=False)   # no worker holds the engine
    eng._lock.release()


def test_a_stream_whose_reader_is_gone_stops_its_worker(eng):
    s = eng.stream(PROMPT, max_new_tokens=40)
    next(s)
    worker = next(t for t in threading.enumerate() if t.name == "grout-decode-ahead")
    del s
    worker.join(WAIT_S)
    assert not worker.is_alive()
    assert eng.generate(PROMPT, max_new_tokens=2).finish_reason == "length"
