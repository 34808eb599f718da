"""grout serve under concurrent clients: requests are served one at a time in arrival order,
and a bounded load (200 requests from 8 threads) loses and mixes up nothing."""
import asyncio
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import grout
from server_process import ServerProcess, build_checkpoint

MAX_SEQ_LEN = 128
LOAD_REQUESTS, LOAD_THREADS, LOAD_TOKENS = 200, 8, 2
PROMPTS = [f"{word} number {i}" for i, word in enumerate(
    ["Hello", "The fox", "A server", "Once upon", "How are", "The lazy dog", "Tokens", "World",
     "Quick", "Brown"])]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("server_load") / "ckpt")


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("server_load_log") / "serve.log"
    with ServerProcess(str(checkpoint), log, "--device", "cpu", "--dtype", "float32",
                       "--max-seq-len", str(MAX_SEQ_LEN), "--served-model-name",
                       "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def references(checkpoint):
    """Each prompt's greedy completion, from the engine in this process."""
    eng = grout.load(str(checkpoint), device="cpu", dtype="float32", max_seq_len=MAX_SEQ_LEN)
    return {p: eng.generate(p, max_new_tokens=LOAD_TOKENS, temperature=0.0).text
            for p in PROMPTS}


def test_six_concurrent_clients_are_served_one_at_a_time_in_arrival_order(server):
    """Six async clients send 0.3 s apart while the first is still generating; each gets
    its whole answer, and each answer starts only after the one before it finished."""
    async def one(ac, i):
        await asyncio.sleep(0.3 * i)
        stream = await ac.completions.create(model="tiny", prompt=PROMPTS[i], max_tokens=24,
                                             temperature=0.0, stream=True,
                                             stream_options={"include_usage": True})
        first = last = None
        usage = None
        async for chunk in stream:
            now = time.monotonic()
            first = first or now
            last = now
            usage = chunk.usage or usage
        return i, first, last, usage

    async def run():
        async with server.async_client() as ac:
            return await asyncio.gather(*(one(ac, i) for i in range(6)))

    results = asyncio.run(run())
    assert [r[0] for r in sorted(results, key=lambda r: r[2])] == list(range(6))
    for (_, _, last, _), (_, first, _, _) in zip(results, results[1:]):
        assert first >= last - 0.05, "a request started before the one ahead of it finished"
    assert all(u is not None and u.completion_tokens > 0 for *_, u in results)


def test_two_hundred_requests_from_eight_threads_each_get_their_own_answer(
        server, references, request):
    client = server.client()
    lock = threading.Lock()
    latencies: list[float] = []

    def one(k: int) -> tuple[int, str, str, str]:
        prompt = PROMPTS[k % len(PROMPTS)]
        stream = k % 2 == 1
        started = time.perf_counter()
        if stream:
            text = "".join(c.choices[0].text for c in client.completions.create(
                model="tiny", prompt=prompt, max_tokens=LOAD_TOKENS, temperature=0.0,
                stream=True))
            finish = "streamed"
        else:
            r = client.completions.create(model="tiny", prompt=prompt, max_tokens=LOAD_TOKENS,
                                          temperature=0.0)
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        with lock:
            latencies.append(time.perf_counter() - started)
        return k, prompt, text, finish

    started = time.perf_counter()
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        results = list(pool.map(one, range(LOAD_REQUESTS)))
    wall = time.perf_counter() - started

    assert len(results) == LOAD_REQUESTS
    wrong = [(k, p, t) for k, p, t, _ in results if t != references[p]]
    assert not wrong, f"{len(wrong)} answers are not their own prompt's: {wrong[:3]}"
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    line = (f"load: {LOAD_REQUESTS} requests from {LOAD_THREADS} threads, {LOAD_TOKENS} tokens "
            f"each, in {wall:.1f} s: p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms")
    request.config.pluginmanager.get_plugin("terminalreporter").write_line(line)
    request.node.user_properties.append(("latency_p50_s", p50))
    request.node.user_properties.append(("latency_p99_s", p99))
