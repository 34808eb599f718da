"""Batch-1 greedy decode on the GPU: tok/s of every engine that runs here, at Qwen3 shapes with
random bf16 weights (transformers' initialization: std 0.02, never zeros).

Variants (``--variants``; each is checked before it is timed):
- ``hf_eager``: transformers ``generate`` with its dynamic cache;
- ``hf_static``: ``generate(cache_implementation="static")`` without compilation;
- ``hf_static_compile``: the same with transformers' own ``torch.compile`` path (run in a
  child process under ``--compile-timeout``);
- ``torch_graph``: ``torch_decode.py``, a pure-torch static-cache step (the gpt-fast
  recipe) captured in a CUDA graph, the argmax inside it;
- ``torch_compile``: that step under ``torch.compile(mode="reduce-overhead")`` (child
  process, ``--compile-timeout``).
An engine plugs in by adding a ``Variant`` subclass to ``VARIANTS`` (grout's come with its
integration).

Checks: the reference is transformers eager on the same weights: its greedy tokens for the
first ``CHECK_TOKENS`` steps and its teacher-forced logits over prompt + those tokens. HF
static and the compiled paths must give logits within 3e-2 (relative) of it while their
tokens agree; the torch step's logits are checked teacher-forced, then its graph replay must
give exactly the tokens of stepping it eagerly.

Figures per (model, variant, generation length): whole-request tok/s (prefill included),
decode tok/s (the request's time less the time to first token, over the tokens after the
first), ms/token, % of the bandwidth roofline (weight bytes and the KV cache read per token
over 4.26 TB/s), and the time to first token for 18- and 1024-token prompts.

    python benchmarks/bench_decode.py --models qwen3-4b --variants hf_eager,hf_static,torch_graph
    python benchmarks/bench_decode.py --smoke          # tiny model on the CPU: the checks only
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from harness import RESULTS, check_close, env_info, print_table, save_figure, write_results

import torch_decode

COPY_TBS = 4.26
PROMPT = 18                   # prompt tokens, as the Grout paper's decode figures use
LONG_PROMPT = 1024
CHECK_TOKENS = 8
LOGITS_TOL = 3e-2
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


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


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
    ``generate(prompt, n)`` produces n tokens (prefill included) and returns them."""

    slow = False            # timed once per length (transformers eager runs ~10 tok/s)

    def __init__(self, model, max_seq: int):
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

    def __init__(self, model, max_seq):
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
        return self.dec.generate(prompt, n)


class TorchCompile(TorchGraph):
    compile_mode = "reduce-overhead"


VARIANTS = {"hf_eager": HFEager, "hf_static": HFStatic, "hf_static_compile": HFStaticCompile,
            "torch_graph": TorchGraph, "torch_compile": TorchCompile}
CHILD = {"hf_static_compile", "torch_compile"}       # compiled: in a child, under a timeout


