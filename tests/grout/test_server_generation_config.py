"""grout serve's sampling defaults: a request that leaves temperature, top_p or top_k out
takes the checkpoint's generation_config.json value (as vLLM does), unless the server runs
with --generation-config none; a value the request sends always wins."""
import json
import shutil

import pytest

from server_process import ServerProcess, cpu_engine, shared_checkpoint

MAX_SEQ_LEN = 128
PROMPT = "The quick brown fox"
SAMPLED = {"temperature": 1.0, "seed": 5, "max_tokens": 12}


def _server(tmp_path_factory, name: str, *extra: str) -> ServerProcess:
    """A server for a copy of the test checkpoint whose generation_config.json sets top_k 1
    (every sample is the argmax)."""
    directory = tmp_path_factory.mktemp(name) / "checkpoint"
    shutil.copytree(shared_checkpoint(tmp_path_factory), directory)
    path = directory / "generation_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "top_k": 1}))
    return ServerProcess(str(directory), directory.parent / "serve.log", "--device", "cpu",
                         "--dtype", "float32", "--max-seq-len", str(MAX_SEQ_LEN),
                         "--served-model-name", "tiny", *extra)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return cpu_engine(tmp_path_factory, MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def texts(engine):
    """The engine's greedy and top-k-free sampled texts for the requests below (they differ)."""
    greedy = engine.generate(PROMPT, max_new_tokens=12).text
    sampled = engine.generate(PROMPT, max_new_tokens=12, temperature=1.0, seed=5).text
    assert greedy != sampled, "the seed must sample off the argmax for these tests to tell"
    return {"greedy": greedy, "sampled": sampled}


@pytest.fixture(scope="module")
def auto_server(tmp_path_factory):
    with _server(tmp_path_factory, "generation_config_auto") as s:
        yield s


def complete(server, **extra_body):
    r = server.client().completions.create(model="tiny", prompt=PROMPT, extra_body=extra_body,
                                           **SAMPLED)
    return r.choices[0].text


def test_a_request_without_top_k_samples_with_generation_configs(auto_server, texts):
    assert complete(auto_server) == texts["greedy"]


def test_a_top_k_the_request_sends_wins_over_generation_configs(auto_server, texts):
    assert complete(auto_server, top_k=0) == texts["sampled"]


def test_a_null_top_k_is_left_out_and_takes_generation_configs(auto_server, texts):
    assert complete(auto_server, top_k=None) == texts["greedy"]


def test_the_server_log_says_which_defaults_requests_take(auto_server):
    auto_server.wait_for_log(r"generation_config\.json's top_k=1")


def test_generation_config_none_keeps_the_openai_defaults(tmp_path_factory, texts):
    with _server(tmp_path_factory, "generation_config_none", "--generation-config",
                 "none") as server:
        assert complete(server) == texts["sampled"]
        assert "generation_config.json's" not in server.log()
