"""grout's short-context step with ``model.EARLY_CACHE_ATTENTION`` on: the attention reads
the cache before the append (``ops.qk_norm_rope_attention``, then ``ops.kv_append``). The
same tokens and logits as the default step; and, recorded as for a Hopper GPU (PDL forced
on), every launch keeps programmatic launch and the attention's cache loads stay before its
wait (the launcher finds no launch that may still run writing the cache)."""
import gc

import pytest

import grout
from grout import model as model_module
from grout.config import from_dict
from grout.engine import from_tensors
from safetile.kernel.kernel_op import MAX_RUNNING, KernelOp
from safetile.ops import host
from safetile.ops.early_attention import EARLY

from test_model_vs_transformers import PROMPT

NAMES = ["tied", "untied"]


@pytest.fixture(scope="module")
def pair(checkpoints):
    """name -> (default engine, engine that records with EARLY_CACHE_ATTENTION on); both
    fused, 256-row caches, so that steps at the prompt's positions are short."""
    engines = {name: tuple(grout.load(path, device="cpu", dtype="float32", max_seq_len=256,
                                      progress=False) for _ in range(2))
               for name, (path, _) in checkpoints.items()}
    yield engines
    engines.clear()
    gc.collect()


def generate(eng, early: bool, **kw):
    """``eng.generate(PROMPT, **kw)`` with the step recorded under ``early``."""
    was = model_module.EARLY_CACHE_ATTENTION
    model_module.EARLY_CACHE_ATTENTION = early
    try:
        return eng.generate(PROMPT, **kw)
    finally:
        model_module.EARLY_CACHE_ATTENTION = was


def kernel_names(eng) -> list:
    return [rec.kernel.name for g in eng.runner.graphs.values() for rec in g.records
            if isinstance(rec, KernelOp)]


@pytest.mark.parametrize("name", NAMES)
def test_early_cache_attention_gives_the_default_greedy_tokens_and_logits(name, pair):
    plain, early = pair[name]
    want = generate(plain, False, max_new_tokens=13)
    got = generate(early, True, max_new_tokens=13)
    assert "early_attention_kernel" in kernel_names(early)
    assert "early_attention_kernel" not in kernel_names(plain)
    assert got.token_ids == want.token_ids
    diff = early.runner.buf.logits.to_torch() - plain.runner.buf.logits.to_torch()
    assert diff.abs().max().item() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_early_cache_attention_gives_the_default_seeded_samples(name, pair):
    plain, early = pair[name]
    kw = dict(max_new_tokens=11, temperature=0.9, top_k=50, top_p=0.95, seed=7)
    assert generate(early, True, **kw).token_ids == generate(plain, False, **kw).token_ids


def test_a_short_layer_attends_then_appends_in_six_kernels(pair):
    _, early = pair["untied"]
    generate(early, True, max_new_tokens=3)
    records = [rec for rec in early.runner.graphs[(True, True)].records
               if isinstance(rec, KernelOp)]
    layers = early.config.num_hidden_layers
    # embedding; per layer 6; lm_head with argmax (2); the cursor's advance (2)
    assert len(records) == 1 + 6 * layers + 4
    names = [rec.kernel.name for rec in records]
    at = [i for i, n in enumerate(names) if n == "early_attention_kernel"]
    assert len(at) == layers
    assert all(names[i + 1] == "kv_append_kernel" for i in at)
    assert "qk_norm_rope_append_kernel" not in names and "decode_whole_kernel" not in names


@pytest.fixture
def gpu_short_step(checkpoints, monkeypatch):
    """The kernel launches of the short step recorded with EARLY_CACHE_ATTENTION on, by an
    engine configured as on an H200 with early triggers (PDL forced on)."""
    monkeypatch.setattr(host, "pdl_available", lambda: True)
    monkeypatch.setattr(model_module, "EARLY_CACHE_ATTENTION", True)
    _, model = checkpoints["untied"]
    cfg = from_dict(dict(model.config.to_dict(), max_position_embeddings=1024), "untied")
    eng = from_tensors(cfg, model.state_dict(), device="cpu", dtype="float32",
                       max_seq_len=512)
    r = eng.runner
    r.gemm.cpu, r.gemm.trigger_early = False, True     # the GPU's gemv configs and signals
    r.buf.fuse_head(r.w.lm_head, r.gemm)
    records = [rec for rec in r.graph(True, True).records if isinstance(rec, KernelOp)]
    yield records
    records.clear()
    del eng, r
    gc.collect()


def test_every_launch_of_the_early_attention_step_but_its_first_keeps_programmatic_launch(
        gpu_short_step):
    assert [rec.kernel.name for rec in gpu_short_step if not rec.kernel.opts.get("pdl")] == []
    assert [i for i, rec in enumerate(gpu_short_step) if rec.serial] == [0]   # a graph's first
    assert all(len(rec._running) <= MAX_RUNNING for rec in gpu_short_step)


def test_the_early_attention_launches_keep_their_cache_loads_before_the_wait(gpu_short_step):
    attention = [rec for rec in gpu_short_step if rec.kernel.name == "early_attention_kernel"]
    assert attention
    for rec in attention:
        assert rec.kernel.opts.get("pdl") and not rec.serial
        assert set(rec.kernel.opts["early"]) == set(EARLY) >= {"k_cache", "v_cache"}
        assert not rec.kernel.opts.get("trigger_early")
