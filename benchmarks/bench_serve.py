"""Decode speed through `grout serve` and the openai client, against `grout bench`.

Starts ``grout serve --model SHAPE`` as a subprocess and streams ``--gen-len`` tokens through
the official openai client: greedy, past end tokens (``ignore_eos``), after the very prompt
``grout bench`` uses (``--prompt-len`` token ids from grout.bench.prompt_ids). The client's
decode rate is the tokens after the first over the time from the first streamed chunk to
the last, as ``grout bench`` times the steps after the first token; the server logs the rate
its engine thread saw for the same request. Then the server stops and ``grout bench`` runs
with the same lengths. The script prints the three rates and the client / bench ratio (the
target: within 3%) and writes benchmarks/results/serve.json and serve.png.

    PYTHONPATH=src python3 benchmarks/bench_serve.py --model qwen3-4b --gen-len 512
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))

from harness import RESULTS, write_results  # noqa: E402


def project_env() -> dict:
    """This process's environment with the project's src first on PYTHONPATH."""
    path = os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{path}")


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(project_env(), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "grout", "serve", "--model", args.model, "--port", str(port),
           "--device", args.device, "--max-seq-len", str(args.max_seq_len), "--no-progress"]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx
    deadline = time.monotonic() + args.load_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"grout serve exited ({proc.returncode}):\n"
                             f"{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"grout serve not healthy after {args.load_timeout} s")


def stream_once(client, model: str, prompt: list[int], gen_len: int) -> dict:
    """One greedy streamed completion; the client's view of its timing."""
    sent = time.perf_counter()
    first = last = None
    usage = None
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=gen_len,
                                       temperature=0.0, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    for chunk in stream:
        now = time.perf_counter()
        if chunk.choices:
            first = first or now
            last = now
        if chunk.usage is not None:
            usage = chunk.usage
    tokens = usage.completion_tokens
    if tokens != gen_len:
        raise AssertionError(f"the server generated {tokens} tokens, not {gen_len}")
    return {"tokens": tokens, "ttft_s": first - sent, "decode_s": last - first,
            "client_tok_s": (tokens - 1) / (last - first), "id": chunk.id}


def engine_rate(log_text: str, request_id: str) -> float | None:
    """The decode rate the server's engine thread logged for one request."""
    m = re.search(rf"{re.escape(request_id)}: .*?decode ([\d.]+) tok/s", log_text)
    return float(m.group(1)) if m else None


def run_bench(args) -> dict:
    """``grout bench`` with the same lengths, in its own process (the server is stopped)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        env = project_env()
        cmd = [sys.executable, "-m", "grout", "bench", "--model", args.model, "--device",
               args.device, "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len),
               "--max-seq-len", str(args.max_seq_len), "--repeats", str(args.repeats),
               "--json", str(out)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, env=env)
        return json.loads(out.read_text())


def bench_decode_rate(bench: dict) -> float:
    """The decode tok/s in `grout bench`'s JSON (its one result)."""
    return float(bench["results"][0]["decode_tok_s"])


def plot(rows: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names, values = list(rows), list(rows.values())
    ax.barh(names, values, color=["#4c72b0", "#55a868", "#c44e52"][: len(names)])
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.1f}", va="center")
    ax.set_xlabel("decode tokens / s")
    ax.set_xlim(0, max(values) * 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    if os.environ.get("OUT"):
        fig.savefig(Path(os.environ["OUT"], path.name), dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3-4b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=512)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--load-timeout", type=float, default=900.0)
    args = p.parse_args()

    import openai
    from grout.bench import prompt_ids
    prompt = prompt_ids(args.prompt_len)
    log_path = Path(tempfile.mkdtemp()) / "serve.log"
    proc, url = start_server(args, log_path)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                               timeout=600)
        model = client.models.list().data[0].id
        stream_once(client, model, prompt, min(args.gen_len, 32))          # warm-up
        runs = [stream_once(client, model, prompt, args.gen_len) for _ in range(args.repeats)]
    finally:
        proc.terminate()
        proc.wait(60)
    log_text = log_path.read_text(errors="replace")
    for r in runs:
        r["engine_tok_s"] = engine_rate(log_text, r.pop("id"))
    bench = run_bench(args)

    client_rate = statistics.median(r["client_tok_s"] for r in runs)
    engine_rates = [r["engine_tok_s"] for r in runs if r["engine_tok_s"] is not None]
    server_engine_rate = statistics.median(engine_rates) if engine_rates else None
    bench_rate = bench_decode_rate(bench)
    ratio = client_rate / bench_rate
    print(f"grout bench            {bench_rate:8.1f} tok/s")
    if server_engine_rate is not None:
        print(f"server's engine thread {server_engine_rate:8.1f} tok/s")
    print(f"openai client (stream) {client_rate:8.1f} tok/s   ratio to bench {ratio:.4f} "
          f"({(ratio - 1) * 100:+.2f}%; target within 3%)")
    rates = {"grout bench": bench_rate, "openai client": client_rate}
    if server_engine_rate is not None:
        rates = {"grout bench": bench_rate, "server engine thread": server_engine_rate,
                 "openai client": client_rate}
    path = write_results("serve", {
        "model": args.model, "prompt_len": args.prompt_len, "gen_len": args.gen_len,
        "max_seq_len": args.max_seq_len, "repeats": args.repeats,
        "client_tok_s_median": client_rate, "server_engine_tok_s_median": server_engine_rate,
        "bench_tok_s": bench_rate, "client_over_bench": ratio, "within_3_percent":
        abs(ratio - 1) <= 0.03, "runs": runs, "bench": bench})
    plot(rates, RESULTS / "serve.png")
    print(f"wrote {path}")
    return 0 if abs(ratio - 1) <= 0.03 else 1


if __name__ == "__main__":
    sys.exit(main())
