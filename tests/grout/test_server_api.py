"""grout serve, driven by the official openai client: endpoints, streaming, stop strings,
logprobs, seeds and exact usage, each checked against the engine itself."""
import asyncio

import httpx
import openai
import pytest
import torch

from server_process import cpu_engine, cpu_server

MAX_SEQ_LEN = 256
USER = [{"role": "user", "content": "Hello, how are you today?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_api", MAX_SEQ_LEN) as s:
        yield s


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return cpu_engine(tmp_path_factory, MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def complete(client, prompt="The quick brown fox", **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0.0)
    return client.completions.create(model="tiny", prompt=prompt, **kw)


def streamed(client, create, **kw):
    return list(create(model="tiny", stream=True, **kw))


def test_health_says_ok_once_the_engine_is_loaded(server):
    r = httpx.get(f"{server.url}/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_completion_is_the_engines_greedy_completion(client, engine):
    prompt = "The quick brown fox"
    ref = engine.generate(prompt, max_new_tokens=8, temperature=0.0)
    r = complete(client, prompt)
    assert r.object == "text_completion" and r.model == "tiny"
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(engine.tokenizer.encode(prompt)) == ref.prompt_tokens
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_prompt_of_token_ids_is_served(client, engine):
    ids = engine.tokenizer.encode("Hello, world!")
    r = complete(client, ids)
    assert r.choices[0].text == engine.generate(ids, max_new_tokens=8).text
    assert r.usage.prompt_tokens == len(ids)


def test_streamed_completion_equals_the_non_streamed_one(client):
    full = complete(client, max_tokens=12)
    chunks = streamed(client, client.completions.create, prompt="The quick brown fox",
                      max_tokens=12, temperature=0.0, stream_options={"include_usage": True})
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and
                c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == full.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_is_the_engines_chat(client, engine):
    ref = engine.chat(USER, enable_thinking=False, max_new_tokens=8, temperature=0.0)
    r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8,
                                       temperature=0.0, extra_body=NO_THINKING)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == ref.prompt_tokens
    assert r.usage.completion_tokens == len(ref.token_ids)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_assistant_turns_reasoning_reaches_the_chat_template(client, engine, field):
    messages = [*USER, {"role": "assistant", "content": "Fine.", field: "Be polite."}]
    ref = engine.chat([*USER, {"role": "assistant", "content": "Fine.",
                               "reasoning_content": "Be polite."}],
                      max_new_tokens=4, temperature=0.0)
    assert ref.prompt_tokens > engine.chat(messages[:1] + [dict(messages[1], **{field: None})],
                                           max_new_tokens=0).prompt_tokens
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                       temperature=0.0, extra_body=NO_THINKING)
    assert r.usage.prompt_tokens == ref.prompt_tokens
    assert r.choices[0].message.content == ref.text


def test_streamed_chat_sends_the_role_first_and_one_finish_reason(client):
    full = client.chat.completions.create(model="tiny", messages=USER, max_tokens=10,
                                          temperature=0.0)
    chunks = streamed(client, client.chat.completions.create, messages=USER, max_tokens=10,
                      temperature=0.0)
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == \
        full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices[0].finish_reason is not None


def test_enable_thinking_false_prefills_an_empty_think_block(client, engine):
    on = client.chat.completions.create(model="tiny", messages=USER, max_tokens=1)
    off = client.chat.completions.create(model="tiny", messages=USER, max_tokens=1,
                                         extra_body=NO_THINKING)
    block = engine.tokenizer.encode("<think>\n\n</think>\n\n")
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + len(block)


def test_the_async_client_streams_the_same_text(server, client):
    full = complete(client, "Once upon a time", max_tokens=10).choices[0].text

    async def run():
        async with server.async_client() as ac:
            stream = await ac.completions.create(model="tiny", prompt="Once upon a time",
                                                 max_tokens=10, temperature=0.0, stream=True)
            return "".join([c.choices[0].text async for c in stream])
    assert asyncio.run(run()) == full


def _pieces(engine, prompt, n):
    return [p.text for p in engine.stream(prompt, max_new_tokens=n, temperature=0.0)]


def test_a_stop_string_across_chunks_is_held_back_and_never_sent(client, engine):
    prompt = "A server streams tokens"
    pieces = _pieces(engine, prompt, 16)
    # The end of one token's text and the start of the next: a stop string that only
    # exists across two chunks (the random model's text has many empty, held-back pieces).
    at = next(i for i in range(len(pieces) - 1) if pieces[i] and len(pieces[i + 1]) >= 2)
    stop = pieces[at][-1] + pieces[at + 1][:2]
    text = "".join(pieces)
    boundary = len("".join(pieces[: at + 1]))
    assert text.find(stop) == boundary - 1
    chunks = streamed(client, client.completions.create, prompt=prompt, max_tokens=16,
                      temperature=0.0, stop=[stop])
    sent = [c.choices[0].text for c in chunks]
    assert "".join(sent) == text[: boundary - 1]
    assert [c.choices[0].finish_reason for c in chunks].count("stop") == 1
    assert chunks[-1].choices[0].finish_reason == "stop"
    full = complete(client, prompt, max_tokens=16, stop=stop)
    assert full.choices[0].text == text[: boundary - 1]
    assert full.choices[0].finish_reason == "stop"


def test_the_earliest_of_several_stop_strings_ends_the_text(client, engine):
    prompt = "Hello, world!"
    text = "".join(_pieces(engine, prompt, 12))
    first, later = text[2:4], text[6:9]
    assert text.find(first) == 2 and text.find(later) == 6
    r = complete(client, prompt, max_tokens=12, stop=[later, first])
    assert r.choices[0].text == text[: text.find(first)]
    assert r.choices[0].finish_reason == "stop"


def test_completion_logprobs_are_the_models_distribution(client, engine):
    prompt = "The lazy dog"
    r = complete(client, prompt, max_tokens=6, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == r.usage.completion_tokens
    prompt_ids = engine.tokenizer.encode(prompt)
    generated = engine.generate(prompt, max_new_tokens=6).token_ids
    logits = engine.logits(prompt_ids + generated[:-1])[len(prompt_ids) - 1:]
    expected = torch.log_softmax(logits.float(), dim=-1)
    for i, token in enumerate(generated):
        assert lp.token_logprobs[i] == pytest.approx(expected[i, token].item(), abs=1e-3)
        top = sorted(lp.top_logprobs[i].values(), reverse=True)
        assert top[0] == pytest.approx(expected[i].max().item(), abs=1e-3)
        assert lp.token_logprobs[i] == pytest.approx(top[0], abs=1e-6)   # greedy: the best
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_completion_text_offsets_are_the_tokens_positions_while_text_is_held_back(client,
                                                                                 engine):
    prompt = "The lazy dog"
    pieces = list(engine.stream(prompt, max_new_tokens=6, ignore_eos=True))
    stops = [p.text[-1] + "\x00never" for p in pieces if p.text][:16]
    r = complete(client, prompt, max_tokens=6, logprobs=0, stop=stops,
                 extra_body={"ignore_eos": True})
    assert r.choices[0].logprobs.text_offset == [p.offset for p in pieces]


def test_streamed_chat_logprobs_cover_every_token(client):
    chunks = streamed(client, client.chat.completions.create, messages=USER, max_tokens=6,
                      temperature=0.0, logprobs=True, top_logprobs=2,
                      stream_options={"include_usage": True})
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs
               for e in c.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 2 and e.logprob <= 0.0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob, abs=1e-6)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token


def test_the_same_seed_gives_the_same_sample(client):
    def sample(seed):
        r = complete(client, temperature=1.0, seed=seed, max_tokens=4, logprobs=0)
        return r.choices[0].logprobs.tokens, r.choices[0].text
    a, b, c = sample(7), sample(7), sample(8)
    assert a == b
    assert c != a


def test_a_streamed_sample_equals_the_non_streamed_one_with_its_seed(client):
    full = complete(client, temperature=0.8, top_p=0.9, seed=3, max_tokens=4,
                    extra_body={"top_k": 20})
    chunks = streamed(client, client.completions.create, prompt="The quick brown fox",
                      max_tokens=4, temperature=0.8, top_p=0.9, seed=3,
                      extra_body={"top_k": 20})
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_an_end_token_stops_generation_unless_ignore_eos(client, engine):
    prompt = "time a"      # the test checkpoint's greedy answer to it ends in <|endoftext|>
    ref = engine.generate(prompt, max_new_tokens=8)
    assert ref.finish_reason == "stop" and len(ref.token_ids) < 8, "pick another prompt"
    r = complete(client, prompt, max_tokens=8)
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(ref.token_ids)     # the end token counts
    r = complete(client, prompt, max_tokens=8, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8


def test_max_tokens_zero_generates_nothing(client):
    r = complete(client, max_tokens=0)
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 0 and r.usage.prompt_tokens > 0


def _chat_leaving(engine, room):
    """A user message whose chat prompt (no thinking) leaves ``room`` tokens of the context."""
    words = []
    while True:
        messages = [{"role": "user", "content": " ".join(words)}]
        prompt = engine.tokenizer.apply_chat_template(messages, enable_thinking=False)
        if MAX_SEQ_LEN - len(engine.tokenizer.encode(prompt)) <= room:
            return messages
        words.append("fox")


def test_max_tokens_may_fill_the_context_exactly_as_the_engine_does(client, engine):
    ids = (engine.tokenizer.encode("The quick brown fox jumps. ") * MAX_SEQ_LEN)[:MAX_SEQ_LEN - 6]
    ref = engine.generate(ids, max_new_tokens=MAX_SEQ_LEN, ignore_eos=True)
    assert len(ref.token_ids) == 6 and ref.finish_reason == "length"
    r = complete(client, ids, max_tokens=6, extra_body={"ignore_eos": True})
    assert r.choices[0].text == ref.text and r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == MAX_SEQ_LEN
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, ids, max_tokens=7, extra_body={"ignore_eos": True})
    assert info.value.body["code"] == "context_length_exceeded"
    assert "ask for at most 6" in info.value.body["message"]


def test_a_prompt_that_fills_the_context_is_answered_with_nothing_as_the_engine_does(
        client, engine):
    ids = (engine.tokenizer.encode("The quick brown fox jumps. ") * MAX_SEQ_LEN)[:MAX_SEQ_LEN]
    ref = engine.generate(ids, max_new_tokens=8)
    assert (ref.text, ref.finish_reason, ref.prompt_tokens) == ("", "length", MAX_SEQ_LEN)
    r = complete(client, ids, max_tokens=0)
    assert (r.choices[0].text, r.choices[0].finish_reason) == ("", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (MAX_SEQ_LEN, 0)
    messages = _chat_leaving(engine, 0)
    prompt = engine.tokenizer.apply_chat_template(messages, enable_thinking=False)
    assert len(engine.tokenizer.encode(prompt)) == MAX_SEQ_LEN
    r = client.chat.completions.create(model="tiny", messages=messages, extra_body=NO_THINKING)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("", "length")
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (MAX_SEQ_LEN, 0)
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, ids + ids[:1], max_tokens=0)
    assert info.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_without_max_tokens_generates_what_the_engine_would(client, engine, stream):
    messages = _chat_leaving(engine, 5)
    ref = engine.chat(messages, max_new_tokens=MAX_SEQ_LEN, ignore_eos=True)
    kw = dict(messages=messages, temperature=0.0, extra_body={"ignore_eos": True, **NO_THINKING})
    if stream:
        chunks = streamed(client, client.chat.completions.create,
                          stream_options={"include_usage": True}, **kw)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish, usage = chunks[-2].choices[0].finish_reason, chunks[-1].usage
    else:
        r = client.chat.completions.create(model="tiny", **kw)
        text, finish, usage = r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    assert (text, finish) == (ref.text, ref.finish_reason) == (ref.text, "length")
    assert usage.completion_tokens == len(ref.token_ids)
    assert usage.total_tokens == MAX_SEQ_LEN


def test_serve_seed_makes_a_run_of_seedless_requests_repeat_and_each_differ(tmp_path_factory,
                                                                             client):
    def sample(c, **kw):
        r = complete(c, temperature=1.0, max_tokens=8, logprobs=0, **kw)
        return r.choices[0].logprobs.tokens
    runs = []
    for run in range(2):
        with cpu_server(tmp_path_factory, f"server_seed{run}", MAX_SEQ_LEN, "--seed", "7") as s:
            c = s.client()
            runs.append([sample(c), sample(c), sample(c, seed=8)])
    (first, second, own), again = runs
    assert again == runs[0]                       # the same sequence of requests, the same samples
    assert first != second                        # as vLLM's --seed: requests still differ
    assert own == sample(client, seed=8)          # a request's own seed wins


def test_without_allowed_origins_a_browser_page_of_another_origin_gets_no_allow_header(server):
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_serve_seeds_s_and_minus_s_draw_different_request_seeds():
    from grout.server import create_app

    def first_draw(seed):
        return create_app(lambda: None, "m", default_seed=seed).state.grout.seeds.randrange(2**63)
    assert first_draw(7) != first_draw(-7) and first_draw(7) == first_draw(7)
