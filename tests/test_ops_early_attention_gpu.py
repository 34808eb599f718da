"""ops.qk_norm_rope_attention then ops.kv_append on the GPU at Qwen3-4B's shapes (bf16, PDL
on): the caches equal the prologue's, the output the attention over them."""
import pytest
import torch

import safetile as st
from safetile import ops

import support

pytestmark = pytest.mark.gpu

HQ, HKV, D = 32, 8, 128


triton_backend = support.triton_backend()


rand = support.cuda_bf16


def wrap(t):
    return st.from_torch(t.clone())


@pytest.mark.parametrize("p", [0, 63, 64, 127, 130, 255, 1000])
def test_attention_then_append_matches_the_prologue_then_attention(p):
    max_seq = 2048
    qkv, qw, kw = rand((HQ + 2 * HKV) * D, 14, 2.0), rand(D, 15, 0.1, 1.0), rand(D, 16, 0.1, 1.0)
    kc, vc = rand((HKV, max_seq, D), 17), rand((HKV, max_seq, D), 18)
    kc[:, p:], vc[:, p:] = float("nan"), float("nan")     # row p is the append's
    pos = lambda: st.from_torch(torch.tensor([p], dtype=torch.int32, device="cuda"))  # noqa
    inv = ops.inv_freq_table(D)
    out, k_rows = ops.qk_norm_rope_attention(wrap(qkv), wrap(qw), wrap(kw), pos(), inv,
                                             wrap(kc), wrap(vc)).sync()
    k_cache, v_cache = ops.kv_append(k_rows, wrap(qkv.view(-1, D)[HQ + HKV:]), pos(), wrap(kc),
                                     wrap(vc), pdl=True).sync()
    q, k_ref, v_ref = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos(), inv,
                                                 wrap(kc), wrap(vc)).sync()
    assert torch.equal(k_cache.to_torch()[:, :p + 1], k_ref.to_torch()[:, :p + 1])
    assert torch.equal(v_cache.to_torch()[:, :p + 1], v_ref.to_torch()[:, :p + 1])
    want = support.grouped_attention(q.to_torch(), k_ref.to_torch(), v_ref.to_torch(), p + 1)
    got = out.to_torch().double()
    assert ((got - want.double()).norm() / want.double().norm()).item() < 1e-2
