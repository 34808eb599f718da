"""ops.qk_norm_rope_kv_append on the CPU executor: equal to rmsnorm -> rope -> kv_append,
and to Qwen3's q/k norm and rotary embedding in torch."""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as pos_tensor
from support import PROLOGUE_SHAPE_IDS as SHAPE_IDS
from support import PROLOGUE_SHAPES as SHAPES
from support import ROPE_THETA as THETA
from support import prologue_inputs, rand, wrap

cpu_executor = support.cpu_executor(seed=4)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
TOL = {st.f32: 1e-5, st.bf16: 2e-2}


def inputs(hq, hkv, d, dtype, max_seq=37, seed=0):
    return prologue_inputs(hq, hkv, d, dtype, max_seq, seed)


def fused(qkv, qw, kw, kc, vc, p, d):
    return ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                      ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                      wrap(vc)).sync()


def unfused(qkv, qw, kw, kc, vc, p, hq, hkv, d):
    rows = qkv.view(-1, d)
    inv = ops.inv_freq_table(d, THETA, "cpu")
    qn = ops.rmsnorm(wrap(rows[:hq]), wrap(qw)).sync()
    kn = ops.rmsnorm(wrap(rows[hq:hq + hkv]), wrap(kw)).sync()
    q = ops.rope(qn.view(1, hq, d), pos_tensor(p), inv).sync()
    k = ops.rope(kn.view(1, hkv, d), pos_tensor(p), inv).sync()
    kc, vc = ops.kv_append(k.view(hkv, d), wrap(rows[hq + hkv:]), pos_tensor(p), wrap(kc),
                           wrap(vc)).sync()
    return q.view(hq, d), kc, vc


def hf_reference(qkv, qw, kw, p, hq, hkv, d):
    """Qwen3's q/k RMSNorm and rotate-half RoPE at position ``p``, as transformers computes."""
    rows = qkv.view(-1, d)

    def norm(x, w):
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = torch.tensor([float(p)])[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos().to(qkv.dtype), emb.sin().to(qkv.dtype)

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin
    return rope(norm(rows[:hq], qw)), rope(norm(rows[hq:hq + hkv], kw)), rows[hq + hkv:]


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_equals_rmsnorm_then_rope_then_kv_append(dtype, hq, hkv, d):
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, dtype)
    q, k_cache, v_cache = fused(qkv, qw, kw, kc, vc, 21, d)
    q_ref, k_ref, v_ref = unfused(qkv, qw, kw, kc, vc, 21, hq, hkv, d)
    assert q.shape == (hq, d) and q.dtype is dtype
    assert torch.equal(q.to_torch(), q_ref.to_torch())
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_matches_qwen3_norm_and_rope_in_torch(dtype, hq, hkv, d):
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, dtype, seed=10)
    q, k_cache, v_cache = fused(qkv, qw, kw, kc, vc, 36, d)
    q_hf, k_hf, v_hf = hf_reference(qkv, qw, kw, 36, hq, hkv, d)
    torch.testing.assert_close(q.to_torch().float(), q_hf.float(), rtol=TOL[dtype],
                               atol=TOL[dtype])
    torch.testing.assert_close(k_cache.to_torch()[:, 36].float(), k_hf.float(),
                               rtol=TOL[dtype], atol=TOL[dtype])
    assert torch.equal(v_cache.to_torch()[:, 36], v_hf)


def test_only_row_pos_of_each_cache_changes():
    qkv, qw, kw, kc, vc = inputs(8, 2, 64, st.bf16, seed=20)
    _, k_cache, v_cache = fused(qkv, qw, kw, kc, vc, 5, 64)
    keep = torch.ones(37, dtype=torch.bool)
    keep[5] = False
    assert torch.equal(k_cache.to_torch()[:, keep], kc[:, keep])
    assert torch.equal(v_cache.to_torch()[:, keep], vc[:, keep])
    assert not torch.equal(k_cache.to_torch()[:, 5], kc[:, 5])


def test_qkv_may_be_given_as_rows_of_head_dim():
    qkv, qw, kw, kc, vc = inputs(8, 2, 64, st.bf16, seed=30)
    q_flat, _, _ = fused(qkv, qw, kw, kc, vc, 3, 64)
    q_rows, _, _ = fused(qkv.view(-1, 64), qw, kw, kc, vc, 3, 64)
    assert torch.equal(q_flat.to_torch(), q_rows.to_torch())


