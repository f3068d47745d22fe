"""ChatInput.prompt_prefix (frontend.prepare): a rendered conversation that extends the
prefix's text starts with the prefix's exact ids, and its turn endpoints count them; one
that does not is the plain encoding."""

from __future__ import annotations

from helios_contract.schema import frontend_pb2
from helios_serve.bootstrap import Bootstrap
from helios_serve.frontend.prepare import ChatInput, Preparer
from helios_serve.testing.scripted import tiny_geometry
from helios_serve.testing.tiny import tiny_contract
from helios_serve.testing.tokenizer import EOS_ID, TinyTokenizer

TOK = TinyTokenizer()
FIRST = ({"role": "user", "content": "hi"},)
TURNS = (*FIRST, {"role": "assistant", "content": "Hello, world!"},
         {"role": "user", "content": "more"})  # fmt: skip


def _preparer() -> Preparer:
    contract = tiny_contract(TOK)
    contract.model.frontend.prefix_boundary_rules.extend(
        frontend_pb2.PrefixBoundaryRule(role=role, end_marker="<|im_end|>\n")
        for role in (frontend_pb2.FRONTEND_MESSAGE_ROLE_USER,
                     frontend_pb2.FRONTEND_MESSAGE_ROLE_ASSISTANT))  # fmt: skip
    b = Bootstrap.from_parts(contract, TOK.to_json(), _TEMPLATE)
    return Preparer(b.frontend, b.chat_template, b.template_variables, b.defaults,
                    tiny_geometry(TOK.vocab_size))  # fmt: skip


_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_a_conversation_extending_the_prefix_starts_with_its_ids():
    preparer = _preparer()
    first = preparer.chat(ChatInput(FIRST))
    output = TOK.ids(["Hello", ",", " world", "!"]) + [EOS_ID]  # pieces, not bytes
    prefix = first.prompt_token_ids + tuple(output)
    plain = preparer.chat(ChatInput(TURNS))
    turn = preparer.chat(ChatInput(TURNS, prompt_prefix=prefix))
    assert turn.prompt_token_ids[:len(prefix)] == prefix
    assert turn.prompt_text == plain.prompt_text
    assert TOK.decode(turn.prompt_token_ids) == TOK.decode(plain.prompt_token_ids)
    assert len(plain.prompt_token_ids) - len(turn.prompt_token_ids) == 9  # 11 bytes, 2 ids
    # Each turn's end, counted in the prompt's own ids: after "hi", the answer (the
    # prefix and its "\n"), "more"; the open assistant header is 11 ids (1 + 10 bytes).
    assert turn.publish_endpoints == (len(first.prompt_token_ids) - 11, len(prefix) + 1,
                                      len(turn.prompt_token_ids) - 11)  # fmt: skip
    assert plain.publish_endpoints[0] == turn.publish_endpoints[0]
    assert plain.publish_endpoints[2] == turn.publish_endpoints[2] + 9


def test_a_conversation_that_does_not_extend_it_is_the_plain_encoding():
    preparer = _preparer()
    first = preparer.chat(ChatInput(FIRST))
    other = first.prompt_token_ids + tuple(TOK.ids(["Look", " there"])) + (EOS_ID,)
    plain = preparer.chat(ChatInput(TURNS))
    turn = preparer.chat(ChatInput(TURNS, prompt_prefix=other))
    assert turn.prompt_token_ids == plain.prompt_token_ids
    assert turn.publish_endpoints == plain.publish_endpoints
