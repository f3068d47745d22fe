"""GPU tests: run on the lent H200 (``pytest -m gpu tests/gpu``), never in CI."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_harness, gpu_steps


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="session")
def gpu():
    pytest.importorskip("cuda.bindings")
    from gpu_harness import Gpu
    from helios_serve.runtime.errors import RuntimeLoadError

    try:
        return Gpu()
    except RuntimeLoadError as exc:
        pytest.skip(str(exc))
