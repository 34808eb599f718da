"""The ``grout`` command line: ``generate``, ``bench`` and ``serve`` (``python -m grout`` too).

Every subcommand takes ``--device cpu|cuda``, ``--dtype`` and ``--max-seq-len``. Text goes to
stdout as it is produced; progress bars and statistics go to stderr. Bad usage exits with
status 2 and argparse's usage message, before anything loads: an option out of range (each
sampling option checked as the engine checks a request, so the flags take exactly what
``generate`` takes), or options in conflict. What only loading can tell (a checkpoint or
model name, a device, a prompt too long for the model's context), a file that cannot be
written or an address ``serve`` cannot listen on exits with status 1 and a one-line error;
Ctrl-C with 130 (``generate`` ends its line and tells the tokens so far on stderr); a closed
stdout (``| head``) quietly with 141.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from pathlib import Path

from .engine import DEFAULT_MAX_SEQ_LEN, check_request, resolve_dtype
from .errors import GroutError
from .protocol import SEED_RANGE
from .tokenizer import check_unicode

# A request's neutral arguments, beside which one flag's value is checked.
_NEUTRAL = dict(max_new_tokens=0, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=None)


def _int_in(low: int, high: int | None, what: str):
    """An argparse type: an int in [low, high] (high None: no bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not {what}")
        return value
    return parse


def _checked(check):
    """An argparse type: ``check(text)``, whose GroutError becomes a usage error."""
    def parse(text: str):
        try:
            return check(text)
        except GroutError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _request(name: str, convert=str):
    """An argparse type: the request argument ``name`` as ``convert`` reads it, checked as
    the engine checks it (engine.check_request)."""
    def check(text: str):
        try:
            value = convert(text)
        except ValueError:
            kind = "an integer" if convert is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if isinstance(value, str):
            check_unicode(value)
        check_request(**{**_NEUTRAL, name: value})
        return value
    return _checked(check)


def _text(text: str) -> str:
    """An argparse type: text that is valid Unicode (argv need not be UTF-8)."""
    check_unicode(text)
    return text


def _model(text: str) -> str:
    """An argparse type: a model argument that is not blank."""
    if not text.strip():
        raise GroutError("give a checkpoint directory or a named shape (tiny, qwen3-0.6b, ...)")
    return text


def _served_name(text: str) -> str:
    """An argparse type: a served model name that is not blank, in valid Unicode (every
    response carries it)."""
    if not text.strip():
        raise GroutError("give the name clients send as 'model' (or leave the option out)")
    check_unicode(text)
    return text


def _origin(text: str) -> str:
    """An argparse type: a web origin as browsers send it (scheme://host[:port]), or *."""
    from urllib.parse import urlsplit
    if text == "*":
        return text
    try:
        parts = urlsplit(text.rstrip("/"))
        port = parts.port                         # (raises on a port out of range)
    except ValueError:
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname \
            or parts.path or parts.query or parts.fragment or parts.username is not None:
        raise GroutError(f"{text!r} is not a web origin: give scheme://host[:port] as a "
                         f"browser sends it (e.g. http://localhost:3000), or * for any")
    # As a browser writes it: scheme and host in lower case, no default port.
    scheme, host = parts.scheme.lower(), parts.hostname     # (hostname is lower-cased)
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def _api_key(text: str) -> str:
    """An argparse type: an API key a client can send in a Bearer header."""
    if not text or any(c.isspace() for c in text) or not text.isprintable() or \
            not text.isascii():
        raise GroutError("an API key is one word of printable ASCII characters (no spaces), "
                         "as an 'Authorization: Bearer <key>' header carries it")
    return text


def _common(p: argparse.ArgumentParser, model_required: bool = True) -> None:
    p.add_argument("--model", type=_checked(_model), required=model_required,
                   help="a checkpoint directory or a named shape (tiny, qwen3-0.6b, ... "
                        "qwen3-32b: random weights)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda when a GPU is present, else cpu")
    p.add_argument("--dtype", type=_checked(lambda text: resolve_dtype(text, None)),
                   default=None, help="float32, bfloat16, float16 or auto (default: auto, the "
                                      "checkpoint's)")
    p.add_argument("--max-seq-len", type=_int_in(1, None, "a positive count of positions"),
                   default=None, help="KV cache positions, the context: prompt and generated "
                                      "tokens together (default 4096; at most the model's)")
    # vLLM's name for it, unlisted (the help names one)
    p.add_argument("--max-model-len", dest="max_seq_len", default=None, help=argparse.SUPPRESS,
                   type=_int_in(1, None, "a positive count of positions"))
    p.add_argument("--gemm", choices=("safetile", "cublas"), default="safetile",
                   help="cublas: projections on torch.matmul, for comparison")
    p.add_argument("--weights-seed", type=_request("seed", int), default=0,
                   help="seed of a named shape's random weights")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(usage_error=p.error)


def _version() -> str:
    """grout's version, with the safetile, torch and triton it runs on."""
    import importlib.metadata

    import torch

    import safetile

    from . import __version__
    try:
        triton = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton = "not installed"
    return f"grout {__version__} (safetile {safetile.__version__}, torch " \
           f"{torch.__version__}, triton {triton})"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="grout", description="A batch-1 Qwen3 engine on safetile.")
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text, streamed as it is produced")
    _common(g)
    g.add_argument("--prompt", type=_checked(_text), required=True, help="the prompt text")
    g.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")
    g.add_argument("--enable-thinking", action="store_true",
                   help="with --chat: let the model think first (<think> ... </think>)")
    g.add_argument("--max-new-tokens", type=_request("max_new_tokens", int), default=64,
                   help="default 64")
    g.add_argument("--temperature", type=_request("temperature", float), default=0.0,
                   help="0 is greedy")
    g.add_argument("--top-k", type=_request("top_k", int), default=0, help="0 is off")
    g.add_argument("--top-p", type=_request("top_p", float), default=1.0, help="1 is off")
    g.add_argument("--stop", type=_request("stop"), action="append", default=None,
                   help="a stop string (repeatable)")
    g.add_argument("--seed", type=_request("seed", int), default=None,
                   help="sampling seed: the same seed gives the same tokens (default: a fresh "
                        "one each run)")
    b = sub.add_parser("bench", help="time to first token, decode tok/s, %% of roofline")
    _common(b)
    b.add_argument("--prompt-len", type=_int_in(1, None, "a positive count of tokens"),
                   required=True, help="prompt tokens (random ids)")
    b.add_argument("--gen-len", type=_int_in(2, None, "at least 2 tokens (a timed decode step)"),
                   required=True, help="tokens generated per request")
    b.add_argument("--repeats", type=_int_in(1, None, "a positive count"), default=3,
                   help="timed requests; the figures are their medians (default 3)")
    b.add_argument("--json", default=None, help="also write the figures to this file")
    b.add_argument("--seed", type=_request("seed", int), default=0,
                   help="seed of the random prompt ids (default 0); bench decodes greedily, "
                        "so nothing else is drawn")
    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (grout.server)")
    _common(s, model_required=False)
    s.add_argument("model_arg", nargs="?", type=_checked(_model), metavar="MODEL",
                   help="the model, as --model gives it (`grout serve MODEL`, as vLLM takes it)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=_int_in(0, 65535, "a port (0 to 65535)"), default=8000,
                   help="port to listen on (0: any free one)")
    s.add_argument("--served-model-name", type=_checked(_served_name), default=None,
                   help="the model name clients send (default: the --model argument)")
    s.add_argument("--max-request-bytes", type=_int_in(1, None, "a positive size"),
                   default=None, help="largest request body accepted (default 4 MiB); larger "
                                      "ones get HTTP 413")
    s.add_argument("--seed", type=_int_in(*SEED_RANGE, "a signed 64-bit int, the seeds a "
                                                        "request may send"), default=None,
                   help="seeds the draw of the sampling seed of each request that sends no "
                        "\"seed\" of its own, as vLLM's --seed: the same sequence of requests "
                        "gets the same samples, and requests still differ (default: a fresh "
                        "seed per request); a request's \"seed\" wins")
    s.add_argument("--generation-config", choices=("auto", "none"), default="auto",
                   help="auto: a request that leaves temperature, top_p or top_k out takes the "
                        "checkpoint's generation_config.json value, as vLLM does; none: the "
                        "OpenAI defaults (1, 1, off)")
    s.add_argument("--allowed-origin", type=_checked(_origin), action="append", default=[],
                   metavar="ORIGIN",
                   help="a web origin (scheme://host[:port], or *) whose browser pages may "
                        "call the API (CORS; repeatable; default: none)")
    s.add_argument("--api-key", type=_checked(_api_key), action="append", default=[],
                   metavar="KEY",
                   help="a key every /v1 request must send as 'Authorization: Bearer KEY' "
                        "(repeatable; default: the GROUT_API_KEY environment variable, else "
                        "none: anyone who reaches the port may use the API)")
    s.add_argument("--log-level", default="info",
                   choices=("critical", "error", "warning", "info", "debug"))
    # testing aid, not listed: a request's X-Grout-Fault: N header fails it after N tokens
    s.add_argument("--fault-injection", action="store_true", help=argparse.SUPPRESS)
    return ap


