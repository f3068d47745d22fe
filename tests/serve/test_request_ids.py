"""x-request-id: kept when the client sends a usable one, generated otherwise, echoed on
every response (404 and 405 included) and written in that response's access line."""

from __future__ import annotations

import logging
import re
import time

import httpx

HEX32 = re.compile(r"[0-9a-f]{32}")


def _lines(caplog, count: int) -> list[str]:
    deadline = time.monotonic() + 5  # a line is written once the response is sent
    while True:
        lines = [r.getMessage() for r in caplog.records if r.name == "helios_serve.access"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_request_ids_are_echoed_and_logged_for_every_response(scripted, caplog):
    caplog.set_level(logging.INFO, logger="helios_serve.access")
    chat = {"model": scripted.model_name, "messages": [{"role": "user", "content": "hi"}]}
    calls = [
        ("POST", "/v1/chat/completions", chat, "req-42"),
        ("POST", "/v1/chat/completions", {**chat, "stream": True}, "stream-1"),
        ("POST", "/v1/messages", {**chat, "max_tokens": 8}, "msg-1"),
        ("GET", "/no/such/route", None, "nf-1"),
        ("DELETE", "/health", None, "na-1"),
        ("GET", "/health", None, None),  # none sent: one is generated
        ("GET", "/health", None, "has space"),  # not a visible-ASCII token: replaced
        ("GET", "/health", None, "x" * 129),  # too long: replaced
    ]
    statuses, ids = [], []
    for method, path, body, given in calls:
        headers = {"x-request-id": given} if given is not None else {}
        r = httpx.request(method, scripted.url + path, json=body, headers=headers, timeout=30)
        statuses.append(r.status_code)
        ids.append(r.headers["x-request-id"])
    assert statuses == [200, 200, 200, 404, 405, 200, 200, 200]
    assert ids[:5] == ["req-42", "stream-1", "msg-1", "nf-1", "na-1"]
    assert all(HEX32.fullmatch(i) for i in ids[5:]) and len(set(ids[5:])) == 3
    lines = _lines(caplog, len(calls))
    assert len(lines) == len(calls), lines
    for (method, path, _, _), status, rid in zip(calls, statuses, ids, strict=True):
        line = next(x for x in lines if x.endswith(f" request_id={rid}"))
        assert line.startswith(f"{method} {path} {status} "), line
    assert "completion_tokens=5" in next(x for x in lines if x.endswith("request_id=msg-1"))
    assert " finish=end_turn " in next(x for x in lines if x.endswith("request_id=msg-1"))
    scripted.wait_idle()
