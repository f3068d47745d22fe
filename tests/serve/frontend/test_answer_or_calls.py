"""response_format with tools the model may call (tool_choice "auto"), as OpenAI serves
it: the turn is tool calls or an answer in the schema, one or the other. The grammar
admits exactly those two; the pipeline (tools.AnswerOrCalls) lets the answer's opening
decide, so a JSON answer holding a literal call opener stays answer text. Named and
required tool choices keep refusing a response_format (grammar.py), and tool_choice
"none" keeps the answer only.
"""

from __future__ import annotations

import pytest
from helios_serve.frontend import ChatResult, GrammarError
from helios_serve.frontend.deltas import ContentDelta
from helios_serve.frontend.syntax import (
    JSON_IN_TAGS,
    ToolParser,
)
from helios_serve.frontend.testing import Special as S
from helios_serve.frontend.tools import AnswerOrCalls

from tests.serve.frontend.test_grammar import (
    CALL,
    CITY,
    EOS,
    FORECAST,
    TIME,
    TOOL_CASES,
    allowed,
    generate,
    run,
    setup,
    think_syntax,
)

PROMPT = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
RF = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
KW = dict(tools=[FORECAST, TIME], tool_choice="auto", prompt_text=PROMPT)


def _case(name):
    syn, specials, calls = TOOL_CASES[name]
    opener, close = syn.reasoning_syntax.open, syn.reasoning_syntax.close
    return syn, [opener, close, *specials], opener, close, calls


@pytest.mark.parametrize("name", ["json", "qwen"])
def test_the_turn_may_call_a_tool(name):
    syn, specials, opener, close, calls = _case(name)
    script = [S(opener), "Lyon, three days.", S(close), *calls]
    st, fe, gc = setup(syn, [script], specials)
    expected = ChatResult("Lyon, three days.", None, (CALL,), "tool_calls")
    assert run(st, fe, gc, script, grammar_kw=dict(response_format=RF, **KW),
               pipeline_kw=dict(structured_answer=True, **KW), expected=expected) == 1


@pytest.mark.parametrize("name", ["json", "qwen"])
def test_or_answer_in_the_schema_with_a_literal_opener_as_text(name):
    syn, specials, opener, close, _ = _case(name)
    doc = '{"city": "Lyon <tool_call> is no call"}'
    script = [S(opener), "An answer.", S(close), doc]
    st, fe, gc = setup(syn, [script], specials)
    expected = ChatResult("An answer.", doc, (), "stop")
    assert run(st, fe, gc, script, grammar_kw=dict(response_format=RF, **KW),
               pipeline_kw=dict(structured_answer=True, **KW), expected=expected) == 1


def test_the_grammar_admits_nothing_else():
    syn, specials, opener, close, calls = _case("json")
    st, fe, gc = setup(syn, [[S(opener), S(close), "x", *calls]], specials)
    state = gc.for_request(response_format=RF, **KW)
    generate(state, st.ids([S(opener), S(close)]))
    assert allowed(state, st.special_id("<tool_call>")) and allowed(state, ord("{"))
    assert not allowed(state, ord("x")) and not allowed(state, st.special_id(EOS))
    # tool_choice "none": the schema's answer only
    none = gc.for_request(response_format=RF, **{**KW, "tool_choice": "none"})
    generate(none, st.ids([S(opener), S(close)]))
    assert not allowed(none, st.special_id("<tool_call>")) and allowed(none, ord("{"))


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_with_a_response_format_is_refused(choice):
    syn = think_syntax(ToolParser.JSON_IN_TAGS, JSON_IN_TAGS)
    _, _, gc = setup(syn, [["x"]], ["<think>", "</think>", "<tool_call>", "</tool_call>"])
    with pytest.raises(GrammarError) as err:
        gc.for_request(response_format=RF, **{**KW, "tool_choice": choice})
    assert err.value.field == "response_format"


class _Recorder:
    """A tool parser that records what it is fed."""

    def __init__(self) -> None:
        self.fed: list[tuple[int, str]] = []

    def feed(self, token_id: int, text: str):
        self.fed.append((token_id, text))
        return [ContentDelta(f"<{text}>")]

    def finish(self):
        return [ContentDelta("end")]


def test_the_opening_decides_and_held_text_is_replayed():
    calls = _Recorder()
    parser = AnswerOrCalls(calls, "<tool_call>")
    assert parser.feed(1, "\n") == [] and parser.feed(2, "<tool") == []  # undecided
    assert calls.fed == []
    assert parser.feed(3, "_call>") == [ContentDelta("<\n>"), ContentDelta("<<tool>"),
                                         ContentDelta("<_call>>")]
    assert calls.fed == [(1, "\n"), (2, "<tool"), (3, "_call>")]
    assert parser.feed(4, "x") == [ContentDelta("<x>")]
    assert parser.finish() == [ContentDelta("end")]

    answer = AnswerOrCalls(_Recorder(), "<tool_call>")
    assert answer.feed(1, " <to") == []
    assert answer.feed(2, "{") == [ContentDelta(" <to"), ContentDelta("{")]  # opaque text
    assert answer.feed(3, "<tool_call>") == [ContentDelta("<tool_call>")]

    cut = AnswerOrCalls(_Recorder(), "<tool_call>")  # the output limit cut the opening
    assert cut.feed(1, "<tool") == [] and cut.finish() == [ContentDelta("<tool")]
