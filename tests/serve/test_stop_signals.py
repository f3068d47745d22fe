"""helios-serve's stop signals (helios_serve/server.py): the first SIGINT or SIGTERM
starts the drain; a repeat within DUPLICATE_SIGNAL_S (`uv run` forwarding the terminal's
Ctrl-C) is ignored; a later SIGINT ends the drain. Each is re-raised once serving ends
only if it started the drain. The real process under `uv run`: tests/e2e/test_stop_signals.py."""

from __future__ import annotations

import signal

import pytest
import uvicorn
from helios_serve import server as server_module
from helios_serve.server import DUPLICATE_SIGNAL_S, _Listener


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(server_module.time, "monotonic", lambda: now[0])
    return now


def _listener() -> _Listener:
    return _Listener(uvicorn.Config(app=lambda scope, receive, send: None))


def test_a_repeat_at_once_is_the_duplicate_and_ignored(clock):
    listener = _listener()
    listener.handle_exit(signal.SIGINT, None)
    assert (listener.should_exit, listener.force_exit) == (True, False)
    clock[0] += DUPLICATE_SIGNAL_S - 0.001
    listener.handle_exit(signal.SIGINT, None)
    assert (listener.should_exit, listener.force_exit) == (True, False)
    assert listener._captured_signals == [signal.SIGINT]


def test_a_later_sigint_ends_the_drain(clock):
    listener = _listener()
    listener.handle_exit(signal.SIGINT, None)
    clock[0] += DUPLICATE_SIGNAL_S
    listener.handle_exit(signal.SIGINT, None)
    assert (listener.should_exit, listener.force_exit) == (True, True)
    assert listener._captured_signals == [signal.SIGINT]  # raised once when serving ends


def test_a_later_sigterm_does_not_end_the_drain(clock):
    listener = _listener()
    listener.handle_exit(signal.SIGTERM, None)
    clock[0] += 10.0
    listener.handle_exit(signal.SIGTERM, None)
    assert (listener.should_exit, listener.force_exit) == (True, False)
    assert listener._captured_signals == [signal.SIGTERM]
