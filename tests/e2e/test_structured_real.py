"""Structured output and forced tool calls on the real SmolLM2 weights, end to end.

The core is exported from recipes/smollm2_135m_instruct_tools.py (ChatML template that
renders tools, JSON_IN_TAGS syntax) and served by the `helios-serve` command on
127.0.0.1; requests go through the official `openai` client. Greedy decoding makes the
streaming and non-streaming answers the same text, so their shapes are compared exactly.

The first tests need no server: the recipe's template renders byte for byte what is
written here (with the sandboxed renderer serve uses), and its frontend contract is the
frontend presets field for field.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import TOOLS_NAMESPACE as NAMESPACE
from tests.conftest import TOOLS_RECIPE

SERVE = str(Path(sys.executable).parent / "helios-serve")

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": CITY_SCHEMA,
    },
}
FRANCE_JSON = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
PARIS_WEATHER = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _recipe_module():
    spec = importlib.util.spec_from_file_location("smollm2_tools_recipe", TOOLS_RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_city_object(text: str) -> None:
    """`text` is a JSON object with exactly the key "city" holding a nonempty string."""
    value = json.loads(text)
    assert isinstance(value, dict) and list(value) == ["city"], text
    assert isinstance(value["city"], str) and value["city"].strip(), text


# ---- the recipe (no server) ----

EXPECTED_TOOL_PROMPT = (
    "<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face\n\n"
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "Get the '
    'current weather in a city.", "parameters": {"type": "object", "properties": {"city": '
    '{"type": "string"}}, "required": ["city"], "additionalProperties": false}}}\n'
    "</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWhat is the weather like in Paris today?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city":"Paris"}}\n'
    "</tool_call>\n"
    "<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Lyon"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n18 C, sunny\n</tool_response>\n"
    "<tool_response>\n21 C, cloudy\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_template_renders_tools_calls_and_responses_exactly():
    from helios_tools.frontend_assets import render_chat

    messages = [
        *PARIS_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "18 C, sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "21 C, cloudy"},
    ]  # fmt: skip
    template = _recipe_module().CHAT_TEMPLATE
    assert render_chat(template, messages, tools=[WEATHER_TOOL]) == EXPECTED_TOOL_PROMPT
    with_system = render_chat(
        template, [{"role": "system", "content": "Be brief."}, *PARIS_WEATHER], tools=[WEATHER_TOOL]
    )
    assert with_system.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\n")
    assert with_system.count("<|im_start|>system") == 1


def test_template_without_tools_is_the_checkpoint_template(smollm2_checkpoint):
    from helios_tools.frontend_assets import render_chat

    original = smollm2_checkpoint.chat_template
    template = _recipe_module().CHAT_TEMPLATE
    conversations = [
        FRANCE_JSON,
        [{"role": "system", "content": "Be brief."}, *FRANCE_JSON,
         {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "Sure?"}],
        [*FRANCE_JSON, {"role": "assistant", "content": ""}],
    ]  # fmt: skip
    for messages in conversations:
        for opener in (True, False):
            assert render_chat(template, messages, opener) == render_chat(
                original, messages, opener
            )


def test_recipe_declares_the_frontend_presets():
    from helios_contract import frontend_syntax_findings
    from helios_serve.frontend import FrontendSyntax, ReasoningParser, ToolParser
    from helios_serve.frontend.syntax import CHATML_BOUNDARIES, JSON_IN_TAGS

    recipe = _recipe_module().RECIPE
    syntax = FrontendSyntax.from_contract(recipe.frontend)
    assert list(frontend_syntax_findings(recipe.frontend)) == []
    assert syntax.tool_parser is ToolParser.JSON_IN_TAGS
    assert syntax.reasoning_parser is ReasoningParser.NONE
    assert syntax.tool_syntax == JSON_IN_TAGS
    assert syntax.assistant_boundaries == CHATML_BOUNDARIES
    assert recipe.checkpoint == "smollm2" and recipe.chat_template


# ---- a real server on a core of the tools recipe ----


@pytest.fixture(scope="module")
def tools_url(tools_core, module_tmp):
    """Base URL of `helios-serve CORE --trust PUB --accept NS --port 0` on 127.0.0.1, CORE
    tests/conftest.py's `tools_core` (exported once per run)."""
    core, public = tools_core
    logs = module_tmp("serve-tools")
    stdout, stderr = logs / "stdout.txt", logs / "stderr.txt"
    with stdout.open("w") as out, stderr.open("w") as err:
        proc = subprocess.Popen(
            [SERVE, str(core), "--trust", str(public), "--accept", NAMESPACE,
             "--host", "127.0.0.1", "--port", "0", "--max-active", "2"],
            stdout=out, stderr=err, text=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while True:
            first = stdout.read_text().partition("\n")[0]
            if first.startswith("Helios is serving"):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"helios-serve did not start: {stderr.read_text()[-2000:]}")
            time.sleep(0.2)
        yield first.split(" at ")[1].split()[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def tools_tokenizer(tools_core):
    """The served core's tokenizer (the one helios-serve decodes with)."""
    from helios_serve.bootstrap import Bootstrap
    from tokenizers import Tokenizer

    core, public = tools_core
    bootstrap = Bootstrap.load(core, [public], NAMESPACE)
    try:
        return Tokenizer.from_str(bootstrap.tokenizer_json)
    finally:
        bootstrap.close()


@pytest.fixture(scope="module")
def tools_client(tools_url):
    import openai

    return openai.OpenAI(base_url=tools_url + "/v1", api_key="unused", max_retries=0, timeout=600.0)


def _create(client, **kw):
    return client.chat.completions.create(model="smollm2-135m-instruct-tools", temperature=0, **kw)


def _accumulate(chunks) -> dict:
    """Accumulate a stream by tool-call index (the OpenAI client's way), checking that the
    first delta of each call carries index, id, type and name and later ones only the index
    and argument fragments."""
    content, calls, finish = "", {}, []
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            finish.append(choice.finish_reason)
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.index not in calls:
                assert delta.id and delta.type == "function" and delta.function.name, delta
                calls[delta.index] = {
                    "id": delta.id,
                    "name": delta.function.name,
                    "arguments": delta.function.arguments or "",
                }
            else:
                assert delta.id is None and delta.type is None, delta
                assert delta.function.name is None, delta
                calls[delta.index]["arguments"] += delta.function.arguments or ""
    assert len(finish) == 1, finish
    return {
        "content": content or None,
        "calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish[0],
    }


@pytest.mark.slow
def test_json_schema_answer_validates_streaming_and_not(tools_client, tools_url):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "capital", "schema": CITY_SCHEMA},
    }
    r = _create(tools_client, messages=FRANCE_JSON, response_format=response_format, max_tokens=48)
    message = r.choices[0].message
    _assert_city_object(message.content)
    assert message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"

    streamed = _accumulate(
        _create(
            tools_client,
            messages=FRANCE_JSON,
            response_format=response_format,
            max_tokens=48,
            stream=True,
        )
    )
    assert streamed == {"content": message.content, "calls": [], "finish_reason": "stop"}
    # Constrained requests keep at most one outstanding executor frame.
    metrics = httpx.get(tools_url + "/metrics", timeout=30).text
    assert "\nflare_constrained_max_inflight 1.0\n" in metrics


