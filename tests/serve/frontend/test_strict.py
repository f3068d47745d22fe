"""Structured-output strictness: closed objects and bounded whitespace, as the schema
transform and as what the request grammar accepts (docs/api.md)."""

from __future__ import annotations

import pytest
from helios_serve.frontend import Frontend
from helios_serve.frontend.grammar import GrammarCompiler
from helios_serve.frontend.strict import JSON_WHITESPACE, close_objects, strict_schema
from helios_serve.frontend.syntax import (
    CHATML_BOUNDARIES,
    JSON_IN_TAGS,
    QWEN_CODER_TAGS,
    FrontendSyntax,
    ReasoningParser,
    ToolParser,
)
from helios_serve.frontend.testing import ScriptTokenizer

EOS = "<|eos|>"


def test_objects_that_declare_properties_are_closed_at_every_depth():
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
            "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
            "free": {"type": "object"},  # any object: stays open
            "either": {"anyOf": [{"type": "object", "properties": {"a": {}}}, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/Pet"},
        },
        "$defs": {"Pet": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "required": ["city"],
    }
    got = close_objects(schema)
    assert got["additionalProperties"] is False
    p = got["properties"]
    assert p["where"]["additionalProperties"] is False
    assert p["tags"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in p["free"]
    assert p["either"]["anyOf"][0]["additionalProperties"] is False
    assert got["$defs"]["Pet"]["additionalProperties"] is False
    assert got["required"] == ["city"] and "additionalProperties" not in schema  # a copy


def test_explicit_additional_properties_and_all_of_members_are_kept():
    open_ = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    typed = {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    assert close_objects(open_) == open_
    assert close_objects(typed) == typed
    both = {"allOf": [{"type": "object", "properties": {"a": {}}},
                      {"type": "object", "properties": {"b": {}}}]}
    assert close_objects(both) == both  # closing each member would forbid the other's keys


def test_strict_schema_bounds_whitespace_and_keeps_a_requests_own_guidance():
    assert strict_schema({"type": "object"}) == {
        "type": "object", "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
    own = strict_schema({"type": "object", "x-guidance": {"whitespace_flexible": False,
                                                          "whitespace_pattern": "[ ]?"}})
    assert own["x-guidance"] == {"whitespace_flexible": False, "whitespace_pattern": "[ ]?"}
    assert strict_schema(True)["x-guidance"]["whitespace_pattern"] == JSON_WHITESPACE
    assert strict_schema(False) is False


def _compiler(syn: FrontendSyntax, specials) -> tuple[ScriptTokenizer, GrammarCompiler]:
    st = ScriptTokenizer([*specials, EOS])
    return st, GrammarCompiler(Frontend(syn, st.tokenizer, [st.special_id(EOS)]))


def _accepts(state, st: ScriptTokenizer, text: str, eos: bool = True) -> bool:
    ids = st.ids([bytes([b]) for b in text.encode()])
    if not all(state.advance(t) for t in ids):
        return False
    return state.advance(st.special_id(EOS)) if eos else True


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ANSWER = FrontendSyntax(tool_parser=ToolParser.QWEN_CODER_FUNCTION_TAGS,
                        reasoning_parser=ReasoningParser.NONE, tool_syntax=QWEN_CODER_TAGS,
                        assistant_boundaries=CHATML_BOUNDARIES)


@pytest.mark.parametrize("text, ok", [
    ('{"city": "Paris"}', True),
    ('{"city":"Paris"}', True),
    ('{\n  "city": "Paris"\n}', True),
    ('{"city": "Paris", "type": "object"}', False),  # a key outside properties
    ('{}', False),  # a required key missing
    ('{"city":   "Paris"}', False),  # three spaces at one place
    ('{\n\n"city": "Paris"}', False),  # two line breaks
])  # fmt: skip
def test_response_format_schema_is_closed_and_whitespace_bounded(text, ok):
    st, gc = _compiler(ANSWER, ["<tool_call>", "</tool_call>"])
    rf = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}
    assert _accepts(gc.for_request(response_format=rf), st, text) is ok


def test_json_object_mode_stays_any_object_with_bounded_whitespace():
    st, gc = _compiler(ANSWER, ["<tool_call>", "</tool_call>"])
    rf = {"type": "json_object"}
    assert _accepts(gc.for_request(response_format=rf), st, '{"anything": [1, {"x": 2}]}')
    assert not _accepts(gc.for_request(response_format=rf), st, '{"a":      1}')


TOOLS_SYN = FrontendSyntax(tool_parser=ToolParser.JSON_IN_TAGS,
                           reasoning_parser=ReasoningParser.NONE, tool_syntax=JSON_IN_TAGS,
                           assistant_boundaries=CHATML_BOUNDARIES)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}


@pytest.mark.parametrize("arguments, ok", [
    ('{"city": "Paris"}', True),
    ('{"city": "Paris", "type": "object"}', False),
    ('{"city": "Paris", "required": ["city"]}', False),
    ('{}', False),
])  # fmt: skip
@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_forced_tool_call_arguments_follow_the_parameters_schema(arguments, ok, choice):
    st, gc = _compiler(TOOLS_SYN, [])
    state = gc.for_request(tools=[WEATHER], tool_choice=choice)
    text = f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    assert _accepts(state, st, text) is ok
