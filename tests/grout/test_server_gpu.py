"""grout serve on the GPU: a qwen3-0.6b-shaped engine served from its worker thread (graphs
recorded and replayed there), checked against the same engine in this process."""
import pytest

import grout
from server_process import ServerProcess

pytestmark = pytest.mark.gpu
MODEL, MAX_SEQ_LEN = "qwen3-0.6b", 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("server_gpu") / "serve.log"
    with ServerProcess(MODEL, log, "--device", "cuda", "--max-seq-len", str(MAX_SEQ_LEN),
                       "--no-progress") as s:
        yield s


@pytest.fixture(scope="module")
def engine():
    return grout.load(MODEL, device="cuda", max_seq_len=MAX_SEQ_LEN, progress=False)


def test_greedy_completion_on_the_gpu_is_the_engines(server, engine):
    prompt = engine.tokenizer.encode("The capital of France is")
    ref = engine.generate(prompt, max_new_tokens=32)
    client = server.client()
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32,
                                     temperature=0.0, logprobs=5)
    assert full.choices[0].text == ref.text
    assert full.usage.completion_tokens == len(ref.token_ids)
    assert all(len(top) >= 1 for top in full.choices[0].logprobs.top_logprobs)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=32,
                                            temperature=0.0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ref.text


def test_a_seeded_sample_on_the_gpu_repeats(server):
    client = server.client()

    def sample():
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=16,
            temperature=0.8, top_p=0.9, seed=5, extra_body={"top_k": 40}
        ).choices[0].message.content
    assert sample() == sample()
