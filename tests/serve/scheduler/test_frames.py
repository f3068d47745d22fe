"""Two execution frames with a device-owned pending token: decode planned ahead of the
previous decode's completion (the specification: completion feedback)."""

from __future__ import annotations

import pytest
from helios_serve.engine.plan import PENDING_PLACEHOLDER, StepKind
from helios_serve.scheduler import FinishReason, RowResult, SchedRequest, Scheduler

SLOTS = 4  # the tiny scheduler geometry (conftest.TINY)


def fake_token(request_id: int, i: int) -> int:
    return 100 * request_id + i


def test_decode_is_planned_ahead_with_the_token_still_on_the_device(ahead_loop):
    loop = ahead_loop()
    sched = loop.sched
    loop.add(1, tuple(range(1, 7)), 4)  # 6 prompt tokens, pages 0-1
    p0 = sched.schedule()
    assert not sched.can_schedule_ahead()  # prefill -> decode changes phase: feedback
    loop.complete(p0)
    p1 = sched.schedule()
    assert p1.kind is StepKind.DECODE and p1.rows[0].tokens == (fake_token(1, 0),)
    assert sched.can_schedule_ahead()
    p2 = sched.schedule()  # the token p1 samples is fed from the device
    assert [(r.tokens, r.start_position, r.page_ids) for r in p2.rows] == [
        ((PENDING_PLACEHOLDER,), 7, (0, 1))]
    assert sched.outstanding_frames == 2 and not sched.can_schedule_ahead()
    with pytest.raises(RuntimeError, match="complete the outstanding plan"):
        sched.schedule()
    assert loop.complete(p1) == [RowResult(1, fake_token(1, 1), 2)]
    assert sched.can_schedule_ahead()
    p3 = sched.schedule()  # output 4 of 4: p2 brings 3, p3 the last
    assert [(r.tokens, r.start_position, r.page_ids) for r in p3.rows] == [
        ((PENDING_PLACEHOLDER,), 8, (0, 1, 2))]  # position 8 opens page 2
    assert loop.complete(p2) == [RowResult(1, fake_token(1, 2), 3)]
    assert sched.schedule() is None  # no output budget left for a fourth frame
    loop.complete(p3)
    assert loop.outputs[1] == [fake_token(1, i) for i in range(4)]
    assert loop.finished == [1]
    assert sched.stats().pages_used == 0 and not sched.has_work()


def test_request_finished_by_the_first_frame_drops_the_ahead_row(ahead_loop):
    loop = ahead_loop()
    sched = loop.sched
    loop.add(1, (1, 2, 3), 8)
    loop.complete(sched.schedule())
    p1 = sched.schedule()
    p2 = sched.schedule()  # ahead
    sched.complete(p1, [0])  # EOS: the worker finishes the request
    sched.finish(1, FinishReason.STOP)
    assert sched.stats().pages_used == 2  # the ahead row opened page 1; kept until it completes
    assert sched.complete(p2, [55]) == []  # discarded
    s = sched.stats()
    assert (s.pages_used, s.running, s.slots_free) == (0, 0, SLOTS)
    assert s.finished[FinishReason.STOP] == 1 and not sched.has_work()


def test_admission_prefill_runs_ahead_of_a_decode_and_decode_waits_for_it(ahead_loop):
    loop = ahead_loop()
    sched = loop.sched
    loop.add(1, (1, 2, 3), 6)
    loop.complete(sched.schedule())
    p1 = sched.schedule()  # decode of request 1
    loop.add(2, (7, 8, 9, 10, 11), 2)
    p2 = sched.schedule()  # prefill of request 2 ahead of p1's completion
    assert p2.kind is StepKind.PREFILL and [r.request_id for r in p2.rows] == [2]
    assert not sched.can_schedule_ahead()  # both frames busy
    loop.complete(p1)
    assert not sched.can_schedule_ahead()  # p2 samples and is not a decode
    loop.complete(p2)
    p3 = sched.schedule()
    assert [(r.request_id, r.tokens) for r in p3.rows] == [
        (1, (fake_token(1, 1),)), (2, (fake_token(2, 0),))]
    loop.complete(p3)
    loop.run()
    assert loop.outputs == {1: [fake_token(1, i) for i in range(6)],
                            2: [fake_token(2, i) for i in range(2)]}


@pytest.mark.parametrize("frames,device_pending", [(1, True), (2, False)])
def test_no_decode_ahead_with_one_frame_or_a_host_fed_token(ahead_loop, frames, device_pending):
    loop = ahead_loop(frames, device_pending)
    sched = loop.sched
    loop.add(1, (1, 2, 3), 4)
    loop.complete(sched.schedule())
    sched.schedule()
    assert not sched.can_schedule_ahead()


def test_a_live_request_needing_feedback_keeps_one_plan_outstanding(ahead_loop):
    loop = ahead_loop()
    sched = loop.sched
    loop.add(1, (1, 2, 3), 6)
    assert sched.add(SchedRequest(2, (4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                                      20), 3, needs_feedback=True)) is None
    loop.limits[2], loop.outputs[2] = 3, []
    p = sched.schedule()  # prefill: request 1 whole, request 2's first chunk (no sample)
    assert [r.sample for r in p.rows] == [True, False]
    assert not sched.can_schedule_ahead()  # even a non-sampling chunk: 2 needs feedback
    loop.complete(p)
    while sched.is_live(2):
        plan = sched.schedule()
        assert not sched.can_schedule_ahead()
        loop.complete(plan)
    plan = sched.schedule()  # request 1 alone: decode ahead again
    assert sched.can_schedule_ahead()
    loop.complete(plan)
    loop.run()
    assert loop.outputs == {1: [fake_token(1, i) for i in range(6)],
                            2: [fake_token(2, i) for i in range(3)]}


def test_frames_outside_the_supported_range_are_rejected(geometry):
    with pytest.raises(ValueError, match=r"frames must be in 1..2, got 3"):
        Scheduler(geometry, frames=3)
