"""Admission limits, status codes, execution faults and cancellation over real HTTP
(the specification, admission paragraphs)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import openai
import pytest
from helios_serve.testing.harness import ScriptedServer, content_of, sse_post

LONG = ["Hello", ",", " world", "!"] * 40  # 160 tokens


def _chat(server, prompt: str = "hi", **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}], **extra}


def _post(server, body, timeout_s: float = 30.0) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=timeout_s)


def test_overload_every_request_gets_a_terminal_answer(tok):
    with ScriptedServer(tok, max_active=2, queue_capacity=2, step_delay_s=0.005) as server:
        server.script("work", ["Hello", ",", " world", "!"] * 3)
        results: list[tuple[str, int, object]] = []
        lock = threading.Lock()

        def non_stream(i: int) -> None:
            r = _post(server, _chat(server, f"work {i}"))
            with lock:
                results.append(("json", r.status_code, r.json()))

        def stream(i: int) -> None:
            status, events = sse_post(server.url, _chat(server, f"work {i}", stream=True))
            with lock:
                results.append(("sse", status, events))

        threads = [threading.Thread(target=non_stream, args=(i,)) for i in range(20)]
        threads += [threading.Thread(target=stream, args=(i,)) for i in range(5)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        assert time.monotonic() - start < 60
        assert len(results) == 25
        expected = "Hello, world!" * 3
        served = 0
        for kind, status, body in results:
            assert status in (200, 429, 503), (kind, status, body)
            if kind == "json" and status == 200:
                assert body["choices"][0]["message"]["content"] == expected
                served += 1
            elif status in (429, 503):
                error = body[0] if kind == "sse" else body
                # A JSON error body (before headers), OpenAI's code string or null.
                assert error["error"]["code"] == {429: "rate_limit_exceeded", 503: None}[status]
            else:  # a stream under 200: completed, or one terminal error without [DONE]
                if body[-1] == "[DONE]":
                    assert content_of(body) == expected
                    served += 1
                else:
                    assert "error" in body[-1]
                    assert sum(1 for e in body if isinstance(e, dict) and "error" in e) == 1
        assert served >= 4  # at least queue_capacity + max_active were admitted and served
        assert any(status == 429 for _, status, _ in results)
        snap = server.wait_idle()
        assert snap["pages_used"] == 0 and snap["slots_free"] == 2
        # A follow-up request succeeds.
        r = _post(server, _chat(server, "work again"))
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == expected
        server.wait_idle()


def test_429_when_queue_capacity_plus_max_active_are_admitted(tok):
    # 0.1 s steps: the two held streams (160 tokens) run for 16 s, long past the checks
    # below even on a loaded machine (their bytes fit the socket buffers unread).
    with ScriptedServer(tok, max_active=1, queue_capacity=1, step_delay_s=0.1) as server:
        server.script("long", LONG)
        held = []
        for i in range(2):  # fill the HTTP capacity with two open streams
            client = httpx.Client(timeout=30)
            cm = client.stream("POST", server.url + "/v1/chat/completions",
                               json=_chat(server, f"long {i}", stream=True))
            response = cm.__enter__()
            assert response.status_code == 200
            lines = response.iter_lines()  # keep the iterator: dropping it closes the stream
            next(lines)  # the role chunk: admitted
            held.append((client, cm, lines))
        r = _post(server, _chat(server, "short"))
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        with pytest.raises(openai.RateLimitError):
            server.openai().chat.completions.create(
                model=server.model_name, messages=[{"role": "user", "content": "short"}])
        assert server.server.service.admission.in_use == 2
        for client, cm, _ in held:
            cm.__exit__(None, None, None)  # the readers drop their responses
            client.close()
        server.wait_idle()
        assert _post(server, _chat(server, "short")).status_code == 200


def test_scheduler_rejection_is_503_before_headers(scripted):
    # prompt + max_tokens beyond the 256-token context: outside the prepared capacities.
    r = _post(scripted, _chat(scripted, max_tokens=1000))
    assert r.status_code == 503
    assert r.headers["x-should-retry"] == "false"
    assert r.json()["error"] == {
        "message": "prompt is too long: prompt 21 + max output 1000 tokens exceeds the "
                   "context of 256 tokens",
        "type": "admission_rejected", "param": "max_tokens", "code": "context_length_exceeded"}
    # The official client honours x-should-retry: it raises at once (one request, no
    # retries, although it would retry a 503 twice by default).
    before = scripted.server.metrics.requests_received._value.get()
    client = openai.OpenAI(base_url=scripted.url + "/v1", api_key="unused", timeout=30)
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(
            model=scripted.model_name, messages=[{"role": "user", "content": "hi"}],
            max_tokens=1000)
    assert info.value.status_code == 503 and info.value.code == "context_length_exceeded"
    assert scripted.server.metrics.requests_received._value.get() == before + 1
    # Rejection disturbs nothing: the next request is served and the server is healthy.
    assert _post(scripted, _chat(scripted)).status_code == 200
    assert httpx.get(scripted.url + "/health").status_code == 200
    scripted.wait_idle()



@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"max_tokens": 1000}, "max_tokens"),
        ({"max_completion_tokens": 1000}, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "hi " * 300}]}, "messages"),
        ({"messages": [{"role": "user", "content": "hi " * 300}], "max_tokens": 5}, "messages"),
    ],
    ids=["max_tokens", "max_completion_tokens", "long prompt", "long prompt and max_tokens"],
)
def test_capacity_rejection_names_the_field(scripted, patch, param):
    # context 256: a request beyond it can never be admitted; it is decided at
    # preparation, so a stream gets the same 503 and JSON body before any SSE byte
    # (docs/api.md), and param names the field at fault.
    r = _post(scripted, {**_chat(scripted), **patch})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["type"] == "admission_rejected"
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == "context_length_exceeded"
    status, events = sse_post(scripted.url, {**_chat(scripted, stream=True), **patch})
    assert status == 503 and events == [r.json()]
    scripted.wait_idle()


def test_queue_full_after_headers_is_one_distinct_error_event(tok):
    """A rejection known only once the worker sees the request (its admission queue is
    full) comes after the SSE headers: one terminal admission_rejected event."""
    from helios_serve.events import Rejected

    with ScriptedServer(tok) as server:
        worker = server.server.worker
        admit = worker._admit
        worker._admit = lambda request: worker._reject(request, "the admission queue is full (8 waiting)")
        status, events = sse_post(server.url, _chat(server, stream=True))
        worker._admit = admit
        assert status == 200
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert "[DONE]" not in events
        errors = [e for e in events if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1 and events[-1] is errors[0]
        assert errors[0]["error"] == {"message": "the admission queue is full (8 waiting)",
                                      "type": "admission_rejected", "param": None, "code": None}
        assert Rejected("x").reason is None
        server.wait_idle()


def test_fault_after_headers_stream_and_json(scripted):
    scripted.script("boom", ["Hello", "!"])
    trigger = scripted.tok.tokenizer.encode("boom", add_special_tokens=False).ids

    def contains_trigger(seq):
        n = len(trigger)
        return any(tuple(seq[i : i + n]) == tuple(trigger) for i in range(len(seq) - n + 1))

    scripted.model.fail_on_sequence(contains_trigger)
    status, events = sse_post(scripted.url, _chat(scripted, "boom", stream=True))
    assert status == 200
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"  # the role chunk came first
    assert "[DONE]" not in events
    errors = [e for e in events if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and events[-1] is errors[0]
    assert errors[0]["error"]["type"] == "server_error" and errors[0]["error"]["code"] is None
    assert content_of(events) == ""  # the fault came before the first token
    with pytest.raises(openai.APIError):  # the official client raises on the error event
        list(scripted.openai().chat.completions.create(
            model=scripted.model_name, messages=[{"role": "user", "content": "boom"}],
            stream=True))
    r = _post(scripted, _chat(scripted, "boom"))
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    # The worker keeps serving others.
    r = _post(scripted, _chat(scripted, "fine"))
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == (
        "Hello, world!")
    assert httpx.get(scripted.url + "/health").status_code == 200
    snap = scripted.wait_idle()
    assert snap["pages_used"] == 0


def test_fault_mid_generation_fails_only_that_step(scripted):
    scripted.script("midway", LONG)
    scripted.model.fail_at_step(scripted.model.steps + 5)
    status, events = sse_post(scripted.url, _chat(scripted, "midway", stream=True))
    assert status == 200 and "[DONE]" not in events
    assert events[-1]["error"]["type"] == "server_error"
    assert content_of(events).startswith("Hello")
    scripted.wait_idle()
    assert _post(scripted, _chat(scripted)).status_code == 200


def test_stream_disconnect_cancels_and_returns_pages(tok):
    with ScriptedServer(tok, step_delay_s=0.01) as server:
        server.script("long", LONG)
        with httpx.stream("POST", server.url + "/v1/chat/completions",
                          json=_chat(server, "long", stream=True, max_tokens=150),
                          timeout=30) as r:
            lines = r.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: ") and '"content":"Hello"' in line:
                    seen += 1
                    if seen == 3:
                        break
            assert server.server.worker.snapshot()["pages_used"] > 0
        # Leaving the block closes the connection mid-stream.
        snap = server.wait_idle()
        assert snap["pages_used"] == 0 and snap["running"] == 0
        assert server.model.steps < 100  # generation stopped early (150 were allowed)
        metrics = httpx.get(server.url + "/metrics").text
        assert 'helios_requests_finished_total{reason="cancelled"} 1.0' in metrics


def test_json_disconnect_cancels(tok, caplog):
    with ScriptedServer(tok, step_delay_s=0.01) as server:
        server.script("long", LONG)
        with pytest.raises(httpx.ReadTimeout):
            _post(server, _chat(server, "long", max_tokens=150), timeout_s=0.3)
        snap = server.wait_idle()
        assert snap["pages_used"] == 0
        assert server.model.steps < 100  # generation stopped early (150 were allowed)
    # A client leaving is routine: no error record, no traceback in the server log.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_raw_socket_drop_before_reading(tok):
    """A client that sends a streaming request and closes at once leaves nothing behind."""
    with ScriptedServer(tok, step_delay_s=0.01) as server:
        server.script("long", LONG)
        body = json.dumps(_chat(server, "long", stream=True)).encode()
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
            time.sleep(0.1)
        server.wait_idle()


def test_preparation_failure_releases_the_permit(scripted):
    r = _post(scripted, _chat(scripted, stop=["a"] * 5))
    assert r.status_code == 400
    snap = scripted.wait_idle()
    assert snap["permits"] == 0


def test_paused_reader_loses_nothing_and_blocks_no_one(tok):
    with ScriptedServer(tok, step_delay_s=0.002) as server:
        server.script("long", LONG)
        client = httpx.Client(timeout=30)
        with client.stream("POST", server.url + "/v1/chat/completions",
                           json=_chat(server, "long", stream=True, max_tokens=160)) as r:
            lines = r.iter_lines()
            next(lines)  # admitted; now pause while the whole output is generated
            other = _post(server, _chat(server, "other"))
            assert other.json()["choices"][0]["message"]["content"] == "Hello, world!"
            deadline = time.monotonic() + 20
            while server.server.worker.snapshot()["live"] and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.server.worker.snapshot()["pages_used"] == 0  # finished generating
            text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                           for line in lines
                           if line.startswith("data: {") and '"choices":[{' in line)
        client.close()
        assert text == "".join(LONG)
        server.wait_idle()


def test_worker_crash_is_unhealthy_and_refuses_requests(tok):
    """The request the crash fails is finished{reason="error"}; a request after it is
    refused at admission: received and rejected (scheduler), never admitted."""
    with ScriptedServer(tok) as server:
        worker = server.server.worker
        m = server.server.metrics

        def counts() -> tuple[float, ...]:
            return (m.requests_received._value.get(), m.requests_admitted._value.get(),
                    m.requests_rejected.labels("scheduler")._value.get(),
                    m.requests_finished.labels("error")._value.get())

        def broken():
            raise RuntimeError("scheduler bug")

        worker.scheduler.schedule = broken
        assert counts() == (0, 0, 0, 0)
        status, events = sse_post(server.url, _chat(server, stream=True))
        assert status == 200 and events[-1]["error"]["type"] == "server_error"
        deadline = time.monotonic() + 5
        while worker.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        assert counts() == (1, 1, 0, 1)
        assert httpx.get(server.url + "/health").status_code == 503
        r = _post(server, _chat(server))
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "the model worker is not running"
        assert counts() == (2, 1, 1, 1)


def test_a_cancel_frees_queue_room_for_a_request_submitted_in_the_same_step(tok):
    """A queued request whose reader left and a newly admitted one reach the worker in
    the same step: the cancel frees the queue room first, so the new one is not a 503."""
    with ScriptedServer(tok, max_active=1, queue_capacity=1) as server:
        worker = server.server.worker
        server.script("long", LONG)
        steps = threading.Semaphore(0)
        gated = [True]

        def one_step_at_a_time(_plan) -> bool:
            if gated[0]:
                assert steps.acquire(timeout=20)
            return False

        server.model.fail_when(one_step_at_a_time)

        def wait_for(condition) -> None:
            deadline = time.monotonic() + 20
            while not condition():
                assert time.monotonic() < deadline, (worker._live, worker._ingress,
                                                     worker._cancels, server.model.steps)
                time.sleep(0.01)

        def open_stream(prompt: str):
            client = httpx.Client(timeout=30)
            cm = client.stream("POST", server.url + "/v1/chat/completions",
                               json=_chat(server, prompt, stream=True))
            response = cm.__enter__()
            assert response.status_code == 200
            lines = response.iter_lines()
            next(lines)  # the role chunk
            return client, cm, lines  # keep the iterator: dropping it closes the stream

        a = open_stream("long a")  # admitted; its prefill waits at the gate
        wait_for(lambda: len(worker._live) == 1 and not worker._ingress)
        b = open_stream("long b")  # in the ingress channel
        wait_for(lambda: len(worker._ingress) == 1)
        steps.release()  # A's prefill completes; B is admitted and waits for the slot
        wait_for(lambda: len(worker._live) == 2 and not worker._ingress)
        assert worker.scheduler.stats().waiting == 1
        b[1].__exit__(None, None, None)  # B's reader leaves while it is queued
        b[0].close()
        wait_for(lambda: len(worker._cancels) == 1)
        result: list[httpx.Response] = []
        c = threading.Thread(target=lambda: result.append(_post(server, _chat(server, "c"))))
        c.start()
        wait_for(lambda: len(worker._ingress) == 1)  # C is admitted by HTTP, not yet queued
        a[1].__exit__(None, None, None)  # A leaves too: C gets the slot once it is queued
        a[0].close()
        wait_for(lambda: len(worker._cancels) == 2)
        gated[0] = False
        steps.release()
        c.join(30)
        assert result and result[0].status_code == 200, result[0].text
        assert result[0].json()["choices"][0]["message"]["content"] == "Hello, world!"
        snap = server.wait_idle()
        assert snap["pages_used"] == 0


def test_grammar_mask_failure_fails_only_its_request(tok, monkeypatch):
    """A constrained request whose grammar cannot produce a mask fails alone (500); an
    unconstrained request in the same decode step is not disturbed."""
    from helios_serve.frontend.grammar import GrammarState

    calls = [0]
    fill_mask = GrammarState.fill_mask

    def failing_fill_mask(self, out_row):
        calls[0] += 1
        if calls[0] == 2:  # the first decode step: both requests share it
            raise RuntimeError("injected mask failure")
        return fill_mask(self, out_row)

    monkeypatch.setattr(GrammarState, "fill_mask", failing_fill_mask)
    with ScriptedServer(tok, max_active=4) as server:
        worker = server.server.worker
        server.book.add("json please", tok.byte_ids(b'{"city": "Paris"}'))
        server.script("plain", ["Hello", ",", " world", "!"] * 5)
        release = threading.Event()
        gated = [True]

        def hold_first_step(_plan) -> bool:
            if gated[0]:
                gated[0] = False
                assert release.wait(20)
            return False

        server.model.fail_when(hold_first_step)
        # A first request occupies the worker (held in its first step) while the two
        # requests under test arrive, so both are admitted in one prefill.
        blocker = threading.Thread(target=lambda: _post(server, _chat(server, "first")))
        blocker.start()
        deadline = time.monotonic() + 20
        while gated[0]:  # the worker is held in the first request's first step
            assert time.monotonic() < deadline
            time.sleep(0.01)
        out: dict[str, httpx.Response] = {}
        threads = [
            threading.Thread(target=lambda: out.__setitem__("plain", _post(
                server, _chat(server, "plain")))),
            threading.Thread(target=lambda: out.__setitem__("json", _post(
                server, _chat(server, "json please", response_format={"type": "json_object"})))),
        ]  # fmt: skip
        for t in threads:
            t.start()
        while len(worker._ingress) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        for t in [*threads, blocker]:
            t.join(30)
        assert calls[0] >= 2
        assert out["json"].status_code == 500, out["json"].text
        assert "mask" in out["json"].json()["error"]["message"]
        assert out["plain"].status_code == 200, out["plain"].text
        assert out["plain"].json()["choices"][0]["message"]["content"] == "Hello, world!" * 5
        snap = server.wait_idle()
        assert snap["pages_used"] == 0


def test_max_active_beyond_the_model_slots_is_capped_everywhere(tok):
    """--max-active above the captured slots (8 here) runs at most 8 requests, and HTTP
    admission counts the same 8: queue_capacity + 8 permits, not queue_capacity + 20
    (which let a burst through to the worker's queue as 503s instead of 429s)."""
    with ScriptedServer(tok, max_active=20, queue_capacity=2) as server:
        assert server.server.worker.geometry.slots == 8
        assert server.server.settings.max_active == 8
        assert server.server.service.admission.capacity == 10
        metrics = httpx.get(server.url + "/metrics").text
        assert "helios_http_admission_permits_capacity 10.0" in metrics
        assert _post(server, _chat(server)).status_code == 200
        server.wait_idle()


def test_a_request_that_a_free_slot_will_take_is_not_counted_as_queued(tok):
    """max_active 2, queue_capacity 1: with one request queued for a free slot, a third
    admitted request still fits (the queue holds requests waiting for a slot) and is
    served, not rejected with 503."""
    with ScriptedServer(tok, max_active=2, queue_capacity=1) as server:
        worker = server.server.worker
        steps = threading.Semaphore(0)
        gated = [True]

        def one_step_at_a_time(_plan) -> bool:
            if gated[0]:
                assert steps.acquire(timeout=20)
            return False

        server.model.fail_when(one_step_at_a_time)

        def wait_for(condition) -> None:
            deadline = time.monotonic() + 20
            while not condition():
                assert time.monotonic() < deadline
                time.sleep(0.01)

        results: dict[str, httpx.Response] = {}

        def post(name: str) -> threading.Thread:
            t = threading.Thread(
                target=lambda: results.__setitem__(name, _post(server, _chat(server, name)))
            )
            t.start()
            return t

        threads = [post("a")]  # A's prefill runs and waits at the gate
        wait_for(lambda: len(worker._live) == 1 and not worker._ingress)
        threads.append(post("b"))
        wait_for(lambda: len(worker._ingress) == 1)
        steps.release()  # A's prefill completes; B is queued; A's decode goes first
        wait_for(lambda: len(worker._live) == 2 and not worker._ingress)
        assert worker.scheduler.stats().waiting == 1 and worker.scheduler.stats().slots_free == 1
        threads.append(post("c"))
        wait_for(lambda: len(worker._ingress) == 1)
        gated[0] = False
        steps.release()
        for t in threads:
            t.join(30)
        for name in "abc":
            assert results[name].status_code == 200, (name, results[name].text)
            assert results[name].json()["choices"][0]["message"]["content"] == "Hello, world!"
        server.wait_idle()


def test_requests_arriving_during_a_step_take_free_slots_not_503(tok):
    """max_active 4, queue_capacity 1: while the worker executes a step (one slot busy),
    three admitted requests arrive. Three slots are free, so none is pending admission:
    all are served, none rejected because the hand-off channel holds more than one."""
    with ScriptedServer(tok, max_active=4, queue_capacity=1) as server:
        worker = server.server.worker
        release = threading.Event()
        gated = [True]

        def hold_first_step(_plan) -> bool:
            if gated[0]:
                gated[0] = False
                assert release.wait(20)
            return False

        server.model.fail_when(hold_first_step)
        results: dict[str, httpx.Response] = {}

        def post(name: str) -> threading.Thread:
            t = threading.Thread(
                target=lambda: results.__setitem__(name, _post(server, _chat(server, name)))
            )
            t.start()
            return t

        threads = [post("first")]
        deadline = time.monotonic() + 20
        while gated[0]:  # the worker is held in the first request's first step
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for name in ("a", "b", "c"):
            threads.append(post(name))
            while len(worker._ingress) < len(threads) - 1 and name not in results:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        release.set()
        for t in threads:
            t.join(30)
        for name in ("first", "a", "b", "c"):
            assert results[name].status_code == 200, (name, results[name].text)
        server.wait_idle()


def test_dropped_streams_free_their_places_at_once(tok):
    """Streams dropped after their first event while the worker is busy leave the
    worker's ingress channel at once: as many new requests within the admitted bound
    are all served (before: 1 x 200 and 5 x 503 'the model queue is full')."""
    with ScriptedServer(tok, max_active=1, queue_capacity=5) as server:
        worker = server.server.worker
        release = threading.Event()
        gated = [True]

        def hold_first_step(_plan) -> bool:
            if gated[0]:
                gated[0] = False
                assert release.wait(20)
            return False

        server.model.fail_when(hold_first_step)
        blocker = threading.Thread(target=lambda: _post(server, _chat(server, "first")))
        blocker.start()
        deadline = time.monotonic() + 20
        while gated[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for i in range(5):  # the rest of the HTTP capacity: 5 streams, dropped at once
            with httpx.stream("POST", server.url + "/v1/chat/completions",
                              json=_chat(server, f"drop {i}", stream=True), timeout=30) as r:
                next(r.iter_lines())  # the role chunk
        while server.server.service.admission.in_use > 1 or worker._ingress:
            assert time.monotonic() < deadline, (worker._ingress, worker._cancels)
            time.sleep(0.01)
        results: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            _post(server, _chat(server, f"new {i}")))) for i in range(5)]
        for t in threads:
            t.start()
        while len(worker._ingress) < 5:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        for t in [*threads, blocker]:
            t.join(30)
        assert sorted(r.status_code for r in results) == [200] * 5, [r.text for r in results]
        server.wait_idle()


