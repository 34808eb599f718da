"""The fused decode step and chunked decode: the same tokens and logits as the unfused step
replayed one token at a time, and as transformers; the kernel count of a fused layer."""
import gc

import pytest
import torch

import grout
from grout import model as model_module
from grout import runner as runner_module
from safetile import ops

from test_model_vs_transformers import PROMPT, hf_logits

NAMES = ["tied", "untied"]


@pytest.fixture(scope="module")
def unfused(checkpoints):
    """name -> an engine of the unfused step, one token per host read (the reference)."""
    engines = {name: grout.load(path, device="cpu", dtype="float32", max_seq_len=64,
                                progress=False, fused=False, decode_chunk=1)
               for name, (path, _) in checkpoints.items()}
    yield engines
    engines.clear()
    gc.collect()


@pytest.fixture(scope="module")
def single(checkpoints):
    """The fused step of the "tied" checkpoint, one token per host read."""
    eng = grout.load(checkpoints["tied"][0], device="cpu", dtype="float32", max_seq_len=64,
                     progress=False, decode_chunk=1)
    yield eng
    del eng
    gc.collect()


@pytest.fixture(scope="module")
def long_cache(checkpoints):
    """Fused and unfused engines of the "untied" checkpoint whose cache is four key blocks,
    so that a long-context step splits its attention (a 64-row cache is one block)."""
    path = checkpoints["untied"][0]
    engines = [grout.load(path, device="cpu", dtype="float32", max_seq_len=256,
                          progress=False, fused=fused) for fused in (True, False)]
    assert engines[0].runner.buf.attn_ws.num_splits == 4
    yield engines
    engines.clear()
    gc.collect()


@pytest.mark.parametrize("name", NAMES)
def test_the_fused_step_gives_the_greedy_tokens_of_the_unfused_step(name, engines, unfused):
    assert engines[name].runner.fused and not unfused[name].runner.fused
    got = engines[name].generate(PROMPT, max_new_tokens=13).token_ids
    assert got == unfused[name].generate(PROMPT, max_new_tokens=13).token_ids


