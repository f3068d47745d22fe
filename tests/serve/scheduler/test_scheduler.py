"""Scheduler on tiny geometry (page_tokens 4, 16 pages, 4 slots, decode (1, 2, 4),
prefill (8, 16), 4 prefill rows, context 32): exact plans, pages and counters.

The fake model samples 100 * request_id + output_index (conftest.fake_token).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helios_serve.engine.plan import SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import (
    AdmissionReason,
    CompletionError,
    FinishReason,
    RowResult,
    SchedRequest,
    Scheduler,
    smallest_capacity,
)


def tok(request_id: int, i: int) -> int:
    return 100 * request_id + i


def rows(plan: StepPlan) -> list[tuple]:
    """(request_id, tokens, start_position, page_ids, sample, histogram_tokens) per row."""
    return [
        (r.request_id, r.tokens, r.start_position, r.page_ids, r.sample, r.histogram_tokens)
        for r in plan.rows
    ]


def r(a: int, b: int) -> tuple[int, ...]:
    return tuple(range(a, b))


def assert_idle(sched: Scheduler) -> None:
    s = sched.stats()
    assert s.idle
    assert (s.running, s.waiting, s.outstanding_frames) == (0, 0, 0)
    assert s.slots_free == s.slots_total == sched.geometry.slots
    assert s.pages_used == 0
    assert s.pages_free + s.pages_evictable == s.pages_total == sched.geometry.num_pages
    assert not sched.has_work()


def test_single_request_prefill_then_decode(loop):
    sched = loop.sched
    loop.add(1, r(1, 7), 3)  # 6 prompt tokens
    p = sched.schedule()
    assert p.kind is StepKind.PREFILL
    assert rows(p) == [(1, r(1, 7), 0, (0, 1), True, r(1, 7))]
    assert p.rows[0].slot == 0 and p.rows[0].generation == 1
    assert p.rows[0].sampling == SamplingParams()
    assert loop.complete(p) == [RowResult(1, tok(1, 0), 1)]
    assert sched.stats().pages_cached == 1  # page 0 (tokens 1..4) is complete
    p = sched.schedule()
    assert p.kind is StepKind.DECODE
    assert rows(p) == [(1, (tok(1, 0),), 6, (0, 1), True, None)]
    loop.complete(p)
    p = sched.schedule()
    assert rows(p) == [(1, (tok(1, 1),), 7, (0, 1), True, None)]
    loop.complete(p)  # third output: the loop finishes it (LENGTH)
    assert loop.outputs[1] == [tok(1, 0), tok(1, 1), tok(1, 2)]
    assert sched.schedule() is None
    s = sched.stats()
    assert (s.pages_cached, s.pages_evictable, s.pages_free) == (2, 2, 14)
    assert sched.pages.lru_order() == (1, 0)
    assert (s.prefill_steps, s.decode_steps, s.prompt_tokens_computed) == (1, 2, 6)
    assert s.finished[FinishReason.LENGTH] == 1
    assert_idle(sched)


def test_long_prompt_is_chunked(loop):
    sched = loop.sched
    loop.add(1, r(1, 21), 2)  # 20 tokens: chunks of 16 and 4
    p1 = sched.schedule()
    assert rows(p1) == [(1, r(1, 17), 0, (0, 1, 2, 3), False, r(1, 21))]
    assert sched.stats().pages_cached == 0  # nothing published before completion
    assert loop.complete(p1) == [RowResult(1, None, 0)]
    assert sched.stats().pages_cached == 4
    p2 = sched.schedule()
    assert p2.kind is StepKind.PREFILL
    assert rows(p2) == [(1, r(17, 21), 16, (0, 1, 2, 3, 4), True, None)]
    assert loop.complete(p2) == [RowResult(1, tok(1, 0), 1)]
    assert sched.stats().pages_cached == 5
    p3 = sched.schedule()
    assert rows(p3) == [(1, (tok(1, 0),), 20, (0, 1, 2, 3, 4, 5), True, None)]
    loop.complete(p3)
    assert loop.run() == 0
    assert_idle(sched)


def test_schedule_ahead_only_while_no_row_samples(loop):
    sched = loop.sched
    loop.add(1, r(1, 21), 2)
    assert sched.can_schedule_ahead()
    p1 = sched.schedule()
    assert sched.can_schedule_ahead()  # a non-final chunk samples nothing
    p2 = sched.schedule()  # second frame: the next chunk of the same prompt
    assert rows(p2) == [(1, r(17, 21), 16, (0, 1, 2, 3, 4), True, None)]
    assert sched.outstanding_frames == 2
    assert not sched.can_schedule_ahead()
    with pytest.raises(RuntimeError, match="complete the outstanding plan"):
        sched.schedule()
    with pytest.raises(CompletionError, match="oldest outstanding"):
        sched.complete(p2, [5])
    assert sched.stats().pages_cached == 0
    assert loop.complete(p1) == [RowResult(1, None, 0)]
    assert sched.stats().pages_cached == 4  # only pages the completed plan wrote
    assert not sched.can_schedule_ahead()  # p2 samples: decode needs its token
    assert loop.complete(p2) == [RowResult(1, tok(1, 0), 1)]
    assert sched.can_schedule_ahead()
    loop.run()
    assert_idle(sched)


def test_prefill_packs_requests_and_alternates_with_decode(loop):
    sched = loop.sched
    loop.add(1, r(10, 16), 2)  # 6 tokens
    loop.add(2, r(20, 27), 2)  # 7 tokens
    loop.add(3, r(30, 35), 2)  # 5 tokens: only 3 fit the 16-token step
    p = sched.schedule()
    assert p.kind is StepKind.PREFILL and p.token_count == 16
    assert rows(p) == [
        (1, r(10, 16), 0, (0, 1), True, r(10, 16)),
        (2, r(20, 27), 0, (2, 3), True, r(20, 27)),
        (3, r(30, 33), 0, (4,), False, r(30, 35)),
    ]
    assert [row.slot for row in p.rows] == [0, 1, 2]
    loop.complete(p)
    p = sched.schedule()  # after a prefill, requests with a pending token decode first
    assert rows(p) == [
        (1, (tok(1, 0),), 6, (0, 1), True, None),
        (2, (tok(2, 0),), 7, (2, 3), True, None),
    ]
    loop.complete(p)  # both reach 2 outputs and finish
    p = sched.schedule()
    assert rows(p) == [(3, (33, 34), 3, (4, 5), True, None)]
    loop.complete(p)
    p = sched.schedule()
    assert rows(p) == [(3, (tok(3, 0),), 5, (4, 5), True, None)]
    loop.complete(p)
    assert sched.schedule() is None
    assert_idle(sched)


def test_waiting_requests_do_not_starve_running_decode(loop):
    loop.add(1, r(1, 5), 10)
    loop.step()  # prefill
    loop.step()  # decode
    for rid in (2, 3, 4):
        loop.add(rid, r(10 * rid, 10 * rid + 16), 1)  # one full step each
    kinds = []
    for _ in range(6):
        kinds.append(loop.step().kind)
    assert kinds == [StepKind.PREFILL, StepKind.DECODE] * 3


def test_prefix_reuse_across_requests(loop):
    sched = loop.sched
    prompt_1 = r(1, 11)  # 10 tokens: pages 0, 1 complete after prefill
    loop.add(1, prompt_1, 1)
    loop.run()
    assert sched.pages.lru_order() == (1, 0)  # page 2 (partial) went to the free list
    prompt_2 = r(1, 9) + (77, 78, 79)  # shares two complete pages
    loop.add(2, prompt_2, 2)
    p = sched.schedule()
    assert rows(p) == [(2, (77, 78, 79), 8, (0, 1, 3), True, prompt_2)]
    assert [sched.pages.refcount(x) for x in (0, 1, 3)] == [1, 1, 1]
    # A third request with the same two pages shares them while request 2 runs.
    loop.add(3, r(1, 9) + (90,), 1)
    loop.complete(p)
    p = sched.schedule()
    assert p.kind is StepKind.DECODE  # request 2 has a pending token
    loop.complete(p)
    p = sched.schedule()
    assert rows(p) == [(3, (90,), 8, (0, 1, 4), True, r(1, 9) + (90,))]
    assert [sched.pages.refcount(x) for x in (0, 1)] == [1, 1]  # request 2 finished
    loop.complete(p)
    s = sched.stats()
    assert (s.prefix_queries, s.prefix_hit_tokens, s.prefix_hit_pages) == (3, 16, 4)
    assert_idle(sched)


def test_reused_prompt_tokens_reported_on_finish(sched):
    sched.add(SchedRequest(1, r(1, 11), 1))
    p = sched.schedule()
    sched.complete(p, [7])
    assert sched.finish(1, FinishReason.STOP).reused_prompt_tokens == 0
    sched.add(SchedRequest(2, r(1, 10), 1))  # 9 tokens: the page of token 9 is excluded
    p = sched.schedule()
    assert rows(p)[0][1:4] == ((9,), 8, (0, 1, 3))  # page 2 (partial) sits at the free tail
    sched.complete(p, [7])
    done = sched.finish(2, FinishReason.STOP)
    assert (done.reused_prompt_tokens, done.output_tokens, done.preemptions) == (8, (7,), 0)


def test_prefix_match_never_covers_the_last_prompt_token(loop):
    sched = loop.sched
    loop.add(1, r(1, 11), 1)
    loop.run()
    loop.add(2, r(1, 9), 1)  # exactly two pages: page 1 holds the last token
    p = sched.schedule()
    assert rows(p) == [(2, r(5, 9), 4, (0, 3), True, r(1, 9))]
    loop.complete(p)
    # page 3 repeats cached page 1's content: it stays private and is freed
    assert not sched.pages.is_published(3)
    assert sched.pages.lru_order() == (1, 0)
    assert sched.stats().pages_free == 14


def test_lru_eviction_order_through_the_scheduler(loop):
    sched = loop.sched
    loop.add(1, r(1, 13), 1)  # 3 complete pages
    loop.add(2, r(21, 33), 1)
    loop.run()
    assert sched.pages.lru_order() == (2, 1, 0, 5, 4, 3)
    loop.add(3, r(41, 69), 1)  # 28 tokens: pages 6..12 from the free list
    loop.run()
    assert [p.rows[0].page_ids for p in loop.plans[-2:]] == [r(6, 10), r(6, 13)]
    assert sched.pages.lru_order() == (2, 1, 0, 5, 4, 3, 12, 11, 10, 9, 8, 7, 6)
    assert sched.stats().page_evictions == 0
    loop.add(4, r(71, 91), 1)  # 5 pages: 13, 14, 15 free, then evicts 2, then 1
    loop.run()
    assert [p.rows[0].page_ids for p in loop.plans[-2:]] == [(13, 14, 15, 2), (13, 14, 15, 2, 1)]
    assert sched.stats().page_evictions == 2
    # Request 1's chain lost its tail first; its head page still serves a hit.
    loop.add(5, r(1, 13) + (7,), 1)
    p = sched.schedule()
    assert rows(p) == [(5, r(5, 13) + (7,), 4, (0, 5, 4, 3), True, r(1, 13) + (7,))]
    loop.complete(p)
    s = sched.stats()
    assert (s.page_evictions, s.prefix_hit_tokens) == (5, 4)
    assert_idle(sched)


def test_preempts_newest_after_waiting_for_reclamation_and_readmits(loop):
    sched = loop.sched
    prompts = {rid: r(10 * rid, 10 * rid + 12) for rid in (1, 2, 3)}
    for rid, prompt in prompts.items():
        loop.add(rid, prompt, 20)  # 3 x 8 pages of demand on 16
    steps = []
    while (p := sched.schedule()) is not None:
        steps.append((p, sched.stats().preemptions))
        loop.complete(p)
    plans = [p for p, _ in steps]
    # Steps 12-14: pages are short; requests 2 and 3 wait while request 1 (which
    # still has room in its last page) progresses: no preemption yet.
    assert [row.request_id for row in plans[11].rows] == [1, 2, 3]
    assert [[row.request_id for row in plans[i].rows] for i in (12, 13, 14)] == [[1, 3], [1], [1]]
    assert [pre for _, pre in steps[:15]] == [0] * 15
    # Step 15: nothing can progress; request 3 (newest) is preempted, its pages
    # (published, released tail first: 14, 11, 10, 8, 7) feed requests 1 and 2.
    assert steps[15][1] == 1
    assert rows(plans[15]) == [
        (1, (tok(1, 12),), 24, (0, 1, 2, 4, 12, 15, 14), True, None),
        (2, (tok(2, 8),), 20, (3, 5, 6, 9, 13, 11), True, None),
    ]
    # Readmission once request 1 finishes: prompt + 9 outputs recomputed, the
    # surviving head page 7 reused, histogram over prompt + output so far.
    readmit = plans[22]
    history_3 = prompts[3] + tuple(tok(3, i) for i in range(9))
    assert rows(readmit) == [
        (3, history_3[4:20], 4, (7, 10, 14, 15, 12), False, history_3),
    ]
    assert readmit.rows[0].slot == 0 and readmit.rows[0].generation == 2  # request 1's slot
    assert rows(plans[24]) == [(3, history_3[20:21], 20, (7, 10, 14, 15, 12, 4), True, None)]
    assert loop.outputs[3] == [tok(3, i) for i in range(20)]
    assert loop.outputs[1] == [tok(1, i) for i in range(20)]
    assert loop.outputs[2] == [tok(2, i) for i in range(20)]
    s = sched.stats()
    assert (s.preemptions, s.admitted, s.readmitted, s.prefix_hit_tokens) == (1, 3, 1, 4)
    assert len(plans) == 35
    assert_idle(sched)


def test_preempted_request_goes_to_the_front_of_the_queue(make_loop):
    loop = make_loop(num_pages=8)
    sched = loop.sched
    loop.add(1, r(1, 17), 16)  # 4 pages of prompt, 8 at most
    loop.add(2, r(21, 33), 4)  # 3 pages of prompt
    loop.add(3, r(41, 45), 1)
    p = sched.schedule()
    assert [row.request_id for row in p.rows] == [1]
    loop.complete(p)
    p = sched.schedule()  # decode 1 (page 4)
    loop.complete(p)
    p = sched.schedule()  # prefill 2 (pages 5, 6, 7); 3 finds no page and waits
    assert rows(p) == [(2, r(21, 33), 0, (5, 6, 7), True, r(21, 33))]
    loop.complete(p)
    p = sched.schedule()  # decode 1 and 2; 2 needs a page: none free, none idle
    assert [row.request_id for row in p.rows] == [1]
    loop.complete(p)
    p = sched.schedule()
    loop.complete(p)
    p = sched.schedule()
    loop.complete(p)  # 1 fills page 4 at position 19
    assert sched.stats().preemptions == 0
    p = sched.schedule()  # neither can progress: preempt 2 (the newest)
    assert sched.stats().preemptions == 1 and sched.stats().waiting == 2
    # 2's published pages went idle tail first (7, 6, 5); 1 takes page 7
    assert rows(p) == [(1, (tok(1, 4),), 20, (0, 1, 2, 3, 4, 7), True, None)]
    assert sched.pages.lru_order() == (6, 5)
    loop.complete(p)
    plans_before = len(loop.plans)
    loop.run()
    readmit = loop.plans[plans_before + 10]  # once 1 finishes: 2 first, then 3
    history_2 = r(21, 33) + (tok(2, 0),)
    assert rows(readmit) == [
        (2, history_2, 0, (5, 6, 7, 4), True, history_2),
        (3, r(41, 44), 0, (3,), False, r(41, 45)),
    ]
    assert loop.finished == [1, 3, 2]
    assert loop.outputs[2] == [tok(2, i) for i in range(4)]
    assert_idle(sched)


def test_cancel_keeps_pages_until_the_plan_completes(loop):
    sched = loop.sched
    loop.add(1, r(1, 9), 4)
    loop.add(2, r(11, 15), 4)
    p = sched.schedule()
    assert [row.page_ids for row in p.rows] == [(0, 1), (2,)]
    done = sched.cancel(1)
    assert done.reason is FinishReason.CANCELLED and done.output_tokens == ()
    s = sched.stats()
    assert (s.running, s.slots_free, s.pages_used) == (1, 2, 3)  # still held
    assert sched.is_live(1)  # draining its frame
    results = loop.complete(p)
    assert results == [RowResult(2, tok(2, 0), 1)]  # nothing for the cancelled row
    s = sched.stats()
    assert (s.slots_free, s.pages_used, s.pages_free) == (3, 1, 15)
    assert s.pages_cached == 1  # request 2's page; 1's two pages were never published
    assert not sched.pages.is_published(0) and not sched.pages.is_published(1)
    assert s.finished[FinishReason.CANCELLED] == 1
    assert not sched.is_live(1)
    assert sched.cancel(1) is None  # gone: a late cancel is not an error
    loop.run()
    assert_idle(sched)


def test_cancel_outside_a_frame_releases_at_once(loop):
    sched = loop.sched
    loop.add(1, r(1, 6), 4)
    loop.add(2, r(11, 14), 4)
    loop.step()  # both prefilled
    assert sched.stats().pages_cached == 1
    sched.cancel(1)
    assert sched.stats().pages_used == 1  # request 2's page; 1's pages returned
    sched.cancel(2)
    assert_idle(sched)
    loop.add(3, r(1, 6), 1)
    loop.add(4, r(1, 6), 1)
    sched.cancel(4)  # waiting: leaves at once, never admitted
    assert sched.stats().waiting == 1
    loop.run()
    assert loop.finished == [3]
    s = sched.stats()
    assert (s.admitted, s.finished[FinishReason.CANCELLED]) == (3, 3)
    assert_idle(sched)


@pytest.mark.parametrize(
    ("changes", "prompt_tokens", "max_output", "reason"),
    [
        ({}, 0, 4, AdmissionReason.EMPTY_PROMPT),
        ({}, 4, 0, AdmissionReason.INVALID_OUTPUT_LIMIT),
        ({}, 30, 3, AdmissionReason.CONTEXT_EXCEEDED),
        ({"context_tokens": 64}, 30, 3, AdmissionReason.PAGE_TABLE_EXCEEDED),
        ({"num_pages": 6}, 20, 5, AdmissionReason.CACHE_EXCEEDED),
    ],
)
def test_admission_rejections(make_loop, changes, prompt_tokens, max_output, reason):
    loop = make_loop(**changes)
    sched = loop.sched
    loop.add(1, r(1, 5), 1)
    error = sched.add(SchedRequest(2, r(1, 1 + prompt_tokens), max_output))
    assert error.reason is reason and error.request_id == 2 and error.detail
    s = sched.stats()
    assert s.waiting == 1 and s.rejected[reason] == 1 and sum(s.rejected.values()) == 1
    loop.run()
    assert loop.finished == [1]
    assert sched.add(SchedRequest(2, r(1, 5), 1)) is None  # the id was never taken


def test_admission_accepts_exact_capacities(make_loop):
    sched = make_loop(num_pages=8).sched
    assert sched.add(SchedRequest(1, r(0, 29), 3)) is None  # 32 tokens = 8 pages
    with pytest.raises(ValueError, match="already live"):
        sched.add(SchedRequest(1, r(0, 4), 1))


def test_decode_never_exceeds_the_largest_capacity(make_loop):
    loop = make_loop(decode_capacities=(1, 2))
    sched = loop.sched
    for rid in (1, 2, 3, 4):
        loop.add(rid, r(10 * rid, 10 * rid + 4), 3)
    loop.step()  # one prefill of all four
    served = [[row.request_id for row in loop.step().rows] for _ in range(4)]
    # least recently served first; rows stay in admission order
    assert served == [[1, 2], [3, 4], [1, 2], [3, 4]]
    loop.run()
    assert_idle(sched)


def test_prefill_row_capacity_limits_packing(make_loop):
    loop = make_loop(prefill_row_capacity=2)
    for rid in (1, 2, 3):
        loop.add(rid, r(10 * rid, 10 * rid + 3), 1)
    assert [row.request_id for row in loop.step().rows] == [1, 2]
    assert [row.request_id for row in loop.step().rows] == [3]


def test_slot_generation_bumps_on_reassignment(loop):
    sched = loop.sched
    loop.add(1, r(1, 4), 1)
    p = loop.step()
    assert (p.rows[0].slot, p.rows[0].generation) == (0, 1)
    loop.add(2, r(1, 4), 1)
    p = loop.step()
    assert (p.rows[0].slot, p.rows[0].generation) == (0, 2)
    assert [sched.slot_generation(s) for s in range(4)] == [2, 0, 0, 0]


def test_complete_validates_before_changing_anything(loop):
    sched = loop.sched
    loop.add(1, r(1, 6), 2)
    p = sched.schedule()
    with pytest.raises(CompletionError, match="1 rows"):
        sched.complete(p, [1, 2])
    with pytest.raises(CompletionError, match="outside"):
        sched.complete(p, [1000])
    with pytest.raises(CompletionError, match="outside"):
        sched.complete(p, [-1])
    forged = StepPlan(StepKind.DECODE, p.rows)
    with pytest.raises(CompletionError, match="oldest outstanding"):
        sched.complete(forged, [1])
    masked = StepPlan(
        p.kind, tuple(replace(row, grammar_mask=np.zeros(32, np.int32)) for row in p.rows)
    )
    assert masked == p  # a plan with masks attached still completes
    assert sched.outstanding_frames == 1 and sched.stats().pages_cached == 0
    assert sched.complete(masked, [tok(1, 0)]) == [RowResult(1, tok(1, 0), 1)]
    with pytest.raises(CompletionError, match="oldest outstanding"):
        sched.complete(p, [1])


def test_fail_finishes_rows_with_error_and_publishes_nothing(loop):
    sched = loop.sched
    loop.add(1, r(1, 9), 4)
    loop.add(2, r(1, 9), 4)
    p = sched.schedule()
    failed = sched.fail(p)
    assert [(f.request_id, f.reason) for f in failed] == [
        (1, FinishReason.ERROR),
        (2, FinishReason.ERROR),
    ]
    assert sched.stats().pages_cached == 0
    assert sched.stats().finished[FinishReason.ERROR] == 2
    assert_idle(sched)


def test_unfinished_request_at_its_limit_is_neither_decoded_nor_preempted(sched):
    sched.add(SchedRequest(1, r(1, 5), 1))
    p = sched.schedule()
    sched.complete(p, [9])  # the worker has not called finish yet
    assert sched.schedule() is None
    assert sched.stats().preemptions == 0
    assert sched.finish(1, FinishReason.LENGTH).output_tokens == (9,)
    with pytest.raises(KeyError):
        sched.finish(1, FinishReason.LENGTH)
    assert_idle(sched)


def test_idle_state_is_restored_after_a_mixed_workload(loop):
    sched = loop.sched
    shared = r(500, 512)
    for rid in range(1, 9):
        loop.add(rid, shared + r(10 * rid, 10 * rid + rid), 2 + rid)
    loop.add(9, r(1, 25), 8)
    steps = 0
    while sched.has_work():
        p = sched.schedule()
        assert p is not None
        steps += 1
        if steps == 5:
            sched.cancel(p.rows[0].request_id)
        loop.complete(p)
        assert steps < 200
    s = sched.stats()
    assert s.idle and s.pages_used == 0 and s.slots_free == 4
    assert s.pages_free + s.pages_evictable == 16
    assert s.prefix_hit_tokens > 0
    assert sum(s.finished.values()) == 9


def test_smallest_capacity():
    assert [smallest_capacity((1, 2, 4), n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    assert smallest_capacity((8, 16), 13) == 16


def test_geometry_is_validated(geometry):
    with pytest.raises(ValueError, match="decode_capacities"):
        Scheduler(replace(geometry, decode_capacities=(4, 2)))
    with pytest.raises(ValueError, match="prefill_token_capacities"):
        Scheduler(replace(geometry, prefill_token_capacities=()))
