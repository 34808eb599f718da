"""Sweep: the short-context decode attention's launch options (key block, warps, stages)
and the attention prologue's warps inside grout's whole decode step.

    python benchmarks/attention_step_sweep.py --model qwen3-4b [--tag 1]
    python benchmarks/attention_step_sweep.py --variants attention:block_n=128,num_warps=8

One engine (random weights of the named shape) prefills a 127-token prompt, so the step
attends about 128 positions with one kernel per kv head. A variant passes its options to
every ``ops.decode_attention`` (role ``attention``) or ``ops.qk_norm_rope_kv_append`` (role
``prologue``) call of the step; its graphs are recorded once. Chunks of 8 steps from
position 127 (cursor and token set back each time) are then timed for every variant in
turn, median over repeats. Before any is timed, each attention variant's op (random q and
cache, 128 positions) is checked against an fp32 torch reference, to no more than twice
the default's error; a prologue variant's outputs must stay within 1% of the default's
(bf16 rounding of another reduction order). Greedy tokens are reported, not required to
match. Writes
benchmarks/results/archive/attention_step_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import argparse
import functools
import statistics

import harness
from early_trigger_sweep import START, chunk
from gemv_step_sweep import parse_variant

OPS = {"attention": "decode_attention", "prologue": "qk_norm_rope_kv_append"}
VARIANTS = {
    "attention": [dict(block_n=32), dict(block_n=128), dict(num_warps=2), dict(num_warps=8),
                  dict(num_stages=2), dict(num_stages=4), dict(block_n=128, num_warps=8),
                  dict(block_n=32, num_stages=4)],
    "prologue": [dict(num_warps=1), dict(num_warps=2), dict(num_warps=8)],
}


def attention_error(override: dict, hq: int, hkv: int, d: int, length: int = 128,
                    device: str = "cuda") -> float:
    """Relative L2 error of one short-context ``ops.decode_attention`` with ``override``
    against fp32 torch (random bf16 q and caches of ``2 * length`` positions)."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
    q, kc, vc = rand(hq, d), rand(hkv, 2 * length, d), rand(hkv, 2 * length, d)
    pos = torch.tensor([length], dtype=torch.int32, device=device)
    got = ops.decode_attention(st.from_torch(q), st.from_torch(kc), st.from_torch(vc),
                               st.from_torch(pos), num_splits=1, **override).sync()
    g = hq // hkv
    k, v = (c[:, :length].float().repeat_interleave(g, 0) for c in (kc, vc))
    p = torch.softmax(torch.einsum("hd,hnd->hn", q.float(), k) / d ** 0.5, -1)
    want = torch.einsum("hn,hnd->hd", p, v)
    return float((got.to_torch().float() - want).norm() / want.norm())


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


def patched(fn, role: str, override: dict):
    """``fn`` with ``override`` added to its keywords (for the attention: its one-kernel
    calls only, so a split step's workspace keeps its own key block)."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if role == "attention" and kwargs.get("num_splits") != 1:
            return fn(*args, **kwargs)
        return fn(*args, **{**kwargs, **override})
    return call


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]]) -> tuple[list, list]:
    import grout
    from safetile import ops
    eng = grout.load(name, max_seq_len=2048, progress=False)
    r, c = eng.runner, eng.config
    params, key = grout.SamplingParams().tensors(eng.device)
    first = r.begin([(7 * i + 3) % c.vocab_size for i in range(START)], params, key, True)
    variants = [("default", {})] + chosen
    originals = {role: getattr(ops, fn) for role, fn in OPS.items()}
    heads = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    graphs, tokens, failed, errors = {}, {}, [], {}
    for i, (role, override) in enumerate(variants):
        r.graphs, r.chunks = {}, {}
        try:
            if role == "attention":
                errors[i] = attention_error(override, *heads), attention_error({}, *heads)
            elif role == "prologue":
                errors[i] = prologue_error(override, *heads), 0.0
            if role != "default":
                setattr(ops, OPS[role], patched(originals[role], role, override))
            tokens[i] = chunk(r, first)[1]
        except Exception as e:                # options the kernel refuses, or out of resources
            failed.append(dict(role=role, override=override, error=f"{type(e).__name__}: {e}"))
            print(f"{role} {override}: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            for role_, fn in OPS.items():
                setattr(ops, fn, originals[role_])
        if i in errors and not errors[i][0] <= 2 * errors[i][1] + \
                (1e-2 if role == "prologue" else 1e-4):
            raise AssertionError(f"{role} {override}: relative error {errors[i][0]:.2e}, "
                                 f"the default's {errors[i][1]:.2e}")
        graphs[i] = (r.graphs, r.chunks)
    times: dict = {i: [] for i in graphs}
    for _ in range(repeats):
        for i, g in graphs.items():
            r.graphs, r.chunks = g
            times[i].append(chunk(r, first)[0])
    base = statistics.median(times[0])
    rows = []
    for i, samples in times.items():
        role, override = variants[i]
        us = statistics.median(samples) * 1e6
        rows.append(dict(role=role, override=override, us_per_step=us,
                         default_over_this=base * 1e6 / us,
                         rel_error=errors.get(i, (None,))[0],
                         default_rel_error=errors.get(i, (None, None))[1],
                         tokens_equal=tokens[i] == tokens[0]))
    return rows, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--roles", nargs="+", default=list(VARIANTS))
    ap.add_argument("--variants", nargs="+", default=None,
                    help="role:option=value,... (instead of the roles' default variants)")
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--tag", default="1")
    args = ap.parse_args()
    chosen = [parse_variant(v) for v in args.variants] if args.variants else \
        [(role, o) for role in args.roles for o in VARIANTS[role]]
    if not harness.start_gpu("attention_step_sweep"):
        return
    rows, failed = sweep(args.model, args.repeats, chosen)
    harness.print_table(rows, ["role", "override", "us_per_step", "default_over_this",
                               "rel_error", "tokens_equal"])
    harness.write_results(f"archive/attention_step_sweep_{args.model}_{args.tag}", dict(
        model=args.model, chunk=8, start=START, repeats=args.repeats, rows=rows,
        failed=failed, method=__doc__,
        note="µs per decode step of the whole model, median of repeats; override: the "
             "options the variant passed"))


if __name__ == "__main__":
    main()
