"""Prefill through a recorded graph of the prompt's length bucket (runner.PrefillGraph): the
same first token, logits and cache as the prefill run op by op."""
import pytest
import torch

import grout
import safetile as st
from grout.runner import prefill_bucket
from grout.sampler import SamplingParams


@pytest.fixture(scope="module")
def pair(checkpoints):
    """(graphed, op by op): two float32 engines of the untied checkpoint."""
    path, _ = checkpoints["untied"]
    graphed, eager = (grout.load(path, device="cpu", dtype="float32", max_seq_len=64,
                                 progress=False) for _ in range(2))
    graphed.runner.prefill_graph_max = 64
    eager.runner.prefill_graph_max = 0
    return graphed, eager


def begin(eng, ids):
    params, key = SamplingParams().tensors(eng.device)
    with st.backend(eng.backend):
        token = eng.runner.begin(ids, params, key, greedy=True)
    return token, eng.runner.buf.logits.to_torch().clone()


def test_buckets_are_powers_of_two_and_their_one_and_a_half_multiples():
    assert [prefill_bucket(s) for s in (1, 16, 17, 24, 25, 33, 48, 49, 1000, 1024, 1025)] == \
        [16, 16, 24, 24, 32, 48, 48, 64, 1024, 1024, 1536]


@pytest.mark.parametrize("length", [1, 5, 16, 17, 40])
def test_a_graphed_prefill_gives_the_first_token_and_logits_of_the_op_by_op_one(pair, length):
    graphed, eager = pair
    ids = [(7 * i + 3) % 300 for i in range(length)]
    token, logits = begin(graphed, ids)
    ref_token, ref_logits = begin(eager, ids)
    assert token == ref_token
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert prefill_bucket(length) in graphed.runner.prefills


def test_decoding_after_a_graphed_prefill_gives_the_tokens_of_the_op_by_op_one(pair):
    graphed, eager = pair
    prompt = [11, 250, 7, 99, 3, 180, 42]            # bucket 16: nine padded rows
    assert graphed.generate(prompt, max_new_tokens=8).token_ids == \
        eager.generate(prompt, max_new_tokens=8).token_ids


def test_prompts_of_one_bucket_replay_one_recorded_graph(pair):
    graphed, _ = pair
    begin(graphed, list(range(10, 30)))
    g = graphed.runner.prefills[24].graph
    begin(graphed, list(range(40, 62)))
    assert graphed.runner.prefills[24].graph is g


def test_a_prompt_whose_bucket_passes_the_cache_is_prefilled_op_by_op(checkpoints):
    path, _ = checkpoints["untied"]
    eng = grout.load(path, device="cpu", dtype="float32", max_seq_len=40, progress=False)
    eng.runner.prefill_graph_max = 40
    begin(eng, list(range(33)))                      # bucket 48 > 40 positions
    assert eng.runner.prefills == {}
