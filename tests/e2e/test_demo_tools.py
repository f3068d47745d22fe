"""The demo core (recipes/smollm2_135m_instruct.py, what `scripts/demo.sh` serves) declares
the JSON_IN_TAGS tool syntax: `tools=` works out of the box, and a forced call is a
tool call. The real SmolLM2 weights, served from that recipe's core."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip
PARIS = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _recipe(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RECIPE


def test_the_demo_recipe_declares_the_tools_recipes_syntax():
    from helios_serve.frontend import FrontendSyntax, ToolParser
    from helios_serve.frontend.syntax import JSON_IN_TAGS

    demo, tools = _recipe("smollm2_135m_instruct"), _recipe("smollm2_135m_instruct_tools")
    syntax = FrontendSyntax.from_contract(demo.frontend)
    assert syntax.tool_parser is ToolParser.JSON_IN_TAGS and syntax.tool_syntax == JSON_IN_TAGS
    assert demo.frontend == tools.frontend and demo.chat_template == tools.chat_template
    assert (demo.name, tools.name) == ("smollm2-135m-instruct", "smollm2-135m-instruct-tools")


@pytest.mark.slow
def test_tools_work_on_the_demo_core(client):
    r = client.chat.completions.create(model="smollm2", messages=PARIS, tools=[WEATHER_TOOL],
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=64, temperature=0)  # fmt: skip
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert list(json.loads(call.function.arguments)) == ["city"]
    # Parallel calls allowed (the default): one function offered, so the turn ends after
    # the first call (the limit of parallel calls) with finish tool_calls.
    r = client.chat.completions.create(model="smollm2", messages=PARIS, tools=[WEATHER_TOOL],
                                       tool_choice="required", max_tokens=96,
                                       temperature=0)  # fmt: skip
    assert r.choices[0].finish_reason == "tool_calls" and len(r.choices[0].message.tool_calls) == 1
    # Without tools the answer is plain text, as before the syntax was declared.
    plain = client.chat.completions.create(model="smollm2", messages=PARIS, max_tokens=8,
                                           temperature=0)  # fmt: skip
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].message.content
