"""`tools` and a JSON-schema `response_format` in one request, on a JSON_IN_TAGS core with
think-tag reasoning (the scripted ToolsServer of test_responses_api.py): as OpenAI serves
it, the turn either calls a tool or answers in the schema (frontend/grammar.py admits
both, frontend/tools.py AnswerOrCalls tells them apart by the answer's opening:
tests/serve/frontend/test_answer_or_calls.py drives both turns through llguidance and
the pipeline). Here, through the official client: the answer turn of chat completions
and of the Responses API (tools with text.format, as openai-agents sends an agent with
tools and an output_type), and a forced tool_choice that cannot be combined with a
response_format (400). (This scripted server's tag pieces are not the canonical
tokenization llguidance admits for forced tags, so a scripted call under any grammar,
tool_choice "required" included, is refused by the mask: the call turn is tested at the
frontend level.)
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.serve.test_responses_api import ANSWER, tools_server  # noqa: F401 (fixture)

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["city", "population"]}  # fmt: skip
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
RF = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}


def _chat(server, content: str, **extra):
    """A chat request with a tool the model may call and a JSON-schema answer format."""
    return server.openai().chat.completions.create(
        model=server.model_name, messages=[{"role": "user", "content": content}],
        tools=[WEATHER], response_format=RF, **extra)


def test_chat_turn_answers_in_the_schema(tools_server):  # noqa: F811
    r = _chat(tools_server, "census")
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == ANSWER


def test_responses_tools_with_a_text_format(tools_server):  # noqa: F811
    client = tools_server.openai()
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
    tool = {"type": "function", "name": "get_weather",
            "parameters": WEATHER["function"]["parameters"]}
    answered = client.responses.create(model=tools_server.model_name, input="census",
                                       tools=[tool], text=fmt)
    assert json.loads(answered.output_text) == {"city": "Paris", "population": 2102650}


@pytest.mark.parametrize("choice", ["required",
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_call_with_a_response_format_is_a_400(tools_server, choice):  # noqa: F811
    with pytest.raises(openai.BadRequestError) as err:
        _chat(tools_server, "weather in Paris?", tool_choice=choice)
    assert err.value.body["param"] == "response_format"
    assert _chat(tools_server, "census").choices[0].message.content == ANSWER
