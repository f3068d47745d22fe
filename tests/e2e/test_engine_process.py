"""helios-serve --engine-process (docs/serving.md, "Design: engine process + frontend
process"): the same answers, statuses and metrics as the one-process server, a dropped
reader cancelled through the channel, and the engine process's death failing live
requests and /health instead of hanging.

The tiny model serves real weights on the CPU in both modes (tests/e2e/conftest.py);
greedy and seeded answers are deterministic, so each request's response in the engine
mode is compared field for field with the one-process server's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.tiny_model import serve_error_line

SERVE = os.path.join(os.path.dirname(sys.executable), "helios-serve")
MODEL = "tiny-served"
REAL = "smollm2"  # the real SmolLM2 core's alias (recipes/smollm2_135m_instruct.py)
HELLO = [{"role": "user", "content": "hello"}]


def _post(server, path: str, body: dict) -> tuple[int, object]:
    r = httpx.post(server.url + path, json=body, timeout=120)
    return r.status_code, r.json()


def _stream(server, path: str, body: dict) -> tuple[int, list]:
    events = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=120) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, [r.json()]
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return 200, events


def _normal(value):
    """A response without what differs between two servers by design: ids, creation
    times, tool-call ids, prefix-cache hits (each server's cache history) and logprob
    rounding (a cached prompt sums in another order)."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()
                if k not in ("id", "created", "prompt_tokens_details")}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    if isinstance(value, float):
        return round(value, 3)
    return value


def _accumulated(events: list) -> dict:
    """A stream's content per choice (chunk boundaries follow delivery timing, which
    differs between the two servers): text, logprob entries, token ids, finish reason."""
    choices: dict[int, dict] = {}
    for event in events:
        if event == "[DONE]":
            choices[-1] = {"done": True}
            continue
        for c in event.get("choices") or ():
            acc = choices.setdefault(c["index"], {"text": "", "logprobs": [], "ids": [],
                                                  "finish_reason": None})
            delta = c.get("delta") or {}
            acc["text"] += c.get("text") or delta.get("content") or ""
            logprobs = c.get("logprobs") or {}
            acc["logprobs"] += logprobs.get("content") or logprobs.get("tokens") or []
            acc["ids"] += c.get("token_ids") or []
            acc["finish_reason"] = c.get("finish_reason") or acc["finish_reason"]
    return choices