@pytest.mark.slow
def test_named_tool_choice_returns_a_valid_call_streaming_and_not(tools_client):
    ask = dict(
        messages=PARIS_WEATHER,
        tools=[WEATHER_TOOL],
        tool_choice=NAMED,
        parallel_tool_calls=False,
        max_tokens=64,
    )
    r = _create(tools_client, **ask)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"  # OpenAI's for a named call
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.id.startswith("call_")
    _assert_city_object(call.function.arguments)

    streamed = _accumulate(_create(tools_client, stream=True, **ask))
    (scall,) = streamed["calls"]
    assert scall["id"].startswith("call_")
    assert streamed == {
        "content": None,
        "calls": [{"id": scall["id"], "name": "get_weather",
                   "arguments": call.function.arguments}],
        "finish_reason": "stop",
    }  # fmt: skip


@pytest.mark.slow
def test_tool_round_trip_renders_through_the_server(tools_client):
    """An assistant tool call and its tool response, sent back as OpenAI messages, render
    through the recipe's template and the model answers in text (auto choice, no grammar)."""
    messages = [
        *PARIS_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "18 C and sunny"},
    ]  # fmt: skip
    r = _create(tools_client, messages=messages, tools=[WEATHER_TOOL], max_tokens=8)
    assert r.usage.prompt_tokens > 200  # the tools system prompt was rendered
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


# ---- forced tool calls that finish (issue 14 item 7) ----

# As langchain and instructor send parameters: no additionalProperties (closed by Helios'
# strictness, docs/api.md), extra keywords ("title", "description").
OPEN_CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "title": "City", "description": "a city"}},
    "required": ["city"],
}
OPEN_WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Get the current weather in a city.",
                 "parameters": OPEN_CITY},
}


@pytest.mark.slow
def test_required_tool_choice_finishes_with_a_strict_call(tools_client):
    """tool_choice "required" (parallel calls off) on parameters without
    additionalProperties: the call's arguments hold exactly the declared key and the
    request ends with finish tool_calls, streaming and not."""
    ask = dict(messages=PARIS_WEATHER, tools=[OPEN_WEATHER_TOOL], tool_choice="required",
               parallel_tool_calls=False, max_tokens=96)
    r = _create(tools_client, **ask)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    _assert_city_object(call.function.arguments)
    streamed = _accumulate(_create(tools_client, stream=True, **ask))
    assert streamed["finish_reason"] == "tool_calls"
    assert [c["arguments"] for c in streamed["calls"]] == [call.function.arguments]


