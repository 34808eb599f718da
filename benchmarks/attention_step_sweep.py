"""Sweep: the decode attention's launch options (key block, warps, stages, masking), the
attention prologue's warps and the fused prologue + attention's inside the whole decode step.

    python benchmarks/attention_step_sweep.py --model qwen3-4b [--tag 1]
    python benchmarks/attention_step_sweep.py --variants attention:block_n=128,num_warps=8
    python benchmarks/attention_step_sweep.py --start 1023 --variants split:masked=1
    python benchmarks/attention_step_sweep.py --model qwen3-4b --roles early

One engine (random weights of the named shape) prefills a 127-token prompt (``--start``
tokens), so the step attends about 128 positions with one kernel per kv head. A variant
passes its options to every one-split ``ops.decode_attention`` (role ``attention``), split
one (role ``split``, for a ``--start`` past the short context),
``ops.qk_norm_rope_kv_append`` (role ``prologue``), ``ops.qk_norm_rope_append_attention``
(role ``fused``) or ``ops.qk_norm_rope_attention`` (role ``early``) call of the step. A
``fused`` variant records the short step with that one kernel (``model.FUSED_SHORT_ATTENTION``
on; ``{}``: its default options); an ``early`` variant with the attention reading the cache
before its PDL wait, then ``ops.kv_append`` (``model.EARLY_CACHE_ATTENTION`` on; ``early:``
on the command line: its default options); the default and the other roles' variants run the
prologue and the attention as two kernels. Each variant's
graphs are recorded once. Chunks of 8 steps from that position (cursor and token set back
each time) are then timed for every variant in turn, median over repeats. Before any is
timed, each attention variant's op (random q and cache, NaN past the length) is checked
against an fp32 torch reference at a whole number of key blocks and with a partial last one
(128 and 135 positions; a split variant at 1024 and 1031), to no more than twice the
default's error; a prologue variant's outputs must stay within 1% of the default's (bf16
rounding of another reduction order), and a fused variant's output within 1% of the
two-kernel chain's, as an early variant's (whose caches after its append must equal the
chain's exactly). Greedy tokens are reported, not required to match. Writes
benchmarks/results/archive/attention_step_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import contextlib
import functools

import step_sweep
from step_sweep import engine, median_us, record

OPS = {"attention": "decode_attention", "split": "decode_attention",
       "prologue": "qk_norm_rope_kv_append", "fused": "qk_norm_rope_append_attention",
       "early": "qk_norm_rope_attention"}
VARIANTS = {
    "attention": [dict(block_n=32), dict(block_n=128), dict(num_warps=2), dict(num_warps=8),
                  dict(num_stages=2), dict(num_stages=4), dict(block_n=128, num_warps=8),
                  dict(block_n=32, num_stages=4)],
    "prologue": [dict(num_warps=1), dict(num_warps=2), dict(num_warps=8)],
    "split": [dict(masked=True)],
    "fused": [dict(), dict(num_warps=8), dict(block_n=32), dict(num_stages=3)],
    "early": [dict(), dict(trim=False), dict(early_positions=128), dict(block_n=128),
              dict(block_n=32, early_positions=128), dict(num_warps=4)],
}


def attention_error(override: dict, hq: int, hkv: int, d: int, lengths=(128, 135),
                    splits: int = 1, device: str = "cuda") -> float:
    """Largest relative L2 error of one ``ops.decode_attention`` of ``splits`` splits with
    ``override`` against fp32 torch, over ``lengths`` (whole key blocks, and a partial last
    one): random bf16 q and caches of twice the longest length, NaN past the length."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
    worst, size = 0.0, 2 * max(lengths)
    for length in lengths:
        q, kc, vc = rand(hq, d), rand(hkv, size, d), rand(hkv, size, d)
        k, v = (c[:, :length].float().repeat_interleave(hq // hkv, 0) for c in (kc, vc))
        kc[:, length:], vc[:, length:] = float("nan"), float("nan")
        pos = torch.tensor([length], dtype=torch.int32, device=device)
        got = ops.decode_attention(st.from_torch(q), st.from_torch(kc), st.from_torch(vc),
                                   st.from_torch(pos), num_splits=splits, **override).sync()
        p = torch.softmax(torch.einsum("hd,hnd->hn", q.float(), k) / d ** 0.5, -1)
        want = torch.einsum("hn,hnd->hd", p, v)
        worst = max(worst, float((got.to_torch().float() - want).norm() / want.norm()))
    return worst


def prologue_error(override: dict, hq: int, hkv: int, d: int, pos: int = 128,
                   device: str = "cuda") -> float:
    """Largest relative L2 difference of ``ops.qk_norm_rope_kv_append`` with ``override``
    from the default's outputs (the normed, rotated q and both caches), random inputs."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device).manual_seed(1)

    def run(opts):
        def rand(*shape):
            return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
        gen.manual_seed(1)
        qkv, qw, kw = rand((hq + 2 * hkv) * d), rand(d), rand(d)
        kc, vc = rand(hkv, 2 * pos, d), rand(hkv, 2 * pos, d)
        at = torch.tensor([pos], dtype=torch.int32, device=device)
        outs = ops.qk_norm_rope_kv_append(
            st.from_torch(qkv), st.from_torch(qw), st.from_torch(kw), st.from_torch(at),
            ops.inv_freq_table(d, 1e6, device), st.from_torch(kc), st.from_torch(vc), 1e-6,
            **opts).sync()
        return [t.to_torch().float() for t in outs]
    return max(float((a - b).norm() / b.norm()) for a, b in zip(run(override), run({})))


def fused_error(override: dict, hq: int, hkv: int, d: int, pos: int = 130,
                device: str = "cuda") -> float:
    """Relative L2 difference of ``ops.qk_norm_rope_append_attention`` with ``override``
    from ``ops.qk_norm_rope_kv_append`` then one-split ``ops.decode_attention`` (random
    inputs, the caches NaN past ``pos``)."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device).manual_seed(2)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
    qkv, qw, kw = rand((hq + 2 * hkv) * d), rand(d), rand(d)
    kc, vc = rand(hkv, 2 * pos, d), rand(hkv, 2 * pos, d)
    kc[:, pos + 1:], vc[:, pos + 1:] = float("nan"), float("nan")
    at = st.from_torch(torch.tensor([pos], dtype=torch.int32, device=device))
    inv = ops.inv_freq_table(d, 1e6, device)
    common = (st.from_torch(qkv), st.from_torch(qw), st.from_torch(kw), at, inv)
    got = ops.qk_norm_rope_append_attention(*common, st.from_torch(kc.clone()),
                                            st.from_torch(vc.clone()), 1e-6,
                                            **override).sync()[0].to_torch().float()
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(*common, st.from_torch(kc),
                                                     st.from_torch(vc), 1e-6).sync()
    want = ops.decode_attention(q, k_cache, v_cache, at, length_offset=1,
                                num_splits=1).sync().to_torch().float()
    return float((got - want).norm() / want.norm())


def early_error(override: dict, hq: int, hkv: int, d: int, pos: int = 130,
                device: str = "cuda") -> float:
    """Relative L2 difference of ``ops.qk_norm_rope_attention`` with ``override`` (then
    ``ops.kv_append``) from ``ops.qk_norm_rope_kv_append`` then one-split
    ``ops.decode_attention`` (random inputs, the caches NaN from ``pos`` on, the row the
    append writes included); raises unless the caches after both appends are equal."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device).manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
    qkv, qw, kw = rand((hq + 2 * hkv) * d), rand(d), rand(d)
    kc, vc = rand(hkv, 2 * pos, d), rand(hkv, 2 * pos, d)
    kc[:, pos:], vc[:, pos:] = float("nan"), float("nan")
    at = st.from_torch(torch.tensor([pos], dtype=torch.int32, device=device))
    inv = ops.inv_freq_table(d, 1e6, device)
    common = (st.from_torch(qkv), st.from_torch(qw), st.from_torch(kw), at, inv)
    got, k_rows = ops.qk_norm_rope_attention(*common, st.from_torch(kc.clone()),
                                             st.from_torch(vc.clone()), 1e-6,
                                             **override).sync()
    v_rows = st.from_torch(qkv.view(hq + 2 * hkv, d)[hq + hkv:].clone())
    k_got, v_got = ops.kv_append(k_rows, v_rows, at, st.from_torch(kc.clone()),
                                 st.from_torch(vc.clone())).sync()
    q, k_cache, v_cache = ops.qk_norm_rope_kv_append(*common, st.from_torch(kc),
                                                     st.from_torch(vc), 1e-6).sync()
    for a, b in ((k_got, k_cache), (v_got, v_cache)):
        if not torch.equal(a.to_torch()[:, :pos + 1], b.to_torch()[:, :pos + 1]):
            raise AssertionError(f"early {override}: the caches after the append differ")
    want = ops.decode_attention(q, k_cache, v_cache, at, length_offset=1,
                                num_splits=1).sync().to_torch().float()
    return float((got.to_torch().float() - want).norm() / want.norm())


def patched(fn, role: str, override: dict):
    """``fn`` with ``override`` added to its keywords (role ``attention``: the one-kernel
    calls only, so a split step's workspace keeps its own key block; role ``split``: the
    split calls only)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if (role == "attention" and kwargs.get("num_splits") != 1) or \
                (role == "split" and kwargs.get("num_splits") == 1):
            return fn(*args, **kwargs)
        return fn(*args, **{**kwargs, **override})
    return call


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]],
          start: int) -> tuple[list, list]:
    from grout import model
    from safetile import ops
    eng, origin = engine(name, start)
    r, c = eng.runner, eng.config
    variants = [("default", {})] + chosen
    heads = c.num_attention_heads, c.num_key_value_heads, c.head_dim

    split_args = dict(lengths=(1024, 1031), splits=r.buf.attn_ws.num_splits)
    default_error = functools.cache(lambda: attention_error({}, *heads))
    default_split_error = functools.cache(lambda: attention_error({}, *heads, **split_args))

    def check(role, override):
        if role == "attention":
            return attention_error(override, *heads), default_error(), 1e-4
        if role == "split":
            return (attention_error(override, *heads, **split_args), default_split_error(),
                    1e-4)
        if role == "fused":
            return fused_error(override, *heads), 0.0, 1e-2
        if role == "early":
            return early_error(override, *heads), 0.0, 1e-2
        return prologue_error(override, *heads), 0.0, 1e-2

    @contextlib.contextmanager
    def applied(role, override):
        original = getattr(ops, OPS[role])
        setattr(ops, OPS[role], patched(original, role, override))
        was = model.FUSED_SHORT_ATTENTION, model.EARLY_CACHE_ATTENTION
        model.FUSED_SHORT_ATTENTION = role == "fused"
        model.EARLY_CACHE_ATTENTION = role == "early"
        try:
            yield
        finally:
            setattr(ops, OPS[role], original)
            model.FUSED_SHORT_ATTENTION, model.EARLY_CACHE_ATTENTION = was
    graphs, tokens, failed, errors = record(r, origin, variants, check, applied)
    times = median_us(r, origin, graphs, repeats)
    return step_sweep.rows(variants, times, tokens, errors), failed


if __name__ == "__main__":
    step_sweep.main("attention_step_sweep", __doc__, VARIANTS, sweep, 11,
                    "µs per decode step of the whole model, median of repeats; override: the "
                    "options the variant passed")
