"""The Engine API: generate / stream / chat / logits, stopping, seeded sampling, and every bad
request (a RequestError, with the engine usable afterwards)."""
import gc
import json
import threading

import pytest
import torch

import grout

PROMPT = [3, 17, 250, 41, 99, 5]


@pytest.fixture
def eng(engines):
    return engines["tied"]


@pytest.fixture(scope="module")
def reference(engines):
    """The greedy tokens of PROMPT, to check the engine is unharmed by a bad request."""
    return engines["tied"].generate(PROMPT, max_new_tokens=3).token_ids


BAD = [
    (dict(max_new_tokens=-1), "max_new_tokens"),
    (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(temperature=-0.5), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=10 ** 400), "temperature"),         # too large for a float
    (dict(top_p=10 ** 400), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(seed="7"), "seed"),
    (dict(stop=[""]), "stop"),
    (dict(stop="\ud800"), "Unicode"),                   # a lone surrogate could never match
]


BAD_PROMPTS = [([1, 2, 384], "outside the vocabulary"), ([-1], "outside the vocabulary"),
               ([], "empty"), ([1, 2.0], "ints"), (list(range(65)), "does not fit"),
               (42, "prompt must")]


def test_bad_request_parameters_raise_and_leave_the_engine_usable(eng, reference):
    for kwargs, word in BAD:
        with pytest.raises(grout.RequestError, match=word):
            eng.generate(PROMPT, **{"max_new_tokens": 3, **kwargs})
        with pytest.raises(grout.RequestError, match=word):
            eng.stream(PROMPT, **{"max_new_tokens": 3, **kwargs})   # checked when made
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


def test_bad_prompts_raise_and_leave_the_engine_usable(eng, reference):
    for prompt, word in BAD_PROMPTS:
        with pytest.raises(grout.RequestError, match=word):
            eng.generate(prompt, max_new_tokens=3)
        with pytest.raises(grout.RequestError, match=word):
            eng.logits(prompt)
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


def test_token_ids_may_come_as_numpy_or_torch_integers(eng, reference):
    import numpy as np
    for prompt in (np.array(PROMPT), torch.tensor(PROMPT), [np.int64(i) for i in PROMPT]):
        assert eng.generate(prompt, max_new_tokens=3).token_ids == reference
        assert eng.logits(prompt).shape[0] == len(PROMPT)


def test_text_prompts_with_ids_outside_a_small_vocabulary_are_rejected(eng):
    with pytest.raises(grout.RequestError, match="outside the vocabulary"):
        eng.logits("Hello, world!")              # Qwen ids 9707, 1879 > 384


@pytest.mark.parametrize("logprobs", [None, 0], ids=["in chunks", "step by step"])
def test_prompt_and_generated_tokens_together_fit_max_seq_len(eng, logprobs):
    c = eng.generate(list(range(60)), max_new_tokens=10, ignore_eos=True, logprobs=logprobs)
    assert c.prompt_tokens + len(c.token_ids) == eng.max_seq_len == 64
    assert c.finish_reason == "length"
    pieces = list(eng.stream(list(range(60)), max_new_tokens=10, ignore_eos=True))
    assert [p.token_id for p in pieces] == c.token_ids and pieces[-1].finish_reason == "length"


def test_a_prompt_that_fills_max_seq_len_generates_nothing(eng):
    c = eng.generate(list(range(64)), max_new_tokens=10)
    assert (c.token_ids, c.finish_reason, c.prompt_tokens) == ([], "length", 64)
    assert list(eng.stream(list(range(64)), max_new_tokens=10)) == []


def test_zero_new_tokens(eng):
    c = eng.generate(PROMPT, max_new_tokens=0)
    assert (c.text, c.token_ids, c.finish_reason, c.prompt_tokens) == ("", [], "length", 6)