def timed(fn) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def measure(variant: Variant, model, lengths: list, repeats: int, device) -> list[dict]:
    vocab = model.config.vocab_size
    p18, p1k = prompt_ids(PROMPT, vocab, device), prompt_ids(LONG_PROMPT, vocab, device)
    reps = 1 if variant.slow else repeats
    variant.generate(p18, 2)                  # warm-up: first-shape costs (kernel choices,
    variant.generate(p1k, 1)                  # cache allocation) stay out of the figures
    ttft = statistics.median(timed(lambda: variant.generate(p18, 1)) for _ in range(reps))
    ttft_1k = statistics.median(timed(lambda: variant.generate(p1k, 1)) for _ in range(reps))
    rows = []
    for n in lengths:
        total = statistics.median(timed(lambda: variant.generate(p18, n)) for _ in range(reps))
        decode = (n - 1) / max(total - ttft, 1e-9)
        roof = COPY_TBS * 1e12 / bytes_per_token(model, PROMPT + n // 2)
        rows.append(dict(gen_len=n, request_tok_s=n / total, decode_tok_s=decode,
                         ms_per_token=1e3 / decode, frac_roofline=decode / roof,
                         ttft_ms=ttft * 1e3, ttft_1024_ms=ttft_1k * 1e3, repeats=reps))
    return rows


def run_variant(name: str, model_name: str, model, args, device) -> list[dict]:
    max_seq = max(LONG_PROMPT, PROMPT + max(args.lengths_for(name))) + 8
    t0 = time.time()
    v = VARIANTS[name](model, max_seq)
    ref = Reference(model, prompt_ids(PROMPT, model.config.vocab_size, device))
    checked = v.check(ref)
    setup = time.time() - t0
    if args.smoke:
        return [dict(model=model_name, variant=name, checked=True, **checked)]
    rows = measure(v, model, args.lengths_for(name), args.repeats, device)
    del v
    return [dict(model=model_name, variant=name, setup_s=setup, **checked, **r) for r in rows]


def run_child(name: str, model_name: str, args) -> list[dict]:
    """``name`` in a fresh process (its own model, reference and check), killed after
    ``--compile-timeout`` seconds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--models", model_name,
           "--lengths", args.lengths, "--fast-lengths", args.fast_lengths,
           "--repeats", str(args.repeats)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.compile_timeout)
    except subprocess.TimeoutExpired:
        return [dict(model=model_name, variant=name,
                     error=f"did not compile and run within {args.compile_timeout:.0f} s")]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ROWS ")]
    if p.returncode or not lines:
        return [dict(model=model_name, variant=name,
                     error=f"exit {p.returncode}: {(p.stderr or p.stdout)[-400:]}")]
    return json.loads(lines[-1][5:])


def plot(rows: list[dict], path) -> bool:
    """tok/s (decode) against generation length, one line per (model, variant)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    keys = dict.fromkeys((r["model"], r["variant"]) for r in rows if "decode_tok_s" in r)
    for m, v in keys:
        pts = sorted((r["gen_len"], r["decode_tok_s"]) for r in rows
                     if (r["model"], r["variant"]) == (m, v) and "decode_tok_s" in r)
        ax.plot(*zip(*pts), marker="o", label=f"{m} {v}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("generated tokens (prompt 18)")
    ax.set_ylabel("decode tok/s, batch 1")
    ax.set_title("Qwen3 shapes, random bf16 weights, H200")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def summary(rows: list[dict]) -> dict:
    """The issue's headline keys, from the fastest variant measured at each point."""
    out = {}
    for key, model, n in (("qwen3-4b_tok_s_128", "qwen3-4b", 128),
                          ("qwen3-4b_tok_s_8192", "qwen3-4b", 8192),
                          ("qwen3-8b_tok_s_128", "qwen3-8b", 128),
                          ("qwen3-32b_tok_s_128", "qwen3-32b", 128)):
        best = max((r for r in rows if r["model"] == model and r.get("gen_len") == n
                    and "decode_tok_s" in r), key=lambda r: r["decode_tok_s"], default=None)
        out[key] = best and round(best["decode_tok_s"], 2)
        out[key + "_variant"] = best and best["variant"]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="qwen3-4b,qwen3-8b,qwen3-32b")
    p.add_argument("--variants", default="hf_eager,hf_static,hf_static_compile,torch_graph,"
                                         "torch_compile")
    p.add_argument("--lengths", default="128", help="generation lengths for every variant")
    p.add_argument("--fast-lengths", default="128,1024,8192",
                   help="generation lengths for the fast variants (not transformers eager or "
                        "static without compile), qwen3-4b only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile-timeout", type=float, default=240.0)
    p.add_argument("--budget-s", type=float, default=1e9, help="variants not started by then "
                   "are skipped")
    p.add_argument("--name", default="decode", help="results file name")
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU: checks only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.lengths_for = lambda v: [int(x) for x in (
        args.fast_lengths if VARIANTS[v].slow is False and current[0] == "qwen3-4b"
        else args.lengths).split(",")]
    current = [None]
    device = "cpu" if args.smoke else "cuda"
    if args.smoke:
        args.models = "tiny"
    elif not torch.cuda.is_available():
        print("bench_decode needs a CUDA GPU")
        return 1
    if args.child:
        current[0] = args.models
        model = build_model(args.models, device)
        print("ROWS " + json.dumps(run_variant(args.child, args.models, model, args, device)))
        return 0
    print(env_info(), flush=True)
    deadline = time.time() + args.budget_s
    rows = []
    for m in args.models.split(","):
        current[0] = m
        model = None
        for v in args.variants.split(","):
            if time.time() > deadline:
                rows.append(dict(model=m, variant=v, error="skipped: out of time"))
                continue
            try:
                if v in CHILD and not args.smoke:
                    rows += run_child(v, m, args)
                else:
                    model = model or build_model(m, device)
                    rows += run_variant(v, m, model, args, device)
            except Exception as e:                     # report and go on
                rows.append(dict(model=m, variant=v, error=f"{type(e).__name__}: {e}"[:400]))
            print(rows[-1], flush=True)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            if not args.smoke:
                write_results(args.name, {"rows": rows, "summary": summary(rows),
                                          "method": __doc__.split("\n\n")[2]})
        del model
    if args.smoke:
        bad = [r for r in rows if "error" in r]
        print("smoke:", "every check passed" if not bad else bad)
        return 1 if bad else 0
    try:
        plot(rows, RESULTS / f"{args.name}.png")
    except Exception as e:                                # the JSON is written already
        print("plot failed:", type(e).__name__, e)
    print_table(rows, ["model", "variant", "gen_len", "decode_tok_s", "request_tok_s",
                       "ms_per_token", "frac_roofline", "ttft_ms", "ttft_1024_ms",
                       "tokens_agreeing", "error"])
    print("summary:", summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