def test_a_recorded_step_follows_the_device_position_on_replay():
    # Record once (as grout captures its decode step); only the device position changes.
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=16, seed=40)
    pos_t = torch.tensor([2], dtype=torch.int32)
    k_cache, v_cache, q_out = wrap(kc), wrap(vc), st.empty((hq, d), device="cpu")
    g = ops.qk_norm_rope_kv_append(wrap(qkv), wrap(qw), wrap(kw), st.from_torch(pos_t),
                                   ops.inv_freq_table(d, THETA, "cpu"), k_cache, v_cache,
                                   q_out=q_out).graph()
    for p in (2, 7, 15):
        pos_t.fill_(p)
        q, k_cache, v_cache = g.launch().sync()
        q_hf, k_hf, v_hf = hf_reference(qkv, qw, kw, p, hq, hkv, d)
        torch.testing.assert_close(q.to_torch(), q_hf, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_cache.to_torch()[:, p], k_hf, rtol=1e-5, atol=1e-5)
        assert torch.equal(v_cache.to_torch()[:, p], v_hf)


def test_a_position_outside_the_cache_raises_on_the_cpu_executor():
    qkv, qw, kw, kc, vc = inputs(4, 2, 32, st.f32, max_seq=8, seed=50)
    with pytest.raises(st.OutOfBoundsError):
        fused(qkv, qw, kw, kc, vc, 8, 32)


@pytest.mark.parametrize("change,match", [
    (dict(pos=torch.tensor([1], dtype=torch.int64)), "pos must be an int32"),
    (dict(inv_freq=torch.ones(8)), "inv_freq must be an fp32 tensor of shape"),
    (dict(qkv=torch.ones(5 * 32)), "qkv must hold"),
    (dict(q_norm_weight=torch.ones(16)), r"q_norm_weight must have shape \(32,\)"),
    (dict(v_cache=torch.ones(2, 9, 32)), "caches must both be"),
])
def test_bad_arguments_raise_argument_errors(change, match):
    args = support.prologue_arguments(max_seq=8, seed=60)
    args.update(change)
    with pytest.raises(st.ArgumentError, match=match):
        ops.qk_norm_rope_kv_append(**{k: wrap(v) for k, v in args.items()})


def test_one_append_program_owns_at_most_one_tile_of_cache_rows():
    assert ops.max_cache_positions(128) == 8192
    assert ops.max_cache_positions(64) == 16384


@pytest.mark.parametrize("p", [0, 15, 16, 36])
def test_a_cache_split_into_blocks_takes_two_kernels_and_equals_the_chain(p):
    hq, hkv, d = 8, 2, 32
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, seed=70)
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(
        wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p), ops.inv_freq_table(d, THETA, "cpu"),
        wrap(kc), wrap(vc), block_s=16).sync()
    q_ref, k_ref, v_ref = unfused(qkv, qw, kw, kc, vc, p, hq, hkv, d)
    assert torch.equal(q.to_torch(), q_ref.to_torch())
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())


def test_a_cache_longer_than_one_tile_per_head_appends_its_last_row():
    hq, hkv, d = 2, 1, 128
    max_seq = ops.max_cache_positions(d) + 3
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=max_seq, seed=71)
    q, k_cache, v_cache = fused(qkv, qw, kw, kc, vc, max_seq - 1, d)
    q_ref, k_ref, v_ref = unfused(qkv, qw, kw, kc, vc, max_seq - 1, hq, hkv, d)
    assert torch.equal(q.to_torch(), q_ref.to_torch())
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())


def test_the_two_kernel_path_writes_the_rotated_k_rows_into_the_given_buffer():
    hq, hkv, d = 4, 2, 16
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=40, seed=72)
    k_rows = st.empty((hkv, d), st.f32)
    _, k_cache, _ = ops.qk_norm_rope_kv_append(
        wrap(qkv), wrap(qw), wrap(kw), pos_tensor(33), ops.inv_freq_table(d, THETA, "cpu"),
        wrap(kc), wrap(vc), k_rows=k_rows, block_s=8).sync()
    assert torch.equal(k_rows.to_torch(), k_cache.to_torch()[:, 33])