def test_bad_load_arguments():
    with pytest.raises(grout.RequestError, match="model must be"):
        grout.load("", device="cpu")
    with pytest.raises(grout.RequestError, match="seed"):
        grout.load("tiny", device="cpu", seed="x")
    with pytest.raises(grout.RequestError, match="seed"):
        grout.load("tiny", device="cpu", seed=2 ** 70)
    with pytest.raises(grout.RequestError, match="gemm"):
        grout.load("tiny", gemm="mkl")
    with pytest.raises(grout.RequestError, match="dtype"):
        grout.load("tiny", device="cpu", dtype="int8")
    with pytest.raises(grout.RequestError, match="max_seq_len"):
        grout.load("tiny", max_seq_len=0)
    with pytest.raises(grout.RequestError, match="device"):
        grout.load("tiny", device="tpu")


@pytest.mark.parametrize("asked, warned", [(1000, True), (None, False)], ids=["given", "default"])
def test_a_max_seq_len_past_the_models_context_is_capped_with_a_warning_when_given(
        tmp_path, recwarn, asked, warned):
    from server_process import build_checkpoint
    path = build_checkpoint(tmp_path / "ck")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 256}))
    given = {} if asked is None else dict(max_seq_len=asked)
    eng = grout.load(path, device="cpu", dtype="float32", progress=False, **given)
    capped = [w for w in recwarn if "past the model's context" in str(w.message)]
    assert eng.max_seq_len == 256 and len(capped) == warned
    if warned:
        assert "max_seq_len=1000" in str(capped[0].message) and capped[0].filename == __file__


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_a_request_error():
    with pytest.raises(grout.RequestError, match="no CUDA GPU"):
        grout.load("tiny", device="cuda")


def test_stream_yields_one_piece_per_token_and_the_text_of_generate(engines):
    eng = engines["untied"]
    c = eng.generate(PROMPT, max_new_tokens=6)
    pieces = list(eng.stream(PROMPT, max_new_tokens=6))
    assert [p.token_id for p in pieces] == c.token_ids
    assert "".join(p.text for p in pieces) == c.text
    assert [p.finish_reason for p in pieces] == [None] * 5 + ["length"]


def test_closing_a_stream_stops_it_and_frees_the_engine(eng, reference):
    s = eng.stream(PROMPT, max_new_tokens=50)
    first = next(s)
    s.close()
    with pytest.raises(StopIteration):
        next(s)
    assert first.token_id == reference[0]
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


def test_a_stream_closed_from_another_thread_while_it_decodes_stops(eng, reference):
    s = eng.stream(PROMPT, max_new_tokens=200, ignore_eos=True)
    got, started = [], threading.Event()

    def consume():
        for piece in s:
            got.append(piece)
            started.set()

    th = threading.Thread(target=consume)
    th.start()
    started.wait()
    s.close()
    th.join()
    assert 1 <= len(got) < 200
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


def test_a_newer_request_supersedes_an_unfinished_stream(eng, reference):
    old = eng.stream(PROMPT, max_new_tokens=10)
    next(old)
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference
    with pytest.raises(grout.RequestError, match="superseded"):
        next(old)
    del old
    gc.collect()


def test_requests_from_several_threads_wait_their_turn(eng, reference):
    """generate, chat and logits each own the engine for their whole request: a request
    from another thread waits for it instead of superseding it."""
    want = eng.logits(PROMPT)
    results, errors = [], []

    def worker():
        try:
            for _ in range(3):
                results.append(eng.generate(PROMPT, max_new_tokens=3).token_ids)
                assert torch.equal(eng.logits(PROMPT), want)
        except Exception as e:                      # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [reference] * 9


def test_generate_gives_logprobs_and_ignores_eos_like_stream(eng):
    pieces = list(eng.stream(PROMPT, max_new_tokens=3, logprobs=2, ignore_eos=True))
    c = eng.generate(PROMPT, max_new_tokens=3, logprobs=2, ignore_eos=True)
    assert c.logprobs == [p.logprobs for p in pieces]
    assert eng.generate(PROMPT, max_new_tokens=3).logprobs is None


