"""grout on the H200: a qwen3-0.6b-shaped bf16 model against transformers, graph decode against
eager decode bit for bit, seeded sampling, the cublas path, and the qwen3-4b CLI stream."""
import math
import pytest
import torch

import grout
import safetile as st

from conftest import reference_model
from grout_support import run_cli

pytestmark = pytest.mark.gpu

SHAPE_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  vocab_size=151936, tie_word_embeddings=True, rope_theta=1_000_000.0)
PROMPT = [9707, 11, 1879, 0, 358, 1079, 264, 1614, 429, 646, 3960, 13, 576, 6722, 315, 9625,
          374, 12095]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(grout bf16 engine, HF bf16 model, HF fp32 model) of one random 0.6b-shaped model."""
    fp32 = reference_model(SHAPE_0_6B, seed=1, device="cuda")
    bf16 = reference_model(SHAPE_0_6B, seed=1, device="cuda", dtype=torch.bfloat16)
    path = tmp_path_factory.mktemp("q06")
    bf16.save_pretrained(path)
    eng = grout.load(path, device="cuda", max_seq_len=256, progress=False)
    held = [eng, bf16, fp32]
    del eng, bf16, fp32
    yield held
    held.clear()                  # pytest keeps a fixture's value: drop the engine's borrows


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()


def test_bf16_prefill_logits_are_as_close_to_fp32_as_transformers_own_bf16(models):
    """Tolerance: both engines round to bf16 at the same points (projection outputs, norms,
    rope's cos/sin, the residual adds), so their distance to the fp32 model is bf16 rounding
    noise carried through 28 layers; grout may not be further from the fp32 logits than
    1.25x transformers' own bf16 error (plus 1% of the logits' scale for accumulation-order
    differences), and the two bf16 results may not differ by more than twice that error."""
    eng, hf, ref = models
    assert eng.dtype == "bfloat16"
    got, hf16, want = eng.logits(PROMPT), _logits(hf, PROMPT), _logits(ref, PROMPT)
    err_hf = (hf16 - want).abs().max().item()
    err = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print(f"max |grout - fp32| {err:.4f}, |hf bf16 - fp32| {err_hf:.4f}, scale {scale:.2f}")
    assert err <= 1.25 * err_hf + 0.01 * scale
    assert (got - hf16).abs().max().item() <= 2 * err_hf + 0.01 * scale


def test_greedy_tokens_equal_transformers_bf16_for_32_steps(models):
    """Same greedy tokens as transformers' generate in bf16. A step where the two top logits
    are closer than bf16's rounding noise (transformers' own bf16-vs-fp32 error) may go
    either way in either engine; the test then requires that it is such a near-tie."""
    eng, hf, ref = models
    ours = eng.generate(PROMPT, max_new_tokens=32).token_ids
    with torch.no_grad():
        ids = torch.tensor([PROMPT], device="cuda")
        # The attention mask is explicit: PROMPT holds token 0, which transformers would
        # otherwise take for padding and mask out.
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    theirs = theirs[0, len(PROMPT):].tolist()
    if ours != theirs:
        j = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
        prefix = PROMPT + theirs[:j]
        lg = _logits(hf, prefix)[-1]
        noise = (lg - _logits(ref, prefix)[-1]).abs().max().item()
        gap = (lg[theirs[j]] - lg[ours[j]]).item()
        assert 0.0 <= gap <= 2 * noise, (f"step {j}: grout {ours[j]}, transformers {theirs[j]}, "
                                  f"logit gap {gap:.4f} > bf16 noise {noise:.4f}")
        pytest.skip(f"near-tie at step {j} (gap {gap:.4f}, noise {noise:.4f}); {j} steps equal")
    assert len(set(ours)) > 3


def test_graph_replayed_decode_is_bit_identical_to_eager_decode(models):
    eng = models[0]
    r = eng.runner
    params, key = grout.SamplingParams().tensors(eng.device)
    with st.backend("triton"):
        graph = [r.begin(PROMPT, params, key, True)] + [r.step(True) for _ in range(16)]
        graph_logits = r.buf.logits.to_torch()
        eager = [r.begin(PROMPT, params, key, True)] + [r.step_eager(True) for _ in range(16)]
        eager_logits = r.buf.logits.to_torch()
    assert graph == eager
    assert torch.equal(graph_logits, eager_logits)


def test_seeded_sampling_on_the_gpu_repeats_and_top_k_1_is_greedy(models):
    eng = models[0]
    kw = dict(max_new_tokens=12, temperature=0.9, top_k=50, top_p=0.9)
    a = eng.generate(PROMPT, seed=7, **kw).token_ids
    assert eng.generate(PROMPT, seed=7, **kw).token_ids == a
    assert eng.generate(PROMPT, seed=8, **kw).token_ids != a
    greedy = eng.generate(PROMPT, max_new_tokens=8).token_ids
    assert eng.generate(PROMPT, max_new_tokens=8, temperature=1.0, top_p=1e-6,
                        seed=3).token_ids == greedy


def test_the_cublas_path_agrees_with_the_safetile_path(models):
    eng = models[0]
    path = eng.config.name
    cub = grout.load(path, device="cuda", max_seq_len=256, gemm="cublas", progress=False)
    a, b = eng.logits(PROMPT), cub.logits(PROMPT)
    assert (a - b).abs().max().item() < 0.05 * a.abs().max().item()


def test_grout_generate_streams_a_qwen3_4b_shaped_model():
    code, out, err = run_cli("generate", "--model", "qwen3-4b", "--prompt", "Hello",
                             "--max-new-tokens", "24", "--device", "cuda", timeout=300)
    assert code == 0, err
    assert "24 tokens" in err and out.strip()


def _decode(eng, steps: int):
    """Greedy tokens and each step's logits, one graph replay per step."""
    r = eng.runner
    params, key = grout.SamplingParams().tensors(eng.device)
    with st.backend("triton"):
        tokens = [r.begin(PROMPT, params, key, True)]
        logits = [r.buf.logits.to_torch().float().cpu()]
        for _ in range(steps):
            tokens.append(r.step(True))
            logits.append(r.buf.logits.to_torch().float().cpu())
    return tokens, logits


