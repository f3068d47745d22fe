"""PacedBackend (the emulated device of bench/serve_overhead.py) over a real core."""

from __future__ import annotations

import time

from helios_serve.bootstrap import Bootstrap
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.testing.paced import paced_model


def _bootstrap(tiny_served) -> Bootstrap:
    core = tiny_served.core
    return Bootstrap.load(core.path, [core.public_key], core.namespace)


def test_paced_model_loads_a_core_with_restore_programs(tiny_served):
    """Cores carry RESTORE programs, whose graphs have no completion record: the paced
    device runs them without filling one, and sampling graphs keep their records."""
    with _bootstrap(tiny_served) as boot:
        graphs = boot.core.manifest.graphs
        assert any(not g.completion.buffer for g in graphs)  # RESTORE copies
        model = paced_model(boot.core, lambda name: 0.002, [7, 8, 9], max_concurrency=1)
        backend = model.backend
        restore = next(g.name for g in graphs if not g.completion.buffer)
        backend.launch(restore, 0)
        backend.wait(0)
        row = RowPlan(request_id=1, slot=0, generation=1, tokens=(3, 4), start_position=0,
                      page_ids=(0,), sample=True, sampling=SamplingParams())
        started = time.perf_counter()
        sampled = model.execute(StepPlan(StepKind.PREFILL, (row,)))
        assert time.perf_counter() - started >= 0.002  # the step's emulated device time
        assert sampled.tolist() == [8]  # step 1 (after the RESTORE launch), row 0
        assert backend.counters["graph_launches"] == 2
        model.close()
