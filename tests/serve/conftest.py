"""Fixtures for serving tests: a real server around the scripted test backend."""

from __future__ import annotations

import pytest
from helios_serve.testing.harness import ScriptedServer
from helios_serve.testing.tokenizer import TinyTokenizer


@pytest.fixture(scope="session")
def tok() -> TinyTokenizer:
    return TinyTokenizer()


@pytest.fixture
def scripted(tok):
    """A running ScriptedServer (max_active 4, queue_capacity 8)."""
    with ScriptedServer(tok) as server:
        yield server
