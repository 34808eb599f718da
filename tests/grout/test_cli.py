"""The grout command line: ``python -m grout generate`` as a subprocess, ``bench`` and bad
arguments in-process."""
import json
import re
import socket

import pytest
import torch

import grout
from grout import cli
from grout_support import run_cli


def test_python_m_grout_generate_streams_text_from_the_tiny_model():
    code, out, err = run_cli("generate", "--model", "tiny", "--prompt", "Hello, world",
                             "--max-new-tokens", "5", "--device", "cpu")
    assert code == 0, err
    assert out.strip() and "5 tokens, finish: length" in err
    assert "random tiny" in err and "recording the greedy decode step" in err   # progress


@pytest.mark.parametrize("tokens, summary", [("1", "[1 token, finish: length; first token "),
                                               ("0", "[0 tokens, finish: length]")])
def test_generate_summarizes_one_or_no_token_without_a_rate(capsys, tokens, summary):
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", tokens,
                     "--device", "cpu", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert summary in err and "tok/s" not in err and "nan" not in err


def test_generate_in_process_matches_the_engine(capsys):
    import grout
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "3",
                     "--device", "cpu", "--no-progress", "--temperature", "0.7", "--seed",
                     "4"]) == 0
    out = capsys.readouterr().out
    eng = grout.load("tiny", device="cpu", progress=False)
    assert out == eng.generate("Hi", max_new_tokens=3, temperature=0.7, seed=4).text \
        + "\n"


def test_generate_sampling_dtype_and_cache_flags_reach_the_engine(capsys, monkeypatch):
    import grout
    import grout.engine
    seen, real_load = {}, grout.engine.load
    monkeypatch.setattr(grout.engine, "load", lambda *a, **kw: seen.update(kw) or real_load(
        *a, **kw))
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "3",
                     "--device", "cpu", "--dtype", "float32", "--max-seq-len", "64",
                     "--no-progress", "--temperature", "0.9", "--top-k", "5", "--top-p", "0.8",
                     "--seed", "2"]) == 0
    out = capsys.readouterr().out
    eng = grout.load("tiny", device="cpu", dtype="float32", max_seq_len=64, progress=False)
    assert out == eng.generate("Hi", max_new_tokens=3, temperature=0.9, top_k=5, top_p=0.8,
                               seed=2).text + "\n"
    assert (seen["device"], seen["dtype"], seen["max_seq_len"]) == ("cpu", "float32", 64)


def test_generate_chat_sends_the_prompt_as_one_user_turn_of_the_chat_template(capsys):
    import grout
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--chat",
                     "--max-new-tokens", "3", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    eng = grout.load("tiny", device="cpu", progress=False)
    chat = eng.chat([{"role": "user", "content": "Hi"}], enable_thinking=False,
                    max_new_tokens=3)
    assert out == chat.text + "\n" != eng.generate("Hi", max_new_tokens=3).text + "\n"


def test_generate_stops_where_prompt_and_output_fill_max_seq_len(capsys):
    # "Hello, world" is 3 tokens: 5 more fill an 8-position context, as in the engine
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hello, world", "--max-seq-len",
                     "8", "--max-new-tokens", "64", "--device", "cpu", "--no-progress"]) == 0
    assert "[5 tokens, finish: length;" in capsys.readouterr().err


@pytest.mark.parametrize("command, extra", [
    ("generate", ["--prompt", "x"]), ("bench", ["--prompt-len", "4", "--gen-len", "2"]),
    ("serve", [])])
def test_every_subcommand_takes_device_dtype_and_max_seq_len(command, extra):
    args = cli.parser().parse_args([command, "--model", "tiny", "--device", "cpu", "--dtype",
                                    "float32", "--max-seq-len", "128", *extra])
    assert (args.device, args.dtype, args.max_seq_len) == ("cpu", "float32", 128)
    if command == "serve":
        assert (args.host, args.port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize("args,message", [
    (["--model", "qwen5-7b"], "unknown model"),
    (["--model", "./missing/dir"], "no such checkpoint"),
])
def test_a_model_that_cannot_load_exits_1_with_a_one_line_error(capsys, args, message):
    assert cli.main(["generate", "--prompt", "x", "--device", "cpu", "--no-progress",
                     *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("grout: error: ") and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_device_cuda_without_a_gpu_exits_1(capsys):
    assert cli.main(["generate", "--model", "tiny", "--prompt", "x", "--device", "cuda"]) == 1
    assert "no CUDA GPU" in capsys.readouterr().err


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--prompt", "x"])
    assert e.value.code == 2


def test_version_names_grout_safetile_torch_and_triton_and_exits_0(capsys):
    import safetile
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"grout {grout.__version__} (safetile {safetile.__version__}, "
                          f"torch {torch.__version__}, triton ")


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"], ["bench", "--help"],
                                  ["serve", "--help"]])
