"""ops.qk_norm_rope_attention on the CPU executor: q/k norm, RoPE and the one-split decode
attention reading the cache before the append, then ops.kv_append; equal to
ops.qk_norm_rope_kv_append then ops.decode_attention. Its sm_90 compile keeps the cache
loads before the programmatic-launch wait."""
import re

import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops.early_attention import MAX_EARLY_BLOCKS, _kernel

import support
from support import position as pos_tensor
from support import ROPE_THETA as THETA
from support import prologue_chain as chain
from support import prologue_inputs, wrap

cpu_executor = support.cpu_executor(seed=7)

DTYPES = [st.f32, st.bf16]
IDS = [d.name for d in DTYPES]
# (q heads, kv heads, head_dim): GQA groups of 4 (Qwen3-4B's), 2, 1 and 5 (padded to 8)
SHAPES = [(8, 2, 128), (8, 4, 64), (4, 4, 32), (10, 2, 64)]
SHAPE_IDS = ["group4", "group2", "group1", "group5"]
# The scores sum the two rotated halves' products: fp32 summation order only, but in bf16
# P is rounded against a running max that may differ in its last bit.
TOL = {st.f32: 1e-5, st.bf16: 2e-2}
MAX_SEQ = 208                     # four 64-key blocks, the last one partial


def v_rows(qkv: torch.Tensor, hq: int, hkv: int, d: int) -> st.Tensor:
    """The v rows of a token's qkv projection, as ops.kv_append takes them."""
    return wrap(qkv.view(hq + 2 * hkv, d)[hq + hkv:])


def early(qkv, qw, kw, kc, vc, p, hq, hkv, d, **kw_args):
    """The attention, then the append of its rotated k and the v rows: (out, k_out, caches)."""
    out, k_out = ops.qk_norm_rope_attention(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                            ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                            wrap(vc), **kw_args).sync()
    k_cache, v_cache = ops.kv_append(k_out, v_rows(qkv, hq, hkv, d), pos_tensor(p), wrap(kc),
                                     wrap(vc)).sync()
    return out, k_out, k_cache, v_cache


def assert_matches_chain(dtype, hq, hkv, d, p, max_seq=MAX_SEQ, seed=0, **kw_args):
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, dtype, max_seq, seed)
    out, k_out, k_cache, v_cache = early(qkv, qw, kw, kc, vc, p, hq, hkv, d, **kw_args)
    want, k_ref, v_ref = chain(qkv, qw, kw, kc, vc, p, d)
    assert out.shape == (hq, d) and out.dtype is dtype and k_out.shape == (hkv, d)
    assert torch.equal(k_out.to_torch(), k_ref.to_torch()[:, p])
    assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
    assert torch.equal(v_cache.to_torch(), v_ref.to_torch())
    torch.testing.assert_close(out.to_torch().float(), want.to_torch().float(),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("hq,hkv,d", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("p", [0, 63, 64, 77, 200])
def test_attention_then_append_equals_the_prologue_then_one_split_attention(dtype, hq, hkv,
                                                                            d, p):
    assert_matches_chain(dtype, hq, hkv, d, p)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("p", [64, 130, 200])
def test_rows_past_the_early_blocks_are_attended_after_the_wait(dtype, p):
    assert_matches_chain(dtype, 8, 2, 64, p, early_positions=64, seed=3)


@pytest.mark.parametrize("block_n", [16, 32, 128])
def test_other_key_blocks_give_the_same_result(block_n):
    assert_matches_chain(st.f32, 8, 2, 64, 77, block_n=block_n,
                         early_positions=MAX_EARLY_BLOCKS * block_n, seed=4)


def test_loading_the_blocks_past_the_position_gives_the_same_result():
    assert_matches_chain(st.bf16, 8, 2, 128, 70, trim=False, seed=5)


def test_the_new_row_comes_from_registers_not_from_the_stale_cache_row():
    hq, hkv, d, p = 8, 2, 64, 40
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, MAX_SEQ, 10)
    kc[:, p:], vc[:, p:] = float("nan"), float("nan")      # row p too: not appended yet
    out, _, k_cache, v_cache = early(qkv, qw, kw, kc, vc, p, hq, hkv, d)
    want, _, _ = chain(qkv, qw, kw, kc, vc, p, d)
    assert torch.isfinite(out.to_torch()).all()
    assert torch.isfinite(k_cache.to_torch()[:, :p + 1]).all()
    torch.testing.assert_close(out.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)


def test_a_cache_shorter_than_the_early_positions_loads_only_its_own_blocks():
    assert_matches_chain(st.f32, 4, 2, 32, 20, max_seq=24, seed=12)


def test_writes_into_given_outputs_and_returns_them():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 16, 20)
    given, k_given = st.empty((hq, d), st.f32), st.empty((hkv, d), st.f32)
    out, k_out = ops.qk_norm_rope_attention(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(9),
                                            ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                            wrap(vc), out=given, k_out=k_given).sync()
    want, k_ref, _ = chain(qkv, qw, kw, kc, vc, 9, d)
    assert out is given and k_out is k_given
    torch.testing.assert_close(given.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)
    assert torch.equal(k_given.to_torch(), k_ref.to_torch()[:, 9])


