"""The fused decode kernels on the GPU at Qwen3-4B's shapes (bf16, PDL on), against the
unfused chains and torch, and a graph of fused layers replayed against the unfused one."""
import pytest
import torch

import safetile as st
from safetile import ops

import support

pytestmark = pytest.mark.gpu

H, HQ, HKV, D, INTER = 2560, 32, 8, 128, 9728


triton_backend = support.triton_backend()


rand = support.cuda_bf16


def wrap(t):
    return st.from_torch(t.clone())


def rel_err(got, want) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_rmsnorm_gemv_matches_rmsnorm_then_gemv():
    x, nw, w = rand(H, 1, 3.0), rand(H, 2, 0.1, 1.0), rand((6144, H), 3, 0.02)
    fused = ops.rmsnorm_gemv(wrap(x), wrap(nw), wrap(w)).sync().to_torch()
    chain = ops.gemv(wrap(w), ops.rmsnorm(wrap(x), wrap(nw)).sync()).sync().to_torch()
    assert rel_err(fused, chain) < 2e-3
    h = x.float()
    want = w.double() @ (nw * (h * torch.rsqrt(h.pow(2).mean() + 1e-6)).bfloat16()).double()
    assert rel_err(fused, want) < 1e-2


def test_gemv_add_and_silu_mul_gemv_add_match_their_chains():
    wo, a, r = rand((H, HQ * D), 4, 0.02), rand(HQ * D, 5), rand(H, 6)
    fused = ops.gemv_add(wrap(wo), wrap(a), wrap(r)).sync().to_torch()
    chain = ops.add(ops.gemv(wrap(wo), wrap(a)).sync(), wrap(r)).sync().to_torch()
    assert rel_err(fused, chain) < 2e-3
    wd, gu = rand((H, INTER), 7, 0.02), rand(2 * INTER, 8)
    fused = ops.silu_mul_gemv_add(wrap(wd), wrap(gu), wrap(r)).sync().to_torch()
    act = ops.silu_mul(wrap(gu[:INTER]), wrap(gu[INTER:])).sync()
    chain = ops.add(ops.gemv(wrap(wd), act).sync(), wrap(r)).sync().to_torch()
    assert rel_err(fused, chain) < 2e-3


@pytest.mark.parametrize("max_seq,p", [(4096, 1000), (8200, 8199), (40960, 20000)],
                         ids=["one-kernel", "two-kernel-last-row", "two-kernel-40k"])
def test_qk_norm_rope_kv_append_matches_the_unfused_chain(max_seq, p):
    qkv, qw, kw = rand((HQ + 2 * HKV) * D, 9, 2.0), rand(D, 10, 0.1, 1.0), rand(D, 11, 0.1, 1.0)
    kc, vc = rand((HKV, max_seq, D), 12), rand((HKV, max_seq, D), 13)
    pos = lambda: st.from_torch(torch.tensor([p], dtype=torch.int32, device="cuda"))  # noqa
    inv = ops.inv_freq_table(D)
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos(), inv,
                                                     wrap(kc), wrap(vc)).sync()
    rows = qkv.view(-1, D)
    qn = ops.rmsnorm(wrap(rows[:HQ]), wrap(qw)).sync()
    kn = ops.rmsnorm(wrap(rows[HQ:HQ + HKV]), wrap(kw)).sync()
    q_ref = ops.rope(qn.view(1, HQ, D), pos(), inv).sync().to_torch().view(HQ, D)
    k_ref = ops.rope(kn.view(1, HKV, D), pos(), inv).sync().to_torch().view(HKV, D)
    assert rel_err(q.to_torch(), q_ref) < 2e-3
    kt, vt = k_cache.to_torch(), v_cache.to_torch()
    assert rel_err(kt[:, p], k_ref) < 2e-3
    assert torch.equal(vt[:, p], rows[HQ + HKV:])
    assert torch.equal(kt[:, :p], kc[:, :p]) and torch.equal(vt[:, p + 1:], vc[:, p + 1:])


