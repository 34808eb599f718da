"""grout.logprobs and the engine's per-token logprobs; Tokenizer.token_bytes."""
import pytest
import torch

import grout
from grout.logprobs import from_logits
from grout.tokenizer import load_tokenizer
from server_process import build_checkpoint, cpu_engine, shared_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return shared_checkpoint(tmp_path_factory)


def test_from_logits_is_log_softmax_with_the_k_best():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    lp = from_logits(logits, 7, 3)
    want = torch.log_softmax(logits, dim=-1)
    assert lp.token_id == 7
    assert lp.logprob == pytest.approx(want[7].item(), abs=1e-6)
    values, ids = torch.topk(want, 3)
    assert lp.top_ids == tuple(ids.tolist())
    assert lp.top_logprobs == pytest.approx(values.tolist(), abs=1e-6)


def test_from_logits_with_k_zero_gives_only_the_chosen_token():
    lp = from_logits(torch.tensor([0.0, 1.0, 2.0]), 0, 0)
    assert lp.top_ids == () and lp.logprob == pytest.approx(-2.4076, abs=1e-4)


def test_token_bytes_rebuild_the_utf8_of_a_text(checkpoint):
    tok = load_tokenizer(checkpoint)
    text = "héllo ✓ wörld"
    ids = tok.encode(text)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode()
    assert tok.token_bytes(tok.token_id("<|im_end|>")) == b"<|im_end|>"
    assert tok.token_bytes(10 ** 6) == b""


def test_stream_logprobs_give_each_piece_its_tokens_distribution(tmp_path_factory):
    eng = cpu_engine(tmp_path_factory, 64)
    prompt = eng.tokenizer.encode("The quick brown fox")
    pieces = list(eng.stream(prompt, max_new_tokens=4, logprobs=2))
    tokens = [p.token_id for p in pieces]
    want = torch.log_softmax(eng.logits(prompt + tokens[:-1])[len(prompt) - 1:], dim=-1)
    for i, p in enumerate(pieces):
        assert p.logprobs.token_id == p.token_id
        assert p.logprobs.logprob == pytest.approx(want[i, p.token_id].item(), abs=1e-3)
        assert p.logprobs.top_ids[0] == p.token_id          # greedy: the best token
        assert len(p.logprobs.top_ids) == 2
    assert all(p.logprobs is None for p in eng.stream(prompt, max_new_tokens=2))
    with pytest.raises(grout.RequestError, match="logprobs"):
        eng.stream(prompt, logprobs=21)


def test_logprobs_past_the_models_vocabulary_are_a_request_error(tmp_path):
    build_checkpoint(tmp_path, model_vocab=4)
    eng = grout.load(str(tmp_path), device="cpu", dtype="float32", max_seq_len=8,
                     progress=False)
    with pytest.raises(grout.RequestError, match="logprobs is 5, more than the model's "
                                                 "vocabulary of 4 tokens"):
        eng.stream([1], max_new_tokens=1, logprobs=5)
    assert len(eng.generate([1], max_new_tokens=1, logprobs=4).logprobs[0].top_ids) == 4


def test_a_logprob_entry_holds_only_json_numbers(checkpoint):
    """-inf (a token of probability 0 in fp32) is written as OpenAI's floor, -9999.0; NaN (a
    model whose logits are NaN) as null."""
    from grout.logprobs import TokenLogprobs
    from grout.serving import token_entry
    tok = load_tokenizer(checkpoint)
    inf, nan = float("inf"), float("nan")
    entry = token_entry(tok, TokenLogprobs(5, -inf, (6, 5), (nan, -inf)), 0)
    assert entry["logprob"] == -9999.0
    assert [t["logprob"] for t in entry["top"]] == [None, -9999.0]
    assert token_entry(tok, TokenLogprobs(5, -0.5, (), ()), 0)["logprob"] == -0.5