@pytest.mark.parametrize("text", ["\ud800", "a\udcff b"])
def test_a_lone_surrogate_in_a_prompt_is_a_request_error(eng, reference, text):
    with pytest.raises(grout.RequestError, match="valid Unicode"):
        eng.generate(text, max_new_tokens=2)
    with pytest.raises(grout.RequestError, match="valid Unicode"):
        eng.chat([{"role": "user", "content": text}], max_new_tokens=2)
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


@pytest.mark.parametrize("ids", [[-1], [2 ** 70], None, [1.5], [True], "ab", 5])
def test_decoding_what_is_not_a_list_of_token_ids_is_a_request_error(eng, ids):
    with pytest.raises(grout.RequestError, match="token ids"):
        eng.tokenizer.decode(ids)


def test_stop_strings_end_the_text_before_them(engines):
    eng = engines["untied"]
    full = eng.generate(PROMPT, max_new_tokens=8)
    assert len(full.text) > 4
    stop = full.text[2:4]
    c = eng.generate(PROMPT, max_new_tokens=8, stop=[stop, "\x00never"])
    assert c.finish_reason == "stop" and c.text == full.text[:full.text.find(stop)]
    pieces = list(eng.stream(PROMPT, max_new_tokens=8, stop=stop))
    assert "".join(p.text for p in pieces) == c.text and pieces[-1].finish_reason == "stop"


def test_a_pieces_offset_is_where_its_tokens_text_starts_while_text_is_held_back(engines):
    eng = engines["untied"]
    free = list(eng.stream(PROMPT, max_new_tokens=8, ignore_eos=True))
    starts = [sum(len(p.text) for p in free[:i]) for i in range(len(free))]
    assert [p.offset for p in free] == starts
    # A stop that is never met but begins with each piece's last character holds that
    # character back: the text sent so far then lags the tokens' own positions.
    stops = [p.text[-1] + "\x00never" for p in free if p.text][:16]
    held = list(eng.stream(PROMPT, max_new_tokens=8, ignore_eos=True, stop=stops))
    assert [p.token_id for p in held] == [p.token_id for p in free]
    assert [p.offset for p in held] == starts
    assert any(len(p.text) != len(f.text) for p, f in zip(held, free))


def test_eos_tokens_stop_generation_and_add_no_text(checkpoints):
    path, _ = checkpoints["tied"]
    eng = grout.load(path, device="cpu", dtype="float32", max_seq_len=32, progress=False)
    first = eng.generate(PROMPT, max_new_tokens=4).token_ids
    eng.eos_ids = frozenset({first[1]})
    c = eng.generate(PROMPT, max_new_tokens=4)
    assert c.token_ids == first[:first.index(first[1]) + 1] and c.finish_reason == "stop"
    assert c.text == eng.tokenizer.decode(c.token_ids[:-1])


def test_sampling_with_a_seed_repeats_and_other_seeds_differ(eng):
    kw = dict(max_new_tokens=3, temperature=1.5)
    a = eng.generate(PROMPT, seed=1, **kw).token_ids
    assert eng.generate(PROMPT, seed=1, **kw).token_ids == a
    others = {tuple(eng.generate(PROMPT, seed=s, **kw).token_ids) for s in (2, 3)}
    assert others != {tuple(a)}


def test_a_seed_outside_64_bits_is_refused_rather_than_repeating_another_seeds_samples(eng):
    kw = dict(max_new_tokens=3, temperature=1.5)
    for seed in (2 ** 64 + 5, -2 ** 63 - 1, 2 ** 200):
        with pytest.raises(grout.RequestError, match=r"seed must be in \[-2\*\*63, 2\*\*64\)"):
            eng.generate(PROMPT, seed=seed, **kw)
    for seed in (2 ** 64 - 1, -2 ** 63):                   # the ends of the range are seeds
        assert len(eng.generate(PROMPT, seed=seed, **kw).token_ids) == 3


