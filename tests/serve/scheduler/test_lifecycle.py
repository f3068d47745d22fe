"""Lifecycle on its own: a request queued, admitted by hand, completed, finished and
retired; a failed plan and a waiting cancellation (8 pages of 4 tokens, CPU, exact)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import CompletionError, FinishReason, RowResult, SchedRequest
from helios_serve.scheduler.allocation import SequencePages
from helios_serve.scheduler.cache import CacheManager
from helios_serve.scheduler.frames import Frames
from helios_serve.scheduler.lanes import SpeculativeLanes
from helios_serve.scheduler.lifecycle import Lifecycle
from helios_serve.scheduler.publication import Publisher
from helios_serve.scheduler.sequence import Sequence
from helios_serve.scheduler.step_clock import StepClock
from helios_serve.scheduler.transfers import TransferQueue
from helios_serve.testing.scripted import tiny_geometry

GEO = tiny_geometry(64, num_pages=8, slots=2)


def _life() -> tuple[Lifecycle, Callable[[StepPlan], None]]:
    """A Lifecycle over real collaborators, and what Scheduler.schedule does when it hands
    a plan out (the step clock and the frames note its issue)."""
    queue = TransferQueue(4)
    cache = CacheManager(GEO.num_pages, GEO.page_tokens, queue=queue)
    frames, clock = Frames(1, False), StepClock(lambda: 0.0, None, ())
    life = Lifecycle(GEO, SequencePages(GEO, cache), Publisher(cache, GEO.page_tokens, True),
                     SpeculativeLanes(GEO), frames, clock, queue)

    def issue(plan: StepPlan) -> None:
        clock.issue(plan)
        frames.issue(plan)

    return life, issue


def _running(life: Lifecycle, rid: int, prompt=(1, 2, 3, 4, 5)) -> Sequence:
    seq = Sequence(SchedRequest(rid, prompt, 3), rid)
    life.queue(seq)
    assert life.alloc.allocate(seq, 8, lambda: life.transfer_failed(seq))
    life.waiting.remove(seq)
    life.running.append(seq)
    return seq


def _prefill(seq: Sequence) -> StepPlan:
    n = len(seq.tokens)
    seq.issue(n, True, False, 0)
    return StepPlan(StepKind.PREFILL, (RowPlan(seq.request_id, seq.slot, seq.generation,
                                               tuple(seq.tokens), 0, tuple(seq.page_ids),
                                               True, SamplingParams()),))


def test_complete_appends_the_token_and_publishes_the_complete_page():
    life, issue = _life()
    seq = _running(life, 1)
    plan = _prefill(seq)
    issue(plan)
    assert life.complete(plan, [9]) == [RowResult(1, 9, 1)]
    assert seq.tokens == [1, 2, 3, 4, 5, 9] and seq.num_computed == 5
    assert seq.num_published == 1 and life.alloc.cache.pages.is_published(seq.page_ids[0])
    summary = life.finish(1, FinishReason.LENGTH)
    assert (summary.reason, summary.output_tokens) == (FinishReason.LENGTH, (9,))
    assert 1 not in life.requests and life.running == [] and life.alloc.free_slots == 2
    assert life.finished[FinishReason.LENGTH] == 1


def test_a_record_of_another_plan_or_an_id_outside_the_vocabulary_changes_nothing():
    life, issue = _life()
    seq = _running(life, 1)
    plan = _prefill(seq)
    issue(plan)
    with pytest.raises(CompletionError, match="sampled id 64 outside"):
        life.complete(plan, [64])
    with pytest.raises(CompletionError, match="2 sampled ids for 1 rows"):
        life.complete(plan, [9, 9])
    with pytest.raises(CompletionError, match="not the oldest outstanding plan"):
        life.complete(StepPlan(StepKind.PREFILL, ()), [])
    assert seq.tokens == [1, 2, 3, 4, 5] and seq.inflight_rows == 1


def test_a_failed_plan_ends_its_requests_with_error_and_frees_them():
    life, issue = _life()
    seq = _running(life, 1)
    plan = _prefill(seq)
    issue(plan)
    (summary,) = life.fail(plan)
    assert summary.reason is FinishReason.ERROR and seq.failed
    assert life.requests == {} and life.alloc.free_slots == 2


def test_a_waiting_request_leaves_at_once_when_cancelled():
    life, _ = _life()
    seq = Sequence(SchedRequest(4, (1, 2), 3), -1)
    life.queue(seq)
    assert life.cancel(4).reason is FinishReason.CANCELLED and seq.cancelled
    assert list(life.waiting) == [] and life.requests == {} and life.cancel(4) is None