@pytest.mark.slow
def test_required_tool_choice_with_parallel_calls_finishes_within_the_call_limit(tools_client):
    """With parallel calls allowed the model may open another call after each one, up to
    the limit of parallel calls (as many as functions offered). SmolLM2-135M repeats its
    call: with one function offered, the grammar ends the turn after the first call, so
    the request finishes tool_calls with that call (it ran to the output limit before the
    limit), streaming and not."""
    ask = dict(messages=PARIS_WEATHER, tools=[OPEN_WEATHER_TOOL], tool_choice="required",
               max_tokens=96)
    r = _create(tools_client, **ask)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    _assert_city_object(call.function.arguments)
    streamed = _accumulate(_create(tools_client, stream=True, **ask))
    assert streamed["finish_reason"] == "tool_calls"
    assert [c["arguments"] for c in streamed["calls"]] == [call.function.arguments]


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_a_call_cut_inside_its_arguments_is_no_tool_call_streaming_and_not(tools_client,
                                                                          tools_url,
                                                                          tools_tokenizer,
                                                                          choice):
    """Cut by max_tokens one token after the argument key: finish "length" and no
    tool_calls entry (its arguments would not be JSON; the clients json.loads them), no
    markup as content, streaming and not (docs/api.md, "Tool calls cut by max_tokens");
    litellm and langchain-openai read it without error."""
    import litellm
    from langchain_openai import ChatOpenAI

    ask = dict(messages=PARIS_WEATHER, tools=[OPEN_WEATHER_TOOL], tool_choice=choice,
               parallel_tool_calls=False)
    full = _create(tools_client, max_tokens=96, extra_body={"return_token_ids": True}, **ask)
    assert full.choices[0].finish_reason == ("stop" if choice == NAMED else "tool_calls")
    ids = full.choices[0].model_extra["token_ids"]
    cut = next(k for k in range(len(ids)) if '"city"' in tools_tokenizer.decode(ids[:k]))
    r = _create(tools_client, max_tokens=cut + 1, **ask)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content == ""  # an empty message, as without tools
    assert r.choices[0].message.tool_calls is None
    assert r.usage.completion_tokens == cut + 1
    streamed = _accumulate(_create(tools_client, stream=True, max_tokens=cut + 1, **ask))
    assert streamed == {"content": None, "calls": [], "finish_reason": "length"}

    response = litellm.completion(
        model="openai/smollm2-135m-instruct-tools", api_base=tools_url + "/v1",
        api_key="unused", temperature=0, max_tokens=cut + 1, **ask)
    assert response.choices[0].finish_reason == "length"
    assert not response.choices[0].message.tool_calls

    llm = ChatOpenAI(model="smollm2-135m-instruct-tools", base_url=tools_url + "/v1",
                     api_key="unused", temperature=0, max_retries=0, max_tokens=cut + 1,
                     timeout=600)
    named = "get_weather" if choice == NAMED else "required"
    message = llm.bind_tools([OPEN_WEATHER_TOOL], tool_choice=named,
                             parallel_tool_calls=False).invoke(PARIS_WEATHER[0]["content"])
    assert message.response_metadata["finish_reason"] == "length"
    assert message.tool_calls == [] and message.invalid_tool_calls == []


@pytest.mark.slow
def test_langchain_bind_tools_required_gets_a_finished_tool_call(tools_url):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model="smollm2-135m-instruct-tools", base_url=tools_url + "/v1",
                     api_key="unused", temperature=0, max_retries=0, max_tokens=96, timeout=600)
    question = PARIS_WEATHER[0]["content"]
    message = llm.bind_tools([get_weather], tool_choice="required",
                             parallel_tool_calls=False).invoke(question)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.invalid_tool_calls == []
    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    assert list(call["args"]) == ["city"] and call["args"]["city"].strip()
    # parallel calls allowed (langchain's default): a non-empty list of strict calls
    message = llm.bind_tools([get_weather], tool_choice="required").invoke(question)
    assert message.tool_calls, message
    assert all(list(c["args"]) == ["city"] for c in message.tool_calls)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_tools_and_json_schema_modes_return_the_model(tools_url, mode):
    """instructor's TOOLS mode (a named tool choice) and JSON_SCHEMA mode (a
    response_format schema without additionalProperties) get a validated model and a
    finished response ("stop" in both, as from OpenAI)."""
    import instructor
    import openai
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str

    client = instructor.from_openai(
        openai.OpenAI(base_url=tools_url + "/v1", api_key="unused", max_retries=0, timeout=600),
        mode=getattr(instructor.Mode, mode))
    got, completion = client.chat.completions.create_with_completion(
        model="smollm2-135m-instruct-tools", response_model=Weather, messages=PARIS_WEATHER,
        temperature=0, max_tokens=96, max_retries=0)
    assert isinstance(got, Weather) and got.city.strip()
    assert completion.choices[0].finish_reason == "stop"  # a named call's too, as OpenAI's