def _load(args):
    from .config import SHAPES
    from .engine import load, resolve_device
    if args.model in SHAPES and args.model != "tiny" and \
            resolve_device(args.device).type == "cpu":
        print(f"grout: note: {args.model} runs on the CPU executor here (no GPU): building "
              f"its weights takes a minute and each token many seconds; --model tiny is "
              f"CPU-sized", file=sys.stderr)
    with warnings.catch_warnings():          # (the note below says it the command line's way)
        warnings.filterwarnings("ignore", "max_seq_len=.* is past the model's context")
        eng = load(args.model, device=args.device, dtype=args.dtype,
                   max_seq_len=_max_seq_len(args), gemm=args.gemm, seed=args.weights_seed,
                   progress=not args.no_progress)
    if args.max_seq_len is not None and eng.max_seq_len < args.max_seq_len:
        print(f"grout: note: the cache holds {eng.max_seq_len} positions, the model's context "
              f"(its max_position_embeddings), not --max-seq-len {args.max_seq_len}",
              file=sys.stderr)
    return eng


def _max_seq_len(args) -> int:
    """--max-seq-len, or its default (given or not tells whether the model's cap is news)."""
    return DEFAULT_MAX_SEQ_LEN if args.max_seq_len is None else args.max_seq_len


def generate(args) -> int:
    eng = _load(args)
    prompt = args.prompt
    if args.chat:
        prompt = eng.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                   enable_thinking=args.enable_thinking)
    stream = eng.stream(prompt, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, stop=args.stop)
    start, first, n, finish = time.perf_counter(), None, 0, "length"
    try:
        for piece in stream:
            if first is None:
                first = time.perf_counter()
            n += 1
            finish = piece.finish_reason or finish
            sys.stdout.write(piece.text)
            sys.stdout.flush()
        end = time.perf_counter()
        sys.stdout.write("\n")
    except BrokenPipeError:                          # the reader of stdout left (| head)
        stream.close()
        return _reader_left()
    except KeyboardInterrupt:
        stream.close()
        return _interrupted(n)
    if not n:
        print(f"[0 tokens, finish: {finish}]", file=sys.stderr)
    else:
        then = f", then {(n - 1) / (end - first):.1f} tok/s" if n > 1 and end > first else ""
        print(f"[{n} token{'s' if n > 1 else ''}, finish: {finish}; first token "
              f"{1e3 * (first - start):.1f} ms{then}]", file=sys.stderr)
    return 0


