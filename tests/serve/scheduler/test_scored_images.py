"""Scored rows and image rows on one geometry (scored capacity 8, 4 image windows): no
SCORED_PREFILL program encodes images, so a scored step carries no image (an image row
joining it stops before its next span) and a scoring row waits for a step without one."""

from __future__ import annotations

from dataclasses import replace

from helios_serve.engine.plan import PromptImage
from helios_serve.scheduler import SchedRequest, Scheduler

from tests.serve.scheduler.conftest import TINY, FakeLoop

GEOMETRY = replace(TINY, scored_token_capacities=(8,), image_windows=4,
                   image_feature_slots=16)
IMAGE = PromptImage(1, 4, (2,), b"", 1, 2, bytes([7]) * 32)  # fits either budget


def _add(loop: FakeLoop, request_id: int, prompt: tuple[int, ...], *, score: bool = False,
         images: tuple[PromptImage, ...] = ()) -> None:
    assert loop.sched.add(SchedRequest(request_id, prompt, 1, score_prompt=score,
                                       images=images)) is None
    loop.limits[request_id] = 1
    loop.outputs[request_id] = []


def _rows(plan):
    return [(r.request_id, r.tokens, r.score_targets, r.images) for r in plan.rows]


def test_an_image_row_in_a_scored_step_stops_before_its_image():
    loop = FakeLoop(Scheduler(GEOMETRY))
    _add(loop, 1, (5, 6, 7), score=True)
    _add(loop, 2, tuple(range(20, 25)), images=(IMAGE,))
    plan = loop.step()
    assert plan.scored
    assert _rows(plan) == [(1, (5, 6, 7), (6, 7, -1), ()), (2, (20,), None, ())]
    plans = [loop.step()]
    while plans[-1].kind.value != "prefill" or plans[-1].rows[0].request_id != 2:
        plans.append(loop.step())
    plan = plans[-1]
    assert not plan.scored
    assert _rows(plan) == [(2, tuple(range(21, 25)), None, (IMAGE,))]
    assert loop.run() == 0


def test_a_scoring_row_waits_for_a_step_without_images():
    loop = FakeLoop(Scheduler(GEOMETRY))
    _add(loop, 1, tuple(range(20, 25)), images=(IMAGE,))
    _add(loop, 2, (5, 6, 7), score=True)  # 5 + 3 tokens would fit the scored capacity
    plan = loop.step()
    assert not plan.scored and _rows(plan) == [(1, tuple(range(20, 25)), None, (IMAGE,))]
    scored = [p for p in loop.plans if p.scored]
    while not scored:
        loop.step()
        scored = [p for p in loop.plans if p.scored]
    assert _rows(scored[0]) == [(2, (5, 6, 7), (6, 7, -1), ())]
    assert loop.run() == 0
