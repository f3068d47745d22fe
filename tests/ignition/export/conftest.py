"""Fixtures for `ignition export` tests: SmolLM2's frontend and tiny checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ignition.export.tiny import Frontend, write_checkpoint


@pytest.fixture(scope="session")
def smollm2_frontend(smollm2_checkpoint) -> Frontend:
    return Frontend(smollm2_checkpoint.tokenizer_json, smollm2_checkpoint.chat_template)


@pytest.fixture
def make_checkpoint(tmp_path, smollm2_frontend) -> Callable[..., Path]:
    """`make_checkpoint(name="ckpt", **write_checkpoint options)` -> a fresh directory."""

    def make(name: str = "ckpt", **options) -> Path:
        return write_checkpoint(tmp_path / name, smollm2_frontend, **options)

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, smollm2_frontend) -> Path:
    """A valid tiny checkpoint, shared read-only by every test of the session."""
    return write_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama", smollm2_frontend)