def _interrupted(n: int) -> int:
    """The exit of a generation stopped by Ctrl-C: the text's line ended, the tokens so far told."""
    try:
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_left()
    print(f"[interrupted after {n} token{'' if n == 1 else 's'}]", file=sys.stderr)
    return 130


def _check_writable(path: str) -> None:
    """GroutError unless ``path`` can be written: checked before the bench runs (minutes on
    a GPU), not after it."""
    target = Path(path)
    if target.is_dir():
        problem = "is a directory"
    elif not target.parent.is_dir():
        problem = f"its directory {target.parent} does not exist"
    elif not os.access(target.parent, os.W_OK) or (target.exists() and
                                                    not os.access(target, os.W_OK)):
        problem = "is not writable"
    else:
        return
    raise GroutError(f"--json {path}: {problem}")


def bench(args) -> int:
    from . import bench as measure
    if args.json:
        _check_writable(args.json)
    eng = _load(args)
    result = measure.run(eng, args.prompt_len, args.gen_len, repeats=args.repeats,
                         seed=args.seed, progress=not args.no_progress)
    print(measure.report(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"environment": measure.environment(), "results": [result]}, f, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def serve(args) -> int:
    from .server import MAX_REQUEST_BYTES
    from .server import serve as run_server
    return run_server(lambda: _load(args), args.served_model_name or args.model, host=args.host,
                      port=args.port, log_level=args.log_level,
                      fault_injection=args.fault_injection,
                      max_request_bytes=args.max_request_bytes or MAX_REQUEST_BYTES,
                      default_seed=args.seed,
                      generation_config=args.generation_config == "auto",
                      allowed_origins=tuple(args.allowed_origin),
                      api_keys=tuple(args.api_key) or _env_api_keys())


def _env_api_keys() -> tuple[str, ...]:
    """The key in GROUT_API_KEY (keys there stay out of the process list), checked."""
    from .auth import KEY_ENV
    key = os.environ.get(KEY_ENV, "")
    try:
        return (_api_key(key),) if key else ()
    except GroutError as e:
        raise GroutError(f"{KEY_ENV}: {e}") from None


def _reader_left() -> int:
    """The exit of a command whose stdout reader left (``grout generate ... | head``): quiet,
    as any writer in a pipeline, with the status a shell reports for SIGPIPE. The stdout
    still buffered would fail again when the interpreter flushes it at exit, so stdout
    becomes /dev/null."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):                    # no file descriptor (a captured stdout)
        pass
    return 128 + 13                                  # 13: SIGPIPE


def _check_usage(args) -> None:
    """Usage errors between options, found before anything loads (minutes for a large model
    on a GPU)."""
    if args.command == "serve":
        if args.model is not None and args.model_arg is not None:
            args.usage_error("give the model once: `grout serve MODEL` or `--model MODEL`")
        args.model = args.model or args.model_arg
        if args.model is None:
            args.usage_error("the following arguments are required: MODEL (or --model MODEL)")
    if args.command == "generate" and not args.prompt and not args.chat:
        args.usage_error("--prompt is empty: give the text to continue")
    if getattr(args, "enable_thinking", False) and not args.chat:
        args.usage_error("--enable-thinking applies to a --chat prompt (the chat template's "
                         "thinking)")
    if args.command == "bench":
        from .bench import check_lengths
        try:
            check_lengths(args.prompt_len, args.gen_len, _max_seq_len(args))
        except GroutError as e:
            args.usage_error(str(e))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["chat"]:             # a command other engines' CLIs have; grout's is a flag
        parser().error("there is no `grout chat`: one chat turn is `grout generate --model M "
                       "--chat --prompt TEXT`; a conversation is `grout serve` and a chat client")
    args = parser().parse_args(argv)
    _check_usage(args)
    try:
        return {"generate": generate, "bench": bench, "serve": serve}[args.command](args)
    except (GroutError, ValueError, OSError) as e:   # OSError: a file it cannot write
        print(f"grout: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:                        # (generate tells its own tokens so far)
        print(f"\n[grout {args.command}: interrupted]", file=sys.stderr)
        return 130
