"""Running the model: prefill as one chained execution, the decode step as one recorded graph.

- :func:`run_steps` runs a list of steps (model.py) as *one* execution: each op is built in
  the ``then`` callback of the one before (after it took its place on the stream), and the
  host waits once, at the end.
- :func:`record_steps` records the steps into one graph (a CUDA graph on the GPU); nothing
  allocates while it records, because every buffer is preallocated.
- :class:`Runner` owns the KV cache and the decode buffers. ``begin`` prefills a prompt and
  samples the first token; ``step`` replays the decode graph (one per sampling mode,
  recorded on first use) and reads the new token: the one device-to-host read per token.
  ``steps(greedy, n)`` replays a *chunk*: one graph of ``n`` decode steps, each followed by
  a copy of its token into ``history[i]``, read back once, so the GPU runs ``n`` tokens
  without waiting on the host. The chunk's launches are the single step's, inlined ``n``
  times: its tokens are exactly those of ``n`` single steps (greedy, or sampled: the
  sampler's step counter advances on the device).
  With ``gemm="cublas"`` the step runs eagerly, since torch work cannot be recorded into a
  safetile graph.
- On the GPU a prompt of up to ``PREFILL_GRAPH_MAX`` tokens is prefilled by a recorded graph
  of its length *bucket* (:func:`prefill_bucket`; recorded on first use): the prompt is
  padded to the bucket, whose extra rows attend only to earlier rows (causal) and whose
  K/V rows past the prompt are overwritten by decode before any step reads them. The host
  then launches one graph instead of every op of every layer.
- A step whose attention spans at most ``short_attention_max`` positions attends with one
  kernel per kv head (model.attention_args); longer ones split the cache and merge. Each
  kind is its own graph; the runner tracks the position on the host, and a chunk never
  straddles the two, so a chunk's tokens stay exactly those of single steps.
- ``fused=True`` (the default with safetile's gemm) builds the fused step
  (model.decode_step_fused); ``fused=False`` the unfused one, the comparison and fallback.
"""
from __future__ import annotations

import sys

import torch

import safetile as st
from safetile import ops

from .config import Qwen3Config
from .kv_cache import KVCache
from .model import (EARLY_TRIGGER_MAX_HIDDEN, CublasGemm, DecodeBuffers, PrefillBuffers,
                    SafetileGemm, TorchStep, decode_step, decode_step_fused, prefill,
                    sample_step)
from .weights import Weights


def _then_build(torch_work: tuple, make):
    """A ``then`` callback: enqueue the torch work, then build the next op."""
    def callback(*_):
        for work in torch_work:
            work()
        return make()
    return callback


def _torch_only(torch_work: tuple):
    def callback(*_):
        for work in torch_work:
            work()
    return callback


def run_steps(steps: list) -> None:
    """Run ``steps`` as one execution on the current stream; return when all are done."""
    op, pending = None, []
    for step in steps:
        if isinstance(step, TorchStep):
            pending.append(step.run)
        elif op is None:
            for work in pending:              # nothing of ours is in flight yet
                work()
            pending, op = [], step()
        else:
            op, pending = op.then(_then_build(tuple(pending), step)), []
    if pending and op is not None:
        op = op.map(_torch_only(tuple(pending)))
    elif pending:
        for work in pending:
            work()
    if op is not None:
        op.sync()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()


def record_steps(steps: list, desc: str, progress: bool) -> st.Graph:
    """Record ``steps`` (ops only) into one graph; on the GPU it is compiled and captured
    when the recording closes."""
    from tqdm import tqdm
    # a bar written to a log (not a terminal) stays, its line ended: what is logged next
    # starts a line of its own
    with tqdm(total=len(steps) + 1, desc=desc, unit="op", file=sys.stderr, disable=not progress,
              leave=not sys.stderr.isatty(), dynamic_ncols=True) as bar:
        with st.graph_scope() as scope:
            for step in steps:
                scope.record(step())
                bar.update(1)
            bar.set_postfix_str("capturing")
        bar.update(1)
    return scope.graph


# The longest context (positions attended) decoded with one attention kernel per kv head: a
# short cache is too little work to split (benchmarks/TUNING.md, "short-context attention").
SHORT_ATTENTION_MAX = 256

# The longest prompt prefilled by a recorded graph (the buckets' activations stay allocated).
PREFILL_GRAPH_MAX = 2048


