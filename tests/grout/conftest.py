"""Tiny random Qwen3 checkpoints built with transformers (the reference), once per session.

Each is a ``Qwen3ForCausalLM`` with its weights redrawn at a scale where every layer moves
the residual stream (transformers' own init, std 0.02, leaves a tied embedding dominant and
the greedy output a repetition of the prompt's last token), saved with ``save_pretrained``. Between them they
cover tied and untied embeddings, GQA groups of 2 and 3, head_dim 64 and 128, and a sharded
checkpoint.
"""
import gc
import shutil

import pytest
import torch

SPECS = {
    # tied, head_dim 64, GQA group 2 (q width 256 != hidden 64), one file
    "tied": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=384,
                 tie_word_embeddings=True),
    # untied, head_dim 128, GQA group 3, sharded into several files
    "untied": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                   num_attention_heads=6, num_key_value_heads=2, head_dim=128, vocab_size=320,
                   tie_word_embeddings=False, rope_theta=1_000_000.0, shard="60KB"),
}


def reference_model(spec: dict, seed: int = 0, device="cpu", dtype=torch.float32):
    """A Qwen3ForCausalLM of ``spec`` with well-conditioned random weights (drawn in fp32,
    then rounded to ``dtype``). A bf16 model is built in bf16, not converted: converting
    would round the rotary inv_freq buffer, which transformers keeps in fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    spec = dict(spec)
    spec.pop("shard", None)
    theta = spec.pop("rope_theta", 10_000.0)
    cfg = Qwen3Config(max_position_embeddings=256, rope_parameters={"rope_type": "default",
                                                                     "rope_theta": theta},
                      **spec)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(cfg, dtype=dtype).eval()
    g = torch.Generator(device=device).manual_seed(seed)
    # A tied embedding is also the lm_head: drawn small, so a token's own logit (its
    # embedding, still in the residual stream of a 2-layer model) does not dominate.
    embed = 0.5 if cfg.tie_word_embeddings else 2.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                w = 1.0 + 0.1 * torch.randn(p.shape, generator=g, device=device)
            else:
                std = (embed if "embed" in name else 1.0) / p.shape[1] ** 0.5
                w = torch.randn(p.shape, generator=g, device=device) * std
            p.copy_(w)
    return model


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """name -> (directory, reference model) for every spec in SPECS."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, spec in SPECS.items():
        model = reference_model(spec)
        path = root / name
        kw = {"max_shard_size": spec["shard"]} if "shard" in spec else {}
        model.save_pretrained(path, **kw)
        out[name] = (path, model)
    return out


@pytest.fixture(scope="module")
def engines(checkpoints):
    """name -> a float32 grout engine of that checkpoint on the CPU (per module: the
    weights' borrows must not outlive grout's tests)."""
    import grout
    engines = {name: grout.load(path, device="cpu", dtype="float32", max_seq_len=64,
                                progress=False)
               for name, (path, _) in checkpoints.items()}
    yield engines
    engines.clear()
    gc.collect()


@pytest.fixture
def checkpoint_copy(checkpoints, tmp_path):
    """A fresh copy of the "tied" checkpoint, to damage."""
    src, _ = checkpoints["tied"]
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


@pytest.fixture
def no_new_holds():
    """Asserts that a test leaves no safetile borrow behind (nothing stays allocated)."""
    from support import holds_left
    before = len(holds_left())
    yield
    assert len(holds_left()) == before


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    """A module's last test lets go of its fixture values before the module's fixtures are
    torn down (pytest would keep them until after), so the check below sees only what the
    module really left behind, whichever of its tests ran last."""
    if nextitem is None or nextitem.module is not item.module:
        item.funcargs.clear()


@pytest.fixture(scope="module", autouse=True)
def modules_leave_no_borrows():
    """After each module, every engine its tests made is gone with its borrows (the rest of
    the suite checks that nothing is held)."""
    yield
    from support import holds_left
    assert holds_left() == [], "a grout test module left safetile borrows behind"
