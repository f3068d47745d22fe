"""The sliding-window history region on the cuda backend: the tiny Gemma 3 core of
tests/serve/runtime/test_window_region.py (window 16 on the local layers, 4-token pages)
compiled for this GPU and served through the real scheduler far past the window.

Pages behind the window go back to the window pool and are taken again by the same and by
a second request while the first still decodes (their stale contents are poisoned with
NaN first: a kernel reading behind its window would turn the logits NaN). Every step's
logits equal the dense NumPy forward with the window as a mask (full-KV reference).

    uv run pytest -m gpu tests/gpu/test_window_region.py
"""

from __future__ import annotations

import pytest
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.testing import tiny_core
from helios_serve.testing.native import load_native

from tests.serve.runtime.test_window_region import CAPS, SHAPES, poisoned_window_run

pytestmark = pytest.mark.gpu


class CompiledWindowCore:
    """The tiny Gemma 3 core with kernel binaries for `target`."""

    def __init__(self, target: str) -> None:
        core = tiny_core(seed=4, shapes=SHAPES, caps=CAPS)
        self.weights = core.weights
        self.contract, self.manifest = core.contract, core.manifest
        self._resources = {rid: a.tobytes() for rid, a in core.weights.items()}
        self._resources.update(compile_targets(self.manifest, (target,)))

    def read_resource(self, rid: str) -> bytes:
        return self._resources[rid]


def test_window_pages_are_freed_reused_and_never_read_behind_the_window(gpu):
    core = CompiledWindowCore(gpu.target)
    model = load_native(core, "cuda")
    try:
        poisoned_window_run(model, core.contract, core.weights)
    finally:
        model.close()