def test_qk_norm_rope_then_a_pdl_kv_append_equals_the_one_op_on_a_long_cache():
    max_seq, p = 8200, 8199
    qkv, qw, kw = rand((HQ + 2 * HKV) * D, 9, 2.0), rand(D, 10, 0.1, 1.0), rand(D, 11, 0.1, 1.0)
    kc, vc = rand((HKV, max_seq, D), 12), rand((HKV, max_seq, D), 13)
    pos = lambda: st.from_torch(torch.tensor([p], dtype=torch.int32, device="cuda"))  # noqa
    inv = ops.inv_freq_table(D)
    q_want, kc_want, vc_want = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos(),
                                                          inv, wrap(kc), wrap(vc)).sync()
    q, k = ops.qk_norm_rope(wrap(qkv), wrap(qw), wrap(kw), pos(), inv, HKV,
                            trigger_early=True).sync()
    kc2, vc2 = ops.kv_append(k, wrap(qkv.view(-1, D)[HQ + HKV:]), pos(), wrap(kc), wrap(vc),
                             pdl=True).sync()
    assert torch.equal(q.to_torch(), q_want.to_torch())
    assert torch.equal(kc2.to_torch(), kc_want.to_torch())
    assert torch.equal(vc2.to_torch(), vc_want.to_torch())


@pytest.mark.parametrize("p", [0, 63, 64, 127, 255, 1000])
def test_qk_norm_rope_append_attention_matches_the_prologue_then_attention(p):
    max_seq = 2048
    qkv, qw, kw = rand((HQ + 2 * HKV) * D, 14, 2.0), rand(D, 15, 0.1, 1.0), rand(D, 16, 0.1, 1.0)
    kc, vc = rand((HKV, max_seq, D), 17), rand((HKV, max_seq, D), 18)
    kc[:, p + 1:], vc[:, p + 1:] = float("nan"), float("nan")     # never attended
    pos = lambda: st.from_torch(torch.tensor([p], dtype=torch.int32, device="cuda"))  # noqa
    inv = ops.inv_freq_table(D)
    out, k_cache, v_cache = ops.qk_norm_rope_append_attention(
        wrap(qkv), wrap(qw), wrap(kw), pos(), inv, wrap(kc), wrap(vc)).sync()
    q, k_ref, v_ref = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos(), inv,
                                                 wrap(kc), wrap(vc)).sync()
    assert torch.equal(k_cache.to_torch()[:, :p + 1], k_ref.to_torch()[:, :p + 1])
    assert torch.equal(v_cache.to_torch()[:, :p + 1], v_ref.to_torch()[:, :p + 1])
    want = support.grouped_attention(q.to_torch(), k_ref.to_torch(), v_ref.to_torch(), p + 1)
    assert rel_err(out.to_torch().float(), want) < 1e-2


def test_rmsnorm_gemv_argmax_gives_the_argmax_of_its_logits():
    x, nw, w = rand(H, 14, 3.0), rand(H, 15, 0.1, 1.0), rand((151936, H), 16, 0.02)
    logits, token = ops.rmsnorm_gemv_argmax(wrap(x), wrap(nw), wrap(w)).sync()
    lg = logits.to_torch()
    assert token.to_torch().item() == torch.argmax(lg).item()
    chain = ops.gemv(wrap(w), ops.rmsnorm(wrap(x), wrap(nw)).sync()).sync().to_torch()
    assert rel_err(lg, chain) < 2e-3


def _layers(n):
    return [dict(ln1=rand(H, 100 + i, 0.1, 1.0), wqkv=rand(((HQ + 2 * HKV) * D, H), 200 + i, 0.02),
                 qn=rand(D, 300 + i, 0.1, 1.0), kn=rand(D, 400 + i, 0.1, 1.0),
                 wo=rand((H, HQ * D), 500 + i, 0.02), ln2=rand(H, 600 + i, 0.1, 1.0),
                 wgu=rand((2 * INTER, H), 700 + i, 0.02), wd=rand((H, INTER), 800 + i, 0.02))
            for i in range(n)]


