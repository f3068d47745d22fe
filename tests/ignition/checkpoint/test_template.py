"""helios_tools.frontend_assets.render_chat: transformers semantics inside the sandbox."""

from __future__ import annotations

import pytest
from helios_tools.frontend_assets import ChatTemplateError, load_tokenizer, render_chat

MSGS = [{"role": "user", "content": "hi"}]


def test_generation_prompt_toggle(smollm2):
    with_prompt = render_chat(smollm2.chat_template, MSGS, add_generation_prompt=True)
    without = render_chat(smollm2.chat_template, MSGS, add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert without.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_trim_and_lstrip_blocks():
    template = "{% for m in messages %}\n    {{ m['content'] }}\n{% endfor %}"
    assert render_chat(template, [{"role": "user", "content": "a"}]) == "    a\n"


def test_raise_exception_becomes_chat_template_error():
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('need system') }}{% endif %}"
    with pytest.raises(ChatTemplateError, match="need system"):
        render_chat(template, MSGS)


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''.__class__.__base__ }}",
        "{% set _ = messages.append({'role': 'x'}) %}ok",
        "{% set ns = namespace(_secret=1) %}x",
    ],
)
def test_sandbox_blocks_escapes(template):
    with pytest.raises(ChatTemplateError):
        render_chat(template, MSGS)


def test_tools_tojson_and_none_dropping():
    template = (
        "{{ tools | tojson }}|{% for m in messages %}{{ m.keys() | list | tojson }}{% endfor %}"
        "|{{ bos_token }}"
    )
    tools = [{"type": "function", "function": {"name": "f", "description": "<é>"}}]
    out = render_chat(template, [{"role": "user", "content": "x", "tool_calls": None}],
                      tools=tools, bos_token="<s>")
    assert out == (
        '[{"type": "function", "function": {"name": "f", "description": "<é>"}}]'
        '|["role", "content"]|<s>'
    )


def test_loopcontrols_and_generation_block():
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    assert render_chat(template, [{"role": "user", "content": "a"},
                                  {"role": "user", "content": "b"}]) == "a"


def test_bad_template_and_bad_tokenizer():
    with pytest.raises(ChatTemplateError, match="compile"):
        render_chat("{% for %}", MSGS)
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer("{not json")
