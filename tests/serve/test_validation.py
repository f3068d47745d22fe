"""Request validation: every bad request is a 400 naming its field, and disturbs nothing."""

from __future__ import annotations

import httpx
import openai
import pytest


def _base(server) -> dict:
    return {"model": server.model_name, "messages": [{"role": "user", "content": "hi"}]}


BAD_FIELDS = [
    ({"frobnicate": 1}, "frobnicate", "unknown field"),
    ({"temperature": "hot"}, "temperature", "invalid field"),
    ({"temperature": 3.5}, "temperature", "invalid field"),
    ({"max_tokens": 0}, "max_tokens", "invalid field"),
    ({"max_tokens": 2.5}, "max_tokens", "invalid field"),
    ({"stream": "yes"}, "stream", "invalid field"),
    ({"stream": 1}, "stream", "invalid field"),
    ({"return_token_ids": "true"}, "return_token_ids", "invalid field"),
    ({"return_token_ids": 1}, "return_token_ids", "invalid field"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage", "invalid field"),
    ({"stream": True, "stream_options": {"bogus": True}}, "stream_options.bogus", "unknown field"),
    ({"seed": "42"}, "seed", "invalid field"),
    ({"stop_token_ids": ["1"]}, "stop_token_ids[0]", "invalid field"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "invalid field"),
    ({"messages": [{"role": "user", "content": "hi", "extra": 1}]}, "messages[0].extra",
     "unknown field"),
    ({"messages": []}, "messages", "invalid field"),
    ({"top_k": "5"}, "top_k", "invalid field"),
]


@pytest.mark.parametrize(("patch", "param", "message"), BAD_FIELDS,
                         ids=[p for _, p, _ in BAD_FIELDS])
def test_bad_field_is_400_naming_it(scripted, patch, param, message):
    r = httpx.post(scripted.url + "/v1/chat/completions", json={**_base(scripted), **patch})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"] and param.split("[")[0].split(".")[0] in error["message"]


SEMANTIC = [
    ({"n": 5}, "n"),  # beyond the 4 requests the server runs at once
    ({"n": 0}, "n"),
    ({"stop": ""}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ["x" * 2049, "y" * 2048]}, "stop"),
    ({"stop": ["x"], "stop_token_ids": [3]}, "stop"),
    ({"stop": ["x"], "stop_token_sequences": [[3]]}, "stop"),
    ({"stop": ["x"], "response_format": {"type": "json_object"}}, "stop"),
    ({"stop_token_sequences": [[3]] * 17}, "stop_token_sequences"),
    ({"stop_token_sequences": [[3] * 65]}, "stop_token_sequences"),
    ({"stop_token_sequences": [[]]}, "stop_token_sequences"),
    ({"stop_token_ids": [10**6]}, "stop_token_ids"),
    ({"return_token_timestamps": True}, "return_token_timestamps"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
     "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
]


@pytest.mark.parametrize(("patch", "param"), SEMANTIC, ids=[str(i) for i in range(len(SEMANTIC))])
def test_semantic_rule_is_400(scripted, patch, param):
    r = httpx.post(scripted.url + "/v1/chat/completions", json={**_base(scripted), **patch})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param)


def test_stop_limits_at_the_edge_are_accepted(scripted):
    body = {**_base(scripted), "stop": ["x" * 2048, "y" * 2048]}  # exactly 4096 bytes
    assert httpx.post(scripted.url + "/v1/chat/completions", json=body).status_code == 200
    body = {**_base(scripted), "stop_token_sequences": [[3] * 64] * 16}
    assert httpx.post(scripted.url + "/v1/chat/completions", json=body).status_code == 200
    body = {**_base(scripted), "stream": True, "stream_options": {"include_usage": None},
            "return_token_ids": None, "n": 1, "stop": None}
    assert httpx.post(scripted.url + "/v1/chat/completions", json=body).status_code == 200


def test_malformed_json_and_unknown_model(scripted):
    r = httpx.post(scripted.url + "/v1/chat/completions", content=b"{not json",
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(scripted.url + "/v1/chat/completions", json={**_base(scripted), "model": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_openai_client_sees_bad_request(scripted):
    client = scripted.openai()
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=scripted.model_name, n=5,
                                       messages=[{"role": "user", "content": "hi"}])
    assert info.value.param == "n"
    assert "n 5 exceeds the 4 requests this server runs at once" in str(info.value)


def test_rejections_disturb_nothing(scripted):
    for patch, _, _ in BAD_FIELDS[:5]:
        httpx.post(scripted.url + "/v1/chat/completions", json={**_base(scripted), **patch})
    snap = scripted.wait_idle()
    assert snap["permits"] == 0 and snap["pages_used"] == 0
    r = httpx.post(scripted.url + "/v1/chat/completions", json=_base(scripted))
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == "Hello, world!"
    metrics = httpx.get(scripted.url + "/metrics").text
    assert 'helios_requests_rejected_total{reason="invalid"} 5.0' in metrics


def test_text_parts_and_roles(scripted):
    body = {"model": "tiny", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
        {"role": "assistant", "content": "Hello"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "user", "content": "again"},
    ]}
    r = httpx.post(scripted.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == scripted.model_name  # an alias resolves to the served name


@pytest.mark.parametrize(("content", "param", "message"), [
    ([{"type": "text"}], "messages[0].content[0].text", "Field required"),
    ([{"type": "text", "text": 5}], "messages[0].content[0].text",
     "Input should be a valid string"),
    ([{"type": "txt", "text": "hi"}], "messages[0].content[0].type", "Input should be 'text'"),
    (5, "messages[0].content", "Input should be a valid string"),
])
def test_a_bad_content_part_is_named(scripted, content, param, message):
    """A list of parts is named down to the part: the first of pydantic's union errors
    was the string branch's ("messages[0].content: Input should be a valid string" for a
    text part without its text)."""
    r = httpx.post(scripted.url + "/v1/chat/completions", json={
        **_base(scripted), "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {"message": f"invalid field {param!r}: {message}",
                                 "type": "invalid_request_error", "param": param,
                                 "code": "invalid_value"}


@pytest.mark.parametrize("body", [b"[1, 2]", b'"hi"', b"42", b"null"])
def test_body_that_is_not_an_object_is_a_clear_400(scripted, body):
    r = httpx.post(scripted.url + "/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] == "the request body must be a JSON object"
    assert error["param"] is None


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool"])
def test_message_without_content_is_400_naming_it(scripted, role):
    messages = [{"role": "user", "content": "hi"}, {"role": role}]
    r = httpx.post(scripted.url + "/v1/chat/completions",
                   json={**_base(scripted), "messages": messages})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages[1].content"
    assert f"a {role} message needs content" in error["message"]
    scripted.wait_idle()


@pytest.mark.parametrize(
    "choice",
    [{"foo": 1}, {"type": "function"}, {"type": "function", "function": {}},
     {"type": "function", "function": {"name": 5}}, {"type": "tool", "function": {"name": "f"}}],
)  # fmt: skip
def test_malformed_named_tool_choice_is_a_clear_400(scripted, choice):
    r = httpx.post(scripted.url + "/v1/chat/completions",
                   json={**_base(scripted), "tool_choice": choice})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tool_choice"
    assert error["message"] == (
        'must be "none", "auto", "required" or {"type": "function", "function": {"name": NAME}}'
    )


@pytest.mark.parametrize(
    ("schema", "reason"),
    [({"type": "nonsense"}, "Invalid type: nonsense"),
     ({"type": "string", "pattern": "(["}, "unclosed character class"),
     ({"$ref": "#/definitions/nope"}, "does not exist")],
)  # fmt: skip
def test_bad_json_schema_is_one_clear_line(scripted, schema, reason):
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = httpx.post(scripted.url + "/v1/chat/completions",
                   json={**_base(scripted), "response_format": rf})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format"
    message = error["message"]
    assert message.startswith("failed to compile JSON schema: ") and reason in message, message
    assert "\n" not in message and "%json" not in message and "start:" not in message, message


@pytest.mark.parametrize(("patch", "limit"), [
    ({"seed": 2**64}, "less than 18446744073709551616"),
    ({"seed": -(2**63) - 1}, "greater than or equal to -9223372036854775808"),
    ({"top_logprobs": 21, "logprobs": True}, "less than or equal to 20"),
])  # fmt: skip
def test_an_integer_out_of_range_names_its_exact_limit(scripted, patch, limit):
    """The limit as an integer (a bound checked after the integral-number validator was
    read through a float: "less than 18446744073709552000")."""
    r = httpx.post(scripted.url + "/v1/chat/completions", json={**_base(scripted), **patch})
    assert r.status_code == 400, r.text
    assert f"Input should be {limit}" in r.json()["error"]["message"]

