"""Attention ops on the CPU executor against torch: causal flash attention (prefill), split-KV
decode attention with its merge, and the KV-cache appends at a device-resident position.

References run in float64 on the same (rounded) inputs. fp32 results must agree to about
1e-6 relative; bf16 results carry the rounding of P to bf16 before P @ V and of the output,
so they agree to about 1e-2.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import safetile as st
from safetile.errors import OutOfBoundsError
from safetile.ops import (DecodeWorkspace, decode_attention, flash_attention, kv_append,
                          kv_append_many)
from safetile.ops.decode_attention import decode_split_kernel, decode_whole_kernel
from safetile.ops.flash_attention import flash_attention_kernel

REL = {st.f32: 2e-6, st.bf16: 1.5e-2}


@pytest.fixture(autouse=True)
def cpu_executor():
    with st.backend("interpret", seed=5):
        yield


def rand(shape, dtype, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype.torch)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    g, w = got.double(), want.double()
    return ((g - w).norm() / w.norm()).item()


def i32(v: int):
    return st.from_torch(torch.tensor([v], dtype=torch.int32))


# ---- prefill ---------------------------------------------------------------------------------

def causal_reference(q, k, v) -> torch.Tensor:
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                          enable_gqa=True)


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hq,hkv,s,d,bm,bn", [
    (4, 2, 37, 16, 16, 16),      # sequence not a multiple of the block; groups of 2
    (4, 1, 64, 32, 32, 16),      # multi-query: every q head reads one kv head
    (3, 3, 1, 16, 16, 16),       # one token
    (2, 2, 21, 16, 64, 32),      # block larger than the sequence
    (8, 2, 50, 16, 16, 16),      # block_n == block_m
])
def test_flash_attention_matches_causal_sdpa(dtype, hq, hkv, s, d, bm, bn):
    q, k, v = rand((hq, s, d), dtype, 1), rand((hkv, s, d), dtype, 2), rand((hkv, s, d), dtype, 3)
    out = flash_attention(st.from_torch(q.clone()), st.from_torch(k.clone()),
                          st.from_torch(v.clone()), block_m=bm, block_n=bn).sync()
    assert out.shape == (hq, s, d) and out.dtype is dtype
    assert rel_err(out.to_torch(), causal_reference(q, k, v)) < REL[dtype]


def test_flash_attention_takes_a_permuted_seq_major_layout_and_an_explicit_scale():
    # grout's projections produce (S, H, D); the op takes the (H, S, D) permuted view as is.
    s, d = 19, 16
    qs, ks, vs = rand((s, 4, d), st.f32, 4), rand((s, 2, d), st.f32, 5), rand((s, 2, d), st.f32, 6)
    q, k, v = (t.permute(1, 0, 2) for t in (qs, ks, vs))
    out = flash_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v), scale=0.3,
                          block_m=16, block_n=16).sync()
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                          enable_gqa=True, scale=0.3)
    assert rel_err(out.to_torch(), want) < REL[st.f32]


def test_flash_attention_output_rows_depend_only_on_earlier_keys():
    q, k, v = rand((2, 24, 16), st.f32, 7), rand((1, 24, 16), st.f32, 8), rand((1, 24, 16), st.f32, 9)
    k2, v2 = k.clone(), v.clone()
    k2[:, 10:] = 100.0
    v2[:, 10:] = -100.0
    a = flash_attention(st.from_torch(q.clone()), st.from_torch(k), st.from_torch(v),
                        block_m=16, block_n=16).sync().to_torch()
    b = flash_attention(st.from_torch(q.clone()), st.from_torch(k2), st.from_torch(v2),
                        block_m=16, block_n=16).sync().to_torch()
    assert torch.equal(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_flash_attention_rejects_mismatched_heads():
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        flash_attention(st.zeros((3, 8, 16), device="cpu"), st.zeros((2, 8, 16), device="cpu"),
                        st.zeros((2, 8, 16), device="cpu"))


def test_flash_attention_masks_only_the_diagonal_blocks_and_compiles_to_wgmma_and_tma():
    args = (st.empty((32, 1024, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 1024, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 1024, 128), dtype=st.bf16, device="cpu"),
            st.empty((32, 1024, 128), dtype=st.bf16, device="cpu").partition((1, 128, 128)),
            0.1, 64)
    kern = flash_attention_kernel.options(num_warps=8, num_stages=3)
    body = kern.source(*args).split("def flash_attention_kernel(")[1]
    loops = body.split("    for j in range(")
    assert len(loops) == 3
    assert "tl.where" not in loops[1] and "tl.where" in loops[2]   # unmasked, then diagonal
    ptx = kern.compile(*args).asm["ptx"]
    assert "wgmma" in ptx and "cp.async.bulk.tensor" in ptx


# ---- decode ------------------------------------------------------------------------------------

def decode_reference(q, k, v, n, scale=None) -> torch.Tensor:
    hq, d = q.shape
    g = hq // k.shape[0]
    kk = k[:, :n].double().repeat_interleave(g, 0)
    vv = v[:, :n].double().repeat_interleave(g, 0)
    s = torch.einsum("hd,hnd->hn", q.double(), kk) * (scale or 1 / math.sqrt(d))
    return torch.einsum("hn,hnd->hd", s.softmax(-1), vv)


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hq,hkv,max_seq,n,splits,bn", [
    (6, 2, 100, 1, 3, 16),        # one valid position: one split works, the others are empty
    (6, 2, 100, 37, 3, 16),       # a partial last block
    (6, 2, 100, 100, 3, 16),      # the whole cache
    (10, 2, 70, 70, 4, 16),       # a group of 5 q heads (not a power of two)
    (4, 4, 64, 50, 8, 16),        # more splits than the length fills
    (4, 1, 33, 20, 1, 32),        # one split: the merge just normalizes
])
@pytest.mark.parametrize("prefetch,cyclic,masked", [(0, False, False), (0, True, False),
                                                    (2, True, False), (0, False, True),
                                                    (0, True, True)],
                         ids=["contiguous", "cyclic", "cyclic+prefetch", "contiguous+masked",
                              "cyclic+masked"])
def test_decode_attention_matches_reference(dtype, hq, hkv, max_seq, n, splits, bn, prefetch,
                                            cyclic, masked):
    d = 16
    q, k, v = rand((hq, d), dtype, 11), rand((hkv, max_seq, d), dtype, 12), \
        rand((hkv, max_seq, d), dtype, 13)
    out = decode_attention(st.from_torch(q.clone()), st.from_torch(k.clone()),
                           st.from_torch(v.clone()), i32(n), block_n=bn,
                           num_splits=splits, prefetch=prefetch, cyclic=cyclic,
                           masked=masked).sync()
    assert out.shape == (hq, d) and out.dtype is dtype
    assert rel_err(out.to_torch(), decode_reference(q, k, v, n)) < REL[dtype]


@pytest.mark.parametrize("splits,masked", [(2, False), (2, True), (1, False)],
                         ids=["split", "split+masked", "one-split"])
def test_decode_attention_ignores_garbage_past_the_length(splits, masked):
    q, k, v = rand((4, 16), st.f32, 1), rand((2, 40, 16), st.f32, 2), rand((2, 40, 16), st.f32, 3)
    k[:, 23:] = float("nan")
    v[:, 23:] = float("nan")
    out = decode_attention(st.from_torch(q), st.from_torch(k.clone()), st.from_torch(v.clone()),
                           i32(23), block_n=16, num_splits=splits,
                           masked=masked).sync().to_torch()
    assert torch.isfinite(out).all()
    assert rel_err(out, decode_reference(q, k, v, 23)) < REL[st.f32]


def test_decode_attention_length_offset_and_reused_buffers_follow_the_device_length():
    # One set of buffers (as in a captured graph); only the device scalar changes per step.
    q, k, v = rand((4, 16), st.f32, 4), rand((2, 48, 16), st.f32, 5), rand((2, 48, 16), st.f32, 6)
    qh, kh, vh = st.from_torch(q), st.from_torch(k.clone()), st.from_torch(v.clone())
    ws = DecodeWorkspace.for_cache(qh, kh, num_splits=4, block_n=16)
    out = st.empty((4, 16), device="cpu")
    for pos in (0, 9, 47):
        pos_t = i32(pos)
        got = decode_attention(qh, kh, vh, pos_t, out, ws, length_offset=1, block_n=16).sync()
        assert rel_err(got.to_torch(), decode_reference(q, k, v, pos + 1)) < REL[st.f32]


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("hq,hkv,max_seq,n", [(8, 2, 100, 1), (8, 2, 100, 37), (10, 2, 70, 70),
                                              (32, 8, 200, 130)])
def test_one_split_attends_in_one_kernel_and_leaves_the_workspace_alone(dtype, hq, hkv,
                                                                        max_seq, n):
    d = 16
    q, k, v = rand((hq, d), dtype, 21), rand((hkv, max_seq, d), dtype, 22), \
        rand((hkv, max_seq, d), dtype, 23)
    ws = DecodeWorkspace(hkv, hq // hkv, d, 1, device="cpu")
    ws.partial = st.from_torch(torch.full(tuple(ws.partial.shape), float("nan")))
    op = decode_attention(st.from_torch(q), st.from_torch(k), st.from_torch(v), i32(n),
                          workspace=ws, block_n=16)
    graph = op.graph()
    assert [r.kernel.name for r in graph.records] == ["decode_whole_kernel"]
    graph.launch().sync()
    assert rel_err(graph.output.to_torch(), decode_reference(q, k, v, n)) < REL[dtype]
    assert torch.isnan(ws.partial.to_torch()).all()


def test_one_split_attention_of_no_positions_is_zero():
    q, k = rand((4, 16), st.f32, 1), rand((2, 40, 16), st.f32, 2)
    out = decode_attention(st.from_torch(q), st.from_torch(k), st.from_torch(k.clone()), i32(0),
                           block_n=16, num_splits=1).sync().to_torch()
    assert (out == 0).all()


def test_decode_kernel_source_does_not_depend_on_the_length():
    def source(n):
        ws = DecodeWorkspace(8, 4, 128, 32, device="cpu")
        return decode_split_kernel.source(
            st.empty((32, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(n),
            ws.partial.partition((1, 1, 16, 128)), ws.lse.partition((1, 1, 16, 1)), 0.1, 64, 0,
            False, 0, False)
    src = source(5)
    assert src == source(4000)
    assert "_st_scalar1(_st_length_ptr" in src      # the loop bound comes from the device
    # Whole blocks stream unmasked; only the partial last block is masked.
    body = src.split("def decode_split_kernel(")[1]
    loop, tail = body.split("    for j in range(")[1].split("    if ", 1)
    assert "tl.where" not in loop and "masked_step" not in loop
    assert "_stf_masked_step(" in tail


def test_masked_splits_run_the_partial_last_block_inside_the_loop():
    ws = DecodeWorkspace(8, 4, 128, 32, device="cpu")
    src = decode_split_kernel.source(
        st.empty((32, 128), dtype=st.bf16, device="cpu"),
        st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
        st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(5),
        ws.partial.partition((1, 1, 16, 128)), ws.lse.partition((1, 1, 16, 1)), 0.1, 64, 0,
        True, 0, True)
    body = src.split("def decode_split_kernel(")[1]
    assert body.count("for j in range(") == 1 and "if tail" not in body
    assert "end = _st_cdiv(stop, BLOCK_N)" in body
    assert "_stf_masked_step(" in body.split("for j in range(")[1]


def test_the_one_split_kernel_runs_every_block_masked_in_one_loop():
    out = st.empty((32, 128), dtype=st.bf16, device="cpu")
    src = decode_whole_kernel.source(
        st.empty((32, 128), dtype=st.bf16, device="cpu"),
        st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
        st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(5),
        out.view(8, 4, 128).partition((1, 16, 128)), 0.1, 64, 1)
    body = src.split("def decode_whole_kernel(")[1]
    assert body.count("for j in range(") == 1
    loop = body.split("for j in range(")[1]
    assert "_st_cdiv(n, BLOCK_N)" in loop.split("\n")[0] and "_stf_masked_step(" in loop


def test_decode_prefetch_needs_cyclic_splits():
    q, k = rand((4, 16), st.f32, 1), rand((2, 40, 16), st.f32, 2)
    with pytest.raises(ValueError, match="cyclic"):
        decode_attention(st.from_torch(q), st.from_torch(k), st.from_torch(k.clone()), i32(5),
                         block_n=16, num_splits=2, prefetch=1, cyclic=False)


def test_decode_prefetch_precedes_the_length_read_and_the_pdl_wait_on_sm90():
    # The K/V prefetches of the split's first blocks are computed from the program's tile
    # index alone, so they are issued before the length is read and before the pdl wait.
    ws = DecodeWorkspace(8, 4, 128, 16, device="cpu")
    args = (st.empty((32, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(1),
            ws.partial.partition((1, 1, 16, 128)), ws.lse.partition((1, 1, 16, 1)), 0.1, 64, 1,
            True, 2, False)
    kern = decode_split_kernel.options(num_warps=4, num_stages=3, pdl=True)
    body = kern.source(*args).split("def decode_split_kernel(")[1]
    assert body.index("_st_prefetch3(_st_k_ptr") < body.index("_st_gdc_wait()") \
        < body.index("_st_scalar1(_st_length_ptr")
    ptx = kern.compile(*args).asm["ptx"]
    wait = ptx.index("griddepcontrol.wait")
    assert ptx.index("prefetch.global.L2") < wait
    assert "prefetch.global.L2" not in ptx[wait:]
    assert min(m.start() for m in re.finditer(r"\bld\.global|cp\.async", ptx)) > wait


def test_decode_kernels_compile_for_sm90_with_tma_loads():
    ws = DecodeWorkspace(8, 4, 128, 32, device="cpu")
    args = (st.empty((32, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(1),
            ws.partial.partition((1, 1, 16, 128)), ws.lse.partition((1, 1, 16, 1)), 0.1, 64, 1, False, 0,
            False)
    ptx = decode_split_kernel.options(num_warps=4, num_stages=3).compile(*args).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "mma" in ptx


def test_the_one_split_kernel_compiles_for_sm90_with_tma_loads_and_mma():
    out = st.empty((32, 128), dtype=st.bf16, device="cpu")
    args = (st.empty((32, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"),
            st.empty((8, 4096, 128), dtype=st.bf16, device="cpu"), i32(1),
            out.view(8, 4, 128).partition((1, 16, 128)), 0.1, 64, 1)
    ptx = decode_whole_kernel.options(num_warps=4, num_stages=3).compile(*args).asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "mma" in ptx


# ---- KV cache ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("max_seq,pos", [(50, 0), (50, 17), (50, 49), (64, 63)])
def test_kv_append_writes_exactly_one_row_per_head(dtype, max_seq, pos):
    kc, vc = rand((3, max_seq, 16), dtype, 1), rand((3, max_seq, 16), dtype, 2)
    kn, vn = rand((3, 16), dtype, 3), rand((3, 16), dtype, 4)
    kh, vh = st.from_torch(kc.clone()), st.from_torch(vc.clone())
    kh, vh = kv_append(st.from_torch(kn), st.from_torch(vn), i32(pos), kh, vh).sync()
    kc[:, pos], vc[:, pos] = kn, vn
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)


@pytest.mark.parametrize("pos", [0, 15, 16, 31, 49])
def test_kv_append_over_blocks_of_the_cache_writes_exactly_one_row_per_head(pos):
    kc, vc = rand((3, 50, 16), st.f32, 21), rand((3, 50, 16), st.f32, 22)
    kn, vn = rand((3, 16), st.f32, 23), rand((3, 16), st.f32, 24)
    kh, vh = st.from_torch(kc.clone()), st.from_torch(vc.clone())
    kh, vh = kv_append(st.from_torch(kn), st.from_torch(vn), i32(pos), kh, vh,
                       block_s=16).sync()
    kc[:, pos], vc[:, pos] = kn, vn
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)


@pytest.mark.parametrize("pos", [-1, 64])
def test_kv_append_over_blocks_outside_the_cache_is_an_out_of_bounds_error(pos):
    kh, vh = st.zeros((2, 50, 16), device="cpu"), st.zeros((2, 50, 16), device="cpu")
    with pytest.raises(OutOfBoundsError, match="outside the owned slab"):
        kv_append(st.zeros((2, 16), device="cpu"), st.zeros((2, 16), device="cpu"), i32(pos),
                  kh, vh, block_s=16).sync()


def test_kv_append_past_the_cache_is_an_out_of_bounds_error():
    kh, vh = st.zeros((2, 20, 16), device="cpu"), st.zeros((2, 20, 16), device="cpu")
    with pytest.raises(OutOfBoundsError, match="outside the owned slab"):
        kv_append(st.zeros((2, 16), device="cpu"), st.zeros((2, 16), device="cpu"), i32(32),
                  kh, vh).sync()


@pytest.mark.parametrize("dtype", [st.f32, st.bf16], ids=["f32", "bf16"])
@pytest.mark.parametrize("pos,s", [(0, 50), (3, 40), (10, 1), (16, 16), (45, 5), (13, 60)])
def test_kv_append_many_writes_the_rows_and_keeps_the_rest(dtype, pos, s):
    max_seq = 50
    kc, vc = rand((2, max_seq, 16), dtype, 5), rand((2, max_seq, 16), dtype, 6)
    kn, vn = rand((2, s, 16), dtype, 7), rand((2, s, 16), dtype, 8)
    kh, vh = st.from_torch(kc.clone()), st.from_torch(vc.clone())
    kh, vh = kv_append_many(st.from_torch(kn), st.from_torch(vn), i32(pos), kh, vh,
                            block_s=16).sync()
    kc[:, pos:pos + s] = kn[:, :max_seq - pos]     # rows past the cache are dropped
    vc[:, pos:pos + s] = vn[:, :max_seq - pos]
    assert torch.equal(kh.to_torch(), kc) and torch.equal(vh.to_torch(), vc)


def test_prefill_append_then_decode_equals_attention_of_the_last_token():
    # The path grout takes: append a prompt, append one more token, decode it.
    hq, hkv, d, max_seq, s = 4, 2, 16, 64, 21
    k, v = rand((hkv, s + 1, d), st.f32, 9), rand((hkv, s + 1, d), st.f32, 10)
    q = rand((hq, d), st.f32, 11)
    kh, vh = st.zeros((hkv, max_seq, d), device="cpu"), st.zeros((hkv, max_seq, d), device="cpu")
    kh, vh = kv_append_many(st.from_torch(k[:, :s].contiguous()),
                            st.from_torch(v[:, :s].contiguous()), i32(0), kh, vh).sync()
    pos = i32(s)
    kh, vh = kv_append(st.from_torch(k[:, s].contiguous()), st.from_torch(v[:, s].contiguous()),
                       pos, kh, vh).sync()
    out = decode_attention(st.from_torch(q), kh, vh, pos, length_offset=1, block_n=16,
                           num_splits=3).sync()
    assert rel_err(out.to_torch(), decode_reference(q, k, v, s + 1)) < REL[st.f32]


def test_a_recorded_decode_step_follows_the_device_length_on_replay():
    # Record once (as grout captures its decode step), then only the device scalar changes.
    q, k, v = rand((4, 16), st.f32, 12), rand((2, 40, 16), st.f32, 13), rand((2, 40, 16), st.f32, 14)
    qh, kh, vh = st.from_torch(q), st.from_torch(k.clone()), st.from_torch(v.clone())
    pos_t = torch.tensor([3], dtype=torch.int32)
    pos = st.from_torch(pos_t)
    ws = DecodeWorkspace.for_cache(qh, kh, num_splits=3, block_n=16)
    out = st.empty((4, 16), device="cpu")
    g = decode_attention(qh, kh, vh, pos, out, ws, length_offset=1, block_n=16).graph()
    for p in (3, 17, 39):
        pos_t.fill_(p)
        got = g.launch().sync()
        assert rel_err(got.to_torch(), decode_reference(q, k, v, p + 1)) < REL[st.f32]
