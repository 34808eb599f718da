"""Attention ops on the GPU (Triton backend) against torch, at grout's shapes.

Skipped without a CUDA GPU. Covers what the CPU tests cannot: the TMA/wgmma code paths, the
decode step replayed as a CUDA graph while only the device-resident length changes, and the
KV append masking an out-of-range position instead of writing past the slab.
"""
import math

import pytest
import torch
import torch.nn.functional as F

import safetile as st
from safetile.ops import (DecodeWorkspace, decode_attention, flash_attention, kv_append,
                          kv_append_many)

import support

pytestmark = pytest.mark.gpu


triton_backend = support.triton_backend()


def randn(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda").to(dtype)


def rel_err(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def i32(v: int):
    return st.from_torch(torch.tensor([v], dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("hq,hkv,s", [(32, 8, 1000), (8, 8, 77), (64, 8, 300)])
def test_flash_attention_bf16_matches_sdpa(hq, hkv, s):
    q, k, v = randn((hq, s, 128), 1), randn((hkv, s, 128), 2), randn((hkv, s, 128), 3)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True,
                                          enable_gqa=True)
    out = flash_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v)).sync()
    assert rel_err(out.to_torch(), want) < 1e-2


def test_flash_attention_fp32_matches_sdpa():
    q, k, v = (randn(s, i, torch.float32) for i, s in enumerate([(4, 200, 64), (2, 200, 64),
                                                                 (2, 200, 64)]))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out = flash_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v), block_m=64,
                          num_warps=4, num_stages=2).sync()
    assert rel_err(out.to_torch(), want) < 5e-3          # tf32 products


def decode_reference(q, k, v, n):
    g = q.shape[0] // k.shape[0]
    kk = k[:, :n].float().repeat_interleave(g, 0)
    vv = v[:, :n].float().repeat_interleave(g, 0)
    s = torch.einsum("hd,hnd->hn", q.float(), kk) / math.sqrt(q.shape[1])
    return torch.einsum("hn,hnd->hd", s.softmax(-1), vv)


@pytest.mark.parametrize("n", [1, 63, 64, 1000, 4096])
def test_decode_attention_matches_reference(n):
    q, k, v = randn((32, 128), 4), randn((8, 4096, 128), 5), randn((8, 4096, 128), 6)
    out = decode_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v), i32(n)).sync()
    assert rel_err(out.to_torch(), decode_reference(q, k, v, n)) < 1e-2


@pytest.mark.parametrize("n", [1, 63, 64, 200, 1024, 4096])
@pytest.mark.parametrize("pdl", [True, False])
def test_one_split_decode_attention_matches_reference(n, pdl):
    q, k, v = randn((32, 128), 4), randn((8, 4096, 128), 5), randn((8, 4096, 128), 6)
    out = decode_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v), i32(n),
                           num_splits=1, pdl=pdl).sync()
    assert rel_err(out.to_torch(), decode_reference(q, k, v, n)) < 1e-2


def test_decode_graph_replays_follow_the_device_length():
    q, k, v = randn((32, 128), 7), randn((8, 2048, 128), 8), randn((8, 2048, 128), 9)
    qh, kh, vh = st.from_torch(q), st.from_torch(k), st.from_torch(v)
    length_t = torch.tensor([5], dtype=torch.int32, device="cuda")
    length = st.from_torch(length_t)
    ws = DecodeWorkspace.for_cache(qh, kh)
    out = st.empty((32, 128), dtype=st.bf16)
    g = decode_attention(qh, kh, vh, length, out, ws, length_offset=1).graph()
    for pos in (0, 300, 2047):
        length_t.fill_(pos)             # what grout's step does on the device
        got = g.launch().sync()
        assert rel_err(got.to_torch(), decode_reference(q, k, v, pos + 1)) < 1e-2


def test_kv_appends_on_the_gpu_and_an_out_of_range_position_writes_nothing():
    kc, vc = randn((8, 100, 128), 10), randn((8, 100, 128), 11)
    kn, vn = randn((8, 128), 12), randn((8, 128), 13)
    kh, vh = st.from_torch(kc.clone()), st.from_torch(vc.clone())
    kh, vh = kv_append(st.from_torch(kn), st.from_torch(vn), i32(42), kh, vh).sync()
    kc[:, 42], vc[:, 42] = kn, vn
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)
    kh, vh = kv_append(st.from_torch(kn), st.from_torch(vn), i32(100), kh, vh).sync()
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)
    many_k, many_v = randn((8, 70, 128), 14), randn((8, 70, 128), 15)
    kh, vh = kv_append_many(st.from_torch(many_k), st.from_torch(many_v), i32(13), kh, vh).sync()
    kc[:, 13:83], vc[:, 13:83] = many_k, many_v
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)


@pytest.mark.parametrize("pdl,stages,splits,block_n,prefetch", [
    (True, 3, 16, 64, 0), (True, 5, 16, 64, 0), (False, 4, 32, 64, 0), (True, 5, 32, 32, 0),
    (True, 3, 16, 64, 2), (False, 3, 16, 64, 1)])
def test_decode_configurations_and_pdl_graph_replays(pdl, stages, splits, block_n, prefetch):
    q, k, v = randn((32, 128), 16), randn((8, 4096, 128), 17), randn((8, 4096, 128), 18)
    qh, kh, vh = st.from_torch(q), st.from_torch(k), st.from_torch(v)
    length_t = torch.tensor([5], dtype=torch.int32, device="cuda")
    ws = DecodeWorkspace.for_cache(qh, kh, num_splits=splits, block_n=block_n)
    out = st.empty((32, 128), dtype=st.bf16)
    g = decode_attention(qh, kh, vh, st.from_torch(length_t), out, ws, length_offset=1,
                         block_n=block_n, num_stages=stages, pdl=pdl,
                         prefetch=prefetch).graph()
    for pos in (0, 63, 64, 1000, 4095):
        length_t.fill_(pos)
        got = g.launch().sync()
        assert rel_err(got.to_torch(), decode_reference(q, k, v, pos + 1)) < 1e-2


def test_a_chain_of_attentions_sharing_one_workspace_replays_correctly():
    # The decode step's pattern: attentions back to back in one graph, all through one
    # workspace. With programmatic launch each split reads its cache early and both kernels
    # signal the next at their start, so several may run at once: every output must still
    # equal its own reference, replay after replay.
    n_layers, n = 6, 2048
    q = randn((32, 128), 30)
    caches = [(randn((8, n, 128), 40 + i), randn((8, n, 128), 60 + i)) for i in range(n_layers)]
    qh = st.from_torch(q)
    length_t = torch.tensor([n - 1], dtype=torch.int32, device="cuda")
    length = st.from_torch(length_t)
    handles = [(st.from_torch(k), st.from_torch(v)) for k, v in caches]
    outs = [st.empty((32, 128), dtype=st.bf16) for _ in caches]
    ws = DecodeWorkspace.for_cache(qh, handles[0][0])
    with st.graph_scope() as scope:
        for (kh, vh), out in zip(handles, outs):
            scope.record(decode_attention(qh, kh, vh, length, out, ws, length_offset=1))
    for pos in (n - 1, 700, 5):
        length_t.fill_(pos)
        got = scope.graph.launch().sync()
        for (k, v), o in zip(caches, got):
            assert rel_err(o.to_torch(), decode_reference(q, k, v, pos + 1)) < 1e-2