@pytest.mark.parametrize("name", NAMES)
def test_the_fused_step_gives_the_seeded_samples_of_the_unfused_step(name, engines, unfused):
    kw = dict(max_new_tokens=11, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    got = engines[name].generate(PROMPT, **kw).token_ids
    assert got == unfused[name].generate(PROMPT, **kw).token_ids


@pytest.mark.parametrize("name", NAMES)
def test_fused_decode_logits_match_the_unfused_step_and_transformers(name, checkpoints,
                                                                     engines, unfused):
    _, model = checkpoints[name]
    c = engines[name].generate(PROMPT, max_new_tokens=9)
    unfused[name].generate(PROMPT, max_new_tokens=9)
    fused_logits = engines[name].runner.buf.logits.to_torch()
    plain_logits = unfused[name].runner.buf.logits.to_torch()
    want = hf_logits(model, PROMPT + c.token_ids[:-1])[-1]
    assert (fused_logits - plain_logits).abs().max().item() < 1e-4
    assert (fused_logits - want).abs().max().item() < 2e-3


def test_chunked_decode_gives_the_tokens_of_single_steps(engines, single):
    eng = engines["tied"]
    assert eng.runner.max_chunk == 8 and single.runner.max_chunk == 1
    for kw in (dict(), dict(temperature=1.1, seed=3), dict(temperature=0.7, top_p=0.8, seed=5)):
        got = eng.generate(PROMPT, max_new_tokens=23, **kw).token_ids
        assert got == single.generate(PROMPT, max_new_tokens=23, **kw).token_ids
    assert {n for _, n, _ in eng.runner.chunks} >= {8, 4, 2}


def test_chunked_stream_yields_the_pieces_of_single_steps(engines, single):
    got = [(p.text, p.token_id, p.finish_reason)
           for p in engines["tied"].stream(PROMPT, max_new_tokens=10)]
    assert got == [(p.text, p.token_id, p.finish_reason)
                   for p in single.stream(PROMPT, max_new_tokens=10)]


def test_a_stop_string_inside_a_chunk_ends_the_completion_where_single_steps_end_it(
        engines, single):
    full = single.generate(PROMPT, max_new_tokens=16)
    stop = full.text[len(full.text) // 2:][:2]
    assert stop
    want = single.generate(PROMPT, max_new_tokens=16, stop=stop)
    got = engines["tied"].generate(PROMPT, max_new_tokens=16, stop=stop)
    assert (got.text, got.token_ids, got.finish_reason) == \
        (want.text, want.token_ids, want.finish_reason)


def test_a_chunk_never_runs_past_the_cache(engines, single):
    """A full context ends generation with "length"; the CPU executor raises on a write past
    the cache, so a chunk that overran would fail here."""
    prompt = (PROMPT * 10)[:53]                    # 11 positions left of 64
    got = engines["tied"].generate(prompt, max_new_tokens=40)
    want = single.generate(prompt, max_new_tokens=40)
    assert got.finish_reason == want.finish_reason == "length"
    assert got.token_ids == want.token_ids and len(got.token_ids) == 64 - 53


def test_logprobs_decode_one_step_at_a_time_with_the_same_tokens(engines, single):
    got = [(p.token_id, p.logprobs.logprob) for p in
           engines["tied"].stream(PROMPT, max_new_tokens=6, logprobs=2)]
    want = [(p.token_id, p.logprobs.logprob) for p in
            single.stream(PROMPT, max_new_tokens=6, logprobs=2)]
    assert [t for t, _ in got] == [t for t, _ in want]
    assert torch.allclose(torch.tensor([lp for _, lp in got]),
                          torch.tensor([lp for _, lp in want]), atol=1e-5)


def test_a_fused_layer_is_seven_kernels_and_six_at_a_short_context(long_cache):
    eng, plain = long_cache
    layers = eng.config.num_hidden_layers
    for e in long_cache:
        e.runner.short_attention_max = 0
    try:
        eng.generate(PROMPT, max_new_tokens=3)
        plain.generate(PROMPT, max_new_tokens=3)
        # embedding; per layer 7; lm_head with argmax (2); the cursor's advance (2)
        assert len(eng.runner.graphs[(True, False)].records) == 1 + 7 * layers + 4
        # embedding and the first norm; per layer 14; lm_head, argmax (2), the cursor (2)
        assert len(plain.runner.graphs[(True, False)].records) == 2 + 14 * layers + 5
    finally:
        for e in long_cache:
            e.runner.short_attention_max = runner_module.SHORT_ATTENTION_MAX
    eng.generate(PROMPT, max_new_tokens=3)
    # a short context attends in one kernel instead of split and merge, after the prologue
    assert len(eng.runner.graphs[(True, True)].records) == 1 + 6 * layers + 4


@pytest.fixture
def fused_short_attention(long_cache, monkeypatch):
    """The fused engine of ``long_cache`` recording its steps with the prologue and the
    short attention as one kernel (its default graphs set aside meanwhile)."""
    eng = long_cache[0]
    r = eng.runner
    monkeypatch.setattr(model_module, "FUSED_SHORT_ATTENTION", True)
    saved = r.graphs, r.chunks
    r.graphs, r.chunks = {}, {}
    yield eng
    r.graphs, r.chunks = saved


def test_the_fused_short_attention_makes_a_short_context_layer_five_kernels(
        fused_short_attention):
    eng = fused_short_attention
    eng.generate(PROMPT, max_new_tokens=3)
    layers = eng.config.num_hidden_layers
    assert len(eng.runner.graphs[(True, True)].records) == 1 + 5 * layers + 4


def test_the_fused_short_attention_gives_the_unfused_tokens(fused_short_attention, unfused):
    want = unfused["untied"].generate(PROMPT, max_new_tokens=12).token_ids
    assert fused_short_attention.generate(PROMPT, max_new_tokens=12).token_ids == want


def test_short_and_long_context_steps_give_the_same_tokens(long_cache, unfused):
    want = unfused["untied"].generate(PROMPT, max_new_tokens=12).token_ids
    eng = long_cache[0]
    start = len(PROMPT) + 1                         # the first decode step's position
    try:
        for limit in (0, start + 5):                # all long; short, then long mid-chunk
            eng.runner.short_attention_max = limit
            assert eng.generate(PROMPT, max_new_tokens=12).token_ids == want
        assert eng.runner.position == start + 10
    finally:
        eng.runner.short_attention_max = runner_module.SHORT_ATTENTION_MAX
    assert {short for _, _, short in eng.runner.chunks} == {True, False}


def test_a_chunk_never_straddles_the_short_context_limit(long_cache):
    r = long_cache[0].runner
    r.position = 20
    try:
        r.short_attention_max = 23
        assert r.chunk_size(8) == 2 and r.short(2) and not r.short(4)
        r.short_attention_max = 21
        assert r.chunk_size(8) == 1
        r.short_attention_max = 20
        assert r.chunk_size(8) == 8 and not r.short()
    finally:
        r.short_attention_max = runner_module.SHORT_ATTENTION_MAX


@pytest.mark.parametrize("chunk", [0, 3, -2, 2.0, True, 2048, 2**62])
def test_a_decode_chunk_that_is_not_a_power_of_two_is_refused(checkpoints, chunk):
    with pytest.raises(grout.RequestError, match="decode_chunk"):
        grout.load(checkpoints["tied"][0], device="cpu", dtype="float32", max_seq_len=64,
                   progress=False, decode_chunk=chunk)


def test_an_engine_from_a_models_tensors_decodes_as_one_loaded_from_its_checkpoint(
        checkpoints, engines):
    from grout.config import from_dict
    from grout.engine import from_tensors
    _, model = checkpoints["untied"]
    cfg = from_dict(model.config.to_dict(), "untied")
    eng = from_tensors(cfg, model.state_dict(), device="cpu", dtype="float32", max_seq_len=64)
    assert eng.generate(PROMPT, max_new_tokens=9).token_ids == \
        engines["untied"].generate(PROMPT, max_new_tokens=9).token_ids
    del eng
    gc.collect()


def test_tensors_missing_a_weight_are_refused_naming_it(checkpoints):
    from grout.config import from_dict
    from grout.engine import from_tensors
    _, model = checkpoints["tied"]
    tensors = dict(model.state_dict())
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(grout.CheckpointError, match="model.layers.1.mlp.up_proj.weight"):
        from_tensors(from_dict(model.config.to_dict(), "tied"), tensors, device="cpu",
                     dtype="float32", max_seq_len=64)


def test_a_cache_longer_than_one_append_tile_decodes_the_tokens_of_a_short_one(checkpoints):
    # head_dim 128: past ops.max_cache_positions(128) rows the fused prologue is two kernels
    from grout.config import from_dict
    from grout.engine import from_tensors
    _, model = checkpoints["untied"]
    cfg = from_dict(dict(model.config.to_dict(), max_position_embeddings=16384), "untied")
    long_len = ops.max_cache_positions(cfg.head_dim) + 8
    long = from_tensors(cfg, model.state_dict(), device="cpu", dtype="float32",
                        max_seq_len=long_len)
    short = from_tensors(cfg, model.state_dict(), device="cpu", dtype="float32",
                         max_seq_len=64)
    assert long.max_seq_len == long_len
    prompt = [5, 17, 42, 99]
    assert long.generate(prompt, max_new_tokens=4).token_ids == \
        short.generate(prompt, max_new_tokens=4).token_ids


def test_decode_gemvs_trigger_early_on_the_gpu_when_asked_and_never_on_the_cpu():
    from types import SimpleNamespace

    from grout.model import SafetileGemm
    lin = SimpleNamespace(w=torch.empty(6144, 2560))
    assert SafetileGemm(torch.device("cuda"), trigger_early=True).config(lin).trigger_early
    assert not SafetileGemm(torch.device("cuda")).config(lin).trigger_early
    cpu = SafetileGemm(torch.device("cpu"), trigger_early=True)
    assert not cpu.trigger_early and not cpu.config(lin).trigger_early


def test_a_cache_that_decodes_both_attention_kinds_records_both_at_first_use(long_cache):
    r = long_cache[0].runner
    saved = r.graphs, r.chunks
    r.graphs, r.chunks = {}, {}
    r.short_attention_max = 40
    try:
        r.graph(True, short=True)
        assert set(r.graphs) == {(True, True), (True, False)}
        r.chunk(True, 2, short=False)
        assert set(r.chunks) == {(True, 2, True), (True, 2, False)}
        r.short_attention_max = r.max_seq_len        # every step is short: one kind
        r.graph(False, short=True)
        assert (False, False) not in r.graphs
    finally:
        r.graphs, r.chunks = saved
        r.short_attention_max = runner_module.SHORT_ATTENTION_MAX
