"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) over real
HTTP, with the official `anthropic` client, around the scripted model (its answers are
chosen, so every field is checked exactly). Every rejection path: its status, Anthropic
error type and message."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from helios_serve.testing.harness import ScriptedServer

LONG = ["Hello", ",", " world", "!"] * 40  # 160 tokens
HI = [{"role": "user", "content": "hi"}]


def _client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=30)


def _body(server, **extra):
    return {"model": server.model_name, "max_tokens": 32, "messages": HI, **extra}


def _post(server, body, path: str = "/v1/messages", **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30, **kw)


def sse_events(server, body, headers=None) -> tuple[int, list[tuple[str, dict]]]:
    """POST a streaming Messages request: (status, [(event name, data), ...])."""
    out: list[tuple[str, dict]] = []
    with httpx.stream("POST", server.url + "/v1/messages", json={**body, "stream": True},
                      timeout=30, headers=headers) as r:  # fmt: skip
        if r.status_code != 200:
            r.read()
            return r.status_code, [("", r.json())]
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[len("data: "):])))
    return 200, out


def _chat_usage(server, messages, **extra):
    r = server.openai().chat.completions.create(model=server.model_name, messages=messages,
                                                **extra)  # fmt: skip
    return r


def test_create_is_the_chat_answer_in_anthropic_shape(scripted):
    client = _client(scripted)
    m = client.messages.create(model=scripted.model_name, max_tokens=32, messages=HI,
                               metadata={"user_id": "u1"}, extra_body={
                                   "temperature": 0.5, "top_p": 0.9, "top_k": 5})  # fmt: skip
    chat = _chat_usage(scripted, HI, max_tokens=32)
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == scripted.model_name
    assert [b.model_dump() for b in m.content] == [
        {"type": "text", "text": "Hello, world!", "citations": None}]
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    # Prompt tokens the prefix cache served are cache reads (the chat request repeats it).
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert m.usage.output_tokens == chat.usage.completion_tokens == 5  # 4 pieces + EOS
    count = client.messages.count_tokens(model=scripted.model_name, messages=HI)
    assert count.input_tokens == chat.usage.prompt_tokens
    scripted.wait_idle()


def test_max_tokens_and_stop_sequences_set_the_stop_reason(scripted):
    client = _client(scripted)
    m = client.messages.create(model=scripted.model_name, max_tokens=2, messages=HI)
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == ("Hello,", "max_tokens", None)
    m = client.messages.create(model=scripted.model_name, max_tokens=32, messages=HI,
                               stop_sequences=["zzz", " wor"])  # fmt: skip
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == (
        "Hello,", "stop_sequence", " wor")
    assert m.usage.output_tokens == 3  # the token crossing the stop counts
    # Two stops completed by the same token: the one ending first wins (the matcher's rule).
    m = client.messages.create(model=scripted.model_name, max_tokens=32, messages=HI,
                               stop_sequences=["world!", "d!"])  # fmt: skip
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == (
        "Hello, ", "stop_sequence", "world!")
    m = client.messages.create(model=scripted.model_name, max_tokens=32, messages=HI,
                               stop_sequences=["never"])  # fmt: skip
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == (
        "Hello, world!", "end_turn", None)
    with client.messages.stream(model=scripted.model_name, max_tokens=32, messages=HI,
                                stop_sequences=[" wor"]) as stream:  # fmt: skip
        assert "".join(stream.text_stream) == "Hello,"
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", " wor")
    scripted.wait_idle()


