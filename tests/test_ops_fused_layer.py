"""A Qwen3 decode layer assembled from the fused ops equals the same layer from the unfused
ops (CPU executor, bf16): 7 kernels where the unfused layer has 14."""
import torch

import safetile as st
from safetile import ops

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=6)

HIDDEN, HQ, HKV, D, INTER, MAX_SEQ, POS = 128, 4, 2, 32, 192, 16, 5
DT = st.bf16


def weights():
    qkv_rows = (HQ + 2 * HKV) * D
    shapes = dict(ln1=(HIDDEN,), wqkv=(qkv_rows, HIDDEN), qn=(D,), kn=(D,), wo=(HIDDEN, HQ * D),
                  ln2=(HIDDEN,), wgu=(2 * INTER, HIDDEN), wd=(HIDDEN, INTER))
    return {name: rand(shape, DT, i, 0.5 if name.startswith("w") else 1.0)
            for i, (name, shape) in enumerate(shapes.items())}


def caches():
    return rand((HKV, MAX_SEQ, D), DT, 20), rand((HKV, MAX_SEQ, D), DT, 21)


def pos():
    return st.from_torch(torch.tensor([POS], dtype=torch.int32))


def unfused_layer(h, w, kc, vc):
    inv = ops.inv_freq_table(D, 1e6, "cpu")
    qkv = ops.gemv(wrap(w["wqkv"]), ops.rmsnorm(wrap(h), wrap(w["ln1"])).sync()).sync()
    rows = qkv.view(HQ + 2 * HKV, D)
    qn = ops.rmsnorm(rows.slice(0, 0, HQ), wrap(w["qn"])).sync()
    kn = ops.rmsnorm(rows.slice(0, HQ, HQ + HKV), wrap(w["kn"])).sync()
    q = ops.rope(qn.view(1, HQ, D), pos(), inv).sync().view(HQ, D)
    k = ops.rope(kn.view(1, HKV, D), pos(), inv).sync().view(HKV, D)
    kc, vc = ops.kv_append(k, rows.slice(0, HQ + HKV, HQ + 2 * HKV), pos(), wrap(kc),
                           wrap(vc)).sync()
    attn = ops.decode_attention(q, kc, vc, pos(), length_offset=1).sync()
    o = ops.gemv(wrap(w["wo"]), attn.view(HQ * D)).sync()
    h2, normed = ops.add_rmsnorm(o, wrap(h), wrap(w["ln2"])).sync()
    gu = ops.gemv(wrap(w["wgu"]), normed).sync()
    act = ops.silu_mul(gu.slice(0, 0, INTER), gu.slice(0, INTER, 2 * INTER)).sync()
    return ops.add(ops.gemv(wrap(w["wd"]), act).sync(), h2).sync(), kc, vc


def fused_layer(h, w, kc, vc):
    inv = ops.inv_freq_table(D, 1e6, "cpu")
    qkv = ops.rmsnorm_gemv(wrap(h), wrap(w["ln1"]), wrap(w["wqkv"])).sync()
    q, kc, vc = ops.qk_norm_rope_kv_append(qkv, wrap(w["qn"]), wrap(w["kn"]), pos(), inv,
                                           wrap(kc), wrap(vc)).sync()
    attn = ops.decode_attention(q, kc, vc, pos(), length_offset=1).sync()
    h2 = ops.gemv_add(wrap(w["wo"]), attn.view(HQ * D), wrap(h)).sync()
    gu = ops.rmsnorm_gemv(h2, wrap(w["ln2"]), wrap(w["wgu"])).sync()
    return ops.silu_mul_gemv_add(wrap(w["wd"]), gu, h2).sync(), kc, vc


def test_a_fused_decode_layer_equals_the_unfused_layer():
    w, h = weights(), rand(HIDDEN, DT, 30, 4.0)
    kc, vc = caches()
    want, k_want, v_want = unfused_layer(h, w, kc, vc)
    got, k_got, v_got = fused_layer(h, w, kc, vc)
    assert torch.equal(k_got.to_torch(), k_want.to_torch())
    assert torch.equal(v_got.to_torch(), v_want.to_torch())
    assert torch.equal(got.to_torch(), want.to_torch())
    assert not torch.equal(got.to_torch(), h)
