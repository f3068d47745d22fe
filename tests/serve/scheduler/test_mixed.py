"""MIXED steps on the tiny geometry with mixed capacities: decode lanes first, prefill
chunks filling the token budget chosen per step (`mixed_budget`), completion feedback
before a mixed step, and chunks a mixed program cannot run (prompt scoring) still
progressing."""

from __future__ import annotations

from dataclasses import replace

from helios_serve.engine.plan import StepKind
from helios_serve.scheduler import SchedRequest, Scheduler
from helios_serve.scheduler.capacity import DRAIN_STEPS, mixed_budget, widest_mixed

from tests.serve.scheduler.conftest import TINY, FakeLoop

MIXED = replace(TINY, mixed_capacities=((2, 8), (2, 16), (4, 8), (4, 16)),
                scored_token_capacities=(8,))


def _rows(plan):
    return [(r.request_id, len(r.tokens), r.start_position, r.sample) for r in plan.rows]


def test_the_budget_rule_picks_the_exact_capacity():
    widest = widest_mixed(MIXED.mixed_capacities)
    assert widest == ((8, 4), (16, 4))
    # W >= L: the largest capacity (as many first tokens delayed as next tokens, or more).
    assert mixed_budget(widest, 3, 1, 0) == (16, 4)
    assert mixed_budget(widest, 2, 2, 0) == (16, 4)
    # W < L: the smallest capacity with room for the lanes and one prompt token.
    assert mixed_budget(widest, 1, 2, 0) == (8, 4)
    # Lanes filling the small capacity's tokens (4 tokens: 3 lanes + 1) or its rows (t8
    # holds 4 rows: 3 lanes + 1 chunk), then the next capacity.
    tokens = widest_mixed(((2, 4), (4, 4), (2, 16), (4, 16), (8, 16)))
    assert tokens == ((4, 4), (16, 8))
    assert mixed_budget(tokens, 1, 3, 0) == (4, 4)
    assert mixed_budget(tokens, 1, 4, 0) == (16, 8)
    rows = widest_mixed(((2, 8), (4, 8), (2, 16), (4, 16), (8, 16)))
    assert rows == ((8, 4), (16, 8))
    assert mixed_budget(rows, 1, 3, 0) == (8, 4)
    assert mixed_budget(rows, 2, 4, 0) == (16, 8)
    # One capacity: always it; no capacity with room: the largest.
    assert mixed_budget(((8, 2),), 1, 1, 0) == (8, 2)
    assert mixed_budget(((8, 2),), 1, 5, 0) == (8, 2)
    assert mixed_budget(tokens, 1, 9, 0) == (16, 8)
    # W < L with a backlog: the small capacity only if its prompt share (tokens - L)
    # clears the owed prompt tokens within DRAIN_STEPS steps, else the next, else the
    # largest (a burst does not trickle in beside many lanes).
    assert DRAIN_STEPS == 8
    assert mixed_budget(widest, 1, 2, 8 * 6) == (8, 4)  # 6 prompt tokens a step: 8 steps
    assert mixed_budget(widest, 1, 2, 8 * 6 + 1) == (16, 4)
    three = widest_mixed(((4, 8), (4, 16), (4, 32)))
    assert mixed_budget(three, 1, 3, 8 * 13) == (16, 4)  # t8 drains 40, t16 104
    assert mixed_budget(three, 1, 3, 8 * 13 + 1) == (32, 4)
    assert mixed_budget(three, 3, 3, 0) == (32, 4)  # W >= L: the largest, whatever owed


def test_a_steady_arrival_is_prefilled_in_the_small_budget():
    loop = FakeLoop(Scheduler(MIXED))
    loop.add(1, (1, 2, 3), 10)
    loop.add(2, (4, 5), 10)
    assert loop.step().kind is StepKind.PREFILL
    loop.add(3, tuple(range(10, 40)), 2)  # 30 prompt tokens
    plans = [loop.step() for _ in range(5)]
    # W = 1 < L = 2: 8 tokens a step (2 lanes + 6), the t8 variant's 4 rows.
    assert [(p.kind, p.lanes, p.token_budget, _rows(p)) for p in plans] == [
        (StepKind.MIXED, 2, 8, [(1, 1, 3 + i, True), (2, 1, 2 + i, True),
                                (3, 6, 6 * i, i == 4)])
        for i in range(5)]
    assert loop.step().kind is StepKind.DECODE  # no prefill left: plain decode
    stats = loop.sched.stats()
    assert stats.mixed_steps == 5 and stats.prompt_tokens_computed == 3 + 2 + 30


def test_a_burst_is_prefilled_in_the_large_budget():
    loop = FakeLoop(Scheduler(MIXED))
    loop.add(1, (1, 2, 3), 10)
    assert loop.step().kind is StepKind.PREFILL
    loop.add(2, tuple(range(10, 28)), 2)  # two 18-token prompts at once
    loop.add(3, tuple(range(30, 48)), 2)
    plans = [loop.step() for _ in range(3)]
    assert [(p.kind, p.lanes, p.token_budget, _rows(p)) for p in plans] == [
        # W = 2 >= L = 1: 16 tokens (a lane + 15).
        (StepKind.MIXED, 1, 16, [(1, 1, 3, True), (2, 15, 0, False)]),
        (StepKind.MIXED, 1, 16, [(1, 1, 4, True), (2, 3, 15, True), (3, 12, 0, False)]),
        # Request 2 decodes: W = 1 < L = 2: 8 tokens (2 lanes + 6).
        (StepKind.MIXED, 2, 8, [(1, 1, 5, True), (2, 1, 18, True), (3, 6, 12, True)]),
    ]
    assert loop.step().kind is StepKind.DECODE


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
