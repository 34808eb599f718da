"""grout serve under bad input and faults: OpenAI-shaped 400s and 500s, a client that walks
away mid-stream, a checkpoint that cannot load; after each, the next request is served."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from server_process import (SRC, ServerProcess, build_checkpoint, cpu_server, free_port,
                            shared_checkpoint)

MAX_SEQ_LEN = 128
FAULT = "x-grout-fault"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_errors", MAX_SEQ_LEN, "--fault-injection") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def assert_openai_error(body, status_type="invalid_request_error"):
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == status_type and body["error"]["message"]


def assert_still_serving(client):
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=1, temperature=0.0)
    assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("body", [
    b'{"prompt": "Hello", "max_tokens": 4', b"not json at all", b"\xff\xfe", b"[1, 2, 3]",
    b"[" * 100_000 + b"]" * 100_000, b'{"prompt": "Hello", "max_tokens": ' + b"9" * 5000 + b"}",
], ids=["truncated", "text", "not-utf8", "array", "nested-too-deep", "5000-digit-integer"])
def test_malformed_json_is_a_400(server, client, body):
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert_openai_error(r.json())
    assert_still_serving(client)


@pytest.mark.parametrize("path, body, param, at", [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 1}', "prompt", 1),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}, '
                             '{"role": "user", "content": "\\udcff"}]}',
     "messages[1].content", 0),
], ids=["prompt", "chat"])
def test_a_lone_surrogate_in_the_text_is_a_400_naming_the_field_and_its_character(
        server, client, path, body, param, at):
    r = httpx.post(f"{server.url}{path}", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert_openai_error(r.json())
    message = r.json()["error"]["message"]
    assert r.json()["error"]["param"] == param and message.startswith(f"{param}: ")
    assert f"character {at} is a lone surrogate" in message and "come in pairs" in message
    assert_still_serving(client)


@pytest.mark.parametrize("body, param, status", [
    ('{"model": "\\ud800", "prompt": "hi", "max_tokens": 1}', "model", 404),
    ('{"prompt": "hi", "max_tokens": 1, "x\\ud800": 1}', "x\\ud800", 400),
], ids=["model", "field name"])
def test_an_error_that_quotes_a_lone_surrogate_escapes_it(server, client, body, param, status):
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == status
    assert_openai_error(r.json())
    assert r.json()["error"]["param"] == param and "\\ud800" in r.json()["error"]["message"]
    assert_still_serving(client)


def test_a_body_over_the_size_limit_is_a_413(server, client):
    from grout.server import MAX_REQUEST_BYTES
    body = json.dumps({"prompt": "x" * MAX_REQUEST_BYTES, "max_tokens": 1}).encode()
    r = httpx.post(f"{server.url}/v1/completions", content=body,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert_openai_error(r.json())
    assert str(MAX_REQUEST_BYTES) in r.json()["error"]["message"]
    assert_still_serving(client)


def test_a_huge_prompt_being_tokenized_holds_up_no_other_request(server, client):
    """A prompt just under the body limit takes seconds to tokenize and is then refused;
    a small request sent meanwhile is answered first, without waiting for it."""
    from grout.server import MAX_REQUEST_BYTES
    huge = {"model": "tiny", "prompt": "fox " * (MAX_REQUEST_BYTES // 5), "max_tokens": 1}
    done = {}

    def send_huge():
        r = httpx.post(f"{server.url}/v1/completions", json=huge, timeout=120)
        done["huge"] = (time.monotonic(), r.status_code, r.json()["error"]["code"])
    thread = threading.Thread(target=send_huge)
    thread.start()
    time.sleep(0.3)
    assert_still_serving(client)
    answered = time.monotonic()
    thread.join()
    assert done["huge"][1:] == (400, "context_length_exceeded")
    assert answered < done["huge"][0], "the small request waited for the huge prompt"


def test_a_wrong_method_is_a_405_that_names_the_allowed_ones(server):
    r = httpx.get(f"{server.url}/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert_openai_error(r.json())


def test_a_client_that_goes_away_while_sending_its_body_is_one_info_line(server, client):
    before = len(server.log())
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n"
                     b'{"prompt": "Hel')
        time.sleep(0.2)
    server.wait_for_log(r"INFO grout\.server: a client went away while sending its request")
    assert_still_serving(client)
    logged = server.log()[before:]
    assert "Traceback" not in logged and "ClientDisconnect" not in logged


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"model": "tiny", "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"model": "tiny", "max_tokens": 2}, "messages"),
])
def test_a_missing_prompt_or_messages_is_a_400(server, client, path, body, param):
    r = httpx.post(f"{server.url}{path}", json=body)
    assert r.status_code == 400
    assert_openai_error(r.json())
    assert r.json()["error"]["param"] == param
    assert_still_serving(client)


BAD_REQUESTS = {
    "negative max_tokens": ({"max_tokens": -1}, "max_tokens"),
    "top_p zero": ({"top_p": 0.0}, "top_p"),
    "top_p above one": ({"top_p": 1.5}, "top_p"),
    "negative temperature": ({"temperature": -1.0}, "temperature"),
    "n above one": ({"n": 2}, "n"),
    "best_of": ({"best_of": 2}, "best_of"),
    "echo": ({"echo": True}, "echo"),
    "penalty": ({"frequency_penalty": 0.5}, "frequency_penalty"),
    "logprobs above five": ({"logprobs": 6}, "logprobs"),
    "unknown field": ({"extra_body": {"mirostat": 2}}, "mirostat"),
    "prompt too long": ({"prompt": "fox " * 400}, "prompt"),
    "prompt plus max_tokens too long": ({"max_tokens": MAX_SEQ_LEN}, "max_tokens"),
    "token id outside the vocabulary": ({"prompt": [1, 2, 10 ** 6]}, "prompt"),
    "max_tokens past the context by 300 digits": ({"max_tokens": 1e300}, "max_tokens"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_a_bad_completion_request_is_a_400_and_the_next_is_served(client, case):
    fields, param = BAD_REQUESTS[case]
    args = {"model": "tiny", "prompt": "Hello", "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(**args)
    assert info.value.status_code == 400
    assert_openai_error(info.value.response.json())
    assert info.value.body["param"] == param
    assert len(info.value.body["message"]) < 300     # a value it quotes is cut short
    assert_still_serving(client)


def test_an_unknown_model_is_a_404_and_the_next_is_served(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4o", prompt="Hello", max_tokens=4)
    assert_openai_error(info.value.response.json())
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    assert_still_serving(client)


def test_an_unknown_model_id_is_the_same_404_as_an_unknown_model_in_a_request(client):
    with pytest.raises(openai.NotFoundError) as retrieved:
        client.models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError) as requested:
        client.completions.create(model="gpt-4o", prompt="Hello", max_tokens=4)
    assert_openai_error(retrieved.value.response.json())
    fields = ("type", "code", "param")
    assert [retrieved.value.body[f] for f in fields] == \
        [requested.value.body[f] for f in fields] == ["invalid_request_error", "model_not_found",
                                                      "model"]


@pytest.mark.parametrize("fields, param", [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"messages": [{"role": "user", "content": "fox " * 400}]}, "messages"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "system"}, {"role": "user", "content": "Hi"}]}, "messages[0].content"),
    ({"max_completion_tokens": MAX_SEQ_LEN}, "max_completion_tokens"),
], ids=["unknown role", "top_logprobs without logprobs", "tools", "too long", "null content",
        "no content", "max_completion_tokens past the context"])
def test_a_bad_chat_request_is_a_400_and_the_next_is_served(client, fields, param):
    args = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**args)
    assert info.value.body["param"] == param
    assert_still_serving(client)


def test_an_unknown_route_is_an_openai_shaped_404(server):
    r = httpx.get(f"{server.url}/v1/engines")
    assert r.status_code == 404
    assert_openai_error(r.json(), "invalid_request_error")
    assert r.json()["error"]["code"] is None            # not model_not_found


@pytest.mark.parametrize("path", ["/v1/models/" + "x" * 20_000, "/v1/engines/" + "y" * 20_000],
                         ids=["model id", "route"])
def test_a_404_cuts_short_the_path_it_quotes(server, path):
    r = httpx.get(f"{server.url}{path}")
    assert r.status_code == 404
    assert_openai_error(r.json(), "invalid_request_error")
    assert len(r.json()["error"]["message"]) < 300


def test_an_internal_error_fails_only_its_own_request(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model="tiny", prompt="Hello", max_tokens=8,
                                  extra_headers={FAULT: "2"})
    assert info.value.status_code == 500
    assert_openai_error(info.value.response.json(), "server_error")
    assert_still_serving(client)


def test_an_internal_error_mid_stream_ends_that_stream_with_an_error(client):
    stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=8, stream=True,
                                       temperature=0.0, extra_headers={FAULT: "3"})
    texts = []
    with pytest.raises(openai.APIError, match="fault injected"):
        for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert len(texts) <= 3
    assert_still_serving(client)


def test_a_client_that_disconnects_stops_its_generation_within_one_decode_chunk(server, client):
    """The chunk of decode steps in flight finishes (at most decode_chunk = 8 tokens) and no
    other starts; the log counts every token decoded, those of the chunk dropped included."""
    long = MAX_SEQ_LEN // 2
    stream = client.completions.create(model="tiny", prompt="Hello", max_tokens=long,
                                       stream=True, temperature=0.0,
                                       extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    m = server.wait_for_log(r"(cmpl-\w+): cancelled \(the client closed the connection\) "
                            r"after (\d+) tokens \((\d+) decoded, (\d+) after the cancel\)")
    sent, decoded, after = int(m.group(2)), int(m.group(3)), int(m.group(4))
    assert sent <= decoded < long
    assert after <= 8 and decoded - sent <= 8
    started = time.monotonic()
    assert_still_serving(client)
    assert time.monotonic() - started < 30


def damaged_server(tmp_path_factory, name, damage) -> ServerProcess:
    """A server (not started) for a copy of the test checkpoint that ``damage(directory)``
    changed."""
    root = tmp_path_factory.mktemp(name)
    shutil.copytree(shared_checkpoint(tmp_path_factory), root / "checkpoint")
    damage(root / "checkpoint")
    return ServerProcess(str(root / "checkpoint"), root / "serve.log", "--device", "cpu",
                         "--dtype", "float32", "--max-seq-len", "64",
                         "--served-model-name", "tiny")


@pytest.fixture(scope="module")
def nan_server(tmp_path_factory):
    """A server for a checkpoint with one NaN weight (an embedding row, so one logit, and
    with it every logprob, is NaN)."""
    def nan_weight(directory):
        from safetensors.torch import load_file, save_file
        tensors = load_file(directory / "model.safetensors")
        tensors["model.embed_tokens.weight"][7, 0] = float("nan")
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    with damaged_server(tmp_path_factory, "server_nan", nan_weight) as s:
        yield s


def test_nan_logprobs_are_null_in_a_response(nan_server):
    r = httpx.post(f"{nan_server.url}/v1/completions", json={
        "model": "tiny", "prompt": "Hello", "max_tokens": 3, "temperature": 0, "logprobs": 2,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [None] * 3
    assert all(v is None for top in lp["top_logprobs"] for v in top.values())


def test_nan_logprobs_are_null_in_a_stream_of_valid_json(nan_server):
    def strict(constant):
        raise AssertionError(f"{constant} is not JSON")
    with httpx.stream("POST", f"{nan_server.url}/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
            "temperature": 0, "logprobs": True, "top_logprobs": 1, "stream": True,
            "ignore_eos": True}) as r:
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e, parse_constant=strict) for e in events[:-1]]
    entries = [e for c in chunks if c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
    assert len(entries) == 3
    assert all(e["logprob"] is None and e["top_logprobs"][0]["logprob"] is None for e in entries)


def test_a_chat_template_that_fails_on_a_request_is_a_400_naming_it(tmp_path_factory):
    def template(directory):
        (directory / "chat_template.jinja").write_text(
            "{% for m in messages %}{{ m.content.foo.bar }}{% endfor %}")
    with damaged_server(tmp_path_factory, "server_template", template) as server:
        client = server.client()
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="tiny", max_tokens=1,
                                           messages=[{"role": "user", "content": "Hi"}])
        assert info.value.body["param"] == "messages"
        assert re.search(r"chat_template\.jinja: .*UndefinedError", info.value.body["message"])
        assert_still_serving(client)


def test_a_context_shorter_than_any_text_prompt_still_loads_and_serves(tmp_path_factory):
    with cpu_server(tmp_path_factory, "server_context_2", 2) as server:
        r = server.client().completions.create(model="tiny", prompt=[5], max_tokens=1,
                                               temperature=0.0)
    assert (r.choices[0].finish_reason, r.usage.total_tokens) == ("length", 2)


def test_a_model_vocabulary_smaller_than_its_tokenizers_still_loads_and_serves(
        tmp_path_factory, checkpoints):
    path, model = checkpoints["tied"]              # Qwen's tokenizer, a 384-token model
    assert (path / "tokenizer.json").exists() is False and model.config.vocab_size == 384
    with ServerProcess(str(path), tmp_path_factory.mktemp("server_vocab") / "serve.log",
                       "--device", "cpu", "--dtype", "float32", "--max-seq-len", "16",
                       "--served-model-name", "tiny") as server:
        r = server.client().completions.create(model="tiny", prompt=[5], max_tokens=2,
                                               temperature=0.0)
    assert r.usage.completion_tokens == 2


def test_logprobs_past_the_models_vocabulary_are_a_400_naming_the_parameter(tmp_path):
    build_checkpoint(tmp_path / "checkpoint", model_vocab=4)
    with ServerProcess(str(tmp_path / "checkpoint"), tmp_path / "serve.log", "--device", "cpu",
                       "--dtype", "float32", "--max-seq-len", "16",
                       "--served-model-name", "tiny") as server:
        client = server.client()
        with pytest.raises(openai.BadRequestError) as completion:
            client.completions.create(model="tiny", prompt=[1], max_tokens=1, logprobs=5)
        with pytest.raises(openai.BadRequestError) as chat:
            client.chat.completions.create(model="tiny", max_tokens=1, logprobs=True,
                                           top_logprobs=20,
                                           messages=[{"role": "user", "content": "Hi"}])
        r = client.completions.create(model="tiny", prompt=[1], max_tokens=1, logprobs=4)
    assert completion.value.body["param"] == "logprobs"
    assert chat.value.body["param"] == "top_logprobs"
    assert "vocabulary of 4 tokens" in chat.value.body["message"]
    assert len(r.choices[0].logprobs.top_logprobs[0]) == 4


def test_a_checkpoint_that_cannot_load_makes_serve_exit_with_its_error(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    r = subprocess.run([sys.executable, "-m", "grout", "serve", "--model", str(missing),
                        "--device", "cpu", "--port", "0"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode != 0
    assert re.search(r"could not load .*no-such-checkpoint", r.stderr), r.stderr[-2000:]


def test_health_is_503_while_loading_and_sigterm_ends_open_streams(tmp_path_factory):
    """Its own server: /health says loading (503) before ok; SIGTERM mid-stream ends the
    generation within one decode chunk and the stream with a "shutting down" error event, and
    the process shuts down cleanly."""
    server = cpu_server(tmp_path_factory, "server_shutdown", MAX_SEQ_LEN)
    try:
        server.start()
        assert (503, '{"status":"loading"}') in server.health_seen
        stream = server.client().completions.create(model="tiny", prompt="Hello",
                                                    max_tokens=MAX_SEQ_LEN // 2, stream=True,
                                                    extra_body={"ignore_eos": True})
        next(iter(stream))
        server.proc.terminate()
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        # uvicorn shuts down, then re-raises the signal it caught: the exit is by SIGTERM.
        assert server.proc.wait(30) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in server.log()
        assert re.search(r"cancelled \(the server is shutting down\) after \d+ tokens "
                         r"\(\d+ decoded, [0-8] after the cancel\)", server.log())
    finally:
        server.stop()


def test_a_stop_during_a_prefill_longer_than_the_graceful_timeout_answers_503(tmp_path):
    """uvicorn cancels a request still running 5 s after Ctrl-C; a prefill cannot be
    interrupted, so the request is answered as every cancelled job is, not with a bare 500."""
    server = ServerProcess("tiny", tmp_path / "serve.log", "--device", "cpu",
                           "--max-seq-len", "4096", "--no-progress").start()
    try:
        answer = {}

        def post():       # about 9 s of prefill on the CPU executor
            answer["r"] = httpx.post(f"{server.url}/v1/completions", timeout=120,
                                     json={"prompt": "hello " * 4000, "max_tokens": 4})
        t = threading.Thread(target=post)
        t.start()
        time.sleep(2)                      # the prompt is tokenized, the prefill runs
        server.proc.send_signal(signal.SIGINT)
        t.join(120)
        r = answer["r"]
        assert r.status_code == 503, r.text
        assert r.json()["error"]["message"] == "the server is shutting down"
        assert server.proc.wait(60) == 130
    finally:
        server.stop()


def inheriting_sigint(monkeypatch, handler) -> None:
    """Start the test's servers with SIGINT ``handler`` inherited. A background job of a
    non-interactive shell inherits it ignored: uvicorn still catches it and stops, but
    re-raising it after the shutdown then does nothing."""
    import server_process

    def spawn(die=server_process._die_with_parent):
        die()
        signal.signal(signal.SIGINT, handler)
    monkeypatch.setattr(server_process, "_die_with_parent", spawn)


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN],
                         ids=["terminal", "background job"])
def test_ctrl_c_while_the_model_loads_exits_at_once(tmp_path, monkeypatch, inherited):
    # A 0.6B shape takes minutes to load and warm up on the CPU executor.
    inheriting_sigint(monkeypatch, inherited)
    server = ServerProcess("qwen3-0.6b", tmp_path / "serve.log", "--device", "cpu",
                           "--max-seq-len", "64", "--no-progress")
    server.port = free_port()
    server._spawn()
    try:
        deadline = time.monotonic() + 120
        while (503, '{"status":"loading"}') not in server.health_seen:
            assert time.monotonic() < deadline and server.proc.poll() is None, server.log()
            server.wait_healthy(0.5)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 130, server.log()[-2000:]
    finally:
        server.proc.kill()
        server.proc.wait()


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN],
                         ids=["terminal", "background job"])
def test_ctrl_c_after_loading_stops_gracefully_with_status_130(tmp_path, monkeypatch, inherited):
    inheriting_sigint(monkeypatch, inherited)
    server = ServerProcess("tiny", tmp_path / "serve.log", "--device", "cpu",
                           "--max-seq-len", "32", "--no-progress").start()
    try:
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 130, server.log()[-2000:]
        assert "Application shutdown complete" in server.log()
    finally:
        server.stop()
