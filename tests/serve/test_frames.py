"""The worker with two execution frames and a device-owned pending token (scripted
backend): decode submitted ahead of completion where the feedback rules allow, one
round outstanding while a request needs feedback (the specification)."""

from __future__ import annotations

import threading

import httpx
from helios_serve.testing.harness import ScriptedServer

WORDS = ["Letters", ":", " H", "IJ", "K", "LM", "NOP", " Hello", ",", " world", "!"]


def _ask(server, prompt: str, **extra) -> dict:
    body = {"model": server.model_name, "messages": [{"role": "user", "content": prompt}],
            **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_concurrent_requests_run_ahead_and_keep_their_scripts(tok):
    with ScriptedServer(tok) as server:
        server.script("story", WORDS)
        server.script("short", ["Hello", "!"])
        got: dict[str, dict] = {}

        def ask(prompt: str) -> None:
            got[prompt] = _ask(server, prompt)

        threads = [threading.Thread(target=ask, args=(p,)) for p in ("story", "short")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got["story"]["choices"][0]["message"]["content"] == "".join(WORDS)
        assert got["story"]["usage"]["completion_tokens"] == len(WORDS) + 1  # + EOS
        assert got["short"]["choices"][0]["message"]["content"] == "Hello!"
        assert got["short"]["choices"][0]["finish_reason"] == "stop"
        assert server.model.max_outstanding == 2  # step N + 1 was submitted before N's wait
        assert server.wait_idle()["pages_used"] == 0


def test_output_limit_is_exact_when_running_ahead(tok):
    with ScriptedServer(tok) as server:
        server.script("story", WORDS)
        r = _ask(server, "story", max_tokens=4)
        assert r["choices"][0]["message"]["content"] == "".join(WORDS[:4])
        assert (r["usage"]["completion_tokens"], r["choices"][0]["finish_reason"]) == (4, "length")
        assert server.model.max_outstanding == 2
        assert server.wait_idle()["pages_used"] == 0


def test_string_stop_request_keeps_one_round_outstanding(tok):
    with ScriptedServer(tok) as server:
        server.script("story", WORDS)
        r = _ask(server, "story", stop=[" Hello"])
        assert r["choices"][0]["message"]["content"] == "".join(WORDS[:7])
        assert server.model.max_outstanding == 1


def test_token_stop_request_keeps_one_round_outstanding(tok):
    with ScriptedServer(tok) as server:
        server.script("story", WORDS)
        stop_id = tok.ids(["K"])[0]
        r = _ask(server, "story", stop_token_ids=[stop_id])
        assert r["choices"][0]["message"]["content"] == "".join(WORDS[:4])
        assert server.model.max_outstanding == 1


def test_host_fed_pending_token_never_runs_ahead(tok):
    with ScriptedServer(tok, device_pending=False) as server:
        server.script("story", WORDS)
        r = _ask(server, "story")
        assert r["choices"][0]["message"]["content"] == "".join(WORDS)
        assert server.model.max_outstanding == 1


def test_fault_in_a_frame_with_another_in_flight_fails_its_request_and_drains(tok):
    with ScriptedServer(tok) as server:
        server.script("story", WORDS)
        server.script("boom", ["Hello", "!"] * 4)
        bang = tok.ids(["!"])[0]
        server.model.fail_on_sequence(lambda seq: list(seq).count(bang) >= 2)
        body = {"model": server.model_name, "messages": [{"role": "user", "content": "boom"}]}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert server.model.max_outstanding == 2  # the failing step had a successor in flight
        assert server.wait_idle()["pages_used"] == 0
        server.model.clear_faults()
        assert _ask(server, "story")["choices"][0]["message"]["content"] == "".join(WORDS)
