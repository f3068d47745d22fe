"""Engine liveness with `helios-serve --engine-process` (docs/api.md, "Engine liveness";
docs/serving.md, "Engine process"): the engine process stopped by SIGSTOP while a stream
is in flight makes /health 503 once --engine-stall-timeout passes with work waiting,
/metrics answers with the engine's part marked stale, new requests are refused, a
request waiting on the stopped engine ends by its client's own timeout (and is
cancelled), and SIGCONT brings everything back: /health 200 and the stream completes.

The rule itself, on a fake clock, and the in-process worker stuck in a device call are
tests/serve/test_liveness.py.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.tiny_model import ServeProcess

MODEL = "tiny-served"
STALL_S = 4  # --engine-stall-timeout
CLIENT_READ_S = 8.0  # the waiting request's own client timeout (past the stall)
STREAM_TOKENS = 200

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="finds the engine process through /proc")


def _chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 12, "temperature": 0, **kw}


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc: every thread's children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(p) for p in (task / "children").read_text().split()]
    return out


def _samples(url: str) -> dict[tuple[str, tuple], float]:
    r = httpx.get(url + "/metrics", timeout=30)  # a hung scrape fails here
    assert r.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def _liveness(samples: dict) -> dict[str, float]:
    return {name: value for (name, _), value in samples.items()
            if name.startswith("helios_engine_")}


def _health(url: str) -> tuple[int, dict]:
    r = httpx.get(url + "/health", timeout=30)  # a hung /health fails here
    return r.status_code, r.json()


def _wait_health(url: str, status: int) -> dict:
    deadline = time.monotonic() + 120
    while (got := _health(url))[0] != status:
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    return got[1]


CANCELLED = ("helios_requests_finished_total", (("reason", "cancelled"),))


@pytest.fixture(scope="module")
def engine_stop(tiny_served):
    """One engine-process server through its engine's SIGSTOP and SIGCONT, recorded."""
    core = tiny_served.core
    out: dict = {}
    with ServeProcess(core.path, "--trust", core.public_key, "--accept", core.namespace,
                      "--engine-process", "--engine-stall-timeout", str(STALL_S),
                      "--max-active", "2") as server:
        url = server.url
        (engine,) = _children(server.proc.pid)
        out["health_before"] = _health(url)
        before = _samples(url)
        out["liveness_before"] = _liveness(before)
        stopped = False
        try:
            body = _chat(max_tokens=STREAM_TOKENS, ignore_eos=True, stream=True,
                         stream_options={"include_usage": True})
            with httpx.stream("POST", url + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                assert r.status_code == 200, r.read()
                lines = r.iter_lines()
                while not next(lines).startswith("data: "):
                    pass  # tokens move
                os.kill(engine, signal.SIGSTOP)
                stopped = True
                # A request admitted now waits on the stopped engine until its client's
                # own read timeout ends it.
                waiting: list = []

                def wait_on_engine() -> None:
                    try:
                        httpx.post(url + "/v1/chat/completions", json=_chat(),
                                   timeout=httpx.Timeout(60, read=CLIENT_READ_S))
                        waiting.append("answered")
                    except httpx.ReadTimeout:
                        waiting.append("client timeout")

                client = threading.Thread(target=wait_on_engine)
                client.start()
                out["health_stalled"] = _wait_health(url, 503)
                out["liveness_stalled"] = _liveness(_samples(url))
                refused = httpx.post(url + "/v1/chat/completions", json=_chat(), timeout=30)
                out["refused"] = (refused.status_code, refused.json())
                client.join(120)
                out["waiting"] = waiting
                out["health_after_client"] = _health(url)  # the stream still waits
                os.kill(engine, signal.SIGCONT)
                stopped = False
                out["health_resumed"] = _wait_health(url, 200)
                out["rest"] = [line[6:] for line in lines if line.startswith("data: ")]
        finally:
            if stopped:
                os.kill(engine, signal.SIGCONT)
        deadline = time.monotonic() + 60  # the engine reads the cancel once it runs again
        while (after := _samples(url))[CANCELLED] != before[CANCELLED] + 1:
            assert time.monotonic() < deadline, after[CANCELLED]
            time.sleep(0.1)
        out["liveness_after"] = _liveness(after)
        out["after"] = after
        out["before"] = before
    return out


def test_a_stopped_engine_with_work_turns_health_503_and_back(engine_stop):
    run = engine_stop
    assert run["health_before"] == (200, {"status": "ok"})
    detail = run["health_stalled"]["detail"]
    assert run["health_stalled"]["status"] == "unhealthy"
    assert detail.startswith("the model engine has work and made no progress for "), detail
    assert detail.endswith(f" s (--engine-stall-timeout {STALL_S} s)"), detail
    status, health = run["health_after_client"]
    assert status == 503 and health["status"] == "unhealthy"
    assert run["health_resumed"] == {"status": "ok"}


def test_metrics_answer_while_stopped_and_mark_the_engine_stale(engine_stop):
    run = engine_stop
    idle = {"helios_engine_stalled": 0.0, "helios_engine_stalled_seconds": 0.0,
            "helios_engine_metrics_stale": 0.0}
    assert run["liveness_before"] == idle
    stalled = run["liveness_stalled"]
    assert stalled["helios_engine_stalled"] == 1.0
    assert stalled["helios_engine_stalled_seconds"] >= STALL_S
    assert stalled["helios_engine_metrics_stale"] == 1.0
    assert run["liveness_after"] == idle


def test_new_requests_are_refused_while_it_is_stalled(engine_stop):
    status, body = engine_stop["refused"]
    assert status == 503
    assert body["error"]["message"].startswith("the model engine has work and made no "
                                               "progress for "), body


def test_a_waiting_request_ends_by_its_clients_timeout_and_is_cancelled(engine_stop):
    run = engine_stop
    assert run["waiting"] == ["client timeout"]
    # The engine read the cancel once it ran again: one request finished cancelled,
    # and none failed.
    assert run["after"][CANCELLED] == run["before"][CANCELLED] + 1
    key = ("helios_requests_finished_total", (("reason", "error"),))
    assert run["after"][key] == run["before"][key]


def test_the_stream_completes_after_sigcont(engine_stop):
    rest = engine_stop["rest"]
    assert rest[-1] == "[DONE]"
    usage = [json.loads(x)["usage"] for x in rest[:-1] if json.loads(x).get("usage")]
    assert usage[-1]["completion_tokens"] == STREAM_TOKENS
    assert not any('"error"' in x for x in rest)
