"""MIXED steps on the tiny geometry with mixed capacities: decode lanes first, prefill
chunks filling the token budget, completion feedback before a mixed step, and chunks a
mixed program cannot run (prompt scoring) still progressing."""

from __future__ import annotations

from dataclasses import replace

from helios_serve.engine.plan import StepKind
from helios_serve.scheduler import SchedRequest, Scheduler

from tests.serve.scheduler.conftest import TINY, FakeLoop

MIXED = replace(TINY, mixed_capacities=((2, 8), (2, 16), (4, 8), (4, 16)),
                scored_token_capacities=(8,))


def _rows(plan):
    return [(r.request_id, len(r.tokens), r.start_position, r.sample) for r in plan.rows]


def test_lanes_first_then_chunks_fill_the_budget_across_steps():
    loop = FakeLoop(Scheduler(MIXED))
    loop.add(1, (1, 2, 3), 10)
    loop.add(2, (4, 5), 10)
    assert loop.step().kind is StepKind.PREFILL
    loop.add(3, tuple(range(10, 40)), 2)  # 30 prompt tokens
    plans = [loop.step() for _ in range(3)]
    assert [(p.kind, p.lanes, _rows(p)) for p in plans] == [
        (StepKind.MIXED, 2, [(1, 1, 3, True), (2, 1, 2, True), (3, 14, 0, False)]),
        (StepKind.MIXED, 2, [(1, 1, 4, True), (2, 1, 3, True), (3, 14, 14, False)]),
        (StepKind.MIXED, 2, [(1, 1, 5, True), (2, 1, 4, True), (3, 2, 28, True)]),
    ]
    assert loop.step().kind is StepKind.DECODE  # no prefill left: plain decode
    stats = loop.sched.stats()
    assert stats.mixed_steps == 3 and stats.prompt_tokens_computed == 3 + 2 + 30


def test_without_mixed_capacities_prefill_and_decode_alternate():
    loop = FakeLoop(Scheduler(replace(MIXED, mixed_capacities=())))
    loop.add(1, (1, 2, 3), 10)
    loop.step()
    loop.add(3, tuple(range(10, 40)), 2)
    kinds = [loop.step().kind for _ in range(4)]
    assert kinds == [StepKind.DECODE, StepKind.PREFILL, StepKind.DECODE, StepKind.PREFILL]


def test_a_mixed_step_waits_for_the_outstanding_decode():
    loop = FakeLoop(Scheduler(MIXED, frames=2, device_pending=True))
    loop.add(1, (1, 2, 3), 10)
    loop.step()
    sched = loop.sched
    first = sched.schedule()
    assert first.kind is StepKind.DECODE and sched.can_schedule_ahead()
    loop.add(2, tuple(range(10, 20)), 2)
    assert sched.schedule() is None  # the lane's token is on the device: complete first
    loop.complete(first)
    plan = sched.schedule()
    assert plan.kind is StepKind.MIXED and plan.lanes == 1
    assert plan.rows[0].tokens == (loop.outputs[1][-1],)  # the completed token, host-fed
    assert not sched.can_schedule_ahead()  # a mixed step samples: feedback first


def test_a_scoring_prompt_gets_its_own_prefill_step():
    loop = FakeLoop(Scheduler(MIXED))
    loop.add(1, (1, 2, 3), 10)
    loop.step()
    assert loop.sched.add(SchedRequest(2, tuple(range(10, 16)), 1, score_prompt=True)) is None
    loop.limits[2], loop.outputs[2] = 1, []
    first, second = loop.step(), loop.step()
    assert (first.kind, _rows(first)) == (StepKind.DECODE, [(1, 1, 3, True)])
    assert second.scored and _rows(second) == [(2, 6, 0, True)]


def test_lanes_over_the_row_capacity_take_turns():
    loop = FakeLoop(Scheduler(replace(MIXED, mixed_capacities=((2, 8),))))
    for rid in (1, 2, 3):
        loop.add(rid, (rid, rid + 1), 10)
    loop.step()
    loop.add(4, tuple(range(10, 39)), 2)  # 29 tokens, 7 per step
    plans = [loop.step() for _ in range(4)]
    # One lane per step (2 rows: a lane and a chunk), least recently served first.
    assert [(p.kind, [(r.request_id, len(r.tokens)) for r in p.rows]) for p in plans] == [
        (StepKind.MIXED, [(1, 1), (4, 7)]), (StepKind.MIXED, [(2, 1), (4, 7)]),
        (StepKind.MIXED, [(3, 1), (4, 7)]), (StepKind.MIXED, [(1, 1), (4, 7)])]
