"""The fused step's chains of programmatic dependent launches, as recorded for a Hopper GPU:
each layer's chain of early signals ends at its attention, so no launch of the step outgrows
the launcher's bound on what may still run (``kernel_op.MAX_RUNNING``), and a cache longer
than one append program's slab appends in a launch of its own rather than after a callback,
so every launch of a step but its first (a graph's first launch goes in plain order) keeps
programmatic launch, the step's small kernels too. Recorded here with the GPU's configurations
(PDL forced on); the GPU tests run them."""
import gc

import pytest

from grout.config import from_dict
from grout.engine import from_tensors
from safetile import ops
from safetile.kernel.kernel_op import MAX_RUNNING, KernelOp
from safetile.ops import host


@pytest.fixture(params=["cache of one slab", "cache longer than one slab"])
def gpu_step_graphs(request, checkpoints, monkeypatch):
    """The kernel launches of both recorded step kinds (short and split attention), greedy
    and sampling, one list a step graph, of an engine configured as on an H200 with early
    triggers: with a 512-row cache, and with one longer than an append program's slab (the
    rotation and the append then two kernels)."""
    monkeypatch.setattr(host, "pdl_available", lambda: True)
    _, model = checkpoints["untied"]
    rows = 512
    if request.param == "cache longer than one slab":
        rows = ops.max_cache_positions(model.config.head_dim) + 8
    cfg = from_dict(dict(model.config.to_dict(), max_position_embeddings=2 * rows), "untied")
    eng = from_tensors(cfg, model.state_dict(), device="cpu", dtype="float32",
                       max_seq_len=rows)
    r = eng.runner
    r.gemm.cpu, r.gemm.trigger_early = False, True     # the GPU's gemv configs and signals
    r.buf.fuse_head(r.w.lm_head, r.gemm)
    graphs = [[rec for rec in r.graph(greedy, short).records if isinstance(rec, KernelOp)]
              for greedy in (True, False) for short in (True, False)]
    yield graphs
    graphs.clear()                      # pytest keeps the fixture value past the teardown
    del eng, r
    gc.collect()


@pytest.fixture
def gpu_step_records(gpu_step_graphs):
    return [rec for step in gpu_step_graphs for rec in step]


def test_every_launch_of_a_decode_step_but_its_first_keeps_programmatic_launch(
        gpu_step_graphs):
    for step in gpu_step_graphs:
        assert [rec.kernel.name for rec in step if not rec.kernel.opts.get("pdl")] == []
        assert [i for i, rec in enumerate(step) if rec.serial] == [0]
        assert all(len(rec._running) <= MAX_RUNNING for rec in step)


def test_the_attention_kernels_signal_after_their_wait(gpu_step_records):
    attention = [rec for rec in gpu_step_records if rec.kernel.name.startswith("decode_")]
    assert {rec.kernel.name for rec in attention} == {"decode_whole_kernel",
                                                      "decode_split_kernel",
                                                      "decode_merge_kernel"}
    assert not any(rec.kernel.opts.get("trigger_early") for rec in attention)


def test_a_long_cache_rotates_and_appends_in_two_launches_of_their_own(gpu_step_records):
    names = [rec.kernel.name for rec in gpu_step_records]
    if "kv_append_kernel" not in names:
        assert "qk_norm_rope_kernel" not in names     # one slab: one prologue kernel
        return
    at = [i for i, n in enumerate(names) if n == "kv_append_kernel"]
    assert all(names[i - 1] == "qk_norm_rope_kernel" for i in at)
    assert all(gpu_step_records[i].kernel.opts.get("pdl") for i in at)
