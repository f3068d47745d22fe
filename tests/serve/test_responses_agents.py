"""openai-agents with its default model (the Responses API) against helios-serve, on the
scripted backend with think-tag reasoning and JSON_IN_TAGS tool calls
(tests/serve/test_responses_api.py::ToolsServer): a tool call the SDK runs and answers,
and a structured `output_type`.

Tools and `output_type` are separate agents here. (With both, a turn calls a tool or
answers in the schema, as OpenAI's: frontend/grammar.py admits either and
tests/serve/frontend/test_answer_or_calls.py drives both; this scripted server's tag
pieces are refused by any grammar's mask, tests/serve/test_tools_with_response_format.py.)
"""

from __future__ import annotations

import asyncio

import agents
import pytest
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.serve.test_responses_api import ANSWER, CALL, ToolsServer


class City(BaseModel):
    city: str
    population: int


@pytest.fixture(scope="module")
def server():
    agents.set_tracing_disabled(True)  # (the SDK would export traces to OpenAI)
    with ToolsServer() as s:
        s.script("weather", ["<think>", "Let", " me", " check", "</think>", "\n\n",
                             "<tool_call>", "\n", CALL, "\n", "</tool_call>"])
        s.script("18 C", ["Look", " there"])
        s.script("census", [ANSWER])
        yield s


def _model(server) -> agents.OpenAIResponsesModel:
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    return agents.OpenAIResponsesModel(model=server.model_name, openai_client=client)


def test_agent_runs_a_tool_call_and_answers_with_its_output(server):
    calls = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        calls.append(city)
        return "18 C"

    agent = agents.Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                         model=_model(server))  # fmt: skip
    result = asyncio.run(agents.Runner.run(agent, "weather in Paris?"))
    assert calls == ["Paris"]
    assert result.final_output == "Look there"
    kinds = [item.type for item in result.new_items]
    assert kinds == ["reasoning_item", "tool_call_item", "tool_call_output_item",
                     "message_output_item"]  # fmt: skip


def test_agent_output_type_is_a_json_schema_answer(server):
    agent = agents.Agent(name="census", instructions="Answer in JSON.", output_type=City,
                         model=_model(server))  # fmt: skip
    result = asyncio.run(agents.Runner.run(agent, "census of Paris"))
    assert result.final_output == City(city="Paris", population=2102650)