def prefill_bucket(s: int) -> int:
    """The padded length a prompt of ``s`` tokens is prefilled at by a graph: the smallest of
    16, 24, 32, 48, 64, 96, ... (powers of two and their 1.5 multiples) >= s."""
    b = 16
    while True:
        if b >= s:
            return b
        if b + b // 2 >= s:
            return b + b // 2
        b *= 2


class PrefillGraph:
    """The prefill of one bucket: its buffers, fixed positions 0..n-1, and the recorded graph
    reading the padded prompt from ``ids``."""

    def __init__(self, runner: "Runner", n: int):
        dev = runner.device
        self.ids = _small([0] * n, torch.int32, dev)
        self.positions = _small(list(range(n)), torch.int32, dev)
        self.start = _small([0], torch.int32, dev)
        self.p = PrefillBuffers(runner.cfg, n, runner.dtype, dev)
        steps = prefill(runner.cfg, runner.w, runner.cache, self.p, self.ids, self.positions,
                        self.start, runner.buf.inv_freq, runner.gemm)
        self.graph = record_steps(steps, f"recording the prefill of {n} tokens",
                                  runner.progress)


def _small(values, dtype, device) -> st.Tensor:
    return st.from_torch(torch.tensor(values, dtype=dtype, device=device))


class Runner:
    """The device state of one engine: cache, decode buffers, recorded decode graphs."""

    def __init__(self, cfg: Qwen3Config, weights: Weights, device: torch.device, dtype,
                 max_seq_len: int, gemm: str, progress: bool = True, fused: bool = True,
                 max_chunk: int = 8):
        self.cfg, self.w, self.device, self.dtype = cfg, weights, device, dtype
        self.progress = progress
        self.cache = KVCache(cfg, max_seq_len, dtype, device)
        self.max_chunk = max_chunk
        self.buf = DecodeBuffers(cfg, self.cache, dtype, device, max_chunk)
        self.gemm = CublasGemm() if gemm == "cublas" else SafetileGemm(
            device, trigger_early=cfg.hidden_size <= EARLY_TRIGGER_MAX_HIDDEN)
        # the fused kernels are safetile's gemvs: the torch comparison path stays unfused
        self.fused = bool(fused) and isinstance(self.gemm, SafetileGemm)
        if self.fused:
            self.buf.fuse_head(weights.lm_head, self.gemm)
        self.graphs: dict = {}            # (greedy, short) -> the one-step graph
        self.chunks: dict = {}            # (greedy, n, short) -> the graph of n steps
        self.short_attention_max = SHORT_ATTENTION_MAX
        self.position = 0                 # the cursor's position, as the host knows it
        self.prefills: dict = {}          # bucket -> PrefillGraph
        # the longest prompt prefilled by a graph (0: every prefill runs op by op)
        self.prefill_graph_max = PREFILL_GRAPH_MAX if device.type == "cuda" and \
            self.graphable() else 0

    @property
    def max_seq_len(self) -> int:
        return self.cache.max_seq_len

    def graphable(self) -> bool:
        """Whether the decode step can be one recorded graph (not on the torch path)."""
        return not isinstance(self.gemm, CublasGemm)

    def _prefill_steps(self, ids: list) -> tuple[list, PrefillBuffers]:
        s, dev = len(ids), self.device
        p = PrefillBuffers(self.cfg, s, self.dtype, dev)
        steps = prefill(self.cfg, self.w, self.cache, p, _small(ids, torch.int32, dev),
                        _small(list(range(s)), torch.int32, dev), _small([0], torch.int32, dev),
                        self.buf.inv_freq, self.gemm)
        return steps, p

    def logits(self, ids: list) -> torch.Tensor:
        """Prefill logits of ``ids``: float32 (len, vocab) on the host."""
        steps, p = self._prefill_steps(ids)
        out = st.empty((len(ids), self.cfg.vocab_size), dtype=self.dtype, device=self.device)
        run_steps(steps + [self.gemm.mat(p.h, self.w.lm_head, out)])
        return out.to_torch().float().cpu()

    def _prefill_graphed(self, ids: list) -> tuple[list, PrefillBuffers]:
        """The steps that prefill ``ids`` through their bucket's graph (recorded on first
        use): the padded prompt copied in, then the graph."""
        n = prefill_bucket(len(ids))
        g = self.prefills.get(n)
        if g is None:
            g = self.prefills[n] = PrefillGraph(self, n)
        padded = _small(ids + [0] * (n - len(ids)), torch.int32, self.device)
        return [lambda: ops.copy(padded, out=g.ids), g.graph.launch], g.p

    def begin(self, ids: list, params: st.Tensor, key: st.Tensor, greedy: bool) -> int:
        """Prefill ``ids`` (the cache starts over), set the sampling parameters and key, and
        sample the first new token; the cursor then points at position ``len(ids)``."""
        b, s, dev = self.buf, len(ids), self.device
        if s <= self.prefill_graph_max and prefill_bucket(s) <= self.max_seq_len:
            steps, p = self._prefill_graphed(ids)
        else:
            steps, p = self._prefill_steps(ids)
        last = p.h.slice(0, s - 1, s)
        setup = [lambda: ops.copy(params, out=b.params), lambda: ops.copy(key, out=b.key),
                 lambda t=_small([s, 0], torch.int32, dev): ops.copy(t, out=b.cursor)]
        after = [lambda t=_small([s, 1], torch.int32, dev): ops.copy(t, out=b.cursor)]
        run_steps(setup + steps + [self.gemm.vec(self.w.lm_head, last, b.logits.view(1, -1)),
                                   sample_step(b, greedy)] + after)
        self.position = s
        return self.read_token()

    def read_token(self) -> int:
        return int(self.buf.token.numpy()[0])

    def short(self, n: int = 1) -> bool:
        """Whether the next ``n`` steps all attend at most ``short_attention_max`` positions
        (the step at position p attends p + 1)."""
        return self.position + n <= self.short_attention_max

    def decode_steps(self, greedy: bool, short: bool = False) -> list:
        build = decode_step_fused if self.fused else decode_step
        return build(self.cfg, self.w, self.cache, self.buf, self.gemm, greedy, short)

    def _kinds(self, short: bool) -> tuple:
        """``short`` first, then the other attention kind where this cache decodes both:
        both are recorded at once, so a stream does not stall mid-way to record."""
        both = 0 < self.short_attention_max < self.max_seq_len
        return (short, not short) if both else (short,)

    def graph(self, greedy: bool, short: bool = False) -> st.Graph:
        """The recorded decode step of this sampling mode and attention kind (recorded on
        first use, with the other kind's)."""
        for kind in self._kinds(short):
            if (greedy, kind) not in self.graphs:
                self.graphs[(greedy, kind)] = record_steps(
                    self.decode_steps(greedy, kind), f"recording the "
                    f"{'greedy' if greedy else 'sampling'} decode step"
                    f"{' (short context)' if kind else ''}", self.progress)
        return self.graphs[(greedy, short)]

    def chunk(self, greedy: bool, n: int, short: bool = False) -> st.Graph:
        """The graph of ``n`` decode steps, each token copied to ``history[i]`` (recorded
        on first use, with the other attention kind's)."""
        b = self.buf
        for kind in self._kinds(short):
            if (greedy, n, kind) not in self.chunks:
                one = self.graph(greedy, kind)
                with st.graph_scope() as scope:
                    for i in range(n):
                        scope.record(one.launch())
                        scope.record(ops.copy(b.token, out=b.history.slice(0, i, i + 1)))
                self.chunks[(greedy, n, kind)] = scope.graph
        return self.chunks[(greedy, n, short)]

    def chunk_size(self, wanted: int) -> int:
        """The largest chunk (a power of two up to ``max_chunk``) of at most ``wanted``
        steps that does not cross from short-context steps to long ones; 1 where the step
        cannot be a graph."""
        if self.short():
            wanted = min(wanted, self.short_attention_max - self.position)
        if not self.graphable() or wanted <= 1:
            return 1
        n = 1
        while n * 2 <= min(wanted, self.max_chunk):
            n *= 2
        return n

    def steps(self, greedy: bool, n: int) -> list:
        """``n`` decode steps, their tokens: in chunks of :meth:`chunk_size` (one read each;
        ``n`` from chunk_size is one chunk)."""
        tokens: list = []
        while len(tokens) < n:
            m = self.chunk_size(n - len(tokens))
            if m == 1:
                tokens.append(self.step(greedy))
                continue
            self.chunk(greedy, m, self.short(m)).launch().sync()
            self.position += m
            tokens += [int(t) for t in self.buf.history.numpy()[:m]]
        return tokens

    def step(self, greedy: bool) -> int:
        """Feed the current token at the current position; return the next token."""
        if self.graphable():
            self.graph(greedy, self.short()).launch().sync()
        else:
            run_steps(self.decode_steps(greedy, self.short()))
        self.position += 1
        return self.read_token()

    def step_eager(self, greedy: bool) -> int:
        """The same step as :meth:`step`, built and run op by op (no graph)."""
        run_steps(self.decode_steps(greedy, self.short()))
        self.position += 1
        return self.read_token()
