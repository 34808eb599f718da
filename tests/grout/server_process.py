"""A real `grout serve` subprocess on a free loopback port, for the server tests."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

SRC = Path(__file__).resolve().parents[2] / "src"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m grout serve`` with its stderr in ``log_path``; a context manager."""

    def __init__(self, model: str, log_path: Path, *extra: str) -> None:
        self.model = model
        self.log_path = log_path
        self.extra = extra
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.health_seen: list[tuple[int, str]] = []   # (status, body) of each /health poll

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> "ServerProcess":
        """Start the server and wait until /health says ok (a few tries if a port is taken)."""
        for _ in range(3):
            self.port = free_port()
            self._spawn()
            if self.wait_healthy(timeout):
                return self
            if "address already in use" not in self.log().lower():
                break
        raise RuntimeError(f"grout serve did not become healthy; its log:\n{self.log()[-4000:]}")

    def _spawn(self) -> None:
        env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                   PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "grout", "serve", "--model", self.model,
               "--port", str(self.port), *self.extra]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=_die_with_parent)

    def wait_healthy(self, timeout: float) -> bool:
        """Poll /health until 200; False when the process exits first or time runs out."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                r = httpx.get(f"{self.url}/health", timeout=2.0)
                self.health_seen.append((r.status_code, r.text))
                if r.status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """The first match of ``pattern`` in the server log, waiting for it to appear."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log())
            if m is not None:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not in the server log:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def client(self, **kw) -> openai.OpenAI:
        """The official sync client, pointed at this server (no retries: tests count requests)."""
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=kw.pop("timeout", 120.0), **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                                  timeout=kw.pop("timeout", 120.0), **kw)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 20 s; returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- a checkpoint small enough for the CPU executor ------------------------------------------

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world! How are you today?",
    "A server streams tokens to its clients, one request at a time, in order of arrival.",
    "system user assistant: once upon a time a small model answered every question.",
]


def _die_with_parent() -> None:
    """In the server's process: be sent SIGTERM when the test process dies (Linux's
    PR_SET_PDEATHSIG), so that a killed test run leaves no server behind; and take Ctrl-C
    as a terminal's process would (a suite started as a background job inherits SIGINT
    ignored, which Python then keeps)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):        # not Linux: the fixtures' teardown only
        pass


def cpu_server(tmp_path_factory, name: str, max_seq_len: int, *extra: str) -> ServerProcess:
    """A server (not started) for the session's checkpoint on the CPU, in fp32, serving it
    as "tiny", with its log in a fresh ``name`` folder."""
    log = tmp_path_factory.mktemp(name) / "serve.log"
    return ServerProcess(str(shared_checkpoint(tmp_path_factory)), log, "--device", "cpu",
                         "--dtype", "float32", "--max-seq-len", str(max_seq_len),
                         "--served-model-name", "tiny", *extra)


def cpu_engine(tmp_path_factory, max_seq_len: int):
    """The session's checkpoint loaded in this process, as the servers load it: the tests'
    reference for what the server answers."""
    import grout
    return grout.load(str(shared_checkpoint(tmp_path_factory)), device="cpu", dtype="float32",
                      max_seq_len=max_seq_len, progress=False)


def shared_checkpoint(tmp_path_factory) -> Path:
    """The session's one test checkpoint (built by the first module that asks for it)."""
    directory = tmp_path_factory.getbasetemp() / "grout-server-checkpoint"
    if not (directory / "model.safetensors").is_file():
        build_checkpoint(directory)
    return directory


def build_checkpoint(directory: Path, *, vocab: int = 320, model_vocab: int | None = None) -> Path:
    """A random Qwen3 checkpoint (one layer, hidden 32) with its own byte-level BPE tokenizer.

    Qwen's 151,936-token vocabulary would make each step's lm_head thousands of programs on
    the CPU executor; a tokenizer.json of ``vocab`` tokens (Qwen3's special tokens included,
    so the chat template and the end tokens work) keeps a request to a fraction of a second.
    ``model_vocab``: the model's vocabulary, when it differs from the tokenizer's.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 20, trainer)
    assert tok.get_vocab_size() == vocab, tok.get_vocab_size()
    tok.save(str(directory / "tokenizer.json"))

    config = Qwen3Config(vocab_size=model_vocab or vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, max_position_embeddings=4096, tie_word_embeddings=True,
                         initializer_range=0.5, rope_theta=1e6, rms_norm_eps=1e-6,
                         eos_token_id=tok.token_to_id("<|im_end|>"),
                         bos_token_id=tok.token_to_id("<|endoftext|>"))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    GenerationConfig(eos_token_id=[tok.token_to_id("<|im_end|>"),
                                   tok.token_to_id("<|endoftext|>")]).save_pretrained(directory)
    return directory
