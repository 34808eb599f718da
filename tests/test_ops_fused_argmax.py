"""ops.rmsnorm_gemv_argmax on the CPU executor: logits equal rmsnorm -> gemv, the token is
torch.argmax of those logits (ties to the lowest index), inside graphs too."""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.gemv import GemvConfig

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=5)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
CONFIGS = [GemvConfig(8, 64, 4, 2, tma=False, head=2), GemvConfig(16, 32, 4, 2, tma=False,
                                                                  head=0)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["head2", "head0"])
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_logits_equal_rmsnorm_then_gemv_and_the_token_is_their_argmax(dtype, cfg):
    # a vocabulary of 1003 rows: the last program's tile is partly past it
    x, nw, w = rand(200, dtype, 1, 2.0), rand(200, dtype, 2), rand((1003, 200), dtype, 3)
    logits, token = ops.rmsnorm_gemv_argmax(wrap(x), wrap(nw), wrap(w), 1e-6,
                                            config=cfg).sync()
    chain = ops.gemv(wrap(w), ops.rmsnorm(wrap(x), wrap(nw)).sync(), config=cfg).sync()
    assert torch.equal(logits.to_torch(), chain.to_torch())
    assert token.shape == (1,) and token.dtype is st.i64
    assert token.to_torch().item() == torch.argmax(chain.to_torch()).item()


def test_rows_past_the_vocabulary_never_win_when_every_logit_is_negative():
    # 1003 = 125 * 8 + 3: five padding rows in the last tile compute 0, above every logit
    x, nw = rand(64, st.f32, 4).abs() + 0.1, rand(64, st.f32, 5).abs() + 0.1
    w = -(rand((1003, 64), st.f32, 6).abs() + 0.01)
    w[1001] *= 0.01                              # the largest logit, in the last tile
    logits, token = ops.rmsnorm_gemv_argmax(wrap(x), wrap(nw), wrap(w),
                                            config=CONFIGS[0]).sync()
    assert (logits.to_torch() < 0).all()
    assert token.to_torch().item() == 1001


@pytest.mark.parametrize("dtype", [st.i32, st.i64], ids=["i32", "i64"])
def test_ties_go_to_the_lowest_index_within_and_across_programs(dtype):
    x, nw, w = rand(64, st.f32, 7), rand(64, st.f32, 8), rand((300, 64), st.f32, 9) * 0.1
    w[[250, 37, 36, 251]] = 1.0                 # four equal maxima, in two tiles of 8
    x, nw = x.abs() + 0.1, nw.abs() + 0.1
    _, token = ops.rmsnorm_gemv_argmax(wrap(x), wrap(nw), wrap(w), dtype=dtype,
                                       config=CONFIGS[0]).sync()
    assert token.dtype is dtype and token.to_torch().item() == 36


def test_a_recorded_head_allocates_nothing_and_replays():
    x, nw, w = rand(96, st.bf16, 10), rand(96, st.bf16, 11), rand((500, 96), st.bf16, 12)
    ws = wrap(w).share()
    workspace = ops.gemv_argmax_workspace(ws, st.i32)
    logits, token = st.empty((500,), dtype=st.bf16, device="cpu"), \
        st.empty((1,), dtype=st.i32, device="cpu")
    with st.graph_scope() as scope:
        scope.record(ops.rmsnorm_gemv_argmax(wrap(x), wrap(nw), ws, logits=logits, token=token,
                                             workspace=workspace))
    scope.graph.launch().sync()
    want = ops.gemv(ws, ops.rmsnorm(wrap(x), wrap(nw)).sync()).sync().to_torch()
    assert torch.equal(logits.to_torch(), want)
    assert token.to_torch().item() == torch.argmax(want).item()


def test_a_workspace_of_another_shape_is_refused():
    w = wrap(rand((500, 96), st.f32, 13))
    small = ops.gemv_argmax_workspace(wrap(rand((100, 96), st.f32, 14)))
    with pytest.raises(st.ArgumentError, match="gemv_argmax_workspace"):
        ops.rmsnorm_gemv_argmax(wrap(rand(96, st.f32, 15)), wrap(rand(96, st.f32, 16)), w,
                                workspace=small)
