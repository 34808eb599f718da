"""grout serve under concurrent clients: requests are served one at a time in arrival order,
and a bounded load (200 requests from 8 threads) loses and mixes up nothing."""
import asyncio
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from server_process import cpu_engine, cpu_server

MAX_SEQ_LEN = 128
LOAD_REQUESTS, LOAD_THREADS, LOAD_TOKENS = 200, 8, 1
# Prompts of different lengths: an answer given to the wrong request shows in its usage
# even where two prompts happen to share their first generated token.
PROMPTS = [" ".join(["fox"] * n) for n in range(1, 11)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_load", MAX_SEQ_LEN) as s:
        yield s


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Each prompt's greedy completion, from the engine in this process."""
    eng = cpu_engine(tmp_path_factory, MAX_SEQ_LEN)
    refs = {p: eng.generate(p, max_new_tokens=LOAD_TOKENS, temperature=0.0) for p in PROMPTS}
    assert len({r.prompt_tokens for r in refs.values()}) == len(PROMPTS)
    return {p: (r.text, r.prompt_tokens) for p, r in refs.items()}


def test_six_concurrent_clients_are_served_one_at_a_time_in_arrival_order(server):
    """Six async clients send 0.05 s apart, all while the first (a long one) is still
    generating; each gets its whole answer, and each answer starts only after the one
    before it finished."""
    lengths = [112, 4, 4, 4, 4, 4]

    async def one(ac, i):
        await asyncio.sleep(0.05 * i)
        sent = time.monotonic()
        stream = await ac.completions.create(model="tiny", prompt=PROMPTS[i],
                                             max_tokens=lengths[i],
                                             temperature=0.0, stream=True,
                                             stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
        first = last = usage = None
        async for chunk in stream:
            last = time.monotonic()
            first = first or last
            usage = chunk.usage or usage
        return {"sent": sent, "first": first, "last": last, "usage": usage}

    async def run():
        async with server.async_client() as ac:
            return await asyncio.gather(*(one(ac, i) for i in range(6)))

    results = asyncio.run(run())
    assert results[-1]["sent"] < results[0]["last"], "the requests did not overlap"
    assert [r["usage"].completion_tokens for r in results] == lengths
    for ahead, behind in zip(results, results[1:]):
        assert behind["first"] >= ahead["last"], "a request ran before the one ahead of it"


def test_two_hundred_requests_from_eight_threads_each_get_their_own_answer(
        server, references, request, capsys):
    client = server.client()
    lock = threading.Lock()
    latencies: list[float] = []

    def one(k: int) -> tuple[int, str, tuple[str, int]]:
        """Request k: prompt k mod 10, streamed when k is odd; its (text, prompt tokens)."""
        prompt = PROMPTS[k % len(PROMPTS)]
        args = dict(model="tiny", prompt=prompt, max_tokens=LOAD_TOKENS, temperature=0.0)
        started = time.perf_counter()
        if k % 2:
            chunks = list(client.completions.create(**args, stream=True,
                                                    stream_options={"include_usage": True}))
            answer = ("".join(c.choices[0].text for c in chunks if c.choices),
                      chunks[-1].usage.prompt_tokens)
        else:
            r = client.completions.create(**args)
            answer = (r.choices[0].text, r.usage.prompt_tokens)
        with lock:
            latencies.append(time.perf_counter() - started)
        return k, prompt, answer

    started = time.perf_counter()
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        results = list(pool.map(one, range(LOAD_REQUESTS)))
    wall = time.perf_counter() - started

    assert len(results) == LOAD_REQUESTS
    assert [k for k, _, _ in results] == list(range(LOAD_REQUESTS))
    wrong = [(k, p, a) for k, p, a in results if a != references[p]]
    assert not wrong, f"{len(wrong)} answers are not their own prompt's: {wrong[:3]}"
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    line = (f"load: {LOAD_REQUESTS} requests from {LOAD_THREADS} threads, {LOAD_TOKENS} tokens "
            f"each, in {wall:.1f} s: p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")
    with capsys.disabled():
        print(f"\n{line}")
    request.node.user_properties.append(("latency_p50_s", p50))
    request.node.user_properties.append(("latency_p99_s", p99))
