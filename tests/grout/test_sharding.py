"""Megatron slicing rules (grout.sharding) on the tiny config: the shards recompose the
unsplit layer, and rank counts that split a head are refused."""
from dataclasses import replace

import pytest
import torch

from grout.config import named
from grout.errors import ShardingError
from grout.sharding import COLUMN, REPLICATE, ROW, VOCAB, rule, shard, shard_shapes, vocab_range

CFG = replace(named("tiny"), vocab_size=96)      # 4 heads, 2 kv heads, hidden 32, mlp 64
L = "model.layers.0."


def _w(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,how", [
    (L + "self_attn.q_proj.weight", COLUMN), (L + "self_attn.k_proj.weight", COLUMN),
    (L + "self_attn.v_proj.weight", COLUMN), (L + "mlp.gate_proj.weight", COLUMN),
    (L + "mlp.up_proj.weight", COLUMN), (L + "self_attn.o_proj.weight", ROW),
    (L + "mlp.down_proj.weight", ROW), ("model.embed_tokens.weight", VOCAB),
    ("lm_head.weight", VOCAB), (L + "input_layernorm.weight", REPLICATE),
    (L + "self_attn.q_norm.weight", REPLICATE), ("model.norm.weight", REPLICATE),
])
def test_each_checkpoint_tensor_has_its_megatron_rule(name, how):
    assert rule(name) == how


def test_query_shards_hold_whole_heads_in_rank_order():
    q = _w(CFG.q_size, CFG.hidden_size, seed=0)
    parts = [shard(L + "self_attn.q_proj.weight", q, CFG, r, 2) for r in range(2)]
    per = shard_shapes(CFG, 2)
    assert all(p.shape == (per.q_size, CFG.hidden_size) for p in parts)
    assert per.q_size % CFG.head_dim == 0
    assert torch.equal(torch.cat(parts, 0), q)


def test_key_value_shards_hold_the_kv_heads_of_the_rank_query_heads():
    d, k = CFG.head_dim, _w(CFG.kv_size, CFG.hidden_size, seed=10)
    per = shard_shapes(CFG, 2)
    for r in range(2):
        mine = shard(L + "self_attn.k_proj.weight", k, CFG, r, 2)
        for j in range(per.num_attention_heads):        # local query head j
            kv_global = (r * per.num_attention_heads + j) // CFG.group
            kv_local = j // (per.num_attention_heads // per.num_key_value_heads)
            assert torch.equal(mine[kv_local * d:(kv_local + 1) * d],
                               k[kv_global * d:(kv_global + 1) * d])


def test_column_then_row_shards_sum_to_the_unsplit_mlp():
    h, m = CFG.hidden_size, CFG.intermediate_size
    x, gate, up, down = _w(1, h, seed=1), _w(m, h, seed=2), _w(m, h, seed=3), _w(h, m, seed=4)
    full = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
    partial = []
    for r in range(2):
        g = shard(L + "mlp.gate_proj.weight", gate, CFG, r, 2)
        u = shard(L + "mlp.up_proj.weight", up, CFG, r, 2)
        d = shard(L + "mlp.down_proj.weight", down, CFG, r, 2)
        partial.append((torch.nn.functional.silu(x @ g.T) * (x @ u.T)) @ d.T)
    torch.testing.assert_close(sum(partial), full)    # what the all-reduce computes


def test_attention_output_partials_sum_to_the_unsplit_projection():
    heads_out, o = _w(1, CFG.q_size, seed=5), _w(CFG.hidden_size, CFG.q_size, seed=6)
    per = shard_shapes(CFG, 2).q_size
    partial = [heads_out[:, r * per:(r + 1) * per] @
               shard(L + "self_attn.o_proj.weight", o, CFG, r, 2).T for r in range(2)]
    torch.testing.assert_close(sum(partial), heads_out @ o.T)


def test_vocab_shards_concatenate_to_the_full_logits():
    head, x = _w(CFG.vocab_size, CFG.hidden_size, seed=7), _w(1, CFG.hidden_size, seed=8)
    logits = [x @ shard("lm_head.weight", head, CFG, r, 2).T for r in range(2)]
    assert torch.equal(torch.cat(logits, 1), x @ head.T)
    assert list(vocab_range(CFG, 1, 2)) == list(range(48, 96))


def test_replicated_tensors_are_the_whole_tensor_on_every_rank():
    norm = _w(CFG.hidden_size, seed=9)
    assert all(shard("model.norm.weight", norm, CFG, r, 2) is norm for r in range(2))


def test_a_rank_count_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(ShardingError, match="num_attention_heads 4 is not divisible by 3"):
        shard_shapes(CFG, 3)


def test_a_rank_count_that_does_not_divide_the_key_value_heads_is_refused():
    with pytest.raises(ShardingError, match="num_key_value_heads 2 is not divisible by 4"):
        shard_shapes(CFG, 4)


def test_a_rank_outside_the_group_is_refused():
    with pytest.raises(ShardingError, match="rank 2 is outside 0..1"):
        shard("lm_head.weight", _w(CFG.vocab_size, CFG.hidden_size, seed=0), CFG, 2, 2)
