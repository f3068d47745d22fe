"""The OpenAI API as real clients use it (issue 14), over real HTTP with the scripted
backend: standard and vLLM request fields, n > 1, legacy completions, models, tokenize,
version, API keys, the access log and the per-request phase histograms."""

from __future__ import annotations

import logging
import time

import httpx
import openai
import pytest
from helios_serve.testing.harness import ScriptedServer, content_of, sse_post
from prometheus_client.parser import text_string_to_metric_families

HELLO = "Hello, world!"


def _chat(server, prompt: str = "hi", **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}], **extra}


def _post(server, body, path="/v1/chat/completions", **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30, **kw)


# -- request fields ---------------------------------------------------------------------


def test_standard_fields_that_change_nothing_are_accepted(scripted):
    r = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}],
        user="u1", store=False, metadata={"team": "a"}, service_tier="auto",
        logprobs=False, top_logprobs=None, prediction=None, functions=None,
    )  # fmt: skip
    assert r.choices[0].message.content == HELLO
    r = _post(scripted, _chat(scripted, user=None, logit_bias={}, n=1, ignore_eos=False,
                              min_tokens=0, stream_options=None))  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    ("patch", "param", "message"),
    [({"store": True}, "store", "invalid field"),
     ({"prediction": {"type": "content", "content": "x"}}, "prediction", "invalid field"),
     ({"functions": [{"name": "f"}]}, "functions", "invalid field"),
     ({"service_tier": "fastest"}, "service_tier", "invalid field"),
     ({"top_logprobs": 2}, "top_logprobs", "requires logprobs"),
     ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid field"),
     ({"logit_bias": {"x": 1}}, "logit_bias", "keys must be token ids (decimal integers), got 'x'"),
     ({"logit_bias": {"5": 101}}, "logit_bias", "token id 5 is 101.0; it must lie in [-100, 100]"),
     ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "has 301 entries; at most 300 are allowed"),
     ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "exceeds max_tokens 2"),
     ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages", "set by"),
     ({"continue_final_message": True}, "continue_final_message", "assistant message"),
     ({"unheard_of": 1}, "unheard_of", "unknown field")],
)  # fmt: skip
def test_field_rules_are_400_naming_the_field(scripted, patch, param, message):
    r = _post(scripted, {**_chat(scripted), **patch})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


def test_unknown_field_code_is_unknown_parameter(scripted):
    error = _post(scripted, {**_chat(scripted), "frobnicate": 1}).json()["error"]
    assert error["code"] == "unknown_parameter" and error["type"] == "invalid_request_error"


