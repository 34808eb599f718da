"""Stage chains of a Qwen3 decode layer for ``bench_fused.py``: one stage of every layer of a
``decode_layers.Step``, unfused and fused (and the plain gemv a fused gemv aims at), each
with a torch reference of its last layer's result."""
from __future__ import annotations

import torch

from safetile import ops

import decode_layers as dl


def hf_rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Qwen3's RMSNorm as transformers computes it, as float64."""
    h = x.float()
    normed = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + dl.EPS)).to(x.dtype)
    return (w * normed).double()


def T(v) -> torch.Tensor:
    """A copy of a safetile value as a torch tensor."""
    return v.to_torch()


class Stages:
    """Stage chains over a ``Step``'s layers. ``table()`` lists, per stage: its name, the
    unfused and the fused recorder (``body(rec, layer)``; None where the variant does not
    exist), the output to check and the torch reference of each variant's last-layer
    result, and the bytes a layer's stage must read."""

    def __init__(self, step: dl.Step):
        self.s = s = step
        sh, dev = step.shape, step.logits.device
        rnd = lambda *shape: dl.random_tensor(shape, dev, 1.0)  # noqa: E731
        # fixed inputs of every layer of a chain
        self.x, self.prev = rnd(sh.hidden), rnd(sh.hidden)
        self.attn_in, self.gu_in = rnd(sh.q_heads * sh.head_dim), rnd(2 * sh.inter)
        self.resid = rnd(sh.hidden)
        self.xs = (T(self.prev).float() + T(self.x).float()).to(torch.bfloat16)  # their sum

    def _norm_gemv(self, norm: str, weight: str, out):
        s = self

        def unfused(rec, L):
            rec(ops.add_rmsnorm(s.prev, s.x, getattr(L, norm), out=s.s.normed,
                                residual_out=s.resid))
            rec(ops.gemv(getattr(L, weight), s.s.normed, out))

        def fused(rec, L):
            rec(ops.rmsnorm_gemv(s.x, getattr(L, norm), getattr(L, weight), dl.EPS, out=out))

        def gemv(rec, L):
            rec(ops.gemv(getattr(L, weight), s.s.normed, out))

        def want(variant, L):
            w, nw = T(getattr(L, weight)).double(), T(getattr(L, norm))
            if variant == "gemv":
                return w @ T(s.s.normed).double()
            return w @ hf_rmsnorm(s.xs if variant == "unfused" else T(s.x), nw)
        return unfused, fused, gemv, want

    def table(self) -> list[dict]:
        s, sh, st_ = self, self.s.shape, self.s
        inter = sh.inter
        rows = []
        for name, norm, weight, out, n in (("qkv", "ln1", "wqkv", st_.qkv, sh.qkv_rows),
                                            ("gate_up", "ln2", "wgu", st_.gu, 2 * inter)):
            unfused, fused, gemv, want = self._norm_gemv(norm, weight, out)
            rows.append(dict(name=name, unfused=unfused, fused=fused, gemv=gemv, out=out,
                             want=want, nbytes=n * sh.hidden * 2))
        q = sh.q_heads * sh.head_dim
        rows.append(dict(
            name="o", out=st_.o, nbytes=sh.hidden * q * 2,
            unfused=lambda rec, L: rec(ops.gemv(L.wo, s.attn_in, st_.o)),
            fused=lambda rec, L: rec(ops.gemv_add(L.wo, s.attn_in, s.x, out=st_.o)),
            gemv=lambda rec, L: rec(ops.gemv(L.wo, s.attn_in, st_.o)),
            want=lambda v, L: T(L.wo).double() @ T(s.attn_in).double()
            + (T(s.x).double() if v == "fused" else 0)))

        def act():
            g = T(s.gu_in).double()
            return torch.nn.functional.silu(g[:inter]) * g[inter:]

        def down_unfused(rec, L):
            rec(ops.silu_mul(s.gu_in.slice(0, 0, inter), s.gu_in.slice(0, inter, 2 * inter),
                             out=st_.act))
            rec(ops.gemv(L.wd, st_.act, st_.down))
        rows.append(dict(
            name="down", out=st_.down, nbytes=sh.hidden * inter * 2, unfused=down_unfused,
            fused=lambda rec, L: rec(ops.silu_mul_gemv_add(L.wd, s.gu_in, s.x, out=st_.down)),
            gemv=lambda rec, L: rec(ops.gemv(L.wd, st_.act, st_.down)),
            want=lambda v, L: T(L.wd).double() @ (act() if v != "gemv" else T(st_.act).double())
            + (T(s.x).double() if v == "fused" else 0)))
        rows.append(dict(
            name="attn_prologue", out=st_.q, nbytes=0,
            unfused=lambda rec, L: dl.attention_prologue_unfused(rec, st_, L),
            fused=lambda rec, L: dl.attention_prologue_fused(rec, st_, L), gemv=None,
            want=self._prologue_want))
        def attention(prologue, early):
            def body(rec, L):
                prologue(rec, st_, L)
                dl.attention(rec, st_, L, early)
            return body
        rows.append(dict(
            name="prologue+attention", out=st_.attn,
            nbytes=2 * sh.kv_heads * st_.context * sh.head_dim * 2,
            unfused=attention(dl.attention_prologue_unfused, True),
            fused=attention(dl.attention_prologue_fused, False), gemv=None,
            want=self._attention_want))
        return rows

    def _prologue_want(self, variant, L):
        """Qwen3's q norm and rotate-half RoPE at the position, from the qkv the chain reads."""
        sh, d = self.s.shape, self.s.shape.head_dim
        q = T(self.s.qkv).view(-1, d)[:sh.q_heads]
        h = q.float()
        q = T(L.q_norm) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True)
                                           + dl.EPS)).to(q.dtype)
        inv = T(self.s.inv_freq)
        emb = torch.cat([inv, inv]) * float(self.s.context - 1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return (q * cos + torch.cat([-q[:, d // 2:], q[:, :d // 2]], -1) * sin).double()

    def _attention_want(self, variant, L):
        sh, n = self.s.shape, self.s.context
        q = T(self.s.q).double()
        k = T(L.k_cache)[:, :n].double().repeat_interleave(sh.q_heads // sh.kv_heads, 0)
        v = T(L.v_cache)[:, :n].double().repeat_interleave(sh.q_heads // sh.kv_heads, 0)
        p = torch.softmax(torch.einsum("hd,hnd->hn", q, k) / sh.head_dim ** 0.5, -1)
        return torch.einsum("hn,hnd->hd", p, v)

    def lm_head(self) -> dict:
        s, st_ = self, self.s

        def unfused(rec, _):
            rec(ops.add_rmsnorm(s.prev, s.x, st_.final_norm, out=st_.normed,
                                residual_out=s.resid))
            rec(ops.gemv(st_.lm_head, st_.normed, st_.logits))
            rec(ops.argmax(st_.logits, st_.next_token, st_.argmax_ws))

        def fused(rec, _):
            rec(ops.rmsnorm_gemv_argmax(s.x, st_.final_norm, st_.lm_head, dl.EPS,
                                        logits=st_.logits, token=st_.next_token,
                                        workspace=st_.head_ws))

        def want(variant, _):
            lg = T(st_.logits)
            if T(st_.next_token).item() != int(torch.argmax(lg)):
                raise AssertionError(f"lm_head {variant}: the token is not the logits' argmax")
            x = s.xs if variant == "unfused" else T(s.x)
            return T(st_.lm_head).double() @ hf_rmsnorm(x, T(st_.final_norm))
        return dict(name="lm_head", out=st_.logits, unfused=unfused, fused=fused, gemv=None,
                    want=want, nbytes=st_.shape.vocab * st_.shape.hidden * 2)
