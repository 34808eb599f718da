"""The engines bench_decode.py times: transformers (eager, static cache, compiled), the
pure-torch CUDA-graph step (``torch_decode.py``) and grout (fused, unfused, ``gemm="cublas"``),
each behind one small interface, with the transformers-eager reference they are checked
against.

Checks: the reference is transformers eager on the same weights: its greedy tokens for the
first ``CHECK_TOKENS`` steps and its teacher-forced logits over prompt + those tokens. Every
variant's per-step logits must be within ``LOGITS_TOL`` (relative) of it while their tokens
agree; the torch step's graph replay must give exactly the tokens of stepping it eagerly, and
grout's chunked decode exactly the tokens of its single steps.
"""
from __future__ import annotations

import time

import torch

from harness import check_close

import torch_decode

PROMPT = 18                   # prompt tokens, as the Grout paper's decode figures use
LONG_PROMPT = 1024
CHECK_TOKENS = 8
# Norm-relative logits error against transformers eager, both in bf16: rounding noise carried
# through every layer grows with depth (the 32B shape has 64 layers), so the gate is loose and
# the greedy tokens, checked too, catch a real error.
LOGITS_TOL = 1e-1
# (hidden, intermediate, layers, q heads, tied embeddings); all: 8 kv heads, head_dim 128
SHAPES = {"qwen3-4b": (2560, 9728, 36, 32, True), "qwen3-8b": (4096, 12288, 36, 32, False),
          "qwen3-32b": (5120, 25600, 64, 64, False), "tiny": (64, 128, 2, 4, True)}


def hf_config(name: str):
    from transformers import Qwen3Config
    hidden, inter, layers, heads, tied = SHAPES[name]
    tiny = name == "tiny"
    return Qwen3Config(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=2 if tiny else 8,
                       head_dim=16 if tiny else 128, vocab_size=512 if tiny else 151936,
                       max_position_embeddings=40960, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       tie_word_embeddings=tied, eos_token_id=None, pad_token_id=None)


def build_model(name: str, device: str):
    """A random-weight ``Qwen3ForCausalLM`` (bf16 on the GPU, fp32 on the CPU), seeded."""
    from transformers import Qwen3ForCausalLM
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(hf_config(name), dtype=dtype)
    return model.eval()


def bytes_per_token(model, context: int) -> int:
    """Weights read per decoded token (the embedding is a one-row gather; lm_head once) plus
    the KV cache up to ``context``."""
    cfg = model.config
    layers = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
    head = model.lm_head.weight
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * context * 2
    return layers + head.numel() * head.element_size() + cfg.hidden_size * 2 + kv


