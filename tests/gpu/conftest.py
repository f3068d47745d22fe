"""GPU tests: run on the lent H200 (``pytest -m gpu tests/gpu``), never in CI."""

from __future__ import annotations

import os
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


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def core_path(gpu, tmp_path_factory):
    from helios_ignition.export import export_core
    from helios_tools.core import generate_key, write_key_pair

    d = tmp_path_factory.mktemp("core")
    key = d / "key.pem"
    write_key_pair(generate_key(), key)
    out = d / "smollm2.core"
    ckpt = os.environ.get("HELIOS_SMOLLM2_GGUF", "smollm2")
    export_core(ROOT / "recipes/smollm2_135m_instruct.py", checkpoint=ckpt, key_path=key,
                namespace="gpu.test", out=out, targets=(gpu.target,))
    return out, key
