"""Frames on its own: the may-issue rule, issue order, the oldest-plan check, unplanning
and the per-kind counts (hand-built plans, CPU)."""

from __future__ import annotations

import pytest
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import CompletionError
from helios_serve.scheduler.frames import Frames

GREEDY = SamplingParams()


def _row(rid: int, sample: bool = True, tokens=(5,)) -> RowPlan:
    return RowPlan(rid, rid, 1, tokens, 0, (0,), sample, GREEDY)


def test_may_issue_follows_frames_feedback_and_the_newest_plan():
    f = Frames(2, device_pending=False)
    assert f.may_issue(feedback=True)  # nothing outstanding
    f.issue(StepPlan(StepKind.PREFILL, (_row(1, sample=False, tokens=(1, 2, 3)),)))
    assert f.may_issue(False) and not f.may_issue(True)
    f.issue(StepPlan(StepKind.PREFILL, (_row(1),)))
    assert not f.may_issue(False)  # two frames outstanding
    g = Frames(2, device_pending=False)
    g.issue(StepPlan(StepKind.DECODE, (_row(1),)))
    assert not g.may_issue(False)  # its token is not known
    h = Frames(2, device_pending=True)
    h.issue(StepPlan(StepKind.DECODE, (_row(1),)))
    assert h.may_issue(False)  # the device feeds it


def test_issue_counts_kinds_steps_and_prefill_tokens():
    f = Frames(2, device_pending=True)
    prefill = StepPlan(StepKind.PREFILL, (_row(1, tokens=(1, 2, 3)), _row(2, tokens=(4,))))
    transfer = StepPlan(StepKind.TRANSFER, ())
    assert f.issue(prefill) is prefill and f.issue(transfer) is transfer
    assert (f.step, f.last_kind, f.prefill_tokens, f.outstanding) == \
        (2, StepKind.PREFILL, 4, 2)  # a TRANSFER leaves last_kind alone
    assert f.issued[StepKind.PREFILL] == f.issued[StepKind.TRANSFER] == 1
    assert f.issued[StepKind.DECODE] == 0


def test_plans_complete_in_issue_order():
    f = Frames(2, device_pending=True)
    a, b = StepPlan(StepKind.DECODE, (_row(1),)), StepPlan(StepKind.DECODE, (_row(2),))
    f.issue(a)
    f.issue(b)
    with pytest.raises(CompletionError, match="not the oldest outstanding plan"):
        f.pop(b)
    assert f.pop(StepPlan(StepKind.DECODE, (_row(1),))) is a  # an equal copy completes it
    assert f.pop(b) is b and f.outstanding == 0
    with pytest.raises(CompletionError):
        f.check_oldest(a)


def test_unplan_drops_a_requests_rows_and_emptied_plans():
    f = Frames(2, device_pending=True)
    only = StepPlan(StepKind.DECODE, (_row(1),))
    shared = StepPlan(StepKind.PREFILL, (_row(1, sample=False), _row(2)))
    f.hold([only, shared])
    assert f.unplan(1) == [_row(1), _row(1, sample=False)]
    assert f.ready == 1 and f.next_ready() == StepPlan(StepKind.PREFILL, (_row(2),))
    assert f.next_ready() is None
