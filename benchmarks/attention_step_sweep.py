"""Sweep: the short-context step's prologue-and-attention kernel inside grout's whole decode
step: its launch options, and the two kernels it replaces.

    python benchmarks/attention_step_sweep.py --model qwen3-4b [--tag 1]
    python benchmarks/attention_step_sweep.py --variants attention:block_n=128,num_warps=8

One engine (random weights of the named shape) prefills a 127-token prompt, so the step
attends about 128 positions. A variant of role ``attention`` passes its options to every
``ops.qk_norm_rope_attend`` call of the step; role ``two_kernels`` (no options) records the
step with the prologue and a one-kernel attention instead (``ops.qk_norm_rope_kv_append``,
``ops.decode_attention``). Each variant's graphs are recorded once. Chunks of 8 steps from
position 127 (cursor and token set back each time) are then timed for every variant in
turn, median over repeats. Before any is timed, each ``attention`` variant's op (random
inputs, 128 positions) must stay within 1% of the default's output (another key block
sums in another order). Greedy tokens are reported, not required to match. Writes
benchmarks/results/archive/attention_step_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import statistics

import harness
from early_trigger_sweep import START, chunk
from gemv_step_sweep import parse_variant

VARIANTS = {
    "attention": [dict(block_n=32), dict(block_n=128), dict(num_warps=2), dict(num_warps=8),
                  dict(num_stages=2), dict(num_stages=4)],
    "two_kernels": [{}],
}


def attend_error(override: dict, hq: int, hkv: int, d: int, pos: int = 128,
                 device: str = "cuda") -> float:
    """Largest relative L2 difference of ``ops.qk_norm_rope_attend`` with ``override`` from
    the default's outputs (attention output and both caches), random inputs."""
    import torch

    import safetile as st
    from safetile import ops
    gen = torch.Generator(device=device)

    def run(opts):
        def rand(*shape):
            return torch.randn(*shape, device=device, generator=gen).to(torch.bfloat16)
        gen.manual_seed(1)
        qkv, qw, kw = rand((hq + 2 * hkv) * d), rand(d), rand(d)
        kc, vc = rand(hkv, 2 * pos, d), rand(hkv, 2 * pos, d)
        at = torch.tensor([pos], dtype=torch.int32, device=device)
        outs = ops.qk_norm_rope_attend(
            st.from_torch(qkv), st.from_torch(qw), st.from_torch(kw), st.from_torch(at),
            ops.inv_freq_table(d, 1e6, device), st.from_torch(kc), st.from_torch(vc), 1e-6,
            **opts).sync()
        return [t.to_torch().float() for t in outs]
    return max(float((a - b).norm() / b.norm()) for a, b in zip(run(override), run({})))


@contextlib.contextmanager
def variant(role: str, override: dict):
    """While recording: ``override`` added to every ``ops.qk_norm_rope_attend`` call, or
    (``two_kernels``) grout's short step built from the prologue and a one-kernel attention
    (it fuses them only where ``ops.qk_norm_rope_attend_fits``)."""
    from safetile import ops
    saved = ops.qk_norm_rope_attend, ops.qk_norm_rope_attend_fits
    if role == "attention":
        ops.qk_norm_rope_attend = functools.partial(saved[0], **override)
    elif role == "two_kernels":
        ops.qk_norm_rope_attend_fits = lambda head_dim, max_seq: False
    try:
        yield
    finally:
        ops.qk_norm_rope_attend, ops.qk_norm_rope_attend_fits = saved


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]]) -> tuple[list, list]:
    import grout
    eng = grout.load(name, max_seq_len=2048, progress=False)
    r, c = eng.runner, eng.config
    params, key = grout.SamplingParams().tensors(eng.device)
    first = r.begin([(7 * i + 3) % c.vocab_size for i in range(START)], params, key, True)
    variants = [("default", {})] + chosen
    heads = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    graphs, tokens, failed, errors = {}, {}, [], {}
    for i, (role, override) in enumerate(variants):
        r.graphs, r.chunks = {}, {}
        try:
            if role == "attention":
                errors[i] = attend_error(override, *heads)
            with variant(role, override):
                tokens[i] = chunk(r, first)[1]
        except Exception as e:                # options the kernel refuses, or out of resources
            failed.append(dict(role=role, override=override, error=f"{type(e).__name__}: {e}"))
            print(f"{role} {override}: {type(e).__name__}: {e}", flush=True)
            continue
        if errors.get(i, 0.0) > 1e-2:
            raise AssertionError(f"{role} {override}: outputs {errors[i]:.2e} from the "
                                 f"default's")
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
                         default_over_this=base * 1e6 / us, rel_diff=errors.get(i),
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
                               "rel_diff", "tokens_equal"])
    harness.write_results(f"archive/attention_step_sweep_{args.model}_{args.tag}", dict(
        model=args.model, chunk=8, start=START, repeats=args.repeats, rows=rows,
        failed=failed, method=__doc__,
        note="µs per decode step of the whole model, median of repeats; override: the "
             "options the variant passed"))


if __name__ == "__main__":
    main()