def test_a_tiny_top_p_is_greedy_and_the_engine_keeps_a_graph_per_mode(eng, reference):
    assert eng.generate(PROMPT, max_new_tokens=3, temperature=0.8, top_p=1e-6,
                        seed=5).token_ids == reference
    assert {greedy for greedy, _ in eng.runner.graphs} == {True, False}
    assert eng.generate(PROMPT, max_new_tokens=3).token_ids == reference


def test_a_top_p_too_small_for_float32_is_greedy(eng, reference):
    assert eng.generate(PROMPT, max_new_tokens=3, temperature=1.0, top_p=1e-46,
                        seed=1).token_ids == reference


def test_chat_applies_the_template():
    eng = grout.load("tiny", device="cpu", max_seq_len=128, progress=False)
    msgs = [{"role": "user", "content": "Hi"}]
    c = eng.chat(msgs, enable_thinking=False, max_new_tokens=2)
    prompt = eng.tokenizer.apply_chat_template(msgs, enable_thinking=False)
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert c.prompt_tokens == len(eng.tokenizer.encode(prompt))
    assert c.token_ids == eng.generate(prompt, max_new_tokens=2).token_ids
    with pytest.raises(grout.RequestError, match="role"):
        eng.chat([{"role": "robot", "content": "x"}])


@pytest.mark.parametrize("value", ["no", 0, None])
def test_enable_thinking_must_be_a_bool(eng, value):
    with pytest.raises(grout.RequestError, match="enable_thinking must be True or False"):
        eng.chat([{"role": "user", "content": "Hi"}], enable_thinking=value, max_new_tokens=1)


def test_named_shape_weights_are_random_varied_and_bf16():
    eng = grout.load("tiny", device="cpu", max_seq_len=32, progress=False)
    assert eng.dtype == "bfloat16" and eng.config.vocab_size == 151936
    w = eng.runner.w.layers[0].qkv.w.to_torch().float()
    assert w.std() > 0.05 and w.abs().max() > 0
    c = eng.generate("Hello, world", max_new_tokens=4)
    assert len(set(c.token_ids)) > 1
    assert c.text == eng.tokenizer.decode(c.token_ids)


# (hidden, intermediate, layers, heads, key/value heads, tied embeddings) of each model's
# config.json as Qwen published it; every one has head_dim 128 and Qwen's 151936-token vocabulary
QWEN3_DIMENSIONS = {
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, True), "qwen3-1.7b": (2048, 6144, 28, 16, 8, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, True), "qwen3-8b": (4096, 12288, 36, 32, 8, False),
    "qwen3-14b": (5120, 17408, 40, 40, 8, False), "qwen3-32b": (5120, 25600, 64, 64, 8, False)}


def test_the_named_shapes_are_tiny_and_the_qwen3_models():
    assert set(grout.SHAPES) == {"tiny", *QWEN3_DIMENSIONS}


@pytest.mark.parametrize("name", QWEN3_DIMENSIONS)
def test_a_named_shape_has_the_real_dimensions_of_its_qwen3_model(name):
    c = grout.SHAPES[name]
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.tie_word_embeddings) == QWEN3_DIMENSIONS[name]
    assert (c.head_dim, c.vocab_size, c.rope_theta, c.rms_norm_eps) == (128, 151936, 1e6, 1e-6)


def test_sampling_parameters_may_be_numpy_numbers(eng):
    # as safetile's ops take them (a numpy float32 is no Python float, an int64 no int)
    import numpy as np
    want = eng.generate(PROMPT, max_new_tokens=3, temperature=0.5, top_k=40, top_p=0.9,
                        seed=7).token_ids
    got = eng.generate(PROMPT, max_new_tokens=np.int64(3), temperature=np.float32(0.5),
                       top_k=np.int64(40), top_p=np.float32(0.9), seed=np.int64(7))
    assert got.token_ids == want
    with pytest.raises(grout.RequestError, match="temperature"):
        eng.generate(PROMPT, temperature=np.bool_(True))      # a truth value is no number