def test_a_recorded_attention_and_append_follow_the_device_position_on_replay():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 48, 30)
    pos_t = torch.tensor([0], dtype=torch.int32)
    pos = st.from_torch(pos_t)
    k_cache, v_cache = wrap(kc), wrap(vc)
    out, k_out = st.empty((hq, d), st.f32), st.empty((hkv, d), st.f32)
    qkv_t, inv = wrap(qkv), ops.inv_freq_table(d, THETA, "cpu")
    with st.graph_scope() as s:
        s.record(ops.qk_norm_rope_attention(qkv_t, wrap(qw), wrap(kw), pos, inv, k_cache,
                                            v_cache, out=out, k_out=k_out))
        s.record(ops.kv_append(k_out, qkv_t.view(hq + 2 * hkv, d).slice(0, hq + hkv,
                                                                         hq + 2 * hkv),
                               pos, k_cache, v_cache))
    for p in (3, 17, 47):
        before_k, before_v = k_cache.to_torch().clone(), v_cache.to_torch().clone()
        pos_t.fill_(p)
        s.graph.launch().sync()
        want, k_ref, v_ref = chain(qkv, qw, kw, before_k, before_v, p, d)
        assert torch.equal(k_cache.to_torch(), k_ref.to_torch())
        assert torch.equal(v_cache.to_torch(), v_ref.to_torch())
        torch.testing.assert_close(out.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)


def test_the_append_of_a_position_outside_the_cache_raises_on_the_cpu_executor():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 16, 40)
    with pytest.raises(st.OutOfBoundsError):
        early(qkv, qw, kw, kc, vc, 16, hq, hkv, d)


@pytest.mark.parametrize("p", [16, 40, 2**31 - 1])
def test_a_position_past_the_cache_attends_the_whole_cache_as_decode_attention(p):
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 16, 41)
    out, _ = ops.qk_norm_rope_attention(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                                        ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                        wrap(vc)).sync()
    q, _ = ops.qk_norm_rope(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(p),
                               ops.inv_freq_table(d, THETA, "cpu"), hkv).sync()
    want = ops.decode_attention(q, wrap(kc), wrap(vc), pos_tensor(p), length_offset=1,
                                num_splits=1).sync()
    torch.testing.assert_close(out.to_torch(), want.to_torch(), rtol=1e-5, atol=1e-5)


def test_a_negative_position_attends_nothing_and_gives_zeros():
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 16, 42)
    out, _ = ops.qk_norm_rope_attention(wrap(qkv), wrap(qw), wrap(kw), pos_tensor(-3),
                                        ops.inv_freq_table(d, THETA, "cpu"), wrap(kc),
                                        wrap(vc)).sync()
    assert torch.equal(out.to_torch(), torch.zeros(hq, d))


def recorded_attention(first: str):
    """The attention's launch recorded with programmatic launch after ``first``: a copy
    into qkv (as the projection writes it) or an append to its caches."""
    hq, hkv, d = 4, 2, 32
    qkv, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, 16, 50)
    qkv_t, k_cache, v_cache, pos = wrap(qkv), wrap(kc), wrap(vc), pos_tensor(3)
    src, k_new, v_new = wrap(qkv), wrap(torch.zeros(hkv, d)), wrap(torch.zeros(hkv, d))
    out, k_out = st.empty((hq, d), st.f32), st.empty((hkv, d), st.f32)
    inv_freq = ops.inv_freq_table(d, THETA, "cpu")
    with st.graph_scope() as s:
        if first == "append":
            s.record(ops.kv_append(k_new, v_new, pos, k_cache, v_cache, pdl=True))
        else:
            s.record(ops.copy(src, out=qkv_t))
        s.record(ops.qk_norm_rope_attention(qkv_t, wrap(qw), wrap(kw), pos, inv_freq, k_cache,
                                            v_cache, out=out, k_out=k_out, pdl=True))
    return s.records[-1]


def test_after_a_launch_that_writes_no_cache_the_early_loads_keep_programmatic_launch():
    rec = recorded_attention("copy")
    assert rec.kernel.name == "early_attention_kernel" and not rec.serial


def test_after_an_append_to_its_caches_the_attention_goes_in_plain_order():
    rec = recorded_attention("append")
    assert rec.kernel.name == "early_attention_kernel" and rec.serial


