"""Sweep: the gemv tilings of one role (qkv, o, gate_up, down) inside grout's whole decode
step, where each gemv's inputs were just written by the kernel before it.

    python benchmarks/gemv_step_sweep.py --model qwen3-4b [--tag 2]
    python benchmarks/gemv_step_sweep.py --model qwen3-8b --variants down:bk=1024,num_stages=4

One engine (random weights of the named shape) prefills a 127-token prompt. A variant
replaces the default ``GemvConfig`` of one weight shape (rows per program ``bn``, K block
``bk``, pipeline stages, warps, head) and leaves every other projection as it is; its
graphs are recorded once. Chunks of 8 steps from position 127 (cursor and token set back
each time) are then timed for every variant in turn, median over repeats. Before any is
timed, each variant's op (layer 0's weight, random inputs) is checked against an fp32 torch
reference, to no more than twice the default config's error (a new K block sums in another
order, so the greedy tokens of random weights, full of near ties, may differ: they are
reported, not required to match). Writes
benchmarks/results/archive/gemv_step_sweep_<model>_<tag>.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import harness
from early_trigger_sweep import START, chunk

# role -> the overrides tried for it by default (fields of ops.GemvConfig)
VARIANTS = {
    "o": [dict(num_stages=3), dict(bk=2048, num_stages=2), dict(bk=2048, num_stages=3),
          dict(bn=8, num_stages=3)],
    "down": [dict(bk=1024, num_stages=s) for s in (3, 4, 5, 6)] +
            [dict(bk=1024, num_stages=4, bn=8), dict(bk=1024, num_stages=4, num_warps=8),
             dict(bk=1024, num_stages=4, head=2), dict(bk=2048, num_stages=2),
             dict(bk=2048, num_stages=3)],
    "qkv": [dict(bk=1024, num_stages=3), dict(bk=1024, num_stages=4),
            dict(num_stages=5), dict(num_stages=3)],
    "gate_up": [dict(num_stages=5), dict(num_stages=3)],
}


def parse_variant(text: str) -> tuple[str, dict]:
    """``"down:bk=1024,num_stages=4"`` -> ``("down", {"bk": 1024, "num_stages": 4})``."""
    role, _, fields = text.partition(":")
    return role, {k: int(v) for k, v in (f.split("=") for f in fields.split(",") if f)}


def roles(cfg) -> dict:
    """Weight shape ``(n, k)`` of each role, for the model config ``cfg``."""
    h = cfg.hidden_size
    return {"qkv": (cfg.q_size + 2 * cfg.kv_size, h), "o": (h, cfg.q_size),
            "gate_up": (2 * cfg.intermediate_size, h), "down": (h, cfg.intermediate_size)}


def role_error(role: str, w, cfg) -> float:
    """Relative L2 error of ``role``'s fused op with ``cfg`` on ``w`` against fp32 torch."""
    import torch

    import safetile as st
    from safetile import ops
    wt = w.to_torch().float()
    n, k = wt.shape
    gen = torch.Generator(device=wt.device).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device=wt.device, generator=gen).to(torch.bfloat16)
    res = rand(n)
    if role in ("qkv", "gate_up"):
        x, norm = rand(k), rand(k).abs() + 0.5
        op = ops.rmsnorm_gemv(st.from_torch(x), st.from_torch(norm).share(), w, 1e-6,
                              config=cfg)
        xf = x.float()
        want = wt @ (xf * torch.rsqrt(xf.pow(2).mean() + 1e-6) * norm.float())
    elif role == "o":
        x = rand(k)
        op = ops.gemv_add(w, st.from_torch(x), st.from_torch(res), config=cfg)
        want = wt @ x.float() + res.float()
    else:
        gu = rand(2 * k)
        op = ops.silu_mul_gemv_add(w, st.from_torch(gu), st.from_torch(res), config=cfg)
        g, u = gu.float().chunk(2)
        want = wt @ (torch.nn.functional.silu(g) * u) + res.float()
    got = op.sync().to_torch().float()
    return float((got - want).norm() / want.norm())


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]]) -> tuple[list, list]:
    import grout
    from safetile import ops
    eng = grout.load(name, max_seq_len=2048, progress=False)
    r = eng.runner
    params, key = grout.SamplingParams().tensors(eng.device)
    vocab = eng.config.vocab_size
    first = r.begin([(7 * i + 3) % vocab for i in range(START)], params, key, True)
    shapes = roles(eng.config)
    default_for_shape = ops.GemvConfig.for_shape.__func__
    variants = [("default", None, {})] + [(role, shapes[role], o) for role, o in chosen]
    weights = {"qkv": r.w.layers[0].qkv.w, "o": r.w.layers[0].o.w,
               "gate_up": r.w.layers[0].gate_up.w, "down": r.w.layers[0].down.w}
    graphs, tokens, failed, errors = {}, {}, [], {}
    for i, (role, shape, override) in enumerate(variants):
        def for_shape(cls, n, k, swiglu=False, shape=shape, override=override):
            base = default_for_shape(cls, n, k, swiglu)
            return dataclasses.replace(base, **override) if (n, k) == shape else base
        ops.GemvConfig.for_shape = classmethod(for_shape)
        r.graphs, r.chunks = {}, {}
        try:
            if shape is not None:
                base_cfg = default_for_shape(ops.GemvConfig, *shape, role == "down")
                errors[i] = (role_error(role, weights[role],
                                        dataclasses.replace(base_cfg, **override)),
                             role_error(role, weights[role], base_cfg))
            tokens[i] = chunk(r, first)[1]
        except Exception as e:                # a tiling the kernel refuses, or out of resources
            failed.append(dict(role=role, override=override, error=f"{type(e).__name__}: {e}"))
            print(f"{role} {override}: {type(e).__name__}: {e}", flush=True)
            continue
        finally:
            ops.GemvConfig.for_shape = classmethod(default_for_shape)
        if i in errors and not errors[i][0] <= 2 * errors[i][1] + 1e-4:
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
        role, shape, override = variants[i]
        us = statistics.median(samples) * 1e6
        cfg = ops.GemvConfig.for_shape(*shape, role == "down") if shape else None
        rows.append(dict(role=role, shape=list(shape) if shape else None,
                         config=dataclasses.asdict(cfg) if cfg else None,
                         override=override, us_per_step=us, default_over_this=base * 1e6 / us,
                         rel_error=errors.get(i, (None,))[0],
                         default_rel_error=errors.get(i, (None, None))[1],
                         tokens_equal=tokens[i] == tokens[0]))
    return rows, failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b")
    ap.add_argument("--roles", nargs="+", default=list(VARIANTS))
    ap.add_argument("--variants", nargs="+", default=None,
                    help="role:field=value,... (instead of the roles' default variants)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--tag", default="1")
    args = ap.parse_args()
    chosen = [parse_variant(v) for v in args.variants] if args.variants else \
        [(role, o) for role in args.roles for o in VARIANTS[role]]
    if not harness.start_gpu("gemv_step_sweep"):
        return
    rows, failed = sweep(args.model, args.repeats, chosen)
    harness.print_table(rows, ["role", "override", "us_per_step", "default_over_this",
                               "rel_error", "tokens_equal"])
    harness.write_results(f"archive/gemv_step_sweep_{args.model}_{args.tag}", dict(
        model=args.model, chunk=8, start=START, repeats=args.repeats, rows=rows,
        failed=failed, method=__doc__,
        note="µs per decode step of the whole model, median of repeats; config is the "
             "role's default, override what the variant changed"))


if __name__ == "__main__":
    main()
