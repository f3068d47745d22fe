"""Engine liveness (docs/api.md, "Engine liveness"): the stall rule on a fake clock, and
the in-process worker thread stuck in a device call (the engine process stopped by
SIGSTOP is tests/e2e/test_engine_liveness.py), and the engine client's writes, which
never block the HTTP loop on an engine that reads nothing.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import pytest
from helios_serve.config import ServeOptions, resolve
from helios_serve.engine_client import EngineClient
from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S, StallWatch
from helios_serve.metrics import Metrics
from helios_serve.testing.harness import ScriptedServer, content_of, sse_post
from helios_serve.testing.tiny import tiny_bootstrap
from helios_serve.testing.tokenizer import TinyTokenizer
from helios_serve.wire import Scrape, to_engine_decoder
from prometheus_client.parser import text_string_to_metric_families

from tests.tiny_model import serve_error_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _watch(timeout_s: float = 30.0) -> tuple[StallWatch, FakeClock]:
    clock = FakeClock()
    return StallWatch(timeout_s, clock), clock


def test_an_idle_engine_never_stalls():
    watch, clock = _watch()
    watch.observe(5, busy=False)
    clock.now += 3600
    watch.observe(5, busy=False)
    assert (watch.stalled, watch.stalled_for(), watch.reason()) == (False, 0.0, None)


def test_work_without_progress_stalls_at_the_timeout_and_progress_clears_it():
    watch, clock = _watch(30.0)
    watch.observe(5, busy=False)
    clock.now += 100  # idle for a while: the bound starts when work arrives
    watch.observe(5, busy=True)
    clock.now += 29.5
    watch.observe(5, busy=True)
    assert (watch.stalled, watch.stalled_for()) == (False, 29.5)
    clock.now += 0.5
    assert (watch.stalled, watch.stalled_for()) == (True, 30.0)
    assert watch.reason() == ("the model engine has work and made no progress for 30 s "
                              "(--engine-stall-timeout 30 s)")
    watch.observe(6, busy=True)  # one step: healthy again, the bound restarts
    assert (watch.stalled, watch.stalled_for(), watch.reason()) == (False, 0.0, None)
    clock.now += 30
    assert watch.stalled


def test_steps_while_busy_keep_it_alive_and_work_ending_clears_a_stall():
    watch, clock = _watch(10.0)
    watch.observe(0, busy=True)
    for step in range(1, 6):
        clock.now += 9.9
        watch.observe(step, busy=True)
        assert not watch.stalled
    clock.now += 10
    assert watch.stalled
    watch.observe(5, busy=False)  # its requests were cancelled: no work, no stall
    assert (watch.stalled, watch.stalled_for()) == (False, 0.0)


def test_the_timeout_must_be_positive():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="the stall timeout must be positive"):
            StallWatch(bad)


def test_the_option_defaults_and_must_be_positive():
    contract = tiny_bootstrap(TinyTokenizer()).contract
    assert resolve(ServeOptions(), contract).engine_stall_timeout_s == DEFAULT_STALL_TIMEOUT_S
    assert resolve(ServeOptions(engine_stall_timeout=2.5), contract).engine_stall_timeout_s \
        == 2.5
    with pytest.raises(ValueError, match="--engine-stall-timeout must be positive"):
        resolve(ServeOptions(engine_stall_timeout=0.0), contract)


@pytest.mark.parametrize(("value", "reason"), [
    ("0", "0.0 is not in the range x>0"),
    ("-2", "-2.0 is not in the range x>0"),
    ("soon", "'soon' is not a valid float range"),
])  # fmt: skip
def test_a_bad_stall_timeout_is_one_usage_line(tmp_path, value, reason):
    serve = str(Path(sys.executable).parent / "helios-serve")
    proc = subprocess.run([serve, str(tmp_path / "absent.core"), "--trust", "k.pub",
                           "--accept", "ns", "--engine-stall-timeout", value],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert serve_error_line(proc.stderr) == \
        f"helios-serve: error: Invalid value for '--engine-stall-timeout': {reason}."


def _gauges(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("helios_engine_")}


def _wait_health(url: str, status: int) -> dict:
    deadline = time.monotonic() + 60
    while (r := httpx.get(url + "/health", timeout=30)).status_code != status:
        assert time.monotonic() < deadline, r.json()
        time.sleep(0.05)
    return r.json()


def test_a_worker_stuck_in_a_device_call_is_unhealthy_until_it_moves():
    """The worker thread blocks inside the model's execute (a hung device call) with a
    stream in flight: /health turns 503 with the stall, /metrics answers and marks the
    engine stale, a new request is refused 503; released, everything recovers and the
    stream completes."""
    with ScriptedServer(engine_stall_timeout=0.5) as s:
        url = s.url
        assert _gauges(url) == {"helios_engine_stalled": 0.0,
                                "helios_engine_stalled_seconds": 0.0,
                                "helios_engine_metrics_stale": 0.0}
        gate = threading.Event()
        execute = s.model.execute

        def stuck(plan):
            gate.wait()
            return execute(plan)

        s.model.execute = stuck
        result: list = []
        body = {"model": s.model_name, "messages": [{"role": "user", "content": "hi"}],
                "stream": True}
        reader = threading.Thread(target=lambda: result.append(sse_post(url, body, 120)))
        reader.start()
        health = _wait_health(url, 503)
        assert health["status"] == "unhealthy"
        assert health["detail"].startswith("the model engine has work and made no progress "
                                           "for ")
        assert health["detail"].endswith(" s (--engine-stall-timeout 0.5 s)")
        gauges = _gauges(url)
        assert gauges["helios_engine_stalled"] == 1.0
        assert gauges["helios_engine_stalled_seconds"] >= 0.5
        assert gauges["helios_engine_metrics_stale"] == 1.0
        refused = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False},
                             timeout=30)
        assert refused.status_code == 503
        assert refused.json()["error"]["message"].startswith("the model engine has work")
        gate.set()
        assert _wait_health(url, 200) == {"status": "ok"}
        reader.join(60)
        status, events = result[0]
        assert status == 200 and events[-1] == "[DONE]"
        assert content_of(events) == "Hello, world!"
        assert _gauges(url) == {"helios_engine_stalled": 0.0,
                                "helios_engine_stalled_seconds": 0.0,
                                "helios_engine_metrics_stale": 0.0}


def test_channel_writes_never_block_on_an_engine_that_reads_nothing():
    """EngineClient._send to an engine that stopped reading (SIGSTOP): every message is
    taken at once, far past the socket's buffer, and the engine reads them all, whole and
    in order, once it reads again."""
    ours, theirs = socket.socketpair()
    engine = Connection(theirs.detach())
    client = EngineClient(None, Connection(ours.detach()), None)  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    try:
        client.attach(loop, Metrics())
        count = 20000  # each Scrape frame is a few bytes: ~100 KiB+ in all, in many frames
        assert all(client._send(Scrape(i)) for i in range(count))
        assert client._queued > 0  # the socket's buffer filled: the rest waits in order
        got = [to_engine_decoder.decode(engine.recv_bytes()).token for _ in range(count)]
        assert got == list(range(count))
    finally:
        client._detach()
        engine.close()
        loop.close()
