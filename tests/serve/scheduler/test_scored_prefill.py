"""Requests scoring their prompt (prompt log probabilities) on the tiny geometry with
scored capacities (8,): their prefill rows carry each token's target (the next prompt
token, -1 for the last), a step holding one fits the scored capacity, they reuse no
cached prefix, and a readmission after a preemption scores no position again."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helios_serve.engine.plan import StepKind
from helios_serve.scheduler import SchedRequest, Scheduler

from tests.serve.scheduler.conftest import TINY, FakeLoop

SCORED = replace(TINY, scored_token_capacities=(8,))


def _add(loop: FakeLoop, request_id: int, prompt: tuple[int, ...], max_output: int,
         score: bool) -> None:
    assert loop.sched.add(SchedRequest(request_id, prompt, max_output,
                                       score_prompt=score)) is None
    loop.limits[request_id] = max_output
    loop.outputs[request_id] = []


def _rows(plan):
    return [(r.request_id, r.tokens, r.start_position, r.score_targets) for r in plan.rows]


def test_a_scored_prompt_is_chunked_to_the_scored_capacity_with_its_targets():
    loop = FakeLoop(Scheduler(SCORED))
    prompt = tuple(range(10, 22))  # 12 tokens: two scored chunks of 8 and 4
    _add(loop, 1, prompt, 1, score=True)
    first = loop.step()
    assert first.scored and _rows(first) == [(1, prompt[:8], 0, prompt[1:9])]
    second = loop.step()
    assert second.scored and _rows(second) == [(1, prompt[8:], 8, prompt[9:] + (-1,))]
    assert second.rows[0].sample and loop.run() == 0


def test_a_scoring_row_waits_when_the_step_already_exceeds_the_scored_capacity():
    loop = FakeLoop(Scheduler(SCORED))
    _add(loop, 1, tuple(range(10, 20)), 1, score=False)  # 10 tokens > the scored 8
    _add(loop, 2, tuple(range(30, 34)), 1, score=True)
    plan = loop.step()
    assert not plan.scored and [r.request_id for r in plan.rows] == [1]
    plan = loop.sched.schedule()
    if plan.kind is StepKind.DECODE:  # request 1's pending token goes first
        loop.plans.append(plan)
        loop.complete(plan)
        plan = loop.sched.schedule()
    assert plan.scored and _rows(plan) == [(2, (30, 31, 32, 33), 0, (31, 32, 33, -1))]


def test_unscored_rows_share_a_scored_step_without_targets():
    loop = FakeLoop(Scheduler(SCORED))
    _add(loop, 1, (5, 6, 7), 1, score=True)
    _add(loop, 2, (8, 9), 1, score=False)
    plan = loop.step()
    assert plan.scored and plan.token_count <= 8
    assert _rows(plan) == [(1, (5, 6, 7), 0, (6, 7, -1)), (2, (8, 9), 0, None)]


def test_a_scored_request_reuses_no_cached_prefix():
    loop = FakeLoop(Scheduler(SCORED))
    prompt = tuple(range(40, 49))  # two complete pages of 4, then one token
    _add(loop, 1, prompt, 1, score=False)
    loop.run()
    _add(loop, 2, prompt, 1, score=True)
    plan = loop.step()
    assert _rows(plan)[0] == (2, prompt[:8], 0, prompt[1:9])  # from position 0
    loop.run()
    _add(loop, 3, prompt, 1, score=False)
    assert loop.step().rows[0].start_position == 8  # a plain one reuses the pages


def test_scoring_on_a_geometry_without_scored_programs_is_a_caller_bug():
    with pytest.raises(ValueError, match="no SCORED_PREFILL programs"):
        Scheduler(TINY).add(SchedRequest(1, (1, 2), 1, score_prompt=True))


def test_a_readmission_after_a_preemption_scores_no_position_again():
    """The preemption scenario of test_scheduler.py (3 x 8 pages of demand on 16): request
    3, the newest, scores its prompt and is preempted after it; its recomputation carries
    no target, and every prompt position but the last was scored exactly once."""
    loop = FakeLoop(Scheduler(SCORED))
    prompts = {rid: tuple(range(10 * rid, 10 * rid + 12)) for rid in (1, 2, 3)}
    for rid, prompt in prompts.items():
        _add(loop, rid, prompt, 20, score=rid == 3)
    scored: list[int] = []
    while (plan := loop.sched.schedule()) is not None:
        loop.plans.append(plan)
        for row in plan.rows:
            if row.request_id == 3 and row.score_targets is not None:
                scored += [row.start_position + j for j, t in enumerate(row.score_targets)
                           if t >= 0]
                assert all(t == prompts[3][row.start_position + j + 1]
                           for j, t in enumerate(row.score_targets) if t >= 0)
        loop.complete(plan)
    assert loop.sched.stats().preemptions == 1
    assert sorted(scored) == list(range(11))
    assert loop.outputs[3] == [100 * 3 + i for i in range(20)]
