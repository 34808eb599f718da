"""A checkpoint's tokenizer and chat template: tokenizer.json when present, the template from
chat_template.jinja or tokenizer_config.json, and a template that cannot compile or run."""
import json

import pytest

import grout


def load(path, **kw):
    return grout.load(path, device="cpu", dtype="float32", max_seq_len=16, progress=False, **kw)


TEMPLATE = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_the_checkpoint_tokenizer_json_is_used_when_present(checkpoint_copy):
    from grout.tokenizer import qwen_tokenizer
    qwen_tokenizer()._tok.save(str(checkpoint_copy / "tokenizer.json"))
    (checkpoint_copy / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": TEMPLATE}))
    eng = load(checkpoint_copy)
    assert eng.tokenizer.source.endswith("tokenizer.json")
    assert eng.tokenizer.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "[user]hi[assistant]"


@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
def test_the_checkpoint_chat_template_is_used_without_a_tokenizer_json(checkpoint_copy, where):
    text = TEMPLATE if where.endswith(".jinja") else json.dumps({"chat_template": TEMPLATE})
    (checkpoint_copy / where).write_text(text)
    eng = load(checkpoint_copy)
    assert eng.tokenizer.source == "qwen-tokenizer ranks"       # Qwen's BPE, built offline
    assert eng.tokenizer.template_source.endswith(where)
    assert eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "[user]hi[assistant]"


def test_the_default_of_hugging_faces_named_chat_templates_is_used(checkpoint_copy):
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": TEMPLATE}]
    (checkpoint_copy / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    eng = load(checkpoint_copy)
    assert eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == \
        "[user]hi[assistant]"


@pytest.mark.parametrize("template, what", [
    ("{% for m in messages %}{{ m.content ", "TemplateSyntaxError"),
    ("{% if %}", "TemplateSyntaxError"),
    ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", "nosuchfilter"),
], ids=["syntax error", "empty if", "unknown filter"])
@pytest.mark.parametrize("where", ["chat_template.jinja", "tokenizer_config.json"])
@pytest.mark.parametrize("tokenizer_json", [True, False], ids=["tokenizer.json",
                                                               "no tokenizer.json"])
def test_a_chat_template_that_does_not_compile_fails_the_load_naming_its_file(
        checkpoint_copy, no_new_holds, template, what, where, tokenizer_json):
    from grout.tokenizer import qwen_tokenizer
    if tokenizer_json:
        qwen_tokenizer()._tok.save(str(checkpoint_copy / "tokenizer.json"))
    text = template if where.endswith(".jinja") else json.dumps({"chat_template": template})
    (checkpoint_copy / where).write_text(text)
    with pytest.raises(grout.CheckpointError, match=rf"{where}: .*{what}"):
        load(checkpoint_copy)


def test_a_chat_template_that_is_not_utf8_fails_the_load(checkpoint_copy, no_new_holds):
    from grout.tokenizer import qwen_tokenizer
    qwen_tokenizer()._tok.save(str(checkpoint_copy / "tokenizer.json"))
    (checkpoint_copy / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(grout.CheckpointError, match=r"chat_template\.jinja: .*UTF-8"):
        load(checkpoint_copy)


def test_a_chat_template_that_fails_on_the_messages_is_a_request_error(checkpoint_copy):
    from grout.tokenizer import qwen_tokenizer
    qwen_tokenizer()._tok.save(str(checkpoint_copy / "tokenizer.json"))
    (checkpoint_copy / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content.foo.bar }}{% endfor %}")
    eng = load(checkpoint_copy)
    with pytest.raises(grout.RequestError, match=r"chat_template\.jinja: .*UndefinedError"):
        eng.chat([{"role": "user", "content": "hi"}], max_new_tokens=1)
    assert eng.generate([1, 2, 3], max_new_tokens=1).token_ids


@pytest.mark.parametrize("message", [{"role": "system", "content": None}, {"role": "user"}],
                         ids=["None", "missing"])
def test_a_checkpoint_template_never_sees_a_message_without_text(checkpoint_copy, message):
    (checkpoint_copy / "chat_template.jinja").write_text(TEMPLATE)
    eng = load(checkpoint_copy)
    role = message["role"]
    with pytest.raises(grout.RequestError, match=rf"message 1 \({role}\): a {role} message "
                                                 rf"needs its 'content'"):
        eng.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message])


def test_a_checkpoint_template_renders_an_empty_assistant_turn_as_no_text(checkpoint_copy):
    (checkpoint_copy / "chat_template.jinja").write_text(TEMPLATE)
    eng = load(checkpoint_copy)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]
    assert eng.tokenizer.apply_chat_template(messages, add_generation_prompt=False) == \
        "[user]hi[assistant]"


# Templates that use what Hugging Face's template environment offers beyond plain jinja.
HF_TEMPLATES = {
    "loop controls": "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                     "[{{ m.role }}]{{ m.content }}{% if loop.index > 2 %}{% break %}{% endif %}"
                     "{% endfor %}",
    "generation block": "{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' %}"
                        "{% generation %}{{ m.content }}{% endgeneration %}{% else %}"
                        "{{ m.content }}{% endif %}{% endfor %}",
    "tojson": "{% for m in messages %}[{{ m.role }}]{{ m.content }}"
              "{% if m.extra is defined %}{{ m.extra | tojson }}{% endif %}{% endfor %}",
    "strftime_now": "[date]{{ strftime_now('%Y') }}"
                    "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}",
}


@pytest.mark.parametrize("template", HF_TEMPLATES.values(), ids=HF_TEMPLATES.keys())
def test_a_checkpoint_template_renders_the_text_hugging_face_renders(checkpoint_copy, template):
    from transformers.utils.chat_template_utils import render_jinja_template
    (checkpoint_copy / "chat_template.jinja").write_text(template)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "a <b> & c"},
                {"role": "assistant", "content": "x", "extra": {"z": 1, "a": "<é>"}},
                {"role": "user", "content": "d"}]
    want = render_jinja_template([messages], chat_template=template, add_generation_prompt=True,
                                 bos_token="", eos_token="<|im_end|>")[0][0]
    assert load(checkpoint_copy).tokenizer.apply_chat_template(messages) == want


@pytest.mark.parametrize("messages", [None, 5, "hi", {"role": "user", "content": "hi"}, []])
def test_the_checkpoint_chat_template_refuses_messages_that_are_not_a_list_of_dicts(
        checkpoint_copy, messages):
    (checkpoint_copy / "chat_template.jinja").write_text(TEMPLATE)
    eng = load(checkpoint_copy)
    with pytest.raises(grout.RequestError, match="non-empty list"):
        eng.tokenizer.apply_chat_template(messages)

