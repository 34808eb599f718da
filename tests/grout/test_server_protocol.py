"""grout.protocol: which OpenAI request fields the server takes, their defaults, its 400s."""
import json

import pytest

from grout.protocol import APIError, parse_chat_request, parse_completion_request

MODEL = "tiny"
USER = [{"role": "user", "content": "Hi"}]


def completion(**fields):
    return parse_completion_request({"model": MODEL, "prompt": "Hello", **fields}, MODEL)


def chat(**fields):
    return parse_chat_request({"model": MODEL, "messages": USER, **fields}, MODEL)


def refused(parse, status=400, **fields) -> APIError:
    with pytest.raises(APIError) as info:
        parse(**fields)
    assert info.value.status == status
    return info.value


def test_completion_defaults_follow_the_openai_api():
    req = completion()
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k) == (16, 1.0, 1.0, 0)
    assert req.seed is None
    assert req.stop == [] and not req.stream and req.logprobs is None


def test_chat_without_max_tokens_may_fill_the_context():
    assert chat().max_tokens is None


def test_chat_prefers_max_completion_tokens():
    assert chat(max_tokens=5, max_completion_tokens=7).max_tokens == 7


def test_a_stop_string_becomes_a_list():
    assert completion(stop="\n").stop == ["\n"]
    assert completion(stop=["a", "", "b"]).stop == ["a", "b"]


def test_a_stop_string_longer_than_the_limit_is_refused_naming_it():
    from grout.protocol import MAX_STOP_LENGTH
    assert completion(stop=["a" * MAX_STOP_LENGTH]).stop == ["a" * MAX_STOP_LENGTH]
    err = refused(completion, stop=["ok", "a" * 16000])
    assert err.param == "stop" and "stop[1] has 16000" in err.message


def test_top_k_minus_one_means_no_cut():
    assert completion(top_k=-1).top_k == 0


def test_token_id_prompts_and_single_prompt_lists_are_accepted():
    assert completion(prompt=[1, 2, 3]).prompt == [1, 2, 3]
    assert completion(prompt=["x"]).prompt == "x"
    assert completion(prompt=[[4, 5]]).prompt == [4, 5]


def test_chat_logprobs_take_top_logprobs():
    assert chat(logprobs=True, top_logprobs=3).logprobs == 3
    assert chat(logprobs=True).logprobs == 0
    assert chat(logprobs=False).logprobs is None


@pytest.mark.parametrize("role", [["user"], {"x": 1}, 5, None])
def test_a_role_that_is_not_a_known_string_is_a_400_naming_it(role):
    e = refused(chat, messages=[{"role": role, "content": "hi"}])
    assert e.param == "messages[0].role"


def test_developer_role_and_text_parts_are_understood():
    req = chat(messages=[{"role": "developer", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "a"}]}])
    assert req.messages == [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "a"}]


def test_a_messages_text_parts_are_joined_by_newlines_as_vllm_joins_them():
    parts = [{"type": "text", "text": "Summarize:"}, {"type": "text", "text": "the text"}]
    req = chat(messages=[{"role": "system", "content": parts}, {"role": "user", "content": parts}])
    assert [m["content"] for m in req.messages] == ["Summarize:\nthe text"] * 2


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool"])
@pytest.mark.parametrize("message, got", [({"content": None}, "got null"),
                                          ({}, "got no 'content'"), ({"content": 5}, "got 5")],
                         ids=["null", "missing", "a number"])
def test_a_message_without_text_is_a_400_naming_its_index_and_role(role, message, got):
    err = refused(chat, messages=[*USER, {"role": role, **message}])
    assert err.param == "messages[1].content" and err.type == "invalid_request_error"
    assert err.message.startswith("messages[1].content: a ") and f"a {role} message" in err.message
    assert got in err.message


def test_an_assistant_message_without_content_is_an_empty_turn():
    req = chat(messages=[*USER, {"role": "assistant", "content": None}, {"role": "assistant"}])
    assert req.messages[1:] == [{"role": "assistant", "content": ""}] * 2


def test_a_reasoning_that_is_not_a_string_is_a_400_naming_it():
    err = refused(chat, messages=[*USER, {"role": "assistant", "content": "4",
                                          "reasoning_content": ["add"]}])
    assert err.param == "messages[1].reasoning_content"


def test_an_assistant_message_with_tool_calls_is_refused_as_unsupported():
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    err = refused(chat, messages=[*USER, {"role": "assistant", "content": None,
                                          "tool_calls": calls}])
    assert (err.param, err.code) == ("messages[1].tool_calls", "unsupported_parameter")


def test_enable_thinking_comes_from_chat_template_kwargs():
    assert chat().enable_thinking is True
    assert chat(chat_template_kwargs={"enable_thinking": False}).enable_thinking is False


def test_a_null_enable_thinking_means_its_default_as_other_null_fields_do():
    assert chat(chat_template_kwargs={"enable_thinking": None}).enable_thinking is True


def test_default_valued_fields_are_accepted():
    req = completion(n=1, best_of=1, echo=False, presence_penalty=0, logit_bias={}, user="u")
    assert req.max_tokens == 16


