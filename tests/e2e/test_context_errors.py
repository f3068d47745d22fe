"""A request that can never fit the context is a 503 (scheduler admission, the
specification's status) whose body the clients tell from an outage: litellm raises its
ContextWindowExceededError (it matches "prompt is too long"), the official openai client
an InternalServerError carrying `code == "context_length_exceeded"` at once (no retry:
`x-should-retry: false`). docs/api.md, "Errors clients can act on"."""

from __future__ import annotations

import httpx
import litellm
import openai
import pytest

HELLO = [{"role": "user", "content": "hello"}]


def test_openai_client_gets_the_code_on_an_internal_server_error(tiny_thread_server):
    server = tiny_thread_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60)
    for stream in (False, True):
        with pytest.raises(openai.InternalServerError) as info:  # mapped by status alone
            client.chat.completions.create(model=server.settings.served_name,
                                           messages=HELLO, max_tokens=10_000, stream=stream)
        assert info.value.status_code == 503
        assert info.value.code == "context_length_exceeded"
        assert info.value.type == "admission_rejected"
        assert info.value.body["message"].startswith("prompt is too long: ")


def test_litellm_raises_its_context_window_error(tiny_thread_server):
    server = tiny_thread_server
    name = server.settings.served_name
    for stream in (False, True):
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(model=f"openai/{name}", api_base=server.url + "/v1",
                               api_key="unused", messages=HELLO, max_tokens=10_000,
                               stream=stream, num_retries=0)  # fmt: skip
        with pytest.raises(litellm.ContextWindowExceededError):  # the prompt alone too long
            litellm.completion(model=f"openai/{name}", api_base=server.url + "/v1",
                               api_key="unused", num_retries=0, stream=stream,
                               messages=[{"role": "user", "content": "hello " * 400}])
    # The body: the specified status, OpenAI's code, the words litellm matches.
    r = httpx.post(server.url + "/v1/chat/completions", json={
        "model": name, "messages": HELLO, "max_tokens": 10_000}, timeout=60)  # fmt: skip
    assert r.status_code == 503 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"] == {
        "message": "prompt is too long: prompt 24 + max output 10000 tokens exceeds the "
                   "context of 256 tokens", "type": "admission_rejected",
        "param": "max_tokens", "code": "context_length_exceeded"}


def test_litellm_anthropic_provider_on_messages(tiny_thread_server):
    """litellm's `anthropic/` provider speaks /v1/messages: an answer, and the
    context-window error streaming and not."""
    server = tiny_thread_server
    kwargs = dict(model=f"anthropic/{server.settings.served_name}", api_base=server.url,
                  api_key="unused", messages=HELLO, num_retries=0)  # fmt: skip
    r = litellm.completion(**kwargs, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 4
    for stream in (False, True):
        with pytest.raises(litellm.ContextWindowExceededError):
            response = litellm.completion(**kwargs, max_tokens=10_000, stream=stream)
            if stream:
                list(response)