def test_help_prints_usage_and_exits_0(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: grout")
    if argv == ["--help"]:
        assert all(name in out for name in ("generate", "bench", "serve"))


def test_bench_prints_and_writes_its_figures(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--model", "tiny", "--prompt-len", "4", "--gen-len", "3",
                     "--repeats", "1", "--device", "cpu", "--no-progress", "--json",
                     str(out)]) == 0
    text = capsys.readouterr().out
    assert "time to first token" in text and "decode" in text
    # every figure bench promises, the roofline too: the H200's, marked as no CPU bound
    assert "ms/token" in text and "tok/s" in text and "% of roofline" in text
    assert "a GPU bound, not this CPU's" in text
    r = json.loads(out.read_text())["results"][0]
    for key in ("ttft_ms", "decode_tok_s", "ms_per_token", "pct_of_roofline", "roofline_tok_s"):
        assert r[key] > 0
    assert r["graph"] and r["model"] == "tiny"


def test_bench_shows_the_tokens_it_decodes_as_progress(capsys):
    assert cli.main(["bench", "--model", "tiny", "--prompt-len", "4", "--gen-len", "3",
                     "--repeats", "1", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "bench: a warm-up run, then 1 timed" in err and "6/6" in err


def test_a_bench_interrupted_says_so_and_exits_130(monkeypatch, capsys):
    from grout import bench

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(bench, "run", interrupted)
    assert cli.main(["bench", "--model", "tiny", "--device", "cpu", "--no-progress",
                     "--prompt-len", "4", "--gen-len", "3"]) == 130
    assert "[grout bench: interrupted]" in capsys.readouterr().err


def test_bench_gemm_cublas_times_the_torch_matmul_projections(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--model", "tiny", "--prompt-len", "4", "--gen-len", "3",
                     "--repeats", "1", "--device", "cpu", "--no-progress", "--gemm", "cublas",
                     "--json", str(out)]) == 0
    assert "gemm=cublas" in capsys.readouterr().out
    r = json.loads(out.read_text())["results"][0]
    assert r["gemm"] == "cublas" and not r["graph"] and r["decode_tok_s"] > 0


def _bench_checkpoint(path, tmp_path, *args):
    """``grout bench`` of the checkpoint at ``path`` in-process; its JSON results."""
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--model", str(path), "--prompt-len", "4", "--gen-len", "3",
                     "--repeats", "1", "--device", "cpu", "--dtype", "float32",
                     "--no-progress", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())["results"][0]


def test_bench_seed_is_the_seed_of_its_prompt_ids(checkpoints, tmp_path):
    import grout
    from grout import bench
    path, _ = checkpoints["tied"]
    r = _bench_checkpoint(path, tmp_path, "--seed", "5")
    eng = grout.load(path, device="cpu", dtype="float32", progress=False)
    ids = bench.prompt_ids(4, seed=5, vocab_size=eng.config.vocab_size)
    assert r["seed"] == 5
    assert r["tokens"] == eng.generate(ids, max_new_tokens=3, ignore_eos=True).token_ids


def test_bench_draws_its_prompt_ids_inside_the_models_vocabulary(checkpoints, monkeypatch):
    import grout
    from grout import bench
    eng = grout.load(checkpoints["tied"][0], device="cpu", dtype="float32", progress=False)
    prompts, begin = [], eng.runner.begin

    def spy(ids, *args, **kwargs):
        prompts.append(list(ids))
        return begin(ids, *args, **kwargs)
    monkeypatch.setattr(eng.runner, "begin", spy)
    bench.run(eng, 32, 2, repeats=1)
    assert prompts and all(100 <= i < eng.config.vocab_size for ids in prompts for i in ids)


def test_bench_refuses_a_vocabulary_too_small_for_its_prompt_ids():
    import grout
    from grout import bench
    with pytest.raises(grout.RequestError, match=r"vocabulary of 100 ids has none"):
        bench.prompt_ids(4, vocab_size=100)


@pytest.mark.parametrize("command, meaning", [
    ("generate", "sampling seed"), ("bench", "seed of the random prompt ids"),
    ("serve", "sampling seed of each request that sends no")])
