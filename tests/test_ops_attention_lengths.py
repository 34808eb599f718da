"""Device lengths outside ``[0, cache length]`` in the decode attentions, on the CPU executor.

The length lives on the device, so no launch can refuse it: a length past the cache attends
the whole cache (never rows past it, which would read as phantom zero keys), and a length of
0 or less attends nothing, giving zeros, on every path (one split, split + merge, cyclic or
contiguous, masked or not) and without int32 overflow at the edge of the int32 range.
"""
import pytest
import torch

import safetile as st
from safetile import ops

import support
from support import position as i32
from support import ROPE_THETA as THETA
from support import prologue_inputs, rand, wrap

cpu_executor = support.cpu_executor(seed=9)

HQ, HKV, S, D = 4, 2, 100, 16
PATHS = [dict(num_splits=1), dict(num_splits=4), dict(num_splits=4, cyclic=False),
         dict(num_splits=4, masked=False), dict(num_splits=4, cyclic=False, masked=False)]
PATH_IDS = ["one-split", "cyclic+masked", "contiguous+masked", "cyclic", "contiguous"]


def qkv(seed=0):
    return rand((HQ, D), st.f32, seed), rand((HKV, S, D), st.f32, seed + 1), \
        rand((HKV, S, D), st.f32, seed + 2)


def attend(q, k, v, length, **kw):
    return ops.decode_attention(wrap(q), wrap(k), wrap(v), i32(length), block_n=16,
                                **kw).sync().to_torch()


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("length,offset", [(S + 1, 0), (1000, 0), (S, 1), (2**31 - 1, 1)])
def test_decode_attention_of_a_length_past_the_cache_attends_the_whole_cache(path, length,
                                                                            offset):
    q, k, v = qkv()
    whole = attend(q, k, v, S, **path)
    got = attend(q, k, v, length, length_offset=offset, **path)
    assert torch.equal(got, whole)


@pytest.mark.parametrize("path", PATHS, ids=PATH_IDS)
@pytest.mark.parametrize("length,offset", [(0, 0), (-5, 0), (-1, 1), (-2**31, -1)])
def test_decode_attention_of_no_positions_is_zero_on_every_path(path, length, offset):
    q, k, v = qkv(3)
    got = attend(q, k, v, length, length_offset=offset, **path)
    assert (got == 0).all()


def test_prologue_attention_at_a_position_past_the_cache_attends_the_whole_cache():
    # 48 rows: the owned slab is 64, so positions 48..63 pass the slab's bounds check and
    # write nothing; the attention then covers the 48 rows of the cache, no phantom row.
    hq, hkv, d, max_seq, p = 4, 2, 32, 48, 60
    qkv_t, qw, kw, kc, vc = prologue_inputs(hq, hkv, d, st.f32, max_seq, seed=7)
    inv = ops.inv_freq_table(d, THETA, "cpu")
    out, k_after, _ = ops.qk_norm_rope_append_attention(
        wrap(qkv_t), wrap(qw), wrap(kw), i32(p), inv, wrap(kc), wrap(vc)).sync()
    q_rot, _, _ = ops.qk_norm_rope_kv_append(wrap(qkv_t), wrap(qw), wrap(kw), i32(p), inv,
                                             wrap(kc), wrap(vc)).sync()
    assert torch.equal(k_after.to_torch(), kc)
    group = hq // hkv
    keys, values = kc.repeat_interleave(group, 0), vc.repeat_interleave(group, 0)
    w = torch.softmax(torch.einsum("hd,hnd->hn", q_rot.to_torch(), keys) / d ** 0.5, -1)
    torch.testing.assert_close(out.to_torch(), torch.einsum("hn,hnd->hd", w, values),
                               rtol=1e-5, atol=1e-5)
