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

import contextlib
import dataclasses
import functools

import step_sweep
from step_sweep import engine, median_us, record

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


def sweep(name: str, repeats: int, chosen: list[tuple[str, dict]],
          start: int) -> tuple[list, list]:
    from safetile import ops
    eng, origin = engine(name, start)
    r = eng.runner
    shapes = roles(eng.config)
    default_for_shape = ops.GemvConfig.for_shape.__func__
    variants = [("default", {})] + chosen
    weights = {role: getattr(r.w.layers[0], role).w for role in shapes}

    def base(role):
        return default_for_shape(ops.GemvConfig, *shapes[role], role == "down")

    @functools.cache
    def default_error(role):
        return role_error(role, weights[role], base(role))

    def check(role, override):
        return (role_error(role, weights[role], dataclasses.replace(base(role), **override)),
                default_error(role), 1e-4)

    @contextlib.contextmanager
    def applied(role, override):
        def for_shape(cls, n, k, swiglu=False):
            cfg = default_for_shape(cls, n, k, swiglu)
            return dataclasses.replace(cfg, **override) if (n, k) == shapes[role] else cfg
        ops.GemvConfig.for_shape = classmethod(for_shape)
        try:
            yield
        finally:
            ops.GemvConfig.for_shape = classmethod(default_for_shape)
    graphs, tokens, failed, errors = record(r, origin, variants, check, applied)
    times = median_us(r, origin, graphs, repeats)

    def config(i):
        role = variants[i][0]
        if role not in shapes:                           # the default: every role's own
            return dict(shape=None, config=None)
        return dict(shape=list(shapes[role]), config=dataclasses.asdict(base(role)))
    return step_sweep.rows(variants, times, tokens, errors, config), failed

if __name__ == "__main__":
    step_sweep.main("gemv_step_sweep", __doc__, VARIANTS, sweep, 15,
                    "µs per decode step of the whole model, median of repeats; config is the "
                    "role's default, override what the variant changed")