def test_help_says_what_the_seed_of_each_subcommand_means(capsys, command, meaning):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    assert meaning in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("where", ["missing-dir/b.json", "."], ids=["no such directory",
                                                                 "a directory"])
def test_bench_json_that_cannot_be_written_exits_1_before_running(tmp_path, capsys, where):
    assert cli.main(["bench", "--model", "tiny", "--prompt-len", "4", "--gen-len", "3",
                     "--repeats", "1", "--device", "cpu", "--no-progress", "--json",
                     str(tmp_path / where)]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("grout: error: --json ") and "time to first token" not in out


@pytest.mark.parametrize("repeats", ["0", "-2"])
def test_bench_repeats_must_be_positive(capsys, repeats):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--repeats", repeats])
    assert e.value.code == 2 and "is not a positive count" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "--port: 99999 is not a port"), (["--port", "-1"], "--port: -1"),
    (["--max-request-bytes", "0"], "--max-request-bytes: 0 is not a positive size"),
    (["--seed", str(2 ** 63)], "--seed: 9223372036854775808 is not a signed 64-bit int"),
    (["--max-seq-len", "0"], "--max-seq-len: 0 is not a positive count"),
    (["--dtype", "int8"], "--dtype: unsupported dtype 'int8'; use float32"),
    (["--weights-seed", "-" + str(2 ** 63 + 1)], "--weights-seed: seed must be in"),
])
def test_serve_options_out_of_range_are_usage_errors(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", "tiny", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: grout serve" in err and message in err


@pytest.mark.parametrize("name", ["", " "])
def test_a_blank_served_model_name_is_a_usage_error(capsys, name):
    # The bad --port after it keeps a wrongly accepted name from starting a server.
    with pytest.raises(SystemExit) as e:
        cli.main(["serve", "--model", "tiny", "--served-model-name", name, "--port", "-1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--served-model-name: give the name clients send" in err


@pytest.mark.parametrize("command", ["generate", "bench"])
def test_the_seed_options_take_exactly_the_samplers_seeds(capsys, command):
    from grout.sampler import SEED_END, SEED_MIN
    base = [command, "--model", "tiny"] + {"generate": ["--prompt", "x"], "serve": [],
                                           "bench": ["--prompt-len", "4", "--gen-len", "4"]}[command]
    for seed in (SEED_MIN, SEED_END - 1):
        assert cli.parser().parse_args([*base, f"--seed={seed}"]).seed == seed
    for seed in (SEED_MIN - 1, SEED_END):
        with pytest.raises(SystemExit) as e:
            cli.parser().parse_args([*base, f"--seed={seed}"])
        assert e.value.code == 2 and "--seed: seed must be in" in capsys.readouterr().err


def test_serve_on_an_address_it_cannot_listen_on_exits_1_before_loading():
    code, _, err = run_cli("serve", "--model", "tiny", "--device", "cpu", "--host", "256.1.1.1",
                           "--port", "8000", timeout=120)
    assert code == 1 and "cannot listen on 256.1.1.1:8000" in err
    assert "random tiny" not in err                         # the model never started loading


def test_serve_on_a_port_in_use_exits_1_before_loading():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, _, err = run_cli("serve", "--model", "tiny", "--device", "cpu", "--port",
                               str(port), timeout=120)
    assert code == 1 and "address already in use" in err.lower()
    assert "random tiny" not in err


def test_generate_shows_no_progress_bar_after_the_first_token(monkeypatch):
    import io
    import sys
    events = []

    class Recorded(io.StringIO):            # one terminal: the order of every write
        def __init__(self, name):
            super().__init__()
            self.stream_name = name

        def write(self, s):
            events.append((self.stream_name, s))
            return len(s)
    monkeypatch.setattr(sys, "stdout", Recorded("out"))
    monkeypatch.setattr(sys, "stderr", Recorded("err"))
    assert cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--max-new-tokens", "4",
                     "--device", "cpu"]) == 0
    first = next(i for i, (name, s) in enumerate(events) if name == "out" and s)
    assert any("recording the greedy decode step" in s for _, s in events[:first])
    assert not any("recording" in s for name, s in events[first:] if name == "err")


def test_a_gpu_sized_shape_on_the_cpu_says_so_before_it_loads(capsys, monkeypatch):
    import grout.engine
    monkeypatch.setattr(grout.engine, "load", lambda *a, **k: (_ for _ in ()).throw(
        SystemExit(0)))                        # stop before building 36 layers
    with pytest.raises(SystemExit):
        cli.main(["generate", "--model", "qwen3-4b", "--prompt", "Hi", "--device", "cpu"])
    assert "qwen3-4b runs on the CPU executor" in capsys.readouterr().err


def test_enable_thinking_without_chat_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--model", "tiny", "--prompt", "Hi", "--enable-thinking"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--enable-thinking applies to a --chat prompt" in err
    assert "usage: grout generate" in err


@pytest.mark.parametrize("lengths, message", [
    (["--prompt-len", "0", "--gen-len", "5"], "--prompt-len: 0 is not a positive count"),
    (["--prompt-len", "4", "--gen-len", "1"], "--gen-len: 1 is not at least 2")])
def test_bench_lengths_out_of_range_are_usage_errors(capsys, lengths, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--device", "cpu", *lengths])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_lengths_past_the_cache_are_a_usage_error_before_the_model_loads(capsys,
                                                                             monkeypatch):
    # a bench that cannot run says so before the load (long for a real checkpoint on a GPU)
    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--device", "cpu", "--no-progress",
                  "--prompt-len", "60", "--gen-len", "8", "--max-seq-len", "64"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: grout bench" in err
    assert "grout bench: error: " in err and "68 exceeds max_seq_len 64" in err


def _long_generate():
    """``grout generate`` of 500 tokens on the tiny model, in a process of its own."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    from server_process import _die_with_parent
    env = dict(os.environ, PYTHONPATH=str(Path(cli.__file__).resolve().parents[1]))
    return subprocess.Popen([sys.executable, "-m", "grout", "generate", "--model", "tiny",
                             "--prompt", "Hi", "--max-new-tokens", "500", "--device", "cpu",
                             "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, preexec_fn=_die_with_parent)


def test_generate_stops_quietly_when_the_reader_of_its_output_leaves():
    # `grout generate ... | head -c 1`: the pipe closes under the stream, which is no error
    p = _long_generate()
    try:
        assert p.stdout.read(1)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 141             # 128 + SIGPIPE, as a shell reports it
    finally:
        p.kill()
        p.wait()
    assert err == ""


def test_ctrl_c_during_generate_ends_the_line_and_tells_the_tokens_so_far():
    import signal
    p = _long_generate()
    try:
        first = p.stdout.read(1)                      # generation has begun
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 130, err
    assert first and out.endswith(b"\n")
    assert re.fullmatch(r"\[interrupted after \d+ tokens?\]\n", err.decode()), err


@pytest.mark.parametrize("args,message", [
    (["--max-new-tokens", "-2"], "--max-new-tokens: max_new_tokens must be an int >= 0"),
    (["--top-p", "0"], "--top-p: top_p must be in (0, 1]"),
    (["--top-p", "2"], "--top-p: top_p must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature: temperature must be >= 0"),
    (["--temperature", "nan"], "--temperature: temperature must be a finite number"),
    (["--top-k", "-3"], "--top-k: top_k must be an int >= 0"),
    (["--top-k", "2.5"], "--top-k: '2.5' is not an integer"),
    (["--seed", str(2 ** 64)], "--seed: seed must be in [-2**63, 2**64)"),
    (["--seed", "x"], "--seed: 'x' is not an integer"),
    (["--stop", ""], "--stop: stop must be a non-empty string"),
    (["--prompt", "\udcff"], "--prompt: text must be valid Unicode"),    # argv not UTF-8
    (["--prompt", ""], "--prompt is empty"),
    (["--max-seq-len", "0"], "--max-seq-len: 0 is not a positive count"),
    (["--dtype", "int8"], "--dtype: unsupported dtype 'int8'; use float32"),
    (["--model", " "], "--model: give a checkpoint directory or a named shape"),
])
def test_generate_options_out_of_range_are_usage_errors_before_the_model_loads(
        monkeypatch, capsys, args, message):
    import grout.engine

    def load(*a, **kw):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(grout.engine, "load", load)
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "--model", "qwen3-32b", "--prompt", "x", "--device", "cpu",
                  *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: grout generate" in err
    assert "grout generate: error: " in err and message in err and "qwen3-32b runs" not in err


@pytest.mark.parametrize("origin, parsed", [
    ("http://localhost:3000", "http://localhost:3000"),
    ("https://chat.example.com/", "https://chat.example.com"),
    ("HTTP://LocalHost:3000", "http://localhost:3000"),
    ("https://example.com:443", "https://example.com"),
    ("http://example.com:80", "http://example.com"),
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("*", "*")])
def test_serve_allowed_origins_are_origins_as_browsers_send_them(origin, parsed):
    args = cli.parser().parse_args(["serve", "--model", "tiny", "--allowed-origin", origin,
                                    "--allowed-origin", "http://127.0.0.1:8080"])
    assert args.allowed_origin == [parsed, "http://127.0.0.1:8080"]


@pytest.mark.parametrize("origin", ["localhost:3000", "http://host/path", "ftp://host", "",
                                    "http://host:99999", "http://user@host"])
def test_serve_refuses_an_allowed_origin_no_browser_sends(capsys, origin):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(["serve", "--model", "tiny", "--allowed-origin", origin])
    assert e.value.code == 2 and "is not a web origin" in capsys.readouterr().err


def test_dtype_auto_is_the_checkpoints_dtype_as_vllm_and_transformers_take_it():
    from grout.engine import resolve_dtype
    args = cli.parser().parse_args(["generate", "--model", "tiny", "--prompt", "x",
                                    "--dtype", "auto"])
    assert args.dtype is None
    assert resolve_dtype("auto", "bfloat16") == resolve_dtype("AUTO", "bfloat16") == "bfloat16"


def test_max_model_len_is_vllms_name_of_max_seq_len():
    args = cli.parser().parse_args(["serve", "--model", "tiny", "--max-model-len", "128"])
    assert args.max_seq_len == 128


@pytest.mark.parametrize("key", ["", "two words", "tab\tkey", "kéy"])
def test_serve_refuses_an_api_key_no_bearer_header_can_carry(capsys, key):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(["serve", "--model", "tiny", "--api-key", key])
    assert e.value.code == 2 and "an API key is one word" in capsys.readouterr().err


def test_serve_takes_its_api_key_from_grout_api_key_when_none_is_given(monkeypatch):
    monkeypatch.setenv("GROUT_API_KEY", "sk-env")
    assert cli._env_api_keys() == ("sk-env",)
    monkeypatch.setenv("GROUT_API_KEY", "")
    assert cli._env_api_keys() == ()
    monkeypatch.setenv("GROUT_API_KEY", "two words")
    with pytest.raises(grout.GroutError, match="GROUT_API_KEY: an API key is one word"):
        cli._env_api_keys()


def test_a_bench_past_the_models_own_context_says_to_shorten_it_not_to_raise_the_cache():
    from grout.bench import check_lengths
    with pytest.raises(grout.RequestError, match="exceeds max_seq_len 256, the model's context "
                                                 r"\(its max_position_embeddings\): shorten"):
        check_lengths(250, 10, 256, model_context=256)
    with pytest.raises(grout.RequestError, match="exceeds max_seq_len 64, raise --max-seq-len"):
        check_lengths(60, 10, 64, model_context=256)


def test_serve_takes_the_model_as_its_argument_as_vllm_serve_does():
    args = cli.parser().parse_args(["serve", "tiny", "--port", "0"])
    cli._check_usage(args)
    assert args.model == "tiny"


@pytest.mark.parametrize("argv, message", [
    (["serve"], "the following arguments are required: MODEL (or --model MODEL)"),
    (["serve", "tiny", "--model", "tiny"], "give the model once")])
def test_serve_needs_its_model_exactly_once(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_serve_seed_takes_exactly_the_seeds_a_request_may_send(capsys):
    from grout.protocol import SEED_RANGE
    for seed in SEED_RANGE:
        assert cli.parser().parse_args(["serve", "tiny", f"--seed={seed}"]).seed == seed
    for seed in (SEED_RANGE[0] - 1, SEED_RANGE[1] + 1):
        with pytest.raises(SystemExit) as e:
            cli.parser().parse_args(["serve", "tiny", f"--seed={seed}"])
        assert e.value.code == 2 and "a signed 64-bit int, the seeds a request may send" in \
            capsys.readouterr().err


@pytest.mark.parametrize("given, noted", [(["--max-seq-len", "1000"], True), ([], False)],
                         ids=["given", "default"])
def test_a_max_seq_len_past_the_models_context_is_noted_when_given(tmp_path, capsys, given,
                                                                   noted):
    from server_process import build_checkpoint
    path = build_checkpoint(tmp_path / "ck")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 256}))
    assert cli.main(["generate", "--model", str(path), "--device", "cpu", "--dtype", "float32",
                     "--prompt", "hi", "--max-new-tokens", "1", "--no-progress", *given]) == 0
    err = capsys.readouterr().err
    note = "grout: note: the cache holds 256 positions, the model's context " \
           "(its max_position_embeddings), not --max-seq-len 1000"
    assert (note in err) == noted and "past the model's context" not in err   # (said once)