def test_image_part_on_a_text_core_is_a_clear_400(scripted):
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    r = _post(scripted, {"model": scripted.model_name,
                         "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "this model accepts no images"
    assert r.json()["error"]["param"] == "messages[0].content[1]"
    scripted.wait_idle()


def test_ignore_eos_generates_to_the_limit(scripted):
    r = _post(scripted, _chat(scripted, ignore_eos=True, max_tokens=8)).json()
    # The script is four tokens, then the scripted model emits EOS: ignored (no text).
    assert r["choices"][0]["message"]["content"] == HELLO
    assert r["choices"][0]["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 8


def test_min_tokens_masks_eos_before_the_minimum(scripted):
    before = scripted.model.masked_rows
    r = _post(scripted, _chat(scripted, min_tokens=3)).json()
    assert r["choices"][0]["message"]["content"] == HELLO
    assert scripted.model.masked_rows - before == 3  # outputs 0, 1 and 2 were masked
    # The script ends (EOS) after four tokens: a minimum of six forbids that EOS, and
    # the scripted model refuses to emit a token its mask forbids.
    r = _post(scripted, _chat(scripted, min_tokens=6))
    assert r.status_code == 500 and "forbids scripted token 2" in r.json()["error"]["message"]
    scripted.wait_idle()


def test_continuous_usage_stats(scripted):
    status, events = sse_post(scripted.url, _chat(
        scripted, stream=True, stream_options={"include_usage": True,
                                               "continuous_usage_stats": True}))
    assert status == 200
    chunks = [e for e in events if isinstance(e, dict)]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    # Every content chunk carries the usage so far: the tokens whose text it completes
    # (a reader behind gets several tokens' text in one chunk).
    pieces, text = ["Hello", ",", " world", "!"], ""
    for chunk in content:
        text += chunk["choices"][0]["delta"]["content"]
        produced = next(m for m in range(5) if "".join(pieces[:m]) == text)
        assert chunk["usage"]["completion_tokens"] == produced, (text, chunk["usage"])
    assert text == HELLO
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_chat_template_kwargs_and_continue_final_message(scripted, tok):
    body = {"model": scripted.model_name, "return_token_ids": True,
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "Hel"}],
            "add_generation_prompt": False, "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    r = _post(scripted, body).json()
    prompt = tok.decode(r["prompt_token_ids"])
    assert prompt.endswith("<|im_start|>assistant\nHel"), prompt  # no end-of-turn after it
    body["add_generation_prompt"] = True
    r = _post(scripted, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


# -- log probabilities and logit bias ------------------------------------------------------


def _sampling_seen(server) -> list:
    """The SamplingParams of every sampling row the scripted model is handed."""
    seen, submit = [], server.model.submit

    def recording(plan):
        seen.extend(r.sampling for r in plan.rows if r.sample)
        return submit(plan)

    server.model.submit = recording
    return seen


def test_logprobs_logit_bias_and_min_tokens_reach_the_sampler(tok):
    with ScriptedServer(tok, geometry={"top_logprobs": 5, "logit_bias": True}) as server:
        seen = _sampling_seen(server)
        r = _post(server, _chat(server, logprobs=True, top_logprobs=2, min_tokens=2,
                                stop_token_ids=[7], logit_bias={"9": -100, "4": 2.5}))
        assert r.status_code == 200, r.text
        server.wait_idle()
    sampling = seen[0]
    assert sampling.logprobs == 2
    assert sampling.logit_bias == ((4, 2.5), (9, -100.0))  # ids ascending
    assert (sampling.min_tokens, sampling.min_tokens_banned) == (2, (2, 7))  # EOS, stop id
    # The scripted record: the sampled id at -0.25, then alternatives id + i at -0.25 - i.
    content = r.json()["choices"][0]["logprobs"]["content"]
    ids = tok.ids(["Hello", ",", " world", "!"])
    assert [(e["bytes"], e["logprob"]) for e in content] == [
        (list(tok.decode([t]).encode()), -0.25) for t in ids]
    assert [[t["logprob"] for t in e["top_logprobs"]] for e in content] == [[-0.25, -1.25]] * 4


def test_ignore_eos_keeps_eos_out_of_the_min_tokens_ban(tok):
    with ScriptedServer(tok) as server:
        seen = _sampling_seen(server)
        assert _post(server, _chat(server, min_tokens=2, ignore_eos=True,
                                   max_tokens=4)).status_code == 200
        server.wait_idle()
    assert (seen[0].min_tokens, seen[0].min_tokens_banned) == (2, ())


@pytest.mark.parametrize(
    ("geometry", "path", "patch", "param", "message"),
    [({}, "chat", {"logprobs": True}, "logprobs", "this model records no logprobs"),
     ({}, "completions", {"logprobs": 0}, "logprobs", "this model records no logprobs"),
     ({"top_logprobs": 2}, "chat", {"logprobs": True, "top_logprobs": 3}, "top_logprobs",
      "3 alternatives exceed the 2 this model records"),
     ({"top_logprobs": 2}, "completions", {"logprobs": 3}, "logprobs",
      "3 alternatives exceed the 2 this model records"),
     ({}, "chat", {"logit_bias": {"5": 1}}, "logit_bias", "this model applies no logit bias")],
)  # fmt: skip
def test_logprobs_and_logit_bias_a_core_cannot_serve_are_400(tok, geometry, path, patch,
                                                             param, message):  # fmt: skip
    with ScriptedServer(tok, geometry=geometry) as server:
        if path == "chat":
            r = _post(server, {**_chat(server), **patch})
        else:
            r = _post(server, {"model": server.model_name, "prompt": "hi", **patch},
                      path="/v1/completions")
        server.wait_idle()
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


# -- n > 1 --------------------------------------------------------------------------------


def test_n_choices_share_one_prefill(scripted):
    worker = scripted.server.worker
    seeds: list[int] = []
    submit = scripted.model.submit

    def record(plan):
        seeds.extend(r.sampling.seed for r in plan.rows)
        return submit(plan)

    scripted.model.submit = record
    before = worker.scheduler.stats().prompt_tokens_computed
    r = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}], n=3, seed=7)
    scripted.model.submit = submit
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == HELLO and c.finish_reason == "stop" for c in r.choices)
    assert r.usage.completion_tokens == 15 and r.usage.prompt_tokens == 21
    # One prefill of the 21-token prompt; each other choice computes only the token of
    # the last, partial page (its private page): 20 tokens came from shared pages.
    assert worker.scheduler.stats().prompt_tokens_computed - before == 21 + 2
    assert set(seeds) == {7, 8, 9}  # choice i samples with seed + i
    scripted.wait_idle()


