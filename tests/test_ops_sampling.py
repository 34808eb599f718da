"""ops.sample on the CPU executor: temperature, top-k, top-p and the seeded Gumbel draw,
checked token for token against a torch reference that sorts (Hugging Face's filters) and
recomputes the same counter-based noise."""
import numpy as np
import pytest
import torch

import safetile as st
from safetile import ops
from safetile.ops import sampling
from safetile.ops.copy import add_scalar_kernel

import support
from support import rand, wrap

cpu_executor = support.cpu_executor(seed=3)
M32 = 0xFFFFFFFF


def mix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = (h * 0x21F0AAAD) & M32
    h = h ^ (h >> 15)
    h = (h * 0x735A2D97) & M32
    return h ^ (h >> 15)


def gumbel(seed: int, counter: int, n: int) -> torch.Tensor:
    k0, k1 = torch.tensor(seed & M32), torch.tensor((seed >> 32) & M32)
    s = mix(mix(k0 ^ 0x3C6EF372) ^ k1)
    step = mix(s ^ counter)
    h = mix(mix(torch.arange(n, dtype=torch.int64) ^ step) ^ s)
    u = ((h >> 8).float() + 0.5) * (1.0 / 16777216.0)
    return -torch.log(-torch.log(u))


def kept(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Hugging Face's TopK then TopP warpers, as a mask of the tokens they keep."""
    z = logits.float() / temperature
    keep = torch.ones_like(z, dtype=torch.bool)
    if 0 < top_k < z.numel():
        keep &= z >= torch.topk(z, top_k).values[-1]
    if top_p < 1.0:
        masked = torch.where(keep, z, float("-inf"))
        probs, order = torch.sort(torch.softmax(masked, 0), descending=False)
        drop = torch.cumsum(probs, 0) <= 1 - top_p
        drop[-1] = False
        keep &= ~torch.zeros_like(keep).scatter(0, order, drop)
    return keep


def expected(logits, temperature, top_k, top_p, seed, counter) -> int:
    if temperature == 0:
        return int(torch.argmax(logits.float()))
    z = (logits.float() - logits.float().max()) / temperature
    score = torch.where(kept(logits, temperature, top_k, top_p), z + gumbel(seed, counter, z.numel()),
                        float("-inf"))
    return int(torch.argmax(score))


def draw(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, counter=0, **kw):
    params = ops.sampling_params(temperature, top_k, top_p, device="cpu")
    key = ops.sampling_key(seed, device="cpu")
    ctr = st.from_torch(torch.tensor([counter], dtype=torch.int32))
    return int(ops.sample(wrap(logits), params, key, ctr, **kw).sync().to_torch()[0])


CASES = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 7, 1.0), (1.3, 0, 0.6), (0.8, 40, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_the_drawn_token_is_the_gumbel_argmax_over_the_tokens_hf_filters_keep(
        temperature, top_k, top_p):
    logits = rand(2500, st.f32, 1, scale=2.0)
    for counter in (0, 5):
        got = draw(logits, temperature, top_k, top_p, seed=99, counter=counter)
        assert got == expected(logits, temperature, top_k, top_p, 99, counter)


def test_temperature_zero_is_the_first_argmax():
    logits = rand(3000, st.bf16, 2)
    logits[[17, 2900]] = 40.0
    assert draw(logits, temperature=0.0, seed=5) == 17


def test_top_k_one_and_a_tiny_top_p_are_greedy_for_every_seed():
    logits = rand(1500, st.f32, 3)
    best = int(torch.argmax(logits))
    for seed in range(3):
        assert draw(logits, 1.0, top_k=1, seed=seed) == best
        assert draw(logits, 1.0, top_p=1e-6, seed=seed) == best


def test_a_top_p_below_float32s_range_keeps_the_top_token():
    logits = rand(1500, st.f32, 3)
    best = int(torch.argmax(logits))
    assert float(ops.sampling_params(1.0, top_p=1e-46, device="cpu").to_torch()[2]) > 0.0
    for top_p in (1e-38, 1e-46, 5e-324):
        assert draw(logits, 1.0, top_p=top_p, seed=1) == best


def test_the_kernel_keeps_the_top_token_even_for_a_top_p_of_zero():
    """params written on the device bypass the host's checks: a top_p of 0 (nothing to
    keep) still draws the most likely token, never an index from an empty set."""
    logits = rand(1500, st.f32, 3)
    logits[0] = -50.0
    params = st.from_torch(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    key, ctr = ops.sampling_key(1, device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu")
    tok = ops.sample(wrap(logits), params, key, ctr).sync()
    assert int(tok.to_torch()[0]) == int(torch.argmax(logits))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0)] + CASES)