def test_shutdown_drops_open_streams_with_one_line_each(tok, caplog):
    """SIGTERM semantics (Server.stop is what uvicorn's signal handler starts): requests
    may finish within the five-second drain; a stream still open then is dropped; the
    client sees the connection close without [DONE]; one log line per dropped stream and
    no traceback."""
    caplog.set_level(logging.INFO)
    server = ScriptedServer(tok, step_delay_s=0.05)
    server.script("endless", ["Hello"] * 1000)
    errors: list[BaseException] = []
    seen: list[str] = []

    def read(i: int) -> None:
        try:
            with httpx.stream("POST", server.url + "/v1/chat/completions",
                              json=_chat(server, f"endless {i}", stream=True,
                                         max_tokens=200), timeout=30) as r:
                for line in r.iter_lines():
                    seen.append(line)
        except httpx.HTTPError as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + 20
    while sum('"content":"Hello"' in line for line in seen) < 4:
        assert time.monotonic() < deadline and not errors, (seen, errors)
        time.sleep(0.01)
    start = time.monotonic()
    server.close()
    took = time.monotonic() - start
    for t in readers:
        t.join(10)
    assert 5.0 <= took < 9.0, took
    assert len(errors) == 2 and all(isinstance(e, httpx.RemoteProtocolError) for e in errors)
    assert "data: [DONE]" not in seen
    dropped = [r for r in caplog.records if "dropped an open POST" in r.getMessage()]
    assert len(dropped) == 2
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records
                                                            if r.exc_info]
    # uvicorn's own ERROR about the drain's end is not logged beside the dropped lines
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_uvicorns_drain_timeout_error_is_not_logged_beside_the_dropped_lines():
    """A real `helios-serve` stopped with a stream open printed uvicorn's "ERROR: Cancel 1
    running task(s), timeout graceful shutdown exceeded" after the documented "dropped an
    open ..." line (fresh-user pass, 2026-12-05); the uvicorn.error filter drops it, and
    nothing else uvicorn logs."""
    from helios_serve.http.access import QuietCancelledConnections

    def record(msg, *args, level=logging.ERROR):
        return logging.LogRecord("uvicorn.error", level, "server.py", 303, msg, args, None)

    quiet = QuietCancelledConnections()
    assert not quiet.filter(record("Cancel %s running task(s), timeout graceful shutdown "
                                   "exceeded", 1))
    assert quiet.filter(record("Exception in ASGI application"))
    assert quiet.filter(record("Waiting for connections to close. (CTRL+C to force quit)",
                               level=logging.INFO))


def test_a_stream_dropped_and_reopened_at_once_is_never_refused(tok):
    """At the permit count, a client drops its stream and opens the next at once: the
    server has the drop (the FIN arrived first), so the new request is within the
    admitted bound and is served (before: some 429 'at capacity', 9 of 50 in a cancel
    storm, because the dropped response's permit was released a few loop turns after
    the disconnect was read)."""
    with ScriptedServer(tok, max_active=1, queue_capacity=1, step_delay_s=0.1) as server, \
            httpx.Client(timeout=30) as holder, httpx.Client(timeout=30) as client:
        server.script("long", LONG)
        url = server.url + "/v1/chat/completions"
        with holder.stream("POST", url, json=_chat(server, "long held", stream=True)) as held:
            held_lines = held.iter_lines()
            next(held_lines)  # admitted: one of the two permits, for the whole test
            statuses = []
            for i in range(50):
                with client.stream("POST", url,
                                   json=_chat(server, f"long {i}", stream=True)) as r:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        next(r.iter_lines())  # the role chunk; leaving drops the stream
            assert statuses == [200] * 50, statuses
        server.wait_idle()
        assert server.server.service.admission.in_use == 0