def test_n_choices_stream_carry_their_index(scripted):
    stream = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}], n=2,
        stream=True, stream_options={"include_usage": True})
    text = {0: "", 1: ""}
    finish = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert text == {0: HELLO, 1: HELLO} and finish == {0: "stop", 1: "stop"}
    assert usage.completion_tokens == 10


def test_n_cancelled_stream_frees_every_choice(tok):
    with ScriptedServer(tok, step_delay_s=0.01) as server:
        server.script("long", ["Hello"] * 100)
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json=_chat(server, "long", stream=True, n=3), timeout=30) as r:
            for line in r.iter_lines():
                if '"content":"Hello"' in line:
                    break
        snap = server.wait_idle()
        assert snap["pages_used"] == 0 and snap["live"] == 0


# -- legacy completions -------------------------------------------------------------------


def test_completions_with_the_openai_client(scripted, tok):
    client = scripted.openai()
    r = client.completions.create(model=scripted.model_name, prompt="once upon", max_tokens=3)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text == "Hello, world" and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(tok.tokenizer.encode("once upon").ids)
    r = client.completions.create(model=scripted.model_name, prompt=["a", "b"], n=2, echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == ["a" + HELLO] * 2 + ["b" + HELLO] * 2
    ids = tok.tokenizer.encode("once").ids
    r = client.completions.create(model=scripted.model_name, prompt=ids, stop=[","])
    assert r.choices[0].text == "Hello" and r.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model=scripted.model_name, prompt="x",
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == HELLO
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completions_default_limit_is_16(scripted):
    scripted.script("many", ["Hello"] * 40)
    r = _post(scripted, {"model": scripted.model_name, "prompt": "many"}, "/v1/completions")
    assert r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("patch", "param"),
    [({"suffix": "end"}, "suffix"), ({"best_of": 3}, "best_of"),
     # the scripted core has no SCORED_PREFILL programs: no prompt log probabilities
     ({"echo": True, "logprobs": 1}, "logprobs"), ({"max_tokens": 0}, "max_tokens"),
     ({"prompt": []}, "prompt"),
     ({"prompt": [10**7]}, "prompt[0]"), ({"prompt": ""}, "prompt"),
     ({"max_tokens": 1000}, "max_tokens")],
)  # fmt: skip
def test_completions_rejections_name_the_field(scripted, patch, param):
    r = _post(scripted, {"model": scripted.model_name, "prompt": "x", **patch}, "/v1/completions")
    assert r.status_code in (400, 503), r.text
    assert r.json()["error"]["param"] == param
    scripted.wait_idle()


@pytest.mark.parametrize(("prompts", "n"), [(13, 1), (7, 2)])
def test_a_prompt_list_beyond_what_the_server_holds_is_a_400(scripted, prompts, n):
    """More choices than max_active (4) + queue_capacity (8) once reached the worker, which
    refused the prompts beyond its queue as a full queue: a 503 to retry, on an idle
    server, every time."""
    r = _post(scripted, {"model": scripted.model_name, "prompt": ["x"] * prompts, "n": n,
                         "max_tokens": 1}, "/v1/completions")
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": f"{prompts} prompts of n {n} make {prompts * n} requests; this server "
                   "holds 12 at once (4 running, 8 queued)",
        "type": "invalid_request_error", "param": "prompt", "code": None}
    scripted.wait_idle()
    held = _post(scripted, {"model": scripted.model_name, "prompt": ["x"] * 6, "n": 2,
                            "max_tokens": 1}, "/v1/completions")
    assert held.status_code == 200 and len(held.json()["choices"]) == 12, held.text


# -- models, tokenize, version ------------------------------------------------------------


def test_models_retrieve(scripted):
    model = scripted.openai().models.retrieve(scripted.model_name)
    assert model.id == scripted.model_name and model.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        scripted.openai().models.retrieve("nope")
    assert info.value.code == "model_not_found"


