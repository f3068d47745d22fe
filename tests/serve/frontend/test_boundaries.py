"""Prompt-turn endpoints from prefix-boundary rules, on a real tokenizer (the tiny
byte-level BPE through HF tokenizers) and the ChatML template."""

from __future__ import annotations

from helios_serve.frontend.boundaries import first_message_end, prefix_endpoints
from helios_serve.frontend.syntax import FrontendMessageRole as Role
from helios_serve.frontend.syntax import PrefixBoundaryRule
from helios_serve.testing.tokenizer import CHAT_TEMPLATE
from helios_tools.frontend_assets import render_chat
from tokenizers import Tokenizer

END = "<|im_end|>\n"
RULES = (PrefixBoundaryRule(Role.SYSTEM, END), PrefixBoundaryRule(Role.USER, END),
         PrefixBoundaryRule(Role.ASSISTANT, END, rerendered_by_later_messages=True))


def _encode(tok, messages, generation_prompt=True):
    text = render_chat(CHAT_TEMPLATE, messages, add_generation_prompt=generation_prompt)
    encoding = Tokenizer.from_str(tok.to_json()).encode(text, add_special_tokens=False)
    return text, encoding.ids, [end for _, end in encoding.offsets]


def test_each_turn_end_is_the_token_count_of_its_rendered_prefix(tok):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hello, world!"},
                {"role": "user", "content": "Look there"}]
    text, ids, ends = _encode(tok, messages)
    got = prefix_endpoints(text, ends, [m["role"] for m in messages], RULES)
    # The earlier assistant turn is rerendered once later messages follow: no boundary.
    want = []
    for k in (1, 2, 4):
        _, prefix_ids, _ = _encode(tok, messages[:k], generation_prompt=False)
        assert tuple(ids[:len(prefix_ids)]) == tuple(prefix_ids)
        want.append(len(prefix_ids))
    assert got == tuple(want)


def test_a_role_without_a_rule_ends_the_search(tok):
    messages = [{"role": "system", "content": "A"}, {"role": "tool", "content": "B"},
                {"role": "user", "content": "C"}]
    text, _, ends = _encode(tok, messages)
    assert len(prefix_endpoints(text, ends, [m["role"] for m in messages], RULES)) == 1


def test_a_boundary_inside_a_token_is_not_an_endpoint():
    # "ab|cd" with one token "abcd": the marker "b" ends at 2, inside the token.
    assert prefix_endpoints("abcd", [4], ["user"], (PrefixBoundaryRule(Role.USER, "ab"),)) == ()
    assert prefix_endpoints("abcd", [2, 4], ["user"], (PrefixBoundaryRule(Role.USER, "ab"),)) \
        == (1,)


def test_no_rules_no_endpoints(tok):
    text, _, ends = _encode(tok, [{"role": "user", "content": "Hello"}])
    assert prefix_endpoints(text, ends, ["user"], ()) == ()


# SmolLM2's template shape: a default system message when the first is not a system one.
DEFAULT_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_default_system_message_the_template_inserts_does_not_shift_the_turns(tok):
    messages = [{"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi!"},
                {"role": "user", "content": "Look there"}]

    def encode(msgs, generation_prompt):
        text = render_chat(DEFAULT_SYSTEM_TEMPLATE, msgs, add_generation_prompt=generation_prompt)
        enc = Tokenizer.from_str(tok.to_json()).encode(text, add_special_tokens=False)
        return text, enc.ids, [end for _, end in enc.offsets]

    text, ids, ends = encode(messages, True)
    alone = render_chat(DEFAULT_SYSTEM_TEMPLATE, messages[:1], add_generation_prompt=False)
    first_end = first_message_end(text, alone)
    assert first_end == len(alone)
    got = prefix_endpoints(text, ends, [m["role"] for m in messages], RULES, first_end)
    want = tuple(len(encode(messages[:k], False)[1]) for k in (1, 3))
    assert got == want
    # Without it, the inserted system message's marker is taken for the first user turn's
    # and every later turn shifts back by one message: the last user turn is never marked.
    shifted = prefix_endpoints(text, ends, [m["role"] for m in messages], RULES)
    assert shifted != want and want[-1] not in shifted


def test_first_message_end_is_none_when_the_lone_render_is_not_a_prefix():
    assert first_message_end("<a>x</a><b>y</b>", "<c>x</c>") is None
    assert first_message_end("<a>x</a><b>y</b>", "") is None