def test_stream_events_in_order_reassemble_to_the_json_message(scripted):
    body = _body(scripted)
    status, events = sse_events(scripted, body)
    assert status == 200
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(n == d["type"] for n, d in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert events[2][1] == {"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}  # fmt: skip
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    delta = events[-2][1]
    json_message = _post(scripted, body).json()
    assert text == json_message["content"][0]["text"] == "Hello, world!"
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    def prompt(u):
        return u["input_tokens"] + u.get("cache_read_input_tokens", 0)

    assert delta["usage"]["output_tokens"] == json_message["usage"]["output_tokens"] == 5
    assert prompt(start["usage"]) == prompt(delta["usage"]) == prompt(json_message["usage"])
    with _client(scripted).messages.stream(**body) as stream:
        final = stream.get_final_message()
    again = _post(scripted, body).json()  # the same prefix reuse as the stream's
    assert final.model_dump(exclude={"id"}) == anthropic.types.Message.model_validate(
        again).model_dump(exclude={"id"})
    scripted.wait_idle()


def test_system_text_and_blocks_render_as_the_chat_system_message(scripted):
    client = _client(scripted)
    as_chat = httpx.post(scripted.url + "/tokenize", json={"messages": [
        {"role": "system", "content": "Be brief."}, *HI]}).json()["count"]  # fmt: skip
    for system in ("Be brief.", [{"type": "text", "text": "Be "}, {"type": "text",
                                                                  "text": "brief."}]):
        count = client.messages.count_tokens(model=scripted.model_name, messages=HI,
                                             system=system)  # fmt: skip
        assert count.input_tokens == as_chat
    # An assistant turn of blocks and a tool result render as the chat messages they mean.
    turns = [*HI, {"role": "assistant", "content": [
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "42"}, {"type": "text", "text": "so?"}]}]
    chat = [*HI, {"role": "assistant", "content": "Calling.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "user", "content": "so?"}]
    expected = httpx.post(scripted.url + "/tokenize", json={"messages": chat}).json()
    got = _post(scripted, {"model": scripted.model_name, "messages": turns},
                "/v1/messages/count_tokens")  # fmt: skip
    assert got.status_code == 200 and got.json() == {"input_tokens": expected["count"]}


def _error(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    return r.status_code, body["error"]["type"], body["error"]["message"]


@pytest.mark.parametrize(("patch", "message"), [
    ({"max_tokens": None}, "invalid field 'max_tokens'"),
    ({"max_tokens": 0}, "invalid field 'max_tokens'"),
    ({"temperature": 1.5}, "invalid field 'temperature'"),
    ({"messages": []}, "invalid field 'messages'"),
    ({"messages": [{"role": "system", "content": "x"}]}, "invalid field 'messages[0].role'"),
    ({"top_p": 0}, "invalid field 'top_p'"),
    ({"frequency_penalty": 0.5}, "unknown field 'frequency_penalty'"),
    ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences: "),
    ({"stop_sequences": [""]}, "stop_sequences: stop strings must be nonempty"),
    ({"tool_choice": {"type": "any"}}, "tool_choice requires tools"),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]},
     "messages[0].content[0].type: an assistant message cannot carry a tool_result block"),
    ({"messages": [{"role": "user", "content": [
        {"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
     "messages[0].content[0].type: a user message cannot carry a tool_use block"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
     "this model accepts no images"),
], ids=["max_tokens missing", "max_tokens 0", "temperature", "no messages", "system role",
        "top_p", "unknown field", "five stops", "empty stop", "tool_choice without tools",
        "tool_result from the assistant", "tool_use from the user", "image"])  # fmt: skip
def test_invalid_requests_are_400_invalid_request_error(scripted, patch, message):
    body = {k: v for k, v in {**_body(scripted), **patch}.items() if v is not None}
    for stream in (False, True):
        r = _post(scripted, {**body, "stream": stream})
        status, kind, text = _error(r)
        assert (status, kind) == (400, "invalid_request_error"), text
        assert message in text
    with pytest.raises(anthropic.BadRequestError):  # the SDK's own mapping of the error
        _client(scripted).post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    scripted.wait_idle()


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "AAAA"}}


@pytest.mark.parametrize(("patch", "where"), [
    ({"system": "be brief", "messages": [{"role": "user", "content": [IMAGE]}]},
     "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "assistant", "content": [
                       {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                   {"role": "user", "content": [
                       {"type": "tool_result", "tool_use_id": "t1", "content": "4"},
                       {"type": "text", "text": "and this:"}, IMAGE]}]},
     "messages[2].content[2]"),
])  # fmt: skip
def test_a_rejected_block_is_named_by_its_place_in_the_request(scripted, patch, where):
    """The chat path's index was named: the system text is chat message 0 and a
    tool_result block a chat message of its own ("messages[1].content[0]" for the only
    message's only block)."""
    r = _post(scripted, {**_body(scripted), **patch})
    assert _error(r) == (400, "invalid_request_error", f"{where}: this model accepts no images")
    scripted.wait_idle()


def test_malformed_bodies_are_400(scripted):
    for raw in (b"{", b"[]", b'"x"'):
        r = httpx.post(scripted.url + "/v1/messages", content=raw,
                       headers={"content-type": "application/json"})  # fmt: skip
        assert _error(r)[:2] == (400, "invalid_request_error")
        r = httpx.post(scripted.url + "/v1/messages/count_tokens", content=raw,
                       headers={"content-type": "application/json"})  # fmt: skip
        assert _error(r)[:2] == (400, "invalid_request_error")
    r = _post(scripted, {"model": scripted.model_name}, "/v1/messages/count_tokens")
    assert _error(r) == (400, "invalid_request_error", "invalid field 'messages': Field required")


def test_unknown_model_is_404_not_found_error(scripted):
    for path, body in (("/v1/messages", {**_body(scripted), "model": "other"}),
                       ("/v1/messages/count_tokens", {"model": "other", "messages": HI})):
        status, kind, text = _error(_post(scripted, body, path))
        assert (status, kind) == (404, "not_found_error")
        assert text.startswith("model 'other' is not served here")
    with pytest.raises(anthropic.NotFoundError):
        _client(scripted).messages.create(**{**_body(scripted), "model": "other"})


def test_over_context_is_503_before_headers_and_never_retried(scripted):
    body = _body(scripted, max_tokens=1000)
    for stream in (False, True):
        r = _post(scripted, {**body, "stream": stream})
        assert r.headers["x-should-retry"] == "false"
        assert _error(r) == (503, "invalid_request_error",
                             "prompt is too long: prompt 21 + max output 1000 tokens exceeds "
                             "the context of 256 tokens")  # fmt: skip
    before = scripted.server.metrics.requests_received._value.get()
    with pytest.raises(anthropic.InternalServerError) as info:  # x-should-retry: raised at once
        anthropic.Anthropic(base_url=scripted.url, api_key="x", timeout=30).messages.create(
            **body)
    assert info.value.status_code == 503
    assert scripted.server.metrics.requests_received._value.get() == before + 1
    assert _post(scripted, _body(scripted)).status_code == 200  # nothing else disturbed
    scripted.wait_idle()


def test_429_when_http_capacity_is_full(tok):
    with ScriptedServer(tok, max_active=1, queue_capacity=1, step_delay_s=0.1) as server:
        server.script("long", LONG)
        held = []
        for i in range(2):
            client = httpx.Client(timeout=30)
            cm = client.stream("POST", server.url + "/v1/messages", json={
                **_body(server, max_tokens=200), "stream": True,
                "messages": [{"role": "user", "content": f"long {i}"}]})  # fmt: skip
            response = cm.__enter__()
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines)  # message_start: admitted
            held.append((client, cm, lines))
        r = _post(server, _body(server))
        assert r.headers["retry-after"] == "1"
        assert _error(r)[:2] == (429, "rate_limit_error")
        with pytest.raises(anthropic.RateLimitError):
            _client(server).messages.create(**_body(server))
        for client, cm, _ in held:
            cm.__exit__(None, None, None)
            client.close()
        server.wait_idle()


def test_rejection_after_headers_is_one_overloaded_error_event(tok):
    with ScriptedServer(tok) as server:
        worker = server.server.worker
        admit = worker._admit
        worker._admit = lambda request: worker._reject(request, "the admission queue is full (8 waiting)")
        status, events = sse_events(server, _body(server))
        r = _post(server, _body(server))
        worker._admit = admit
        assert status == 200 and [n for n, _ in events] == ["message_start", "ping", "error"]
        assert events[-1][1] == {"type": "error", "error": {
            "type": "overloaded_error", "message": "the admission queue is full (8 waiting)"}}
        assert _error(r) == (503, "overloaded_error", "the admission queue is full (8 waiting)")
        server.wait_idle()


def test_execution_fault_is_500_api_error_or_an_error_event(scripted):
    scripted.script("boom", ["Hello", "!"])
    trigger = scripted.tok.tokenizer.encode("boom", add_special_tokens=False).ids

    def contains_trigger(seq):
        n = len(trigger)
        return any(tuple(seq[i : i + n]) == tuple(trigger) for i in range(len(seq) - n + 1))

    scripted.model.fail_on_sequence(contains_trigger)
    boom = _body(scripted, messages=[{"role": "user", "content": "boom"}])
    status, events = sse_events(scripted, boom)
    assert status == 200 and events[-1][0] == "error"
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "message_stop" not in [n for n, _ in events]
    with pytest.raises(anthropic.APIStatusError):  # the client raises on the error event
        with _client(scripted).messages.stream(**boom) as stream:
            stream.get_final_message()
    assert _error(_post(scripted, boom))[:2] == (500, "api_error")
    assert _post(scripted, _body(scripted)).status_code == 200
    scripted.wait_idle()


def test_api_key_as_x_api_key_or_bearer(tok):
    with ScriptedServer(tok, api_key="s3cret") as server:
        for path, body in (("/v1/messages", _body(server)),
                           ("/v1/messages/count_tokens", {"model": server.model_name,
                                                          "messages": HI})):  # fmt: skip
            for headers in ({}, {"x-api-key": "wrong"}, {"Authorization": "Bearer wrong"},
                            {"x-api-key": "Bearer s3cret"}):  # fmt: skip
                status, kind, text = _error(_post(server, body, path, headers=headers))
                assert (status, kind) == (401, "authentication_error"), headers
                assert text == ("invalid or missing API key: send x-api-key: KEY or "
                                "Authorization: Bearer KEY")
            for headers in ({"x-api-key": "s3cret"}, {"Authorization": "Bearer s3cret"}):
                assert _post(server, body, path, headers=headers).status_code == 200
        m = _client(server, "s3cret").messages.create(**_body(server))
        assert m.content[0].text == "Hello, world!"
        with pytest.raises(anthropic.AuthenticationError):
            _client(server, "nope").messages.create(**_body(server))
        # x-api-key is for the Anthropic routes; the OpenAI routes keep Bearer only.
        r = httpx.get(server.url + "/v1/models", headers={"x-api-key": "s3cret"})
        assert r.status_code == 401
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="nope",
                          max_retries=0).models.list()  # fmt: skip
        server.wait_idle()