def test_tokenize_and_detokenize(scripted, tok):
    r = _post(scripted, {"prompt": "Hello world", "return_token_strs": True}, "/tokenize").json()
    ids = tok.tokenizer.encode("Hello world").ids
    assert r["tokens"] == ids and r["count"] == len(ids) and r["max_model_len"] == 256
    assert r["token_strs"] == [tok.tokenizer.id_to_token(i) for i in ids]
    r = _post(scripted, {"messages": [{"role": "user", "content": "hi"}]}, "/tokenize").json()
    assert tok.decode(r["tokens"]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert r["token_strs"] is None
    assert _post(scripted, {"tokens": ids}, "/detokenize").json() == {"prompt": "Hello world"}
    bad = _post(scripted, {"tokens": [10**7]}, "/detokenize")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens[0]"
    bad = _post(scripted, {"prompt": "x", "messages": []}, "/tokenize")
    assert bad.status_code == 400
    # Found by the property test: continuing an empty conversation was a 500.
    bad = _post(scripted, {"messages": [], "continue_final_message": True,
                           "add_generation_prompt": False}, "/tokenize")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "continue_final_message"


def test_version(scripted):
    from importlib import metadata

    assert httpx.get(scripted.url + "/version").json() == {
        "version": metadata.version("helios-serve")}


# -- API keys, access log -----------------------------------------------------------------


def test_api_key_guards_v1_and_tokenize_only(tok):
    with ScriptedServer(tok, api_key="s3cret") as server:
        for method, path, body in [("GET", "/v1/models", None),
                                   ("POST", "/v1/chat/completions", _chat(server)),
                                   ("POST", "/v1/completions", {"model": "x", "prompt": "x"}),
                                   ("POST", "/tokenize", {"prompt": "x"}),
                                   ("POST", "/detokenize", {"tokens": [1]})]:  # fmt: skip
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = httpx.request(method, server.url + path, json=body, headers=headers)
                assert r.status_code == 401, (path, headers, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
        for path in ("/health", "/metrics", "/version", "/openapi.json"):
            assert httpx.get(server.url + path).status_code == 200, path
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        r = client.chat.completions.create(model=server.model_name,
                                           messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == HELLO
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url + "/v1", api_key="nope",
                          max_retries=0).models.list()  # fmt: skip
        server.wait_idle()


def test_one_access_line_per_request_without_prompt_text(scripted, caplog):
    caplog.set_level(logging.INFO, logger="helios_serve.access")
    def logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "helios_serve.access"]

    def wait_for(count: int) -> list[str]:
        deadline = time.monotonic() + 5  # a line is written once the response is sent
        while len(logged()) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return logged()

    _post(scripted, _chat(scripted, "secret prompt words"))
    wait_for(1)
    sse_post(scripted.url, _chat(scripted, "secret prompt words", stream=True))
    wait_for(2)
    _post(scripted, {**_chat(scripted), "bogus": 1})
    wait_for(3)
    httpx.get(scripted.url + "/health")
    lines = wait_for(4)
    assert len(lines) == 4, lines
    assert all("secret" not in line and "Hello" not in line for line in lines)
    assert lines[0].startswith("POST /v1/chat/completions 200 prompt_tokens=38 "
                               "completion_tokens=5 duration_ms=")
    assert " finish=stop request_id=" in lines[0] and " finish=stop request_id=" in lines[1]
    assert "completion_tokens=5" in lines[1]
    assert lines[2].startswith("POST /v1/chat/completions 400 prompt_tokens=- ")
    assert lines[3].startswith("GET /health 200 ")


def test_phase_histograms_count_each_request(scripted):
    for _ in range(2):
        _post(scripted, _chat(scripted))
    scripted.wait_idle()
    families = {f.name: f for f in text_string_to_metric_families(
        httpx.get(scripted.url + "/metrics").text)}
    for name in ("helios_request_queue_time_seconds", "helios_request_prefill_time_seconds",
                 "helios_request_decode_time_seconds"):
        count = [s.value for s in families[name].samples if s.name == name + "_count"]
        assert count == [2.0], (name, count)


def test_error_stream_content_helper_is_empty_on_error(scripted):
    status, events = sse_post(scripted.url, _chat(scripted, stream=True, max_tokens=1000))
    assert status == 503 and content_of(events) == ""


def test_the_openapi_documents_integer_limits_in_json_schema_terms(scripted):
    """minimum / maximum / exclusiveMaximum, never pydantic's ge / le / lt, which
    validators and client generators ignore."""
    document = httpx.get(scripted.url + "/openapi.json").json()
    schemas = document["components"]["schemas"]

    def keys(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield k
                yield from keys(v)
        elif isinstance(node, list):
            for v in node:
                yield from keys(v)

    assert not {"ge", "gt", "le", "lt"} & set(keys(schemas))
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0] == {"minimum": 1, "type": "integer"}
    assert chat["seed"]["anyOf"][0] == {"minimum": -(2**63), "exclusiveMaximum": 2**64,
                                        "type": "integer"}


def test_metrics_content_type_names_its_charset_once(scripted):
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    r = httpx.get(scripted.url + "/metrics")
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST  # 'text/plain; version=...; charset=utf-8'
