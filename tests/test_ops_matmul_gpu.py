"""ops.matmul / linear / gemv and the unsafe twin on the GPU, vs torch (cuBLAS)."""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.matmul import MatmulConfig, choose_config
from safetile.ops.unsafe_matmul import matmul_unsafe

pytestmark = pytest.mark.gpu


def rel_err(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("m,n,k", [(8192 // 8, 1000, 777), (300, 6144, 2560), (16, 2560, 9728),
                                   (1, 1000, 520), (4097, 257, 136), (2048, 2560, 4096)])
@pytest.mark.parametrize("dtype", [st.bf16, st.f16])
def test_linear_matches_torch(m, n, k, dtype):
    a = st.randn((m, k), dtype=dtype, seed=1)
    w = st.randn((n, k), dtype=dtype, seed=2)
    want = torch.nn.functional.linear(a.to_torch().float(), w.to_torch().float())
    c = ops.linear(a, w).sync()
    assert rel_err(c.to_torch(), want) < 1e-2


@pytest.mark.parametrize("weight", [False, True])
def test_matmul_layouts_and_fp32_output(weight):
    a = st.randn((1000, 1200), dtype=st.bf16, seed=3)
    b = st.randn((700, 1200) if weight else (1200, 700), dtype=st.bf16, seed=4)
    bt = b.to_torch().float()
    want = a.to_torch().float() @ (bt.T if weight else bt)
    c = ops.matmul(a, b, weight=weight, out_dtype=st.f32).sync()
    assert rel_err(c.to_torch(), want) < 1e-5


def test_split_k_matches_unsplit():
    a = st.randn((64, 2560), dtype=st.bf16, seed=5)
    w = st.randn((512, 2560), dtype=st.bf16, seed=6)
    cfg = choose_config(64, 512, 2560)
    assert cfg.split_k > 1
    split = ops.linear(a, w, config=cfg).sync().to_torch().float()
    whole = ops.linear(a, w, config=MatmulConfig(64, 128, 64, 4, 4)).sync().to_torch().float()
    assert rel_err(split, whole) < 1e-2


@pytest.mark.parametrize("n,k", [(6144, 2560), (2560, 9728), (1000, 777)])
def test_gemv_matches_torch(n, k):
    w = st.randn((n, k), dtype=st.bf16, seed=7)
    x = st.randn((k,), dtype=st.bf16, seed=8)
    want = w.to_torch().float() @ x.to_torch().float()
    assert rel_err(ops.gemv(w, x).sync().to_torch(), want) < 1e-2


@pytest.mark.parametrize("m,n,k", [(1000, 900, 512),        # plain persistent
                                   (16, 2560, 9728),         # split-K with pdl
                                   (2048, 2560, 4096)])      # head/tail row split
def test_unsafe_twin_matches_safe(m, n, k):
    # The twin runs the same config (same tiles, K order, reduction): only the store
    # instruction differs, so the result is bitwise the safe one.
    a = st.randn((m, k), dtype=st.bf16, seed=9)
    w = st.randn((n, k), dtype=st.bf16, seed=10)
    safe = ops.linear(a, w).sync().to_torch()
    with st.unsafe():
        raw = matmul_unsafe(a, w, weight=True).sync().to_torch()
    assert torch.equal(raw, safe)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_pdl_gemv_chain_in_a_graph_reads_each_previous_result(prefetch):
    # Each gemv reads the vector the previous one wrote: with programmatic dependent launch
    # the next grid starts early, so a missing device-side wait would read stale values
    # (the weight prefetch before the wait must not change that).
    from safetile.ops.gemv import GemvConfig
    cfg = GemvConfig(4, 512, 4, 4, tma=False, pdl=True, prefetch=prefetch)
    ws = [st.randn((1024, 1024), dtype=st.f32, seed=20 + i).share() for i in range(6)]
    cur = st.randn((1024,), dtype=st.f32, seed=30)
    want = cur.to_torch().double()
    bufs = [st.empty((1024,), dtype=st.f32) for _ in ws]
    with st.graph_scope() as scope:
        for w, buf in zip(ws, bufs):
            cur = scope.record(ops.gemv(w, cur.share(), buf, config=cfg))
    for _ in range(3):
        outs = scope.graph.launch().sync()
    for w in ws:
        want = w.to_torch().double() @ want
    got = outs[-1].to_torch().double()
    assert rel_err(got, want) < 1e-4


def test_a_gemv_reads_the_weights_the_kernel_before_it_just_wrote():
    # The gemv loads its first weight blocks before its programmatic-launch wait; when the
    # launch just before it writes those weights it must go without PDL, or it could read
    # the old ones. Each step overwrites w (an add) and multiplies by it, in a graph.
    n, k = 4096, 4096
    news = [st.randn((n, k), dtype=st.bf16, seed=40 + i).share() for i in range(4)]
    zero = st.zeros((n, k), dtype=st.bf16).share()
    x = st.randn((k,), dtype=st.bf16, seed=50).share()
    w = st.zeros((n, k), dtype=st.bf16)
    ys = [st.empty((n,), dtype=st.bf16) for _ in news]
    with st.graph_scope() as scope:
        for new, y in zip(news, ys):
            w = scope.record(ops.add(new, zero, w))
            shared = w.share()
            scope.record(ops.gemv(shared, x, y))
            w = shared.try_unwrap()
    assert all(r.serial for r in scope.graph.records[1::2])
    for _ in range(3):
        outs = scope.graph.launch().sync()
    xt = x.to_torch().float()
    for new, y in zip(news, outs[1::2]):
        assert rel_err(y.to_torch(), new.to_torch().float() @ xt) < 1e-2
