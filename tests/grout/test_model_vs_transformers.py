"""grout's Qwen3 forward on the CPU executor against transformers' Qwen3ForCausalLM in fp32:
prefill logits, greedy generation, the recorded decode graph against eager steps, and the
torch.matmul (cublas) comparison path."""
import pytest
import torch

import grout

from conftest import SPECS

NAMES = sorted(SPECS)
PROMPT = [3, 17, 250, 41, 99, 5, 128, 77, 200]


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def hf_greedy(model, ids, n):
    t = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("name", NAMES)
def test_prefill_logits_match_transformers_fp32(name, checkpoints, engines):
    _, model = checkpoints[name]
    got = engines[name].logits(PROMPT)
    want = hf_logits(model, PROMPT)
    assert got.dtype == torch.float32 and got.shape == want.shape == (len(PROMPT),
                                                                      model.config.vocab_size)
    assert (got - want).abs().max().item() < 2e-3


@pytest.mark.parametrize("name", NAMES)
def test_greedy_generation_equals_transformers_generate(name, checkpoints, engines):
    _, model = checkpoints[name]
    c = engines[name].generate(PROMPT, max_new_tokens=10)
    assert c.token_ids == hf_greedy(model, PROMPT, 10)
    assert c.finish_reason == "length" and c.prompt_tokens == len(PROMPT)
    assert len(set(c.token_ids)) > 2            # the random model does not just repeat


def test_the_recorded_decode_graph_gives_the_tokens_of_eager_steps(engines):
    eng = engines["untied"]
    runner = eng.runner
    params, key = grout.SamplingParams().tensors(eng.device)
    import safetile as st
    with st.backend("interpret"):
        first = runner.begin(PROMPT, params, key, greedy=True)
        graph = [first] + [runner.step(greedy=True) for _ in range(6)]
        assert runner.graphs[(True, True)] is not None
        first = runner.begin(PROMPT, params, key, greedy=True)
        eager = [first] + [runner.step_eager(greedy=True) for _ in range(6)]
    assert graph == eager


def test_decode_logits_follow_transformers_over_many_positions(checkpoints, engines):
    """Teacher-forced: after each graph-replayed step the device logits match HF's at that
    position (the cache, positions and rope stay right as the graph replays)."""
    eng, (_, model) = engines["tied"], checkpoints["tied"]
    c = eng.generate(PROMPT, max_new_tokens=12)
    seq = PROMPT + c.token_ids
    want = hf_logits(model, seq[:-1])
    got = eng.runner.buf.logits.to_torch()
    assert (got - want[-1]).abs().max().item() < 2e-3


def test_the_cublas_path_matches_transformers(checkpoints):
    path, model = checkpoints["untied"]
    eng = grout.load(path, device="cpu", dtype="float32", max_seq_len=64, gemm="cublas",
                     progress=False)
    assert (eng.logits(PROMPT) - hf_logits(model, PROMPT)).abs().max().item() < 2e-3
    assert eng.generate(PROMPT, max_new_tokens=5).token_ids == hf_greedy(model, PROMPT, 5)
    assert not eng.runner.graphable()


def test_a_bfloat16_engine_on_the_cpu_tracks_the_fp32_reference(checkpoints):
    """bf16 weights and activations (rounded where transformers rounds): the logits stay
    within bf16's error of the fp32 model (a few bf16 ulps at the logits' magnitude)."""
    path, model = checkpoints["tied"]
    eng = grout.load(path, device="cpu", dtype="bfloat16", max_seq_len=32, progress=False)
    assert eng.dtype == "bfloat16"
    got, want = eng.logits(PROMPT[:5]), hf_logits(model, PROMPT[:5])
    err = (got - want).abs().max().item()
    assert err < 0.05 * want.abs().max().item()


def test_partial_rotary_factor_is_ignored_as_transformers_qwen3_ignores_it(checkpoints, tmp_path):
    import json
    import shutil
    from transformers import Qwen3ForCausalLM
    shutil.copytree(checkpoints["tied"][0], tmp_path / "tied")
    cfg = json.loads((tmp_path / "tied" / "config.json").read_text())
    cfg["partial_rotary_factor"] = 0.5
    cfg["rope_parameters"]["partial_rotary_factor"] = 0.5
    (tmp_path / "tied" / "config.json").write_text(json.dumps(cfg))
    model = Qwen3ForCausalLM.from_pretrained(tmp_path / "tied", dtype=torch.float32).eval()
    eng = grout.load(tmp_path / "tied", device="cpu", dtype="float32", max_seq_len=32,
                     progress=False)
    assert (eng.logits(PROMPT) - hf_logits(model, PROMPT)).abs().max().item() < 2e-3
