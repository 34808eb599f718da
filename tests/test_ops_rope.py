"""ops.rope on the CPU executor, against a torch transcription of transformers' Qwen3 rotary
embedding (default rope type, attention scaling 1)."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap

DTYPES, IDS = support.FLOAT_DTYPES, support.FLOAT_IDS


cpu_executor = support.cpu_executor(seed=4)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_qwen3_rope(x, positions, theta):
    """Qwen3RotaryEmbedding.forward + apply_rotary_pos_emb, for x of (seq, heads, dim)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype=torch.float) / d))
    freqs = (inv_freq[None, :, None].float() @ positions[None, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)[0]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]                 # unsqueeze over heads
    return (x * cos) + (rotate_half(x) * sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_rope_matches_hugging_face_qwen3(dtype):
    x = rand((7, 5, 64), dtype, 0)                               # 5 heads: not a power of two
    pos = torch.tensor([0, 1, 2, 100, 4000, 30000, 7], dtype=torch.int32)
    z = ops.rope(wrap(x), wrap(pos), theta=1e6).sync()
    want = hf_qwen3_rope(x, pos, 1e6)
    tol = 1e-6 if dtype is st.f32 else 1e-2
    torch.testing.assert_close(z.to_torch().float(), want.float(), rtol=tol, atol=tol)


def test_int64_positions_and_a_given_inv_freq_table():
    x = rand((3, 2, 128), st.f32, 1)
    pos = torch.tensor([5, 9, 131071], dtype=torch.int64)
    table = ops.inv_freq_table(128, 1e6, device="cpu")
    z = ops.rope(wrap(x), wrap(pos), table).sync()
    torch.testing.assert_close(z.to_torch(), hf_qwen3_rope(x, pos, 1e6), rtol=1e-6, atol=1e-6)


def test_rope_reads_q_and_k_as_strided_views_of_a_fused_qkv_buffer():
    seq, hq, hk, d = 6, 4, 2, 32
    qkv = rand((seq, (hq + 2 * hk) * d), st.bf16, 2)
    pos = torch.arange(10, 10 + seq, dtype=torch.int32)
    buf = wrap(qkv)
    q = buf.slice(1, 0, hq * d).view(seq, hq, d)
    k = buf.slice(1, hq * d, (hq + hk) * d).view(seq, hk, d)
    zq = ops.rope(q, wrap(pos)).sync()
    zk = ops.rope(k, wrap(pos)).sync()
    want_q = hf_qwen3_rope(qkv[:, : hq * d].reshape(seq, hq, d), pos, 1e6)
    want_k = hf_qwen3_rope(qkv[:, hq * d: (hq + hk) * d].reshape(seq, hk, d), pos, 1e6)
    torch.testing.assert_close(zq.to_torch().float(), want_q.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(zk.to_torch().float(), want_k.float(), rtol=1e-2, atol=1e-2)


def test_a_recorded_rope_reads_the_positions_at_each_replay():
    x = rand((1, 2, 16), st.f32, 3)
    positions = torch.tensor([3], dtype=torch.int32)      # the decode position buffer
    table = ops.inv_freq_table(16, device="cpu")
    out = st.empty((1, 2, 16), device="cpu")
    g = ops.rope(wrap(x), st.from_torch(positions), table, out=out).graph()
    g.launch().sync()
    torch.testing.assert_close(out.to_torch(), hf_qwen3_rope(x, torch.tensor([3]), 1e6))
    positions[0] = 4                                        # advance without re-recording
    g.launch().sync()
    torch.testing.assert_close(out.to_torch(), hf_qwen3_rope(x, torch.tensor([4]), 1e6))


def test_head_dim_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        ops.rope(wrap(rand((2, 2, 96), st.f32, 0)), wrap(torch.zeros(2, dtype=torch.int32)))


def test_positions_must_have_one_entry_per_token():
    with pytest.raises(ValueError, match="positions"):
        ops.rope(wrap(rand((2, 2, 16), st.f32, 0)), wrap(torch.zeros(3, dtype=torch.int32)))
