"""Chat completions over real HTTP with the official openai client: response shapes,
token and timing observation, usage, /v1/models, /health and /metrics."""

from __future__ import annotations

import threading

import httpx
from helios_serve.testing.harness import ScriptedServer, content_of, sse_post
from prometheus_client.parser import text_string_to_metric_families

HELLO = ["Hello", ",", " world", "!"]


def _chat(server, prompt: str = "hi", **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}], **extra}


def test_json_response_shape(scripted):
    r = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}])
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    assert r.model == scripted.model_name and isinstance(r.created, int)
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant" and choice.message.content == "Hello, world!"
    assert r.usage.completion_tokens == 5  # four tokens and EOS
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    raw = httpx.post(scripted.url + "/v1/chat/completions", json=_chat(scripted)).json()
    assert "prompt_token_ids" not in raw and "performance" not in raw
    assert "token_ids" not in raw["choices"][0]


def test_stream_with_the_openai_client(scripted):
    stream = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}], stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello, world!"
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_output_limit_finishes_with_length(scripted):
    r = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message.content == "Hello,"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    r = scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=3)
    assert r.choices[0].message.content == "Hello, world"


def test_json_observation(scripted, tok):
    body = _chat(scripted, return_token_ids=True, return_token_timestamps=True)
    r = httpx.post(scripted.url + "/v1/chat/completions", json=body).json()
    choice = r["choices"][0]
    ids = tok.ids(HELLO) + [2]
    assert choice["token_ids"] == ids  # EOS included
    stamps = choice["token_timestamps_ns"]
    assert len(stamps) == len(ids) and stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)  # one validated completion per step
    prompt = tok.tokenizer.encode(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    assert r["prompt_token_ids"] == prompt
    perf = r["performance"]
    assert 0 < perf["ingress_ns"] <= perf["enqueue_ns"] < stamps[0]
    assert perf["reused_prompt_tokens"] == r["reused_prompt_tokens"]
    assert r["usage"]["completion_tokens"] == len(ids)


def test_ids_without_timestamps(scripted):
    r = httpx.post(scripted.url + "/v1/chat/completions",
                   json=_chat(scripted, return_token_ids=True)).json()
    assert "token_timestamps_ns" not in r["choices"][0] and "performance" not in r
    assert "reused_prompt_tokens" in r


def test_stream_observation(scripted, tok):
    status, events = sse_post(scripted.url, _chat(
        scripted, stream=True, return_token_ids=True, return_token_timestamps=True))
    assert status == 200 and events[-1] == "[DONE]"
    chunks = events[:-1]
    assert "prompt_token_ids" in chunks[0]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    observations = [c for c in chunks if c["choices"] and "token_ids" in c["choices"][0]]
    ids = [c["choices"][0]["token_ids"][0] for c in observations]
    assert ids == tok.ids(HELLO) + [2]
    for c in observations:  # metadata-only: an empty delta, one id, one aligned stamp
        assert c["choices"][0]["delta"] == {}
        assert len(c["choices"][0]["token_ids"]) == 1
        assert len(c["choices"][0]["token_timestamps_ns"]) == 1
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert all("token_ids" not in c["choices"][0] for c in text_chunks)
    assert content_of(events) == "Hello, world!"
    # Without include_usage, an observed stream carries usage on its terminal choice chunk.
    terminal = chunks[-1]
    assert terminal["choices"][0]["finish_reason"] == "stop"
    assert terminal["usage"]["completion_tokens"] == 5
    assert "performance" in terminal and "reused_prompt_tokens" in terminal
    stamps = [c["choices"][0]["token_timestamps_ns"][0] for c in observations]
    assert stamps == sorted(stamps)


def test_stream_observation_with_include_usage(scripted):
    status, events = sse_post(scripted.url, _chat(
        scripted, stream=True, return_token_ids=True, stream_options={"include_usage": True}))
    chunks = events[:-1]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert "reused_prompt_tokens" in chunks[-1]


def test_unobserved_stream_has_no_usage(scripted):
    status, events = sse_post(scripted.url, _chat(scripted, stream=True))
    assert all("usage" not in e for e in events[:-1])


def test_prefix_reuse_is_reported(scripted):
    long_prompt = "tell me a story about pages " * 4
    first = httpx.post(scripted.url + "/v1/chat/completions",
                       json=_chat(scripted, long_prompt, return_token_ids=True)).json()
    second = httpx.post(scripted.url + "/v1/chat/completions",
                        json=_chat(scripted, long_prompt, return_token_ids=True)).json()
    assert first["reused_prompt_tokens"] == 0
    prompt_tokens = second["usage"]["prompt_tokens"]
    # Complete 4-token pages of the identical prompt are reused; the last token is computed.
    assert second["reused_prompt_tokens"] == (prompt_tokens - 1) // 4 * 4
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        second["reused_prompt_tokens"])
    assert second["choices"][0]["message"]["content"] == "Hello, world!"


