"""A shifted page-table view on the cuda backend: the kernels read the shifted column
(contract.proto PageTableView: entry i references the request's page i + page_offset).

The tiny model (helios_ignition.testing) with its one view shifted by a page, compiled for
this GPU: greedy ids equal the cpu backend's on the same core, and the KV history of
block i lies in page page_ids[i + 1] (page_ids[0] stays untouched).
"""

from __future__ import annotations

import numpy as np
from helios_ignition.kernels_aot import compile_targets
from helios_ignition.testing import tiny_core
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.runtime.driver import Driver
from helios_serve.testing.native import load_native

PROMPTS = [[5, 17, 3, 88, 41, 9], [40, 41, 42, 43, 44, 45, 46, 47, 48]]


class CompiledTinyCore:
    """The shifted tiny core with kernel binaries for `target`."""

    def __init__(self, target: str) -> None:
        core = tiny_core(seed=3)
        core.contract.model.cache.page_table_views[0].page_offset = 1
        self.contract, self.manifest = core.contract, core.manifest
        self._resources = {rid: a.tobytes() for rid, a in core.weights.items()}
        self._resources.update(compile_targets(self.manifest, (target,)))

    def read_resource(self, rid: str) -> bytes:
        return self._resources[rid]


def test_shifted_view_on_cuda_equals_cpu_and_reads_the_shifted_page(gpu):
    core = CompiledTinyCore(gpu.target)
    cuda, cpu = load_native(core, "cuda"), load_native(core, "cpu")
    try:
        assert cuda.manifests.extra_pages_per_request == 1
        want = Driver(cpu).generate(PROMPTS, max_new_tokens=12)
        assert Driver(cuda).generate(PROMPTS, max_new_tokens=12) == want
        fresh = load_native(core, "cuda")
        try:
            row = RowPlan(request_id=1, slot=2, generation=1, tokens=tuple(PROMPTS[0]),
                          start_position=0, page_ids=(7, 3, 12), sample=True,
                          sampling=SamplingParams(), histogram_tokens=tuple(PROMPTS[0]))
            out = fresh.execute(StepPlan(StepKind.PREFILL, (row,)))
            cpu_out = cpu.execute(StepPlan(StepKind.PREFILL, (row,)))
            assert int(out[0]) == int(cpu_out[0])
            np.testing.assert_array_equal(fresh.backend.read_buffer("state.page_table")[2, :2],
                                          [3, 12])
            k = fresh.backend.read_buffer("L0.k_cache")
            assert not k[7].any() and k[3].any() and k[12, :2].any()
        finally:
            fresh.close()
    finally:
        cuda.close()