def test_a_graph_of_fused_layers_replays_like_the_unfused_ops_step_by_step():
    # Three fused layers in one graph (PDL across every kernel boundary), replayed,
    # against the same layers run op by op, unfused, synchronized after each op.
    layers = _layers(3)
    w = [{k: wrap(v).share() for k, v in L.items()} for L in layers]
    h0 = rand(H, 900, 1.0)
    caches = [(rand((HKV, 256, D), 910 + i), rand((HKV, 256, D), 920 + i)) for i in range(3)]
    pos_t = torch.tensor([77], dtype=torch.int32, device="cuda")
    pos, inv = st.from_torch(pos_t), ops.inv_freq_table(D).share()
    kv = [(wrap(k), wrap(v)) for k, v in caches]
    bufs = [wrap(h0), st.empty((H,), dtype=st.bf16)]
    qkv, q = st.empty(((HQ + 2 * HKV) * D,), dtype=st.bf16), st.empty((HQ, D), dtype=st.bf16)
    attn, gu = st.empty((HQ, D), dtype=st.bf16), st.empty((2 * INTER,), dtype=st.bf16)
    ws = ops.DecodeWorkspace.for_cache(q, kv[0][0])
    with st.graph_scope() as scope:
        for L, (kc, vc) in zip(w, kv):
            cur, other = bufs
            scope.record(ops.rmsnorm_gemv(cur, L["ln1"], L["wqkv"], out=qkv))
            scope.record(ops.qk_norm_rope_kv_append(qkv, L["qn"], L["kn"], pos, inv, kc, vc,
                                                    q_out=q))
            scope.record(ops.decode_attention(q, kc, vc, pos, attn, ws, length_offset=1,
                                              early=False))
            scope.record(ops.gemv_add(L["wo"], attn.view(-1), cur, out=other))
            scope.record(ops.rmsnorm_gemv(other, L["ln2"], L["wgu"], out=gu))
            scope.record(ops.silu_mul_gemv_add(L["wd"], gu, other, out=cur))
    assert sum(1 for r in scope.graph.records if r.kernel.opts.get("pdl")) >= 15
    scope.graph.launch().sync()
    got = bufs[0].to_torch()

    h = wrap(h0)
    for L, (kc, vc) in zip(w, caches):
        kc, vc = wrap(kc), wrap(vc)
        qkv_u = ops.gemv(L["wqkv"], ops.rmsnorm(h, L["ln1"]).sync()).sync()
        rows = qkv_u.view(HQ + 2 * HKV, D)
        qn = ops.rmsnorm(rows.slice(0, 0, HQ), L["qn"]).sync()
        kn = ops.rmsnorm(rows.slice(0, HQ, HQ + HKV), L["kn"]).sync()
        qr = ops.rope(qn.view(1, HQ, D), pos, inv).sync().view(HQ, D)
        kr = ops.rope(kn.view(1, HKV, D), pos, inv).sync().view(HKV, D)
        kc, vc = ops.kv_append(kr, rows.slice(0, HQ + HKV, HQ + 2 * HKV), pos, kc, vc).sync()
        a = ops.decode_attention(qr, kc, vc, pos, length_offset=1).sync()
        mid, normed = ops.add_rmsnorm(ops.gemv(L["wo"], a.view(-1)).sync(), h, L["ln2"]).sync()
        g = ops.gemv(L["wgu"], normed).sync()
        act = ops.silu_mul(g.slice(0, 0, INTER), g.slice(0, INTER, 2 * INTER)).sync()
        h = ops.add(ops.gemv(L["wd"], act).sync(), mid).sync()
    assert rel_err(got, h.to_torch()) < 1e-2
