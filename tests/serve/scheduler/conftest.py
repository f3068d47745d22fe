"""Tiny geometry and a fake model loop for scheduler tests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from helios_serve.engine.plan import ModelGeometry, StepPlan
from helios_serve.scheduler import FinishReason, RowResult, SchedRequest, Scheduler

TINY = ModelGeometry(
    page_tokens=4,
    num_pages=16,
    slots=4,
    max_pages_per_request=8,
    decode_capacities=(1, 2, 4),
    prefill_token_capacities=(8, 16),
    prefill_row_capacity=4,
    context_tokens=32,
    vocab_size=1000,
    mask_words=32,
    eos_token_ids=(0,),
)


def fake_token(request_id: int, output_index: int) -> int:
    """The fixed id the fake model samples: distinct per request and position."""
    return 100 * request_id + output_index


@dataclass
class FakeLoop:
    """The worker's loop with a model that returns `fake_token` ids.

    Finishes a request with LENGTH when it reaches its output limit; records
    every plan and result in order.
    """

    sched: Scheduler
    limits: dict[int, int] = field(default_factory=dict)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    plans: list[StepPlan] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)

    def add(self, request_id: int, prompt: list[int] | tuple[int, ...], max_output: int) -> None:
        assert self.sched.add(SchedRequest(request_id, tuple(prompt), max_output)) is None
        self.limits[request_id] = max_output
        self.outputs[request_id] = []

    def sampled(self, plan: StepPlan) -> list[int]:
        return [
            fake_token(r.request_id, len(self.outputs[r.request_id])) if r.sample else -1
            for r in plan.rows
        ]

    def complete(self, plan: StepPlan) -> list[RowResult]:
        results = self.sched.complete(plan, self.sampled(plan))
        for r in results:
            if r.token_id is None:
                continue
            self.outputs[r.request_id].append(r.token_id)
            assert r.output_tokens == len(self.outputs[r.request_id])
            if r.output_tokens == self.limits[r.request_id]:
                self.sched.finish(r.request_id, FinishReason.LENGTH)
                self.finished.append(r.request_id)
        return results

    def step(self) -> StepPlan | None:
        plan = self.sched.schedule()
        if plan is not None:
            self.plans.append(plan)
            self.complete(plan)
        return plan

    def run(self, max_steps: int = 200) -> int:
        """Step until nothing is scheduled; returns the number of steps."""
        for n in range(max_steps):
            if self.step() is None:
                return n
        raise AssertionError("scheduler did not drain")


@pytest.fixture
def geometry() -> ModelGeometry:
    return TINY


@pytest.fixture
def sched() -> Scheduler:
    return Scheduler(TINY)


@pytest.fixture
def loop(sched: Scheduler) -> FakeLoop:
    return FakeLoop(sched)


@pytest.fixture
def make_loop():
    """FakeLoop over a variant of the tiny geometry: make_loop(num_pages=6)."""

    def make(**changes) -> FakeLoop:
        return FakeLoop(Scheduler(replace(TINY, **changes)))

    return make


@pytest.fixture
def ahead_loop():
    """FakeLoop whose scheduler may plan decode ahead: ahead_loop(frames, device_pending)."""

    def make(frames: int = 2, device_pending: bool = True) -> FakeLoop:
        return FakeLoop(Scheduler(TINY, frames=frames, device_pending=device_pending))

    return make
