"""POST /v1/responses and the stored-response routes through real HTTP, with the official
openai client, on the scripted backend (chosen outputs; the real worker, scheduler,
output pipeline and HTTP server on a free port).

`tools_server` serves a tiny contract with think-tag reasoning and JSON_IN_TAGS tool
calls (the tools recipe's syntax), so reasoning items and function calls are exercised;
`server` is the plain tiny contract with exact-endpoint snapshots.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from helios_contract.schema import frontend_pb2
from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeOptions, resolve
from helios_serve.responses.store import ResponseStore
from helios_serve.server import Server
from helios_serve.testing.harness import ScriptedServer
from helios_serve.testing.scripted import ScriptBook, ScriptedModel, tiny_geometry
from helios_serve.testing.tiny import tiny_contract
from helios_serve.testing.tokenizer import DEFAULT_PIECES, TinyTokenizer
from openai.types.responses import ResponseStreamEvent
from prometheus_client.parser import text_string_to_metric_families
from pydantic import TypeAdapter

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ANSWER = '{"city": "Paris", "population": 2102650}'
PIECES = (*DEFAULT_PIECES, "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", "\n\n",
          "Let", " me", " check", CALL, ANSWER)
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
TOOLS_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{{ '<tool_call>\n{\"name\": ' + call['function']['name'] | tojson + ', \"arguments\": '"
    " + call['function']['arguments'] + '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
EVENTS = TypeAdapter(ResponseStreamEvent)


class ToolsServer(ScriptedServer):
    """ScriptedServer over a contract with think-tag reasoning and JSON_IN_TAGS calls."""

    def __init__(self) -> None:  # (ScriptedServer's construction, another contract)
        self.tok = TinyTokenizer(PIECES)
        self.book = ScriptBook(self.tok.decode, default=self.tok.ids(["Hello", "!"]))
        contract = tiny_contract(self.tok)
        fe = contract.model.frontend
        fe.reasoning_parser = frontend_pb2.REASONING_PARSER_THINK_TAGS
        fe.reasoning_syntax.open = "<think>"
        fe.reasoning_syntax.close = "</think>"
        fe.reasoning_syntax.answer_separator = "\n\n"
        fe.tool_parser = frontend_pb2.TOOL_PARSER_JSON_IN_TAGS
        syntax = fe.tool_syntax
        syntax.call_open, syntax.call_close = "<tool_call>", "</tool_call>"
        syntax.wrapping_newline = syntax.tag_separator = "\n"
        syntax.json_name_key, syntax.json_arguments_key = "name", "arguments"
        bootstrap = Bootstrap.from_parts(contract, self.tok.to_json(), TOOLS_TEMPLATE)
        self.model = ScriptedModel(tiny_geometry(self.tok.vocab_size), self.book)
        self.server = Server.start(bootstrap, self.model,
                                   resolve(ServeOptions(port=0), bootstrap.contract),
                                   ObservationClock())  # fmt: skip
        self.url = self.server.url
        self.model_name = "helios-tiny"


@pytest.fixture(scope="module")
def tools_server():
    with ToolsServer() as s:
        s.script("weather", ["<think>", "Let", " me", " check", "</think>", "\n\n",
                             "<tool_call>", "\n", CALL, "\n", "</tool_call>"])
        s.script("18 C", ["Look", " there"])
        s.script("census", [ANSWER])  # (the latest added trigger is tried first)
        yield s


@pytest.fixture
def server(tok):
    with ScriptedServer(tok, geometry={"snapshot_rows": 8, "top_logprobs": 2}) as s:
        s.script("hi", ["Hello", ",", " world", "!"])
        yield s


def _metrics(server) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for s in family.samples:
            if not s.labels:
                out[s.name] = s.value
    return out


def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json={"model": server.model_name, **body},
                      timeout=30)  # fmt: skip


def _sse(server, body: dict) -> list[dict]:
    """The `data` objects of a streamed response, each checked against its `event:` line."""
    events, kind = [], None
    with httpx.stream("POST", server.url + "/v1/responses", timeout=30,
                      json={"model": server.model_name, "stream": True, **body}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                assert event["type"] == kind
                events.append(event)
    return events


def _without_ids(value):
    """`value` with every generated id, timestamp and cache hit replaced by its kind."""
    if isinstance(value, dict):
        return {k: (k if k in ("id", "item_id", "call_id", "created_at", "completed_at",
                               "cached_tokens")
                    else _without_ids(v)) for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


# -- the official client ------------------------------------------------------------


def test_text_response_stream_and_not(server):
    client = server.openai()
    r = client.responses.create(model=server.model_name, input="hi", metadata={"k": "v"},
                                instructions="Be brief.", temperature=0)  # fmt: skip
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output_text == "Hello, world!" and r.metadata == {"k": "v"}
    assert [o.type for o in r.output] == ["message"] and r.output[0].status == "completed"
    assert r.usage.output_tokens == 5 and r.usage.total_tokens == r.usage.input_tokens + 5
    events = list(client.responses.create(model=server.model_name, input="hi", stream=True,
                                          metadata={"k": "v"}, instructions="Be brief.",
                                          temperature=0))  # fmt: skip
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * 4,
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") \
        == "Hello, world!"
    final = events[-1].response.model_dump()
    assert _without_ids(final) == _without_ids(r.model_dump())
    assert final["output"][0]["id"] == events[2].item.id


def test_output_limit_is_incomplete(server):
    r = server.openai().responses.create(model=server.model_name, input="hi",
                                         max_output_tokens=2)  # fmt: skip
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "Hello," and r.output[0].status == "incomplete"
    events = _sse(server, {"input": "hi", "max_output_tokens": 2})
    assert events[-1]["type"] == "response.incomplete"
    assert events[-2]["item"]["status"] == "incomplete"


def test_function_call_with_reasoning_then_its_output(tools_server):
    client = tools_server.openai()
    name = tools_server.model_name
    r = client.responses.create(model=name, input="weather in Paris?", tools=[WEATHER])
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "Let me check"
    call = r.output[1]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id and call.status == "completed"
    events = list(client.responses.create(model=name, input="weather in Paris?",
                                          tools=[WEATHER], stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added",
                         "response.reasoning_text.delta"]  # fmt: skip
    assert "response.reasoning_text.done" in kinds
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"} and done.output_index == 1
    assert _without_ids(events[-1].response.model_dump()) == _without_ids(r.model_dump())
    # The call's output continues the stored conversation.
    follow = client.responses.create(
        model=name, previous_response_id=r.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18 C"}])
    assert follow.output_text == "Look there" and follow.previous_response_id == r.id
    items = client.responses.input_items.list(follow.id, order="asc").data
    assert [i.type for i in items] == ["message", "reasoning", "function_call",
                                       "function_call_output"]  # fmt: skip


def test_input_items_build_the_chat_conversation(tools_server):
    """The same conversation as explicit items (no stored response)."""
    client = tools_server.openai()
    r = client.responses.create(model=tools_server.model_name, tools=[WEATHER], input=[
        {"role": "user", "content": "weather in Paris?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text",
                                                          "text": "Let me check"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ])  # fmt: skip
    assert r.output_text == "Look there"


def test_json_schema_text_format(tools_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"]}  # fmt: skip
    fmt = {"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}}
    r = tools_server.openai().responses.create(model=tools_server.model_name,
                                               input="census", text=fmt)  # fmt: skip
    assert json.loads(r.output_text) == {"city": "Paris", "population": 2102650}
    assert r.text.format.type == "json_schema" and r.text.format.name == "city"


def test_logprobs_on_output_text(server):
    r = server.openai().responses.create(model=server.model_name, input="hi", top_logprobs=2,
                                         include=["message.output_text.logprobs"])  # fmt: skip
    logprobs = r.output[0].content[0].logprobs
    assert [lp.token for lp in logprobs] == ["Hello", ",", " world", "!"]
    assert [lp.logprob for lp in logprobs] == [-0.25] * 4
    assert [len(lp.top_logprobs) for lp in logprobs] == [2] * 4


# -- stored responses -----------------------------------------------------------------


def test_previous_response_reuses_the_exact_previous_tokens(server):
    """Turn two's prompt starts with turn one's prompt and generated ids: the pieces
    "Hello", " world" re-encode as bytes, so only the stored ids make it a prefix."""
    client = server.openai()
    first = client.responses.create(model=server.model_name, input="hi")
    committed = first.usage.input_tokens + first.usage.output_tokens - 1  # EOS never fed
    before = _metrics(server)
    second = client.responses.create(model=server.model_name, input="more",
                                     previous_response_id=first.id)  # fmt: skip
    after = _metrics(server)
    assert second.usage.input_tokens_details.cached_tokens == committed
    assert after["helios_snapshot_hits_total"] - before["helios_snapshot_hits_total"] == 1
    assert after["helios_prefix_cache_hit_tokens_total"] \
        - before["helios_prefix_cache_hit_tokens_total"] == committed
    assert after["helios_prefill_tokens_total"] - before["helios_prefill_tokens_total"] \
        == second.usage.input_tokens - committed
    # The same conversation through chat completions is re-tokenized: less is reused.
    chat = client.chat.completions.create(model=server.model_name, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, world!"},
        {"role": "user", "content": "more"}])  # fmt: skip
    assert chat.usage.prompt_tokens == second.usage.input_tokens + 9  # 11 bytes, not 2 ids
    assert chat.usage.prompt_tokens_details.cached_tokens < committed
    assert server.wait_idle()["pages_used"] == 0


def test_retrieve_input_items_and_delete(server):
    client = server.openai()
    first = client.responses.create(model=server.model_name, input="hi")
    second = client.responses.create(model=server.model_name, previous_response_id=first.id,
                                     input=[{"role": "user", "content": "more"}])  # fmt: skip
    assert client.responses.retrieve(second.id).model_dump() == second.model_dump()
    items = client.responses.input_items.list(second.id)
    assert [(i.type, i.role) for i in items.data] == [
        ("message", "user"), ("message", "assistant"), ("message", "user")]  # newest first
    assert items.data[1].id == first.output[0].id and items.has_more is False
    page = client.responses.input_items.list(second.id, order="asc", limit=1,
                                             after=items.data[2].id)  # fmt: skip
    assert [i.id for i in page.data] == [items.data[1].id] and page.has_more is True
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first.id)
    assert client.responses.retrieve(second.id).id == second.id  # untouched
    unstored = client.responses.create(model=server.model_name, input="hi", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_an_evicted_response_is_not_found(server):
    server.server.app.state.responses_store = ResponseStore(max_bytes=3000)
    client = server.openai()
    ids = [client.responses.create(model=server.model_name, input="hi").id for _ in range(4)]
    store = server.server.app.state.responses_store
    rows, nbytes = store.stats()
    assert 1 <= rows < 4 and nbytes <= 3000
    assert client.responses.retrieve(ids[-1]).id == ids[-1]  # the newest stays
    r = _post(server, {"input": "more", "previous_response_id": ids[0]})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": f"Response with id {ids[0]!r} not found.",
                                  "type": "invalid_request_error",
                                  "param": "previous_response_id", "code": None}}


# -- rejections -----------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param", "code", "message"), [
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "invalid_value",
     "input[0].type 'item_reference' is not served here; served: message, function_call, "
     "function_call_output, reasoning"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "u"}]}]},
     "input[0].content[0]", "invalid_value",
     "input[0].content[0]: input_file content is not served here (text and images only)"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].file_id", "invalid_value",
     "input[0].content[0]: file ids are not served here: send the image as image_url"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0].type", "invalid_value",
     "input[0].content[0].type must be one of input_text, output_text"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_value",
     "input[0].role must be one of user, system, developer, assistant"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
     "input[0].arguments", "invalid_value", "input[0].arguments must be a string"),
    ({"input": [{"role": "user", "content": "x", "colour": 1}]}, "input[0].colour",
     "unknown_parameter", "unknown field input[0].'colour'"),
    ({"input": []}, "input", "invalid_value", "input must not be empty"),
    ({"input": "hi", "temperature": 3}, "temperature", "invalid_value", None),
    ({"input": "hi", "frequency_penalty": 1}, "frequency_penalty", "unknown_parameter",
     "unknown field 'frequency_penalty'"),
    ({"input": "hi", "include": ["reasoning.encrypted_content"]}, "include", None,
     "include value 'reasoning.encrypted_content' is not served here; served: "
     "'message.output_text.logprobs'"),
    ({"input": "hi", "top_logprobs": 2}, "top_logprobs", None,
     "top_logprobs requires include=['message.output_text.logprobs']"),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "f"}},
     "tool_choice", None, "tool_choice names 'f', which is not among the request's tools"),
    ({"input": "hi", "stream_options": {"include_obfuscation": False}}, "stream_options", None,
     "stream_options requires stream=true"),
    ({"input": "hi", "metadata": {str(i): "v" for i in range(17)}}, "metadata", None,
     "metadata has 17 keys; at most 16"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "text.format.schema", None, "text.format json_schema needs a schema"),
])  # fmt: skip
def test_bad_requests_are_400(server, body, param, code, message):
    r = _post(server, body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    if message is not None:
        assert error["message"] == message
    ok = server.openai().responses.create(model=server.model_name, input="hi")
    assert ok.output_text == "Hello, world!"  # nothing disturbed


def test_other_rejections(server, tok):
    r = _post(server, {"input": "hi", "previous_response_id": "resp_unknown"})
    assert (r.status_code, r.json()["error"]["param"]) == (404, "previous_response_id")
    r = httpx.post(server.url + "/v1/responses", json={"model": "other", "input": "hi"})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "model_not_found")
    for stream in (False, True):  # knowable before headers: a status, also for a stream
        r = _post(server, {"input": "hi", "max_output_tokens": 10_000, "stream": stream})
        assert (r.status_code, r.json()["error"]["code"]) == (503, "context_length_exceeded")
        assert r.headers["x-should-retry"] == "false"
    for path in ("/v1/responses/resp_x", "/v1/responses/resp_x/input_items"):
        r = httpx.get(server.url + path)
        assert r.status_code == 404
        assert r.json()["error"] == {"message": "Response with id 'resp_x' not found.",
                                     "type": "invalid_request_error", "param": None,
                                     "code": None}  # fmt: skip
    first = server.openai().responses.create(model=server.model_name, input="hi")
    for query, param in (("limit=0", "limit"), ("limit=x", "limit"), ("order=up", "order"),
                         ("after=msg_x", "after")):  # fmt: skip
        r = httpx.get(f"{server.url}/v1/responses/{first.id}/input_items?{query}")
        assert (r.status_code, r.json()["error"]["param"]) == (400, param)
    with ScriptedServer(tok) as plain:  # no logprobs record
        r = _post(plain, {"input": "hi", "include": ["message.output_text.logprobs"]})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "include")
        assert "records no logprobs" in r.json()["error"]["message"]
    assert server.wait_idle()["permits"] == 0


def test_a_failure_after_headers_is_one_response_failed_event(server):
    server.model.fail_on_sequence(lambda seq: len(seq) > 0
                                  and seq[-1] == server.tok.ids([" world"])[0])
    events = _sse(server, {"input": "hi"})
    server.model.clear_faults()
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [e["type"] for e in events].count("response.failed") == 1
    for event in events:
        EVENTS.validate_python(event)
    assert server.wait_idle()["pages_used"] == 0
