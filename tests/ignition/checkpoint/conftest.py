"""Shared fixtures: the verified SmolLM2 GGUF, its checkpoint, and the HF goldens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helios_ignition.checkpoint import smollm2_gguf_path
from helios_tools.frontend_assets import load_tokenizer

GOLDENS = Path(__file__).resolve().parents[2] / "golden" / "smollm2_goldens.json"


@pytest.fixture(scope="session")
def goldens() -> dict:
    return json.loads(GOLDENS.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_checkpoint):
    """`smollm2_path` opened: tests/conftest.py's `smollm2_checkpoint`."""
    return smollm2_checkpoint


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    return load_tokenizer(smollm2.tokenizer_json)
