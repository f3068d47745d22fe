"""Chat templates are untrusted code: rendering is bounded in time and size and templates
that load other templates are refused when compiled (helios_tools.template_sandbox)."""

from __future__ import annotations

import time
import tracemalloc

import pytest
from helios_tools.frontend_assets import (
    ChatTemplateCompileError,
    ChatTemplateError,
    ChatTemplateLimitError,
    render_chat,
)
from helios_tools.template_sandbox import RenderLimits

MSGS = [{"role": "user", "content": "hi"}]
FAST = RenderLimits(max_seconds=0.5)


@pytest.mark.parametrize(("template", "tag"), [
    ('{% include "other.jinja" %}', "include"),
    ('{% import "macros.jinja" as m %}{{ m.x() }}', "import"),
    ('{% from "macros.jinja" import x %}', "from"),
    ('hello\n{% extends "base.jinja" %}', "extends"),
])
def test_loading_tags_are_refused_when_compiled(template, tag):
    with pytest.raises(ChatTemplateCompileError) as info:
        render_chat(template, MSGS)
    line = 2 if tag == "extends" else 1
    assert str(info.value) == (f"chat template uses {{% {tag} %}} (line {line}): a chat "
                               "template cannot load other templates")


@pytest.mark.parametrize(("template", "why"), [
    ("{{ range(10**9) }}", "calling safe_range() would create 1000000000 items; the limit "
                           "is 4194304"),
    ("{{ 'a' * 10**10 }}", "the * operator would create 10000000000 items; the limit is "
                           "4194304"),
    ("{{ [0] * 10**10 }}", "the * operator would create 10000000000 items"),
    ("{{ 7 ** (10**6) }}", "7 ** 1000000 has more than 4096 bits"),
    ("{{ '%1000000000d' % 1 }}", "the % operator would create 1000000000 items"),
    ("{{ '%*d' % (10**9, 1) }}", "the % operator would create 1000000000 items"),
    ("{{ '{:>1000000000}'.format(1) }}", "calling format() would create 1000000000 items"),
    ("{{ 'x'.center(10**9) }}", "calling center() would create 1000000000 items"),
    ("{{ 'x'|center(10**9) }}", "the center filter would create 1000000000 items"),
    ("{{ 'x'|indent(10**9, true) }}", "the indent filter would create 1000000000 items"),
    ("{{ ('a' * 4000)|replace('a', 'b' * 4000) }}", "calling replace() would create 16000000"),
    ("{{ ('a' * 4000).replace('a', 'b' * 4000) }}", "calling replace() would create 16000000"),
    ("{{ ('a' * 4000)|join('b' * 4000) }}", "the join filter would create 16000000 items"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}", "a namespace assignment would create 8388608 items"),
    ("{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('a') }}", "calling Macro() would "
                                                                 "create 8388608 items"),
    ("{% for i in range(5000) %}{{ 'a' * 1000 }}{% endfor %}", "the rendered prompt exceeds "
                                                               "4194304 characters"),
])
def test_sizes_are_bounded_before_they_are_allocated(template, why):
    # Refused, not computed: the peak allocation stays far below the refused size (a
    # memory bound, not a wall-clock one, so a loaded machine cannot fail it).
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateLimitError) as info:
            render_chat(template, MSGS)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(info.value).startswith("chat template exceeded its limits: ")
    assert why in str(info.value)
    assert peak < 64 * 2**20


@pytest.mark.parametrize("template", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in 'x' * 100000 %}{{ '' }}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% set total = range(100000)|sum %}{% endfor %}",
])
def test_time_is_bounded(template):
    started = time.monotonic()
    with pytest.raises(ChatTemplateLimitError, match=r"rendering took longer than 0.5 s"):
        render_chat(template, MSGS, limits=FAST)
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize(("template", "error"), [
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{% for m in range(3) recursive %}{{ loop(range(3)) }}{% endfor %}", "RecursionError"),
    ("{{ messages[0]['content'] + 1 }}", "TypeError"),
    ("{{ 'a' + 1 }}", "TypeError"),
    ("{{ 1.5 ** 10000 }}", "OverflowError"),
])
def test_template_failures_are_chat_template_errors(template, error):
    with pytest.raises(ChatTemplateError) as info:
        render_chat(template, MSGS)
    assert not isinstance(info.value, ChatTemplateLimitError)
    assert str(info.value).startswith(f"chat template failed: {error}: ")


def test_ordinary_templates_are_unaffected():
    template = ("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                "{{ '%-6s|' % m['role'] }}{{ '{:>4}'.format(loop.index) }}{{ m['content']|upper }}"
                "{% if loop.last %}!{% endif %}{% endfor %}{{ ns.n }}{{ 2 ** 100 }}"
                "{{ ['a', 'b']|join(', ') }}{{ 'x' * 3 }}{{ range(3)|list }}")
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": "yo"}]
    assert render_chat(template, messages) == (
        f"user  |   1HIsystem|   2YO!2{2 ** 100}a, bxxx[0, 1, 2]")
    big = "z" * 3_000_000  # inputs are not values the template created
    assert render_chat("{{ messages[0]['content'] }}", [{"role": "user", "content": big}]) == big