def prompt_ids(n: int, vocab: int, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    return torch.randint(0, vocab, (n,), generator=g).to(device)


class Reference:
    """transformers eager on the model: greedy tokens and teacher-forced logits."""

    def __init__(self, model, prompt: torch.Tensor):
        self.prompt = prompt
        with torch.no_grad():
            out = model.generate(prompt[None], max_new_tokens=CHECK_TOKENS, do_sample=False)
            self.tokens = out[0, prompt.shape[0]:].tolist()
            full = torch.cat([prompt, out[0, prompt.shape[0]:]])
            self.logits = model(full[None]).logits[0, prompt.shape[0] - 1:-1].float()

    def check_run(self, name: str, tokens: list, logits: list) -> int:
        """Per-step logits within tolerance while the tokens agree; returns how many agree."""
        agree = 0
        for i, (tok, lg) in enumerate(zip(tokens, logits)):
            check_close(f"{name} step {i} logits", lg.float(), self.logits[i], LOGITS_TOL)
            if tok != self.tokens[i]:
                break
            agree += 1
        if agree == 0:
            raise AssertionError(f"{name}: the first token {tokens[0]} is not the reference's "
                                 f"{self.tokens[0]}")
        return agree


class Variant:
    """An engine under test: ``check`` raises unless it agrees with the reference;
    ``generate(prompt, n)`` produces n tokens (prefill included) and returns them, setting
    ``first_token_at`` (``time.perf_counter()`` once the first token is on the host) where
    the engine hands it over before the rest (else None)."""

    slow = False            # timed once per length (transformers eager runs ~10 tok/s)
    copies_weights = False  # builds its own copy of the weights (may be built from the host)
    first_token_at: float | None = None

    def __init__(self, model, max_seq: int, device=None):
        self.model, self.max_seq = model, max_seq

    def check(self, ref: Reference) -> dict:
        raise NotImplementedError

    def generate(self, prompt: torch.Tensor, n: int) -> list:
        raise NotImplementedError


class HFEager(Variant):
    slow = True
    kwargs: dict = {}

    def _generate(self, prompt, n, **extra):
        with torch.no_grad():
            return self.model.generate(prompt[None], max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False, **self.kwargs, **extra)

    def check(self, ref):
        out = self._generate(ref.prompt, CHECK_TOKENS, output_logits=True,
                             return_dict_in_generate=True)
        tokens = out.sequences[0, ref.prompt.shape[0]:].tolist()
        return dict(tokens_agreeing=ref.check_run(type(self).__name__, tokens,
                                                  [lg[0] for lg in out.logits]))

    def generate(self, prompt, n):
        return self._generate(prompt, n)[0, prompt.shape[0]:].tolist()


class HFStatic(HFEager):
    kwargs = dict(cache_implementation="static", disable_compile=True)


class HFStaticCompile(HFEager):
    slow = False
    kwargs = dict(cache_implementation="static")


class TorchGraph(Variant):
    compile_mode = None

    def __init__(self, model, max_seq, device=None):
        super().__init__(model, max_seq)
        self.m = torch_decode.TorchQwen3(model, max_seq)
        self.dec = torch_decode.GraphDecoder(self.m, max_seq, self.compile_mode)

    def check(self, ref):
        p, n = ref.prompt, ref.prompt.shape[0]
        logits = [self.dec.prefill(p)]
        for i, tok in enumerate(ref.tokens[:-1]):          # teacher-forced steps
            t = torch.tensor([tok], device=p.device)
            logits.append(self.m.forward(t, torch.tensor([n + i], device=p.device))[-1])
        agree = ref.check_run(type(self).__name__, ref.tokens, logits)
        eager = self.dec.generate(p, CHECK_TOKENS)
        if torch.cuda.is_available() and self.compile_mode is None:
            self.dec.capture()
        replayed = self.dec.generate(p, CHECK_TOKENS)
        if replayed != eager:
            raise AssertionError(f"{type(self).__name__}: replayed tokens {replayed} differ "
                                 f"from eager steps {eager}")
        return dict(tokens_agreeing=agree)

    def generate(self, prompt, n):
        self.dec.prefill(prompt)
        self.dec.token.item()                  # the first token reaches the host
        self.first_token_at = time.perf_counter()
        self.dec.decode(n)
        return self.dec.out[:n].tolist()


class TorchCompile(TorchGraph):
    compile_mode = "reduce-overhead"


class Grout(Variant):
    """grout's Engine over the model's own weights (copied into grout's fused layout),
    timed through ``Engine.stream`` (the whole API path: chunked graph replays, detokenizing).
    ``device``: where the engine runs (the model's device unless given: the model may be
    on the host while grout copies its weights)."""

    options: dict = dict()
    copies_weights = True

    def __init__(self, model, max_seq, device=None):
        super().__init__(model, max_seq)
        import grout.config
        import grout.engine
        cfg = grout.config.from_dict(model.config.to_dict(), "bench", name=self.label())
        dtype = "bfloat16" if model.dtype == torch.bfloat16 else "float32"
        self.eng = grout.engine.from_tensors(cfg, model.state_dict(),
                                             device=device or model.device,
                                             dtype=dtype, max_seq_len=max_seq, **self.options)

    def label(self) -> str:
        return type(self).__name__

    def check(self, ref):
        import safetile as st
        from grout.sampler import SamplingParams
        eng, r = self.eng, self.eng.runner
        params, key = SamplingParams().tensors(eng.device)
        with st.backend(eng.backend):
            tokens = [r.begin(ref.prompt.tolist(), params, key, greedy=True)]
            logits = [r.buf.logits.to_torch().float().clone()]
            while len(tokens) < CHECK_TOKENS:
                tokens.append(r.step(greedy=True))
                logits.append(r.buf.logits.to_torch().float().clone())
        agree = ref.check_run(self.label(), tokens, logits)
        chunked = self.generate(ref.prompt, CHECK_TOKENS)
        if chunked != tokens:
            raise AssertionError(f"{self.label()}: chunked decode gave {chunked}, single steps "
                                 f"{tokens}")
        return dict(tokens_agreeing=agree, fused=r.fused, decode_chunk=r.max_chunk)

    def generate(self, prompt, n):
        tokens = []
        for piece in self.eng.stream(prompt.tolist(), max_new_tokens=n, ignore_eos=True):
            if not tokens:
                self.first_token_at = time.perf_counter()
            tokens.append(piece.token_id)
        return tokens


class GroutUnfused(Grout):
    options = dict(fused=False)


class GroutCublas(Grout):
    slow = True
    options = dict(gemm="cublas")


VARIANTS = {"grout": Grout, "grout_unfused": GroutUnfused, "grout_cublas": GroutCublas,
            "hf_eager": HFEager, "hf_static": HFStatic, "hf_static_compile": HFStaticCompile,
            "torch_graph": TorchGraph, "torch_compile": TorchCompile}
CHILD = {"hf_static_compile", "torch_compile"}       # compiled: in a child, under a timeout