def _chat(**kw) -> dict:
    return {"model": MODEL, "messages": HELLO, "max_tokens": 12, "temperature": 0, **kw}


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}
REQUESTS = {
    "chat": ("/v1/chat/completions", _chat()),
    "chat_seeded_n2": ("/v1/chat/completions", _chat(temperature=0.8, seed=7, n=2)),
    "chat_logprobs": ("/v1/chat/completions", _chat(logprobs=True, top_logprobs=2)),
    "chat_token_ids": ("/v1/chat/completions", _chat(return_token_ids=True,
                                                     ignore_eos=True, max_tokens=20)),
    "json_schema": ("/v1/chat/completions", _chat(max_tokens=24, response_format={
        "type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}})),
    "json_object": ("/v1/chat/completions", _chat(max_tokens=16,
                                                  response_format={"type": "json_object"})),
    "completions_prompts_n2": ("/v1/completions", {
        "model": MODEL, "prompt": ["once upon", "a time"], "n": 2, "max_tokens": 6,
        "temperature": 0.8, "seed": 1, "logprobs": 1}),
}


@pytest.mark.parametrize("name", list(REQUESTS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_engine_process_answers_as_the_one_process_server(tiny_thread_server,
                                                          tiny_engine_server, name, stream):
    path, body = REQUESTS[name]
    if stream:
        (status, events), (got_status, got) = (_stream(s, path, body) for s in
                                               (tiny_thread_server, tiny_engine_server))
        assert status == got_status == 200, events
        assert _normal(_accumulated(got)) == _normal(_accumulated(events))
        assert got[-1] == "[DONE]"
    else:
        expected = _post(tiny_thread_server, path, body)
        assert expected[0] == 200, expected
        assert _normal(_post(tiny_engine_server, path, body)) == _normal(expected)


def test_every_other_endpoint_answers_as_the_one_process_server(tiny_thread_server,
                                                                tiny_engine_server):
    calls = [("GET", "/v1/models", None), ("GET", f"/v1/models/{MODEL}", None),
             ("GET", "/v1/models/nope", None), ("GET", "/version", None),
             ("GET", "/health", None),
             ("POST", "/tokenize", {"model": MODEL, "messages": HELLO}),
             ("POST", "/tokenize", {"model": MODEL, "prompt": "once upon a time"}),
             ("POST", "/detokenize", {"model": MODEL, "tokens": [40, 41, 42]}),
             ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HELLO,
                                               "max_tokens": 9999}),
             ("POST", "/v1/chat/completions", {"model": MODEL, "messages": "x"}),
             ("POST", "/v1/chat/completions", _chat(tools=[TOOL])),
             ("POST", "/v1/chat/completions", _chat(tools=[TOOL], tool_choice="required"))]
    for method, path, body in calls:
        one, split = (httpx.request(method, s.url + path, json=body, timeout=60)
                      for s in (tiny_thread_server, tiny_engine_server))
        assert (split.status_code, _normal(split.json())) == \
            (one.status_code, _normal(one.json())), path


def _ids_and_text(server) -> tuple[list[int], str]:
    status, body = _post(server, "/v1/chat/completions",
                         _chat(max_tokens=20, ignore_eos=True, return_token_ids=True))
    assert status == 200, body
    choice = body["choices"][0]
    return choice["token_ids"], choice["message"]["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_host_stops_run_in_the_engine_and_answer_alike(tiny_thread_server, tiny_engine_server,
                                                       stream):
    """String and token stops need host feedback: their pipelines run in the engine."""
    ids, text = _ids_and_text(tiny_thread_server)
    assert _ids_and_text(tiny_engine_server) == (ids, text)
    stop_text = text[len(text) // 2:len(text) // 2 + 2]
    for extra in ({"stop": [stop_text]}, {"stop_token_ids": [ids[5]]}):
        body = _chat(max_tokens=20, ignore_eos=True, **extra)
        if stream:
            expected = _accumulated(_stream(tiny_thread_server, "/v1/chat/completions", body)[1])
            got = _accumulated(_stream(tiny_engine_server, "/v1/chat/completions", body)[1])
            assert got == expected and got[0]["finish_reason"] == "stop", got
            continue
        expected = _post(tiny_thread_server, "/v1/chat/completions", body)
        got = _post(tiny_engine_server, "/v1/chat/completions", body)
        assert _normal(got) == _normal(expected)
        if not stream:
            choice = got[1]["choices"][0]
            assert choice["finish_reason"] == "stop" and len(choice["message"]["content"]) < \
                len(text), got


def _samples(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_have_the_same_names_and_labels_and_gauges_move(tiny_thread_server,
                                                                tiny_engine_server):
    one, split = _samples(tiny_thread_server), _samples(tiny_engine_server)
    assert set(split) == set(one)
    for key in [k for k in one if k[0].endswith("_capacity") or k[0] ==
                "helios_execution_frames" or k[0] == "helios_runtime_resources"]:
        assert split[key] == one[key], key  # set by the engine's worker and backend
    before = _samples(tiny_engine_server)
    done = threading.Event()
    body = _chat(max_tokens=200, ignore_eos=True)
    reader = threading.Thread(target=lambda: (_post(tiny_engine_server,
                                                    "/v1/chat/completions", body), done.set()))
    reader.start()
    running = []
    while not done.is_set():
        running.append(_samples(tiny_engine_server)[("helios_requests_running", ())])
        time.sleep(0.01)
    reader.join()
    assert max(running) == 1.0  # the engine's gauge, read through the frontend's /metrics
    deadline = time.monotonic() + 10  # the idle worker publishes its gauges at once
    while (after := _samples(tiny_engine_server))[("helios_requests_running", ())] != 0.0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert after[("helios_generation_tokens_total", ())] - \
        before[("helios_generation_tokens_total", ())] == 200
    assert after[("helios_requests_finished_total", (("reason", "length"),))] - \
        before[("helios_requests_finished_total", (("reason", "length"),))] == 1
    assert after[("helios_requests_received_total", ())] - \
        before[("helios_requests_received_total", ())] == 1


def test_a_dropped_stream_cancels_through_the_channel(tiny_engine_server):
    key = ("helios_requests_finished_total", (("reason", "cancelled"),))
    before = _samples(tiny_engine_server)[key]
    body = _chat(max_tokens=220, ignore_eos=True, stream=True)
    with httpx.stream("POST", tiny_engine_server.url + "/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()
        while not next(lines).startswith("data: "):
            pass
    deadline = time.monotonic() + 30
    while True:
        samples = _samples(tiny_engine_server)
        if samples[key] == before + 1 and samples[("helios_requests_running", ())] == 0:
            break
        assert time.monotonic() < deadline, samples[key]
        time.sleep(0.05)
    # The generation stopped early: far fewer than 240 tokens of it were generated.
    assert httpx.get(tiny_engine_server.url + "/health").status_code == 200


def test_tool_calls_finish_reason_is_the_frontend_parsers():
    """A relayed choice's tokens reach the frontend pipeline; EOS after a parsed call
    ends it with tool_calls (the engine's Finished said stop), counted once, there."""
    from helios_serve.engine_client import EngineClient, _Remote
    from helios_serve.engine_process import TokenRelay
    from helios_serve.events import ChoiceState, EventSink, Finished, FinishReason, Output
    from helios_serve.frontend.pipeline import Frontend
    from helios_serve.frontend.syntax import (
        CHATML_BOUNDARIES,
        JSON_IN_TAGS,
        FrontendSyntax,
        ReasoningParser,
        ToolParser,
    )
    from helios_serve.frontend.testing import ScriptTokenizer
    from helios_serve.frontend.testing import Special as S
    from helios_serve.metrics import Metrics
    from helios_serve.wire import encode_event

    st = ScriptTokenizer(["<tool_call>", "</tool_call>", "<|eos|>"])
    eos = st.special_id("<|eos|>")
    syntax = FrontendSyntax(tool_parser=ToolParser.JSON_IN_TAGS,
                            reasoning_parser=ReasoningParser.NONE, tool_syntax=JSON_IN_TAGS,
                            assistant_boundaries=CHATML_BOUNDARIES)
    fe = Frontend(syntax, st.tokenizer, [eos])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}]
    ids = st.ids([S("<tool_call>"), *'{"name": "f", "arguments": {"x": 1}}',
                  S("</tool_call>"), S("<|eos|>")])

    async def run():
        relay = TokenRelay(frozenset([eos]))  # the engine side
        engine_events = [Output(tuple(relay.feed(t)), 0, (), i + 1) for i, t in enumerate(ids)]
        assert relay.finish_reason is FinishReason.STOP
        engine_events.append(Finished(relay.finish_reason, 3, len(ids), 0))
        client = EngineClient(None, None, None)
        client.metrics = Metrics()
        sink = EventSink(asyncio.get_running_loop())
        request = type("R", (), {"sink": sink, "choices": (
            ChoiceState(0, None, fe.output_pipeline(tools=tools), None),)})()
        client._live[5] = _Remote(request, 1, True, 0, [request.choices[0].pipeline])
        client._handle([0, [[5, [encode_event(e) for e in engine_events]]]])
        assert 5 not in client._live  # its last choice finished
        return sink.drain(), client.metrics

    events, metrics = asyncio.run(run())
    assert type(events[-1]) is Finished and events[-1].reason is FinishReason.TOOL_CALLS
    starts = [d for e in events if type(e) is Output for d in e.deltas
              if type(d).__name__ == "ToolCallStart"]
    assert [d.name for d in starts] == ["f"]
    assert metrics.requests_finished.labels("tool_calls")._value.get() == 1


def test_the_engines_final_snapshot_outlives_it():
    """An engine that exits in order (Stop, or its worker crashed) sends its metrics
    last; once it is gone the frontend's /metrics serves them: counters as sent, the
    engine's gauges 0 but for the lifetime maximum, the frontend's own share added."""
    from helios_serve.engine_client import EngineClient
    from helios_serve.metrics import Metrics, engine_families
    from helios_serve.wire import FINAL_SNAPSHOT, METRICS_REPLY, encoder, to_frontend_decoder

    engine = Metrics()  # the engine's registry as it exits
    engine.requests_finished.labels("error").inc(3)  # the requests its worker failed
    engine.generation_tokens.inc(40)
    engine.requests_running.set(2)
    engine.pages_capacity.set(64)
    engine.constrained_max_inflight.set(1)

    async def scrape_after_exit() -> list:
        client = EngineClient(None, None, None)
        client._loop = asyncio.get_running_loop()
        client._handle(to_frontend_decoder.decode(encoder.encode(
            [METRICS_REPLY, FINAL_SNAPSHOT, engine_families(engine)])))
        client.crashed = "the engine process exited (exit code 1)"
        return await client.scrape()

    frontend = Metrics()
    frontend.requests_received.inc(5)
    text = frontend.render(asyncio.run(scrape_after_exit()))[0].decode()
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(text) for s in family.samples}
    assert got[("helios_requests_finished_total", (("reason", "error"),))] == 3
    assert got[("helios_generation_tokens_total", ())] == 40
    assert got[("helios_requests_received_total", ())] == 5
    assert got[("helios_requests_running", ())] == 0
    assert got[("helios_cache_pages_capacity", ())] == 0
    assert got[("flare_constrained_max_inflight", ())] == 1


# ---- startup failures and the engine process's death (a server of its own) ----


@pytest.mark.parametrize("extra", [["--backend", "cuda"], ["--history-drafting"]],
                         ids=["cuda", "history"])
def test_an_engine_startup_failure_is_the_same_line_and_exit_code(tiny_served, extra):
    core = tiny_served.core
    command = [SERVE, str(core.path), "--trust", str(core.public_key), "--accept",
               core.namespace, "--port", "0", *extra]
    one = subprocess.run(command, capture_output=True, text=True, timeout=120)
    split = subprocess.run([*command, "--engine-process"], capture_output=True, text=True,
                           timeout=120)
    assert one.returncode == split.returncode == 2
    assert serve_error_line(split.stderr) == serve_error_line(one.stderr)


def test_engine_process_refuses_process_ranks(tiny_served):
    core = tiny_served.core
    r = subprocess.run([SERVE, str(core.path), "--trust", str(core.public_key), "--accept",
                        core.namespace, "--port", "0", "--engine-process", "--world", "2",
                        "--peers", "127.0.0.1:1,127.0.0.1:2", "--rank-key", "/nonexistent"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert serve_error_line(r.stderr) == \
        "helios-serve: error: --engine-process does not serve process ranks (--world) yet"


def _typed_samples(server) -> dict[tuple[str, tuple], tuple[str, float]]:
    """/metrics as {(sample name, labels): (family type, value)}; a counter's or
    histogram's `_created` sample (the text parser's gauge family) is "created"."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))):
            ("created" if s.name.endswith("_created") else family.type, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples}


FRONTEND_GAUGES = ("helios_http_admission_permits_in_use",
                   "helios_http_admission_permits_capacity", "helios_engine_stalled",
                   "helios_engine_stalled_seconds", "helios_engine_metrics_stale")
FINISHED = "helios_requests_finished_total"


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))][1]


def _load(samples: dict[tuple[str, tuple], float]) -> tuple[float, float]:
    """(requests running, requests waiting) in `_samples`' output."""
    return samples[("helios_requests_running", ())], samples[("helios_requests_waiting", ())]


@pytest.fixture(scope="module")
def engine_death(smollm2_core_f32):
    """One engine-process server (two slots, a queue of one) through its engine's death,
    recorded: a finished request, then a stream of n=2 on both slots and a JSON request
    waiting in the engine's queue, a 503 from that full queue, /metrics (`before`), the
    engine's SIGKILL, /metrics once the frontend saw it (`after_kill`), a request
    refused, /metrics again (`after_refusal`).

    The real SmolLM2 (not the tiny model): the stream must still hold both slots through
    the requests and scrapes that follow its first event. The tiny model's 220 tokens
    (its context is 256) took well under a second, and on a busy machine the stream had
    finished before the queue-full request, which then got a 200. SmolLM2's 2,000-token
    stream runs for tens of seconds; the engine's SIGKILL ends it long before."""
    from helios_serve.cli import start
    from helios_serve.config import ServeOptions

    core = smollm2_core_f32
    server = start(core.path, [str(core.public_key)], core.namespace,
                   ServeOptions(port=0, max_active=2, queue_capacity=1, engine_process=True))
    server.serve_in_background()
    out = {"health_before": httpx.get(server.url + "/health").status_code}
    try:
        out["finished"] = _post(server, "/v1/chat/completions",
                                _chat(model=REAL, max_tokens=12, ignore_eos=True))
        body = _chat(model=REAL, max_tokens=2000, ignore_eos=True, stream=True, n=2,
                     temperature=0.8, seed=1)
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                          timeout=60) as r:
            assert r.status_code == 200, r.read()
            lines = r.iter_lines()
            while not next(lines).startswith("data: "):
                pass
            # Both slots run; a JSON request waits in the engine's queue (of one).
            waiting: list = []
            queued = threading.Thread(target=lambda: waiting.append(
                _post(server, "/v1/chat/completions", _chat(model=REAL))))
            queued.start()
            deadline = time.monotonic() + 30
            while _load(_samples(server)) != (2, 1):  # the second choice may start later
                assert time.monotonic() < deadline, _load(_samples(server))
                time.sleep(0.01)
            # The queue cannot take two more choices: the engine's Rejected is a 503.
            out["queue_full"] = _post(server, "/v1/chat/completions",
                                      _chat(model=REAL, n=2, temperature=0.8, seed=2))
            out["before"] = _typed_samples(server)  # the engine's last scrape
            os.kill(server.engine.pid, signal.SIGKILL)
            out["rest"] = [line for line in lines if line.startswith("data: ")]
        queued.join(30)
        out["waiting"] = waiting[0]
        health = httpx.get(server.url + "/health")
        out["health_after"] = (health.status_code, health.json())
        out["after_kill"] = _typed_samples(server)
        out["refused"] = _post(server, "/v1/chat/completions", _chat(model=REAL))
        out["after_refusal"] = _typed_samples(server)
        out["metrics_status"] = httpx.get(server.url + "/metrics").status_code
    finally:
        server.stop()
        server.bootstrap.close()
    return out


def test_engine_rejection_is_503_and_its_death_fails_requests_and_health(engine_death):
    run = engine_death
    assert run["health_before"] == 200
    assert run["finished"][0] == 200, run["finished"]
    status, rejected = run["queue_full"]
    assert status == 503, rejected
    assert rejected["error"]["message"] == "the admission queue is full (1 waiting)"
    # The engine died: the live stream got one SSE error event and no [DONE], the
    # waiting JSON request a 500.
    assert run["waiting"][0] == 500, run["waiting"]
    assert run["waiting"][1]["error"]["message"] == "the engine process exited (exit code -9)"
    rest = run["rest"]
    errors = [json.loads(line[6:]) for line in rest if '"error"' in line]
    assert rest[-1] != "data: [DONE]" and len(errors) == 1, rest[-3:]
    assert errors[0]["error"]["message"] == "the engine process exited (exit code -9)"
    status, health = run["health_after"]
    assert status == 503 and health["status"] == "unhealthy"
    status, body = run["refused"]
    assert status == 503 and body["error"]["message"] == "the model worker is not running"
    assert run["metrics_status"] == 200


def test_engine_counters_survive_its_death_and_its_gauges_read_zero(engine_death):
    """Counters and histograms keep the engine's last scrape (a Prometheus counter never
    goes backwards while the server lives); the engine's gauges read 0 once it is gone."""
    before, after = engine_death["before"], engine_death["after_kill"]
    assert set(after) == set(before)
    assert _value(before, "helios_requests_running") == 2  # the stream's two choices
    assert _value(before, "helios_requests_waiting") == 1
    assert _value(before, "helios_cache_pages_used") > 0
    assert _value(before, "helios_cache_pages_capacity") > 0
    assert _value(before, FINISHED, reason="length") == 1
    # At least the finished request's 12 tokens and one token of each streamed choice.
    assert _value(before, "helios_generation_tokens_total") >= 14
    assert _value(before, "helios_graph_launches_total", operation="decode") >= 12
    changed = {(FINISHED, (("reason", "error"),))}  # the failed requests (next test)
    for key, (kind, value) in before.items():
        if kind == "gauge" or key in changed:
            continue
        assert after[key] == (kind, value), key  # counters, histograms: the last scrape
    gauges = {key: value for key, (kind, value) in after.items() if kind == "gauge"}
    assert gauges[("helios_http_admission_permits_capacity", ())] == 3  # the frontend's
    # The engine's part is its last scrape, marked stale (docs/api.md, "Engine liveness");
    # a dead engine has no work to stall on.
    assert _value(before, "helios_engine_metrics_stale") == 0
    assert gauges[("helios_engine_metrics_stale", ())] == 1
    assert gauges[("helios_engine_stalled", ())] == 0
    assert gauges[("flare_constrained_max_inflight", ())] == \
        _value(before, "flare_constrained_max_inflight")  # a lifetime maximum
    engine_gauges = {key: value for key, value in gauges.items()
                     if key[0] not in FRONTEND_GAUGES
                     and key[0] != "flare_constrained_max_inflight"}
    assert "helios_runtime_resources" in {key[0] for key in engine_gauges}
    assert set(engine_gauges.values()) == {0.0}, engine_gauges


def test_the_requests_its_death_fails_are_counted_finished_error(engine_death):
    """The stream (one request of two choices) and the queued JSON request failed: two
    requests finished with reason error, nothing else finished."""
    before, after = engine_death["before"], engine_death["after_kill"]
    assert _value(before, FINISHED, reason="error") == 0
    assert _value(after, FINISHED, reason="error") == 2
    for reason in ("stop", "length", "tool_calls", "cancelled"):
        assert _value(after, FINISHED, reason=reason) == \
            _value(before, FINISHED, reason=reason), reason


def test_requests_refused_after_its_death_are_not_admitted(engine_death):
    """A request after the engine's death is refused at admission (503): received and
    rejected (reason scheduler, as the one-process server's 503s), never admitted."""
    before, killed, after = (engine_death[k] for k in ("before", "after_kill",
                                                       "after_refusal"))
    received, admitted = "helios_requests_received_total", "helios_requests_admitted_total"
    rejected = "helios_requests_rejected_total"
    # Before: finished, stream, waiting, queue-full (rejected by the engine) admitted.
    assert (_value(before, received), _value(before, admitted)) == (4, 4)
    assert _value(before, rejected, reason="scheduler") == 1
    assert (_value(killed, received), _value(killed, admitted)) == (4, 4)
    assert (_value(after, received), _value(after, admitted)) == (5, 4)
    assert _value(after, rejected, reason="scheduler") == 2
    assert _value(after, rejected, reason="ingress_full") == 0
    assert {k: v for k, v in after.items() if k[0] not in (received, rejected)} == \
        {k: v for k, v in killed.items() if k[0] not in (received, rejected)}