def test_chunked_decode_is_bit_identical_to_single_steps(models):
    eng = models[0]
    r = eng.runner
    assert r.fused and r.max_chunk == 8
    single, logits = _decode(eng, 16)
    params, key = grout.SamplingParams().tensors(eng.device)
    with st.backend("triton"):
        chunked = [r.begin(PROMPT, params, key, True)] + r.steps(True, 8) + r.steps(True, 8)
    assert chunked == single
    assert torch.equal(r.buf.logits.to_torch().float().cpu(), logits[-1])


def test_the_fused_step_follows_the_unfused_step(models):
    """The fused kernels round where the unfused chain rounds; their reductions may run in
    another order, so the logits agree to bf16 noise (two bf16 ulps at their largest
    magnitude) while the tokens agree, and the tokens agree for at least the first 8 steps."""
    eng = models[0]
    plain = grout.load(eng.config.name, device="cuda", max_seq_len=256, fused=False,
                       progress=False)
    assert eng.runner.fused and not plain.runner.fused
    ours, our_logits = _decode(eng, 16)
    theirs, their_logits = _decode(plain, 16)
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    assert agree >= 8, (ours, theirs)
    for a, b in zip(our_logits[:agree], their_logits[:agree]):
        two_ulps = 2.0 * 2.0 ** (math.floor(math.log2(b.abs().max().item())) - 7)
        assert (a - b).abs().max().item() <= two_ulps
    fused = len(eng.runner.graph(True).records)
    assert fused == 1 + 7 * eng.config.num_hidden_layers + 4


def test_early_cache_attention_follows_the_default_step(models, monkeypatch):
    """With ``model.EARLY_CACHE_ATTENTION`` the short step attends before it appends; the
    same rounding points, another reduction order: logits within two bf16 ulps while the
    tokens agree, and the tokens agree for at least the first 8 steps."""
    from grout import model as model_module
    eng = models[0]
    r = eng.runner
    theirs, their_logits = _decode(eng, 16)
    saved = r.graphs, r.chunks
    r.graphs, r.chunks = {}, {}
    monkeypatch.setattr(model_module, "EARLY_CACHE_ATTENTION", True)
    try:
        ours, our_logits = _decode(eng, 16)
        names = [rec.kernel.name for rec in r.graphs[(True, True)].records]
    finally:
        r.graphs, r.chunks = saved
    assert names.count("early_attention_kernel") == eng.config.num_hidden_layers
    agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
    assert agree >= 8, (ours, theirs)
    for a, b in zip(our_logits[:agree], their_logits[:agree]):
        two_ulps = 2.0 * 2.0 ** (math.floor(math.log2(b.abs().max().item())) - 7)
        assert (a - b).abs().max().item() <= two_ulps
