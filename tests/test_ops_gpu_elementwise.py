"""The element-wise, norm, rope, softmax, embedding and argmax ops on the GPU, against torch
on the same GPU (Qwen3-like shapes, bf16 where grout uses it)."""
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.unsafe_twins import add_unsafe

import support

pytestmark = pytest.mark.gpu


triton_backend = support.triton_backend()


def rand(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype.torch).cuda()


def wrap(t):
    return st.from_torch(t.clone())


def bf16_close(got, want, rtol=1.6e-2, atol=1e-2):
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
def test_add_and_mul(dtype):
    n = (1 << 20) + 123
    x, y = rand(n, dtype, 0), rand(n, dtype, 1)
    # fp32: bit-exact. bf16: Triton may add natively (one rounding) where torch adds in fp32
    # and rounds again, so allow the rare double-rounding difference of one unit.
    exact = {"rtol": 0, "atol": 0} if dtype is st.f32 else {}
    torch.testing.assert_close(ops.add(wrap(x), wrap(y)).sync().to_torch(), x + y, **exact)
    torch.testing.assert_close(ops.mul(wrap(x), wrap(y)).sync().to_torch(), x * y, **exact)


def test_unsafe_add_twin():
    n = (1 << 20) + 123
    x, y = rand(n, st.f32, 2), rand(n, st.f32, 3)
    with st.unsafe():
        z = add_unsafe(wrap(x), wrap(y)).sync()
    assert torch.equal(z.to_torch(), x + y)


def test_silu_mul_on_the_halves_of_a_fused_projection():
    inter = 9728
    gu = rand((3, 2 * inter), st.bf16, 4)
    t = wrap(gu)
    z = ops.silu_mul(t.slice(1, 0, inter), t.slice(1, inter, 2 * inter)).sync()
    want = torch.nn.functional.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    bf16_close(z.to_torch(), want)


def qwen3_rmsnorm(x, weight, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


@pytest.mark.parametrize("shape", [(4, 2560), (160, 128), (2, 5120)])
def test_rmsnorm(shape):
    x, w = rand(shape, st.bf16, 5), rand(shape[-1], st.bf16, 6)
    bf16_close(ops.rmsnorm(wrap(x), wrap(w), 1e-6).sync().to_torch(), qwen3_rmsnorm(x, w, 1e-6))


def test_add_rmsnorm():
    x, r, w = rand((3, 2560), st.bf16, 7), rand((3, 2560), st.bf16, 8), rand(2560, st.bf16, 9)
    total, z = ops.add_rmsnorm(wrap(x), wrap(r), wrap(w), 1e-6).sync()
    torch.testing.assert_close(total.to_torch(), x + r, rtol=0, atol=0)
    bf16_close(z.to_torch(), qwen3_rmsnorm(x + r, w, 1e-6))


def hf_qwen3_rope(x, positions, theta):
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype=torch.float) / d))
    freqs = positions.float()[:, None] * inv_freq.to(x.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
def test_rope(dtype):
    x = rand((9, 32, 128), dtype, 10)
    pos = torch.tensor([0, 1, 7, 100, 1000, 4095, 8191, 32767, 40000], dtype=torch.int32).cuda()
    z = ops.rope(wrap(x), wrap(pos), theta=1e6).sync().to_torch()
    want = hf_qwen3_rope(x, pos, 1e6)
    if dtype is st.f32:
        torch.testing.assert_close(z, want, rtol=1e-4, atol=1e-4)
    else:
        bf16_close(z, want, rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("shape", [(16, 1000), (2, 151936)], ids=["one_pass", "online"])
def test_softmax(shape):
    x = rand(shape, st.bf16, 11, scale=4.0)
    z = ops.softmax(wrap(x)).sync().to_torch()
    torch.testing.assert_close(z.float(), torch.softmax(x.float(), -1), rtol=1e-2, atol=1e-3)


def test_embedding():
    table = rand((32000, 1024), st.bf16, 12)
    ids = torch.tensor([0, 31999, 17, 17, 2048], dtype=torch.int64).cuda()
    z = ops.embedding(wrap(ids), wrap(table)).sync().to_torch()
    assert torch.equal(z, table[ids])


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
def test_argmax_with_ties(dtype):
    x = rand(151936, dtype, 13)
    x[[150000, 4097, 90000]] = 30.0
    z = ops.argmax(wrap(x)).sync().to_torch()
    assert z.item() == 4097 == torch.argmax(x).item()


def test_a_recorded_decode_step_replays_bit_for_bit():
    """rmsnorm -> rope -> argmax into preallocated buffers, recorded once, replayed twice."""
    d, heads, vocab = 128, 8, 151936
    x, w = rand((heads, d), st.bf16, 14), rand(d, st.bf16, 15)
    logits = rand(vocab, st.bf16, 16)
    positions = torch.tensor([5], dtype=torch.int32).cuda()
    table = ops.inv_freq_table(d, device="cuda")
    normed = st.empty((heads, d), dtype=st.bf16)
    rotated = st.empty((1, heads, d), dtype=st.bf16)
    token = st.empty((1,), dtype=st.i32)
    ws = ops.argmax_workspace(vocab, st.i32)
    xs, ws_, ls, ps = wrap(x), wrap(w), wrap(logits), st.from_torch(positions)
    eager_norm = ops.rmsnorm(xs, ws_, 1e-6).sync()
    eager_rope = ops.rope(eager_norm.view(1, heads, d), ps, table).sync().to_torch()
    with st.graph_scope() as scope:
        scope.record(ops.rmsnorm(xs, ws_, 1e-6, out=normed))
        scope.record(ops.rope(normed.view(1, heads, d), ps, table, out=rotated))
        scope.record(ops.argmax(ls, out=token, workspace=ws))
    for _ in range(2):
        scope.graph.launch().sync()
        assert torch.equal(rotated.to_torch(), eager_rope)
        assert token.to_torch().item() == torch.argmax(logits).item()
