"""Fixtures for helios-contract tests: the example contract and manifest (fresh per test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# `tests.contract.example` is a shared fixture module; with --import-mode=importlib the
# repository root is not on sys.path by itself.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.contract.example import example_contract, example_manifest  # noqa: E402


@pytest.fixture
def serving():
    return example_contract()


@pytest.fixture
def manifest():
    return example_manifest()
