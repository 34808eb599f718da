"""A pure-torch static-cache Qwen3 decoder (the gpt-fast recipe), the torch peer of decode.

The weights are a Hugging Face ``Qwen3ForCausalLM``'s own parameters (q, k, v concatenated
into one projection, as gpt-fast does; everything else shared, not copied). The KV cache is
preallocated, (layers, kv heads, max_seq, head_dim); attention reads all of it under a mask
of the valid positions, so every shape is static. A decode step (one token at a device
position, the greedy argmax, the position advanced) is captured once into a CUDA graph and
replayed; ``torch.compile`` can take the same step function. The arithmetic follows
transformers' Qwen3 (fp32 RMSNorm rounded before the weight, cos/sin rounded to the dtype).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchQwen3:
    """Qwen3 forward over static caches; ``prefill`` and ``decode_step`` are the entry points."""

    def __init__(self, hf_model, max_seq: int):
        cfg = hf_model.config
        m = hf_model.model
        self.eps, self.max_seq = cfg.rms_norm_eps, max_seq
        self.hq, self.hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.hq
        self.embed = m.embed_tokens.weight
        self.lm_head = hf_model.lm_head.weight
        self.final_norm = m.norm.weight
        self.layers = []
        for layer in m.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append(dict(
                ln1=layer.input_layernorm.weight, ln2=layer.post_attention_layernorm.weight,
                wqkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach(),
                wo=a.o_proj.weight, qn=a.q_norm.weight, kn=a.k_norm.weight,
                gate=mlp.gate_proj.weight, up=mlp.up_proj.weight, down=mlp.down_proj.weight))
        dev, dt = self.embed.device, self.embed.dtype
        shape = (len(self.layers), self.hkv, max_seq, self.d)
        self.k_cache = torch.zeros(shape, device=dev, dtype=dt)
        self.v_cache = torch.zeros(shape, device=dev, dtype=dt)
        theta = cfg.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.d, 2, dtype=torch.float,
                                                      device=dev) / self.d))
        self.causal = torch.tril(torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev))

    def rmsnorm(self, x, w):
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    @torch.no_grad()
    def forward(self, ids, pos):
        """Logits (T, vocab) of tokens ``ids`` (T,) at positions ``pos`` (T,), appending their
        K/V to the caches."""
        t = ids.shape[0]
        x = F.embedding(ids, self.embed)
        freqs = pos.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), -1)
        cos, sin = emb.cos().to(x.dtype)[None], emb.sin().to(x.dtype)[None]   # (1, T, D)
        mask = self.causal[pos][None]                                        # (1, T, max_seq)
        for i, L in enumerate(self.layers):
            qkv = F.linear(self.rmsnorm(x, L["ln1"]), L["wqkv"])
            q, k, v = qkv.split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], -1)
            q = self.rmsnorm(q.view(t, self.hq, self.d), L["qn"]).transpose(0, 1)
            k = self.rmsnorm(k.view(t, self.hkv, self.d), L["kn"]).transpose(0, 1)
            v = v.view(t, self.hkv, self.d).transpose(0, 1)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            self.k_cache[i].index_copy_(1, pos, k)
            self.v_cache[i].index_copy_(1, pos, v)
            a = F.scaled_dot_product_attention(q[None], self.k_cache[i][None],
                                               self.v_cache[i][None], attn_mask=mask[None],
                                               enable_gqa=True)
            x = x + F.linear(a[0].transpose(0, 1).reshape(t, self.hq * self.d), L["wo"])
            h = self.rmsnorm(x, L["ln2"])
            x = x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])
        return F.linear(self.rmsnorm(x, self.final_norm), self.lm_head)

    def decode_step(self, token, pos, out_tokens, step):
        """One greedy step on device-resident state: ``token`` (1,) at ``pos`` (1,) -> the
        next token written into ``token`` and into ``out_tokens[step]``; ``pos`` and
        ``step`` advanced. Static shapes and no host reads: capturable as one graph."""
        logits = self.forward(token, pos)
        nxt = torch.argmax(logits[-1]).view(1)
        token.copy_(nxt)
        out_tokens.index_copy_(0, step, nxt)
        pos.add_(1)
        step.add_(1)
        return logits


class GraphDecoder:
    """Greedy generation: prefill eagerly, then replay the captured decode step (or call a
    compiled one) once per token; tokens and position stay on the device."""

    def __init__(self, model: TorchQwen3, max_new: int, compile_mode: str | None = None):
        self.m = model
        dev = model.embed.device
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.step = torch.zeros(1, dtype=torch.long, device=dev)
        self.out = torch.zeros(max_new, dtype=torch.long, device=dev)
        self.max_new = max_new
        self.fn = model.decode_step
        self.graph = None
        if compile_mode:
            self.fn = torch.compile(model.decode_step, mode=compile_mode, fullgraph=True)

    def capture(self) -> None:
        """Capture the step into a CUDA graph (after a warm-up on a side stream)."""
        args = (self.token, self.pos, self.out, self.step)
        saved = [a.clone() for a in args] + [self.m.k_cache.clone(), self.m.v_cache.clone()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self.fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.fn(*args)
        for a, s in zip(list(args) + [self.m.k_cache, self.m.v_cache], saved):
            a.copy_(s)

    def prefill(self, prompt: torch.Tensor) -> torch.Tensor:
        """Logits of the prompt's last token; the first generated token is set on the device."""
        n = prompt.shape[0]
        logits = self.m.forward(prompt, torch.arange(n, device=prompt.device))
        self.token.copy_(torch.argmax(logits[-1]).view(1))
        self.pos.fill_(n)
        self.step.fill_(1)
        self.out[:1].copy_(self.token)
        return logits[-1]

    def decode(self, n: int) -> None:
        """``n - 1`` more tokens (the first came from the prefill)."""
        for _ in range(n - 1):
            if self.graph is not None:
                self.graph.replay()
            else:
                self.fn(self.token, self.pos, self.out, self.step)

    def generate(self, prompt: torch.Tensor, n: int) -> list[int]:
        self.prefill(prompt)
        self.decode(n)
        return self.out[:n].tolist()