def test_include_usage_needs_stream():
    assert completion(stream=True, stream_options={"include_usage": True}).include_usage
    assert refused(completion, stream_options={"include_usage": True}).param == "stream_options"


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 10 ** 400}, "temperature"),         # an int too large for a float
    ({"top_p": 10 ** 400}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"n": 2}, "n"),
    ({"best_of": 3}, "best_of"),
    ({"echo": True}, "echo"),
    ({"logprobs": 6}, "logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"stop": 3}, "stop"),
    ({"seed": 2 ** 63}, "seed"),
    ({"seed": -2 ** 63 - 1}, "seed"),
    ({"repetition_penalty": 1.1}, "repetition_penalty"),
    ({"stop_token_ids": [5]}, "stop_token_ids"),
    ({"min_tokens": True}, "min_tokens"),
    ({"bogus": 1}, "bogus"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"stream": "yes"}, "stream"),
])
def test_completion_refusals_name_the_field(fields, param):
    err = refused(completion, **fields)
    assert err.param == param and err.type == "invalid_request_error"


@pytest.mark.parametrize("fields, param", [
    ({"messages": []}, "messages"),
    ({"messages": None}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"foo": 1}}, "chat_template_kwargs"),
])
def test_chat_refusals_name_the_field(fields, param):
    assert refused(chat, **fields).param == param


@pytest.mark.parametrize("n", [0, -1])
def test_a_count_of_completions_below_one_is_out_of_range_not_unsupported(n):
    err = refused(completion, n=n)
    assert err.param == "n" and "must be at least 1" in str(err) and err.code is None


def test_more_than_one_completion_is_refused_as_one_completion_a_request():
    err = refused(chat, n=2)
    assert err.code == "unsupported_parameter" and "one completion a request" in str(err)


def test_an_unknown_model_is_refused_as_not_found():
    err = refused(completion, 404, model="gpt-4")
    assert (err.status, err.param, err.code) == (404, "model", "model_not_found")


@pytest.mark.parametrize("parse", [completion, chat])
def test_an_empty_model_name_means_the_served_model_as_in_vllm(parse):
    parse(model="")


@pytest.mark.parametrize("model", [5, ["tiny"], True])
def test_a_model_that_is_not_a_string_is_a_400_not_a_missing_model(model):
    err = refused(completion, model=model)
    assert (err.param, err.code) == ("model", None) and "must be a string" in err.message


def test_chat_takes_up_to_twenty_top_logprobs():
    assert chat(logprobs=True, top_logprobs=20).logprobs == 20


@pytest.mark.parametrize("fields", [
    {"repetition_penalty": 1.0}, {"min_p": 0}, {"min_tokens": 0}, {"stop_token_ids": []},
    {"include_stop_str_in_output": False}, {"n": 1.0}, {"presence_penalty": 0},
    {"stream": True, "stream_options": {"include_usage": True,
                                        "continuous_usage_stats": False}},
], ids=lambda f: next(iter(f)))
def test_vllm_clients_neutral_fields_are_accepted(fields):
    completion(**fields)


def test_the_largest_signed_64_bit_seeds_are_accepted():
    assert completion(seed=2 ** 63 - 1).seed == 2 ** 63 - 1
    assert completion(seed=-2 ** 63).seed == -2 ** 63


def test_the_body_must_be_an_object():
    with pytest.raises(APIError, match="JSON object"):
        parse_completion_request([1, 2], MODEL)


def test_error_body_has_the_openai_shape():
    err = refused(completion, n=2)
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("value", [1, 0, 1.0, "true"])
def test_chat_logprobs_must_be_a_boolean_not_a_number(value):
    assert refused(chat, logprobs=value).param == "logprobs"


def test_a_prompt_mixing_text_and_token_ids_is_refused_as_such():
    message = refused(completion, prompt=["a", 1]).message
    assert "several prompts" not in message and "list of token ids" in message


def test_a_quoted_value_is_cut_short():
    err = refused(completion, temperature="x" * 10_000)
    assert err.param == "temperature" and len(err.message) < 200


def test_an_error_body_escapes_a_lone_surrogate_so_it_encodes():
    err = refused(completion, 404, model="\ud800")
    body = json.dumps(err.body(), ensure_ascii=False).encode()
    assert "\\\\ud800" in body.decode()
    err = refused(completion, **{"x\udcff": 1})
    assert err.param == "x\\udcff"


@pytest.mark.parametrize("value", [-1, "abc", 2.5])
def test_chat_max_tokens_is_checked_even_beside_max_completion_tokens(value):
    err = refused(chat, max_completion_tokens=7, max_tokens=value)
    assert err.param == "max_tokens"


@pytest.mark.parametrize("stop", ["\ud800", ["ok", "a\udcffb"]])
def test_a_stop_string_that_is_not_valid_unicode_is_refused_naming_it(stop):
    err = refused(completion, stop=stop)
    assert err.param == "stop" and "valid Unicode" in err.message