def test_concurrent_requests_get_their_own_scripts(tok):
    with ScriptedServer(tok, max_active=4, step_delay_s=0.002) as server:
        server.script("alpha", ["Look", " there", "!"])
        server.script("beta", ["Letters", ":", " H", "IJ"])
        out: dict[str, str] = {}

        def run(name: str) -> None:
            r = httpx.post(server.url + "/v1/chat/completions", json=_chat(server, name),
                           timeout=30)
            out[name] = r.json()["choices"][0]["message"]["content"]

        names = [f"{n} {i}" for n in ("alpha", "beta") for i in range(6)]
        threads = [threading.Thread(target=run, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for name in names:
            assert out[name] == ("Look there!" if name.startswith("alpha") else "Letters: HIJ")
        server.wait_idle()


def test_models_and_health(scripted):
    r = httpx.get(scripted.url + "/v1/models").json()
    assert r["object"] == "list"
    assert [m["id"] for m in r["data"]] == [scripted.model_name, "tiny"]
    assert all(m["object"] == "model" for m in r["data"])
    models = scripted.openai().models.list()
    assert models.data[0].id == scripted.model_name
    health = httpx.get(scripted.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics(scripted):
    before = _samples(httpx.get(scripted.url + "/metrics").text)
    assert before[("flare_mixed_grammar_decode_steps_total", ())] == 0
    assert before[("flare_constrained_max_inflight", ())] == 0
    scripted.openai().chat.completions.create(
        model=scripted.model_name, messages=[{"role": "user", "content": "hi"}])
    sse_post(scripted.url, _chat(scripted, stream=True))
    httpx.post(scripted.url + "/v1/chat/completions", json={"bogus": 1})
    scripted.wait_idle()
    r = httpx.get(scripted.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = _samples(r.text)
    assert m[("helios_requests_received_total", ())] == 3
    assert m[("helios_requests_admitted_total", ())] == 2
    assert m[("helios_requests_rejected_total", (("reason", "invalid"),))] == 1
    assert m[("helios_requests_finished_total", (("reason", "stop"),))] == 2
    assert m[("helios_requests_running", ())] == 0 and m[("helios_requests_waiting", ())] == 0
    assert m[("helios_generation_tokens_total", ())] == 10
    assert m[("helios_prompt_tokens_total", ())] > 0
    assert m[("helios_graph_launches_total", (("operation", "prefill"),))] >= 1
    assert m[("helios_graph_launches_total", (("operation", "decode"),))] >= 4
    # one request at a time: every decode step fills the 1-row variant
    assert m[("helios_decode_rows_total", ())] == 8 + 2
    assert m[("helios_decode_padded_rows_total", ())] == 0
    assert m[("helios_time_to_first_token_seconds_count", ())] == 2
    assert m[("helios_inter_token_latency_seconds_count", ())] == 8
    assert m[("helios_e2e_request_latency_seconds_count", ())] == 2
    assert m[("helios_prefix_cache_queries_total", ())] == 2
    assert m[("helios_cache_pages_published_total", ())] > 0
    assert m[("helios_preemptions_total", ())] == 0
    assert m[("helios_prefix_cache_hit_tokens_total", ())] > 0  # the second prompt is the same
    assert m[("helios_snapshot_publications_total", ())] == 0
    assert m[("helios_snapshot_evictions_total", ())] == 0
    assert m[("helios_cache_pages_capacity", ())] == 256
    assert m[("helios_cache_pages_used", ())] == 0
    # the prompts' published pages outlive the requests, reusable (the second prompt hit)
    assert m[("helios_cache_pages_evictable", ())] == m[("helios_cache_pages_published_total", ())]
    assert m[("helios_http_admission_permits_in_use", ())] == 0
    assert m[("helios_http_admission_permits_capacity", ())] == 12
    # Labels carry bounded enumerations only: no ids, prompts or token ids.
    # The gateway's info gauges carry configuration (test_gateway_metrics.py).
    allowed = {"reason", "operation", "le", "source", "position", "max_lora",
               "running_lora_adapters", "waiting_lora_adapters", "block_size", "num_gpu_blocks"}
    assert all(set(dict(labels)) <= allowed for _, labels in m)


def test_structured_output_masks_and_flare_metrics(tok):
    with ScriptedServer(tok, max_active=4, step_delay_s=0.01) as server:
        server.book.add("json please", tok.byte_ids(b'{"city": "Paris"}'))
        server.script("plain", ["Hello", ",", " world", "!"] * 5)
        out = {}

        def constrained() -> None:
            r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json=_chat(
                server, "json please", response_format={"type": "json_object"}))
            out["json"] = r.json()

        def plain() -> None:
            r = httpx.post(server.url + "/v1/chat/completions", json=_chat(server, "plain"),
                           timeout=30)
            out["plain"] = r.json()

        threads = [threading.Thread(target=plain), threading.Thread(target=constrained)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert out["json"]["choices"][0]["message"]["content"] == '{"city": "Paris"}'
        assert out["plain"]["choices"][0]["message"]["content"] == "Hello, world!" * 5
        assert server.model.masked_rows >= len(b'{"city": "Paris"}')
        m = _samples(httpx.get(server.url + "/metrics").text)
        assert m[("flare_constrained_max_inflight", ())] == 1
        assert m[("flare_mixed_grammar_decode_steps_total", ())] >= 1
        server.wait_idle()