def test_logprobs_may_be_a_numpy_integer_like_the_sampling_parameters(eng):
    import numpy as np
    got = eng.generate(PROMPT, max_new_tokens=2, logprobs=np.int64(3))
    assert [len(lp.top_ids) for lp in got.logprobs] == [3, 3]
    assert all(type(i) is int for lp in got.logprobs for i in lp.top_ids)


def test_ignore_eos_must_be_a_bool_so_the_string_false_is_not_read_as_true(eng, reference):
    for value in ("false", 0, None):
        with pytest.raises(grout.RequestError, match="ignore_eos must be True or False"):
            eng.stream(PROMPT, max_new_tokens=3, ignore_eos=value)
    assert eng.generate(PROMPT, max_new_tokens=3, ignore_eos=False).token_ids == reference


def test_a_batch_of_prompts_is_refused_saying_grout_runs_one(eng):
    # Hugging Face tokenizers return input_ids of shape (1, n); the message stays short
    with pytest.raises(grout.RequestError, match="one sequence of token ids") as e:
        eng.generate(torch.tensor([list(range(50))]), max_new_tokens=1)
    assert len(str(e.value)) < 200


def test_sampling_params_passed_as_the_second_argument_say_to_pass_keywords(eng):
    params = grout.SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3)
    with pytest.raises(grout.RequestError, match=r"pass the sampling settings as keywords, "
                       r"generate\(prompt, max_new_tokens=\.\.\., temperature=0\.7, top_k=5, "
                       r"top_p=0\.9, seed=3\)"):
        eng.generate("hi", params)


def test_a_list_of_prompt_strings_is_refused_saying_grout_runs_one(eng):
    with pytest.raises(grout.RequestError, match="not a list of strings"):
        eng.generate(["Hello", "world"], max_new_tokens=1)


@pytest.fixture
def echo_engine():
    """A tied model with every layer zeroed: greedy decoding repeats the last token."""
    # Each token's logits are then its own embedding's similarity to the others'.
    from grout.checkpoint import tensor_names
    from grout.config import Qwen3Config
    from grout.engine import from_tensors
    cfg = Qwen3Config(vocab_size=640, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      tie_word_embeddings=True, max_position_embeddings=64, dtype="float32")
    g = torch.Generator().manual_seed(0)
    tensors = {name: (torch.ones(shape) if len(shape) == 1 else torch.zeros(shape))
               for name, shape in tensor_names(cfg).items()}
    tensors["model.embed_tokens.weight"] = torch.randn(640, 64, generator=g)
    eng = from_tensors(cfg, tensors, device="cpu", dtype="float32", max_seq_len=64)
    yield eng
    del eng
    gc.collect()


def test_a_stop_string_in_text_held_back_to_the_end_still_stops_it(echo_engine):
    eng = echo_engine
    space_and_half_a_dash = 636                 # Qwen's token b" \xe2\x80": it ends mid-character
    assert eng.tokenizer.token_bytes(space_and_half_a_dash) == b" \xe2\x80"
    full = eng.generate([space_and_half_a_dash], max_new_tokens=3)
    assert full.token_ids == [space_and_half_a_dash] * 3 and full.text.startswith(" \ufffd")
    c = eng.generate([space_and_half_a_dash], max_new_tokens=3, stop=" ")
    assert (c.text, c.finish_reason) == ("", "stop")
    pieces = list(eng.stream([space_and_half_a_dash], max_new_tokens=3, stop=" "))
    assert "".join(p.text for p in pieces) == "" and pieces[-1].finish_reason == "stop"