@pytest.mark.parametrize("change,match", [
    (dict(pos=torch.tensor([1], dtype=torch.int64)), "pos must be an int32"),
    (dict(pos=torch.tensor([1, 2], dtype=torch.int32)), "pos must be an int32"),
    (dict(qkv=torch.ones(5 * 32)), "qkv must hold"),
    (dict(v_cache=torch.ones(2, 9, 32)), "caches must both be"),
    (dict(k_cache=torch.ones(2, 16, 32, dtype=torch.bfloat16),
          v_cache=torch.ones(2, 16, 32, dtype=torch.bfloat16)), "different dtypes"),
    (dict(q_norm_weight=torch.ones(16)), "q_norm_weight must have shape"),
    (dict(inv_freq=torch.ones(32)), "inv_freq must be an fp32"),
])
def test_bad_arguments_raise_argument_errors(change, match):
    args = support.prologue_arguments(max_seq=16, seed=60)
    args.update(change)
    with pytest.raises(st.ArgumentError, match=match):
        ops.qk_norm_rope_attention(**{k: wrap(v) for k, v in args.items()})


@pytest.mark.parametrize("change,match", [
    (dict(block_n=48), "block_n must be a power of two"),
    (dict(block_n=8), "block_n must be a power of two"),
    (dict(block_n=1 << 16), r"block_n must be a power of two in \[16, 32768\]"),
    (dict(early_positions=0), "early_positions must be an int >= 1"),
    (dict(trim="no"), "trim must be True or False"),
    (dict(num_warps=3), "num_warps must be a power of two"),
    (dict(eps=float("nan")), "eps must be a finite number"),
    (dict(block_n=16, early_positions=80), "at most 4 are loaded before the wait"),
    (dict(out=st.empty((4, 32), st.bf16)), "out"),
    (dict(k_out=st.empty((4, 32), st.f32)), "k_out"),
])
def test_bad_options_and_outputs_raise_argument_errors(change, match):
    args = support.prologue_arguments(max_seq=128, seed=61)
    if "eps" in change:
        args.pop("eps", None)
    with pytest.raises(st.ArgumentError, match=match):
        ops.qk_norm_rope_attention(**{k: wrap(v) for k, v in args.items()}, **change)


def test_a_head_dim_below_32_is_refused():
    args = support.prologue_arguments(max_seq=16, seed=62, d=16)
    assert not ops.early_attention_fits(16) and ops.early_attention_fits(32)
    with pytest.raises(st.ArgumentError, match="head_dim 16 is below 32"):
        ops.qk_norm_rope_attention(**{k: wrap(v) for k, v in args.items()})


# -- the sm_90 compile ------------------------------------------------------------------------

def qwen3_4b_launch(blocks: int = 4):
    """The kernel as grout's Qwen3-4B step launches it (bf16, 8 kv heads of 128, groups of
    4, 64-key blocks, PDL), and its arguments."""
    def z(shape, dtype=st.bf16):
        return st.zeros(shape, dtype=dtype, device="cpu")

    def out(shape, tile):
        return st.empty(shape, dtype=st.bf16, device="cpu").partition(tile)
    kernel = _kernel(8, 1, True, False)
    return kernel, (z((8, 4096, 128)), z((8, 4096, 128)), z((1,), st.i32), z((128,)),
                    z((128,)), z((64,), st.f32), z((48, 128)), out((8, 4, 128), (1, 16, 128)),
                    out((8, 1, 128), (1, 1, 128)), 1e-6, 0.1, 4, 32, 8, 64, blocks, True)


def test_the_generated_source_loads_every_early_block_before_the_wait():
    kernel, args = qwen3_4b_launch()
    lines = [ln.strip() for ln in kernel.source(*args).split("def early_attention_kernel(")[1]
             .split("\n")[1:]]
    wait = lines.index("_st_gdc_wait()")
    before = [ln for ln in lines[:wait] if "_st_k_cache_ptr" in ln or "_st_v_cache_ptr" in ln]
    assert [ln.split(" = ")[0] for ln in before] == \
        [f"{x}{j}" for j in range(4) for x in ("ka", "kb", "v")]
    loop = next(i for i, ln in enumerate(lines) if ln.startswith("for j in range(BLOCKS"))
    after = [i for i, ln in enumerate(lines[wait:], wait) if "_st_qkv_ptr" in ln]
    assert after and loop > wait
    assert all("_st_qkv_ptr" not in ln for ln in lines[:wait])


def test_compiles_for_sm90_with_the_cache_loads_before_griddepcontrol_wait():
    kernel, args = qwen3_4b_launch()
    ptx = kernel.compile(*args).asm["ptx"]
    assert ".target sm_90" in ptx
    head, _, tail = ptx.partition("griddepcontrol.wait")
    assert tail
    # 4 blocks of 64 keys of K and V, 128 bf16 each: 128 KB, 512 bytes for each of the
    # 256 threads, in 16-byte loads
    assert len(re.findall(r"ld\.global\.v4\.b32", head)) >= 4 * 64 * 128 * 2 * 2 // 256 // 16