def test_logits_masked_to_minus_infinity_are_never_drawn_and_the_rest_follow_hf(
        temperature, top_k, top_p):
    logits = rand(3000, st.f32, 5, scale=2.0)
    logits[::3] = float("-inf")                      # a mask, as a logits processor makes
    for seed in (0, 7):
        got = draw(logits, temperature, top_k, top_p, seed=seed)
        assert got % 3 != 0
        assert got == expected(logits, temperature, top_k, top_p, seed, 0)


@pytest.mark.parametrize("mask", [-1e12, torch.finfo(torch.float32).min])
@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_a_hugely_negative_logit_leaves_top_k_and_top_p_exact(mask, temperature):
    logits = rand(3000, st.f32, 6)
    logits[5] = mask
    best = int(torch.argmax(logits))
    for seed in range(4):
        assert draw(logits, temperature, top_k=1, seed=seed) == best
        assert draw(logits, temperature, top_p=1e-6, seed=seed) == best
        assert draw(logits, temperature, top_k=9, top_p=0.8, seed=seed) == \
            expected(logits, temperature, 9, 0.8, seed, 0)


@pytest.mark.parametrize("temperature,top_k", [(0.0, 0), (1.0, 0), (0.7, 5)])
def test_a_plus_infinity_logit_is_drawn(temperature, top_k):
    logits = rand(3000, st.f32, 7)
    logits[2222] = float("inf")
    for seed in range(3):
        assert draw(logits, temperature, top_k=top_k, top_p=0.9, seed=seed) == 2222


def test_a_nan_logit_is_never_drawn_and_leaves_top_p_working():
    logits = rand(3000, st.f32, 8)
    logits[11] = float("nan")
    masked = torch.nan_to_num(logits, nan=float("-inf"))
    best = int(torch.argmax(masked))
    for seed in range(4):
        assert draw(logits, 1.0, top_p=1e-6, seed=seed) == best
        assert draw(logits, 0.0, seed=seed) == best
        assert draw(logits, 1.0, top_p=0.3, seed=seed) == expected(masked, 1.0, 0, 0.3, seed, 0)
    logits[:] = float("nan")
    assert 0 <= draw(logits, 1.0, seed=0) < 3000        # all NaN: a token, never a crash


def test_the_same_seed_and_counter_give_the_same_token_and_others_vary():
    logits = torch.zeros(64)                       # uniform: every token equally likely
    a = [draw(logits, seed=7, counter=c) for c in range(12)]
    assert a == [draw(logits, seed=7, counter=c) for c in range(12)]
    assert len(set(a)) > 6
    assert [draw(logits, seed=8, counter=c) for c in range(12)] != a


def test_a_seed_above_32_bits_uses_its_high_word():
    logits = torch.zeros(256)
    lo = [draw(logits, seed=3, counter=c) for c in range(6)]
    hi = [draw(logits, seed=3 + (1 << 40), counter=c) for c in range(6)]
    assert lo != hi


def test_bf16_logits_and_an_int64_token():
    logits = rand(1200, st.bf16, 4, scale=3.0)
    out = st.empty((1,), dtype=st.i64, device="cpu")
    params = ops.sampling_params(0.9, 20, 0.95, device="cpu")
    key, ctr = ops.sampling_key(11, device="cpu"), st.from_torch(torch.tensor([2], dtype=torch.int32))
    tok = ops.sample(wrap(logits), params, key, ctr, out=out).sync()
    assert tok.dtype is st.i64 and int(tok.to_torch()[0]) == expected(logits, 0.9, 20, 0.95, 11, 2)