def test_the_two_kernel_path_refuses_a_shared_qkv():
    hq, hkv, d = 4, 2, 16
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32, max_seq=40, seed=73)
    shared = wrap(qkv.view(-1, d)).share()
    with pytest.raises(st.ArgumentError, match="takes qkv as an st.Tensor"):
        ops.qk_norm_rope_kv_append(shared, wrap(qw), wrap(kw), pos_tensor(3),
                                   ops.inv_freq_table(d, THETA, "cpu"), wrap(kc), wrap(vc),
                                   block_s=8)


@pytest.mark.parametrize("block_s", [0, 9000, 2.0, True])
def test_a_block_outside_one_tile_is_an_argument_error(block_s):
    d = 128
    k_new, v_new = wrap(rand((1, d), st.f32, 0)), wrap(rand((1, d), st.f32, 1))
    k_cache, v_cache = st.zeros((1, 64, d), st.f32), st.zeros((1, 64, d), st.f32)
    with pytest.raises(st.ArgumentError, match=r"block_s must be a power of two in \[1, 8192\]"):
        ops.kv_append(k_new, v_new, pos_tensor(0), k_cache, v_cache, block_s=block_s)


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
def test_qk_norm_rope_then_kv_append_equals_the_one_op(hq, hkv, d):
    qkv, qw, kw, kc, vc = inputs(hq, hkv, d, st.f32)
    q_want, kc_want, vc_want = fused(qkv, qw, kw, kc, vc, 5, d)
    q, k = ops.qk_norm_rope(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(5),
                            ops.inv_freq_table(d, THETA, "cpu"), hkv).sync()
    assert q.shape == (hq, d) and k.shape == (hkv, d)
    kc2, vc2 = ops.kv_append(k, wrap(qkv.view(-1, d)[hq + hkv:]), pos_tensor(5), wrap(kc),
                             wrap(vc)).sync()
    assert torch.equal(q.to_torch(), q_want.to_torch())
    assert torch.equal(kc2.to_torch(), kc_want.to_torch())
    assert torch.equal(vc2.to_torch(), vc_want.to_torch())


def test_qk_norm_rope_writes_the_given_buffers():
    qkv, qw, kw, _, _ = inputs(8, 2, 32, st.f32)
    q_out, k_out = st.empty((8, 32), device="cpu"), st.empty((2, 32), device="cpu")
    q, k = ops.qk_norm_rope(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(3),
                            ops.inv_freq_table(32, THETA, "cpu"), 2, q_out=q_out,
                            k_out=k_out).sync()
    assert q is q_out and k is k_out


@pytest.mark.parametrize("kv_heads", [0, 5, 2.0, True])
def test_qk_norm_rope_refuses_kv_heads_that_do_not_divide_qkv(kv_heads):
    qkv, qw, kw, _, _ = inputs(8, 2, 32, st.f32)
    with pytest.raises(st.errors.ArgumentError):
        ops.qk_norm_rope(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(3),
                         ops.inv_freq_table(32, THETA, "cpu"), kv_heads)


def test_kv_append_under_pdl_waits_before_every_load():
    from safetile.ops.kv_cache import kv_append_kernel
    kc = st.empty((2, 64, 32), device="cpu")
    src = kv_append_kernel.options(pdl=True, trigger_early=True).source(
        wrap(rand((2, 32), st.f32, 1)), wrap(rand((2, 32), st.f32, 2)), pos_tensor(3),
        kc.partition((1, 64, 32)), st.empty((2, 64, 32), device="cpu").partition((1, 64, 32)),
        64)
    body = [ln.strip() for ln in src.split("def kv_append_kernel(")[1].split("\n")[1:]]
    wait = body.index("_st_gdc_wait()")
    assert not any("_st_load" in ln or "_st_scalar" in ln or "_st_store" in ln
                   or "_st_sub" in ln for ln in body[:wait])


def test_qk_norm_rope_refuses_a_norm_weight_that_is_not_a_vector():
    qkv, qw, kw, _, _ = inputs(8, 2, 32, st.f32)
    with pytest.raises(st.errors.ArgumentError, match=r"q_norm_weight must have shape \(D,\)"):
        ops.qk_norm_rope(wrap(qkv), wrap(qw.view(1, 32)), wrap(kw), pos_tensor(3),
                         ops.inv_freq_table(32, THETA, "cpu"), 2)
