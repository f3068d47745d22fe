"""The official `anthropic` client, unchanged, against helios-serve's /v1/messages on real
weights: the tiny model (answers compared with the chat path's, greedy) and SmolLM2 on the
tools recipe (tool_use blocks through the JSON_IN_TAGS parser, forced calls constrained
by the same grammar as the chat path's)."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.e2e.test_structured_real import (  # noqa: F401 (fixtures)
    CITY_SCHEMA,
    PARIS_WEATHER,
    _assert_city_object,
    tools_url,
)

HELLO = [{"role": "user", "content": "hello"}]
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city.",
           "input_schema": CITY_SCHEMA}  # fmt: skip


def _anthropic(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=600)


def test_messages_is_the_chat_answer_on_the_tiny_model(tiny_thread_server):
    server = tiny_thread_server
    name = server.settings.served_name
    client = _anthropic(server.url)
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)  # fmt: skip
    for max_tokens in (3, 12):
        m = client.messages.create(model=name, max_tokens=max_tokens, messages=HELLO,
                                   system="Be brief.")  # fmt: skip
        c = chat.chat.completions.create(model=name, max_tokens=max_tokens, messages=[
            {"role": "system", "content": "Be brief."}, *HELLO])  # fmt: skip
        text = "".join(b.text for b in m.content)
        assert text == (c.choices[0].message.content or "")
        assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[
            c.choices[0].finish_reason]
        assert m.usage.output_tokens == c.usage.completion_tokens
        assert m.usage.input_tokens + m.usage.cache_read_input_tokens == c.usage.prompt_tokens
        with client.messages.stream(model=name, max_tokens=max_tokens, messages=HELLO,
                                    system="Be brief.") as stream:  # fmt: skip
            assert "".join(stream.text_stream) == text
            final = stream.get_final_message()
        assert [(b.type, b.text) for b in final.content] == [(b.type, b.text) for b in m.content]
        assert final.stop_reason == m.stop_reason
        count = client.messages.count_tokens(model=name, messages=HELLO, system="Be brief.")
        assert count.input_tokens == c.usage.prompt_tokens


def test_over_context_raises_at_once_with_the_context_words(tiny_thread_server):
    server = tiny_thread_server
    with pytest.raises(anthropic.InternalServerError) as info:
        anthropic.Anthropic(base_url=server.url, api_key="x").messages.create(
            model=server.settings.served_name, max_tokens=10_000, messages=HELLO)
    assert info.value.status_code == 503
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"].startswith("prompt is too long: ")


@pytest.fixture(scope="module")
def tools_anthropic(tools_url):  # noqa: F811
    return _anthropic(tools_url)


@pytest.mark.slow
@pytest.mark.parametrize("choice", [{"type": "any", "disable_parallel_tool_use": True},
                                    {"type": "tool", "name": "get_weather"}],
                         ids=["any", "tool"])  # fmt: skip
def test_forced_tool_use_streaming_and_not(tools_anthropic, choice):
    ask = dict(model="smollm2-tools", max_tokens=96, messages=PARIS_WEATHER, tools=[WEATHER],
               tool_choice=choice)  # fmt: skip
    m = tools_anthropic.messages.create(**ask)
    assert m.stop_reason == "tool_use" and m.stop_sequence is None
    (block,) = m.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.id
    assert isinstance(block.input, dict) and list(block.input) == ["city"]
    _assert_city_object(json.dumps(block.input))
    with tools_anthropic.messages.stream(**ask) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the SDK's event for input_json_delta fragments
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in final.content] == [
        ("tool_use", "get_weather", block.input)]


@pytest.mark.slow
def test_tool_result_round_trip_and_count_tokens(tools_anthropic, tools_url):  # noqa: F811
    turns = [*PARIS_WEATHER,
             {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                "name": "get_weather",
                                                "input": {"city": "Paris"}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                           "content": "18 C, sunny"}]}]  # fmt: skip
    chat = [*PARIS_WEATHER,
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    tokenized = httpx.post(tools_url + "/tokenize", json={
        "messages": chat, "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": WEATHER["description"],
            "parameters": CITY_SCHEMA}}]}, timeout=60).json()  # fmt: skip
    count = tools_anthropic.messages.count_tokens(model="smollm2-tools", messages=turns,
                                                  tools=[WEATHER])  # fmt: skip
    assert count.input_tokens == tokenized["count"]
    m = tools_anthropic.messages.create(model="smollm2-tools", max_tokens=24, messages=turns,
                                        tools=[WEATHER], tool_choice={"type": "none"})  # fmt: skip
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
