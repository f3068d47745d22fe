"""Startup options beat core defaults; core defaults fill missing settings."""

from __future__ import annotations

import pytest
from helios_serve.config import FALLBACK_EVENT_CAPACITY, ServeOptions, resolve
from helios_serve.testing.tiny import tiny_contract


def test_core_defaults_fill_missing_options(tok):
    contract = tiny_contract(tok, max_active=3, queue_capacity=5, frontend_workers=2)
    s = resolve(ServeOptions(), contract)
    assert (s.max_active, s.queue_capacity, s.frontend_workers) == (3, 5, 2)
    assert s.event_capacity == FALLBACK_EVENT_CAPACITY  # neither gives it
    assert s.served_name == "helios-tiny" and s.aliases == ("tiny",)
    assert s.http_capacity == 8


def test_options_beat_core_defaults(tok):
    contract = tiny_contract(tok, max_active=3, queue_capacity=5, frontend_workers=2)
    s = resolve(ServeOptions(max_active=1, queue_capacity=9, frontend_workers=4,
                             event_capacity=17, served_name="mine"), contract)
    assert (s.max_active, s.queue_capacity, s.frontend_workers, s.event_capacity) == (1, 9, 4, 17)
    assert s.served_name == "mine" and s.aliases == ("helios-tiny", "tiny")


@pytest.mark.parametrize("field", ["max_active", "queue_capacity", "frontend_workers",
                                   "event_capacity", "stream_interval"])
def test_nonpositive_settings_fail(tok, field):
    with pytest.raises(ValueError, match=field.replace("_", "-")):
        resolve(ServeOptions(**{field: 0}), tiny_contract(tok))


def test_stream_interval_defaults_to_every_token(tok):
    assert resolve(ServeOptions(), tiny_contract(tok)).stream_interval == 1
    assert resolve(ServeOptions(stream_interval=4), tiny_contract(tok)).stream_interval == 4
