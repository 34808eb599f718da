"""ops.rmsnorm_gemv, ops.gemv_add and ops.silu_mul_gemv_add on the CPU executor.

Each fused op equals the unfused chain it replaces (the same ops, run one after the other)
exactly, and torch's fp64 reference within the dtype's tolerance.
"""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.gemv import GemvConfig

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=3)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
TOL = {st.f32: 1e-5, st.f16: 2e-3, st.bf16: 2e-2}
# (N, K, config): K blocks that do not divide K, rows that do not divide N, both heads
CASES = [(70, 300, GemvConfig(8, 64, 4, 2, tma=False, head=2)),
         (70, 300, GemvConfig(4, 32, 4, 2, tma=False, head=0)),
         (36, 100, GemvConfig(8, 256, 4, 2, tma=False, head=2))]     # K in one partial block
CASE_IDS = ["head2", "head0", "one-block"]


def rel_err(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def small_inputs(seed):
    """w (24, 64), x (64,), residual (24,): fp32 Tensors."""
    return (wrap(rand((24, 64), st.f32, seed)), wrap(rand(64, st.f32, seed + 1)),
            wrap(rand(24, st.f32, seed + 2)))


def qwen3_rmsnorm(x, weight, eps=1e-6):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("n,k,cfg", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rmsnorm_gemv_equals_rmsnorm_then_gemv(dtype, n, k, cfg):
    x, nw, w = rand(k, dtype, 1, 3.0), rand(k, dtype, 2), rand((n, k), dtype, 3)
    fused = ops.rmsnorm_gemv(wrap(x), wrap(nw), wrap(w), 1e-6, config=cfg).sync().to_torch()
    normed = ops.rmsnorm(wrap(x), wrap(nw), 1e-6).sync()
    chain = ops.gemv(wrap(w), normed, config=cfg).sync().to_torch()
    assert fused.dtype == dtype.torch and fused.shape == (n,)
    assert torch.equal(fused, chain)
    want = w.double() @ qwen3_rmsnorm(x, nw).double()
    assert rel_err(fused, want) < TOL[dtype]


@pytest.mark.parametrize("n,k,cfg", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_gemv_add_equals_gemv_then_add(dtype, n, k, cfg):
    x, w, r = rand(k, dtype, 4), rand((n, k), dtype, 5), rand(n, dtype, 6, 4.0)
    fused = ops.gemv_add(wrap(w), wrap(x), wrap(r), config=cfg).sync().to_torch()
    chain = ops.add(ops.gemv(wrap(w), wrap(x), config=cfg).sync(), wrap(r)).sync().to_torch()
    assert torch.equal(fused, chain)
    assert rel_err(fused, w.double() @ x.double() + r.double()) < TOL[dtype]


@pytest.mark.parametrize("n,k,cfg", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_silu_mul_gemv_add_equals_silu_mul_then_gemv_then_add(dtype, n, k, cfg):
    gu, w, r = rand(2 * k, dtype, 7, 2.0), rand((n, k), dtype, 8), rand(n, dtype, 9, 4.0)
    fused = ops.silu_mul_gemv_add(wrap(w), wrap(gu), wrap(r), config=cfg).sync().to_torch()
    act = ops.silu_mul(wrap(gu[:k]), wrap(gu[k:])).sync()
    chain = ops.add(ops.gemv(wrap(w), act, config=cfg).sync(), wrap(r)).sync().to_torch()
    assert torch.equal(fused, chain)
    g, u = gu[:k].double(), gu[k:].double()
    assert rel_err(fused, w.double() @ (torch.nn.functional.silu(g) * u) + r.double()) \
        < TOL[dtype]


def test_silu_mul_gemv_add_takes_gate_and_up_as_two_rows():
    k = 96
    gu, w, r = rand((2, k), st.bf16, 10), rand((40, k), st.bf16, 11), rand(40, st.bf16, 12)
    rows = ops.silu_mul_gemv_add(wrap(w), wrap(gu), wrap(r)).sync().to_torch()
    flat = ops.silu_mul_gemv_add(wrap(w), wrap(gu.reshape(-1)), wrap(r)).sync().to_torch()
    assert torch.equal(rows, flat)


def test_silu_mul_gemv_add_reads_strided_gate_and_up_rows():
    k = 32
    both = rand((2, 2 * k), st.f32, 45)
    w, r = rand((8, k), st.f32, 46), rand(8, st.f32, 47)
    got = ops.silu_mul_gemv_add(wrap(w), wrap(both).slice(1, 0, k), wrap(r)).sync()
    want = ops.silu_mul_gemv_add(wrap(w), wrap(both[:, :k].contiguous()), wrap(r)).sync()
    assert torch.equal(got.to_torch(), want.to_torch())


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_silu_mul_gemv_add_of_a_long_k_reads_gate_and_up_as_one_vector(dtype):
    # K >= FLAT_MIN_K takes the 1-D form; K not a multiple of the block: the gate's last
    # block must not read into the up half
    from safetile.ops.fused_gemv import FLAT_MIN_K
    k = FLAT_MIN_K + 100
    cfg = GemvConfig(4, 2048, 4, 2, tma=False, head=0)
    gu, w, r = rand(2 * k, dtype, 48, 2.0), rand((6, k), dtype, 49), rand(6, dtype, 50)
    fused = ops.silu_mul_gemv_add(wrap(w), wrap(gu), wrap(r), config=cfg).sync().to_torch()
    act = ops.silu_mul(wrap(gu[:k]), wrap(gu[k:])).sync()
    chain = ops.add(ops.gemv(wrap(w), act, config=cfg).sync(), wrap(r)).sync().to_torch()
    assert torch.equal(fused, chain)
    with pytest.raises(st.ArgumentError, match="contiguous"):
        ops.silu_mul_gemv_add(wrap(w), wrap(rand((2, 2 * k), dtype, 51)).slice(1, 0, k),
                              wrap(r), config=cfg)


def test_the_down_projections_default_takes_1024_wide_blocks_and_a_head_for_a_long_k():
    from safetile.ops.gemv import choose_config
    down = choose_config(2560, 9728, swiglu=True)            # Qwen3-4B's down projection
    assert (down.bk, down.num_stages, down.head) == (1024, 4, 2)
    assert (choose_config(2560, 9728).bk, choose_config(2560, 9728).head) == (512, 0)
    for n, k in ((2560, 4096), (5120, 25600)):               # a short loop; many rows
        assert choose_config(n, k, swiglu=True) == choose_config(n, k)
    assert GemvConfig.for_shape(2560, 9728, swiglu=True) == down


def test_silu_mul_gemv_add_of_a_long_k_with_its_default_config_matches_torch():
    # 8 full 1024-wide blocks and a partial one, two of them loaded ahead of the loop
    k = 8 * 1024 + 300
    gu, w, r = rand(2 * k, st.f32, 52, 2.0), rand((6, k), st.f32, 53), rand(6, st.f32, 54)
    got = ops.silu_mul_gemv_add(wrap(w), wrap(gu), wrap(r)).sync().to_torch()
    act = torch.nn.functional.silu(gu[:k].double()) * gu[k:].double()
    assert rel_err(got, w.double() @ act + r.double()) < TOL[st.f32]


def test_fused_gemvs_at_qwen3_like_shapes_with_the_default_config():
    # hidden 256, 4 q heads and 2 kv heads of 64 (a GQA group of 2), intermediate 768
    h, qkv_n, inter = 256, (4 + 2 * 2) * 64, 768
    x, nw = rand(h, st.bf16, 13, 2.0), rand(h, st.bf16, 14)
    wqkv, wo = rand((qkv_n, h), st.bf16, 15), rand((h, 4 * 64), st.bf16, 16)
    wd = rand((h, inter), st.bf16, 17)
    qkv = ops.rmsnorm_gemv(wrap(x), wrap(nw), wrap(wqkv)).sync().to_torch()
    assert rel_err(qkv, wqkv.double() @ qwen3_rmsnorm(x, nw).double()) < TOL[st.bf16]
    a, r = rand(4 * 64, st.bf16, 18), rand(h, st.bf16, 19)
    o = ops.gemv_add(wrap(wo), wrap(a), wrap(r)).sync().to_torch()
    assert rel_err(o, wo.double() @ a.double() + r.double()) < TOL[st.bf16]
    gu = rand(2 * inter, st.bf16, 20)
    d = ops.silu_mul_gemv_add(wrap(wd), wrap(gu), wrap(r)).sync().to_torch()
    act = torch.nn.functional.silu(gu[:inter].double()) * gu[inter:].double()
    assert rel_err(d, wd.double() @ act + r.double()) < TOL[st.bf16]


def test_a_row_vector_input_is_accepted():
    x, nw, w = rand((1, 64), st.f32, 21), rand(64, st.f32, 22), rand((24, 64), st.f32, 23)
    y = ops.rmsnorm_gemv(wrap(x), wrap(nw), wrap(w)).sync().to_torch()
    assert y.shape == (24,)
    assert rel_err(y, w.double() @ qwen3_rmsnorm(x[0], nw).double()) < TOL[st.f32]


def test_out_is_written_and_handed_back():
    w, x, r = rand((24, 64), st.f32, 24), rand(64, st.f32, 25), rand(24, st.f32, 26)
    out = st.full((24,), float("nan"), dtype=st.f32, device="cpu")
    y = ops.gemv_add(wrap(w), wrap(x), wrap(r), out=out).sync()
    assert y is out
    assert rel_err(out.to_torch(), w.double() @ x.double() + r.double()) < TOL[st.f32]


def test_fused_gemvs_record_in_a_graph_scope_and_replay():
    w, x, nw, r = (rand((24, 64), st.f32, 27), rand(64, st.f32, 28), rand(64, st.f32, 29),
                   rand(24, st.f32, 30))
    ws, xs, nws, rs = wrap(w).share(), wrap(x), wrap(nw).share(), wrap(r)
    y1, y2 = st.empty((24,), device="cpu"), st.empty((24,), device="cpu")
    with st.graph_scope() as scope:
        scope.record(ops.rmsnorm_gemv(xs, nws, ws, out=y1))
        scope.record(ops.gemv_add(ws, xs, rs, out=y2))
    scope.graph.launch().sync()
    assert rel_err(y1.to_torch(), w.double() @ qwen3_rmsnorm(x, nw).double()) < TOL[st.f32]
    assert rel_err(y2.to_torch(), w.double() @ x.double() + r.double()) < TOL[st.f32]


def test_fused_gemvs_allocate_nothing_in_a_graph_scope_unless_given_out():
    w, x, r = small_inputs(31)
    with pytest.raises(st.GraphCaptureError):
        with st.graph_scope() as scope:
            scope.record(ops.gemv_add(w, x, r))


def test_the_output_cannot_be_the_residual():
    w, x, r = small_inputs(34)
    with pytest.raises(st.AliasError):
        ops.gemv_add(w, x, r, out=r).sync()


@pytest.mark.parametrize("call,match", [
    (lambda w, x, v: ops.rmsnorm_gemv(x, v[:32], w), "norm_weight must have shape"),
    (lambda w, x, v: ops.rmsnorm_gemv(v, v, w), r"x must have shape \(64,\)"),
    (lambda w, x, v: ops.gemv_add(w, x, x), r"residual must have shape \(24,\)"),
    (lambda w, x, v: ops.silu_mul_gemv_add(w, x, x), "gate_up must have shape"),
    (lambda w, x, v: ops.gemv_add(x, x, x), r"w must be an \(N, K\) matrix"),
])
def test_wrong_shapes_raise_argument_errors(call, match):
    w, x = wrap(rand((24, 64), st.f32, 37)), wrap(rand(64, st.f32, 38))
    v = wrap(rand(100, st.f32, 39))
    with pytest.raises(st.ArgumentError, match=match):
        call(w, x, v)


def test_mixed_dtypes_raise_an_argument_error():
    w, x = wrap(rand((24, 64), st.bf16, 40)), wrap(rand(64, st.f32, 41))
    with pytest.raises(st.ArgumentError, match="different dtypes"):
        ops.rmsnorm_gemv(x, x, w)


def test_a_prefetch_config_is_refused():
    w, x, r = small_inputs(42)
    with pytest.raises(st.ArgumentError, match="prefetch"):
        ops.gemv_add(w, x, r, config=GemvConfig(8, 32, 4, 2, prefetch=1))
