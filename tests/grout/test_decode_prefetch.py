"""The fused decode step's L2 prefetches (``SafetileGemm.prefetch_o``): where they go in a
layer, and that they change no token. Off on the CPU executor unless asked for."""
import gc

import pytest
import torch

import grout
from grout import model as model_module
from grout.model import SafetileGemm

from test_model_vs_transformers import PROMPT


@pytest.fixture(scope="module")
def engines(checkpoints):
    """A fused engine of the "untied" checkpoint to prefetch with, and the unfused reference."""
    path = checkpoints["untied"][0]
    pair = [grout.load(path, device="cpu", dtype="float32", max_seq_len=64, progress=False,
                       fused=fused) for fused in (True, False)]
    yield pair
    pair.clear()
    gc.collect()


@pytest.fixture
def prefetching(engines):
    """Sets the fused engine's prefetch (where, gate/up rows) and records its steps afresh,
    its default graphs set aside meanwhile."""
    held = {"engine": engines[0]}       # emptied at teardown: pytest keeps the fixture value
    r = engines[0].runner
    saved = r.graphs, r.chunks, r.gemm.prefetch_o, r.gemm.prefetch_gate_up_rows

    def setting(where, gate_up_rows=0):
        eng = held["engine"]
        eng.runner.gemm.prefetch_o = where
        eng.runner.gemm.prefetch_gate_up_rows = gate_up_rows
        eng.runner.graphs, eng.runner.chunks = {}, {}
        return eng
    yield setting
    r.graphs, r.chunks, r.gemm.prefetch_o, r.gemm.prefetch_gate_up_rows = saved
    held.clear()


def kernel_names(eng) -> list:
    return [rec.kernel.name for rec in eng.runner.graphs[(True, True)].records]


def test_the_cpu_executor_prefetches_nothing_by_default():
    assert SafetileGemm(torch.device("cpu")).prefetch_o is None


def test_the_gpu_default_follows_the_model_setting(monkeypatch):
    monkeypatch.setattr(model_module, "L2_PREFETCH_O", "qkv")
    assert SafetileGemm(torch.device("cuda")).prefetch_o == "qkv"


@pytest.mark.parametrize("where, after", [("qkv", "rmsnorm_gemv"),
                                          ("prologue", "qk_norm_rope_append_kernel")])
def test_the_o_prefetch_follows_the_kernel_it_is_placed_after(prefetching, where, after):
    eng = prefetching(where)
    eng.generate(PROMPT, max_new_tokens=2)
    names = kernel_names(eng)
    layers = eng.config.num_hidden_layers
    at = [i for i, n in enumerate(names) if n == "l2_prefetch_kernel"]
    assert len(at) == layers
    assert all(names[i - 1] == after for i in at)


def test_gate_up_rows_add_a_second_prefetch_after_os(prefetching):
    eng = prefetching("qkv", gate_up_rows=16)
    eng.generate(PROMPT, max_new_tokens=2)
    names = kernel_names(eng)
    assert names.count("l2_prefetch_kernel") == 2 * eng.config.num_hidden_layers
    rec = [r for r in eng.runner.graphs[(True, True)].records
           if r.kernel.name == "l2_prefetch_kernel"]
    assert [tuple(r.values[0].shape) for r in rec[:2]] == [
        tuple(eng.runner.w.layers[0].o.w.shape), tuple(eng.runner.w.layers[0].gate_up.w.shape)]


@pytest.mark.parametrize("where", ["qkv", "prologue"])
def test_a_prefetching_step_gives_the_unfused_tokens(prefetching, engines, where):
    want = engines[1].generate(PROMPT, max_new_tokens=10).token_ids
    assert prefetching(where, gate_up_rows=16).generate(PROMPT, max_new_tokens=10).token_ids \
        == want