def test_recorded_with_a_workspace_the_graph_follows_new_params_and_counters():
    n = 900
    logits = rand(n, st.f32, 5, scale=2.0)
    ws = ops.sampler_workspace(n, device="cpu")
    params = st.zeros((4,), device="cpu")
    key = ops.sampling_key(21, device="cpu")
    ctr = st.zeros((1,), dtype=st.i32, device="cpu")
    out = st.empty((1,), dtype=st.i32, device="cpu")
    x = wrap(logits)
    with st.graph_scope() as s:
        s.record(ops.sample(x, params, key, ctr, out=out, workspace=ws))
    for (t, k, p), c in [((1.0, 9, 1.0), 0), ((0.0, 0, 1.0), 1), ((1.2, 0, 0.7), 3)]:
        ops.copy(ops.sampling_params(t, k, p, device="cpu"), out=params).sync()
        ops.copy(st.from_torch(torch.tensor([c], dtype=torch.int32)), out=ctr).sync()
        s.launch().sync()
        assert int(out.to_torch()[0]) == expected(logits, t, k, p, 21, c)


def test_bad_parameters_are_rejected_on_the_host():
    with pytest.raises(ValueError, match="temperature"):
        ops.sampling_params(-0.1)
    with pytest.raises(ValueError, match="top_p"):
        ops.sampling_params(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        ops.sampling_params(1.0, top_k=-2)
    with pytest.raises(ValueError, match="workspace"):
        ops.sample(wrap(torch.zeros(100)), st.zeros((4,), device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"),
                   workspace=ops.sampler_workspace(50, device="cpu"))


@pytest.mark.parametrize("kwargs", [dict(temperature=float("inf")), dict(temperature=True),
                                    dict(temperature="1"), dict(top_p="0.5"),
                                    dict(top_p=float("nan")), dict(top_k=2.0)])
def test_parameters_of_the_wrong_kind_are_argument_errors(kwargs):
    with pytest.raises(st.ArgumentError, match="ops.sampling_params"):
        ops.sampling_params(**{"temperature": 1.0, **kwargs}, device="cpu")


def test_passes_take_any_int_and_refuse_the_rest():
    logits = rand(500, st.f32, 9)
    assert draw(logits, 1.0, top_k=3, seed=2, passes=np.int64(3)) == \
        draw(logits, 1.0, top_k=3, seed=2, passes=3)
    with pytest.raises(st.ArgumentError, match="passes"):
        draw(logits, 1.0, passes=1.5)


@pytest.mark.parametrize("passes", [0, 33, 10**9, True])
def test_passes_outside_1_to_32_are_refused_before_any_launch(passes):
    with pytest.raises(st.ArgumentError, match="ops.sample: passes must be an int"):
        ops.sample(wrap(rand(500, st.f32, 9)), ops.sampling_params(1.0, device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32),
                   passes=passes)


def test_no_logits_is_an_argument_error():
    with pytest.raises(st.ArgumentError, match="0 logits"):
        draw(torch.zeros(0), 1.0)


@pytest.mark.parametrize("fill", [float("-inf"), float("nan")])
def test_with_no_finite_logit_the_token_is_still_inside_the_vocabulary(fill):
    # the last block's padding ties with every -inf logit at z = 0; it is never a token
    logits = torch.full((2000,), fill)
    logits[::3] = float("-inf")
    for counter in range(6):
        assert 0 <= draw(logits, 1.0, counter=counter) < 2000


def test_a_workspace_whose_block_was_changed_is_refused():
    ws = ops.sampler_workspace(3000, device="cpu", block=2048)
    ws.block = 1024
    with pytest.raises(st.ArgumentError, match=r"workspace.stats is st.float32 \(2, 4\), "
                                               r"where 3000 logits in blocks of 1024 need"):
        draw(torch.randn(3000), 0.0, workspace=ws)


@pytest.mark.parametrize("n, block", [(0, 1024), (-5, 1024), (10, 16.0), ("10", 1024)])
def test_a_workspace_for_no_logits_or_a_bad_block_is_an_argument_error(n, block):
    with pytest.raises(st.ArgumentError, match="ops.sampler_workspace"):
        ops.sampler_workspace(n, device="cpu", block=block)


def test_a_float_out_is_refused_when_the_op_is_built():
    with pytest.raises(st.ArgumentError, match="out must be st.i32 or st.i64"):
        ops.sample(wrap(torch.randn(64)), ops.sampling_params(device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"),
                   out=st.zeros((1,), device="cpu"))


def test_an_out_overlapping_an_input_is_refused_before_anything_runs():
    counter = st.zeros((1,), dtype=st.i32, device="cpu")
    with pytest.raises(st.AliasError, match="ops.sample: the output out overlaps the input "
                                            "counter"):
        ops.sample(wrap(rand(500, st.f32, 9)), ops.sampling_params(1.0, device="cpu"),
                   ops.sampling_key(0, device="cpu"), counter, out=counter.view(1))
    assert counter.to_torch().tolist() == [0]


def test_an_out_inside_the_workspace_is_refused_before_anything_runs():
    ws = ops.sampler_workspace(500, device="cpu")
    with pytest.raises(st.AliasError, match="workspace.indices"):
        ops.sample(wrap(rand(500, st.f32, 9)), ops.sampling_params(1.0, device="cpu"),
                   ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"),
                   out=ws.indices.slice(0, 0, 1), workspace=ws)


def test_without_a_workspace_it_allocates_so_it_cannot_be_recorded():
    with pytest.raises(st.GraphCaptureError):
        args = (wrap(torch.zeros(64)), st.zeros((4,), device="cpu"),
                ops.sampling_key(0, device="cpu"), st.zeros((1,), dtype=st.i32, device="cpu"))
        with st.graph_scope() as s:
            s.record(ops.sample(*args))


def test_add_scalar_and_copy_advance_a_device_counter():
    cursor = st.from_torch(torch.tensor([5, 0], dtype=torch.int32))
    scratch = st.empty((2,), dtype=st.i32, device="cpu")
    with st.graph_scope() as s:
        s.record(ops.add_scalar(cursor, 1, out=scratch))
        s.record(ops.copy(scratch, out=cursor))
    for _ in range(3):
        s.launch().sync()
    assert cursor.to_torch().tolist() == [8, 3]
    y = ops.add_scalar(wrap(torch.tensor([1.5, 2.0], dtype=torch.bfloat16)), 0.25).sync()
    assert y.to_torch().tolist() == [1.75, 2.25]
    with pytest.raises(ValueError, match="float value"):
        ops.add_scalar(cursor, 0.5)


def test_sampling_kernels_compile_for_sm90():
    z = lambda shape, dt=st.f32: st.zeros(shape, dtype=dt, device="cpu")  # noqa: E731
    o = lambda shape, tile, dt=st.f32: st.empty(shape, dtype=dt, device="cpu").partition(tile)  # noqa: E731
    nb, n = 149, 151936
    k = sampling
    kernels = [
        k.stats_kernel.compile(z((n,), st.bf16), z((4,)), o((nb, 4), (1, 4)), 1024),
        k.init_kernel.compile(z((nb, 4)), z((4,)), o((64,), (64,)), n, 256),
        k.search_kernel.compile(z((n,), st.bf16), z((64,)), z((4,)), o((nb, 32), (1, 32)),
                                o((nb, 32), (1, 32)), 1024, 1),
        k.step_kernel.compile(z((nb, 32)), z((nb, 32)), z((64,)), z((4,)), o((64,), (64,)), n,
                              256, 0, True),
        k.draw_kernel.compile(z((n,), st.bf16), z((64,)), z((4,)), z((2,), st.i64),
                              z((1,), st.i32), o((nb,), (1,)), o((nb,), (1,), st.i32), 1024),
        add_scalar_kernel.compile(z((2,), st.i32), o((2,), (2,), st.i32), 1),
    ]
    for c in kernels:
        assert ".target sm_90" in c.asm["ptx"]
