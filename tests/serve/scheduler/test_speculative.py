"""Scheduler: SPECULATIVE lanes, their completion records and the validation of each field
(the specification, "Complete speculative generation", "Attention histories")."""

from __future__ import annotations

import numpy as np
import pytest
from helios_serve.engine.plan import PENDING_PLACEHOLDER, SamplingParams, StepKind
from helios_serve.scheduler import CompletionError, FinishReason, SchedRequest, Scheduler
from helios_serve.speculation.policy import MIN_COST_SAMPLES
from helios_serve.testing.scripted import tiny_geometry

VOCAB = 64
WIDTH = 4


def _scheduler(**kw) -> Scheduler:
    geo = tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH), **kw)
    return Scheduler(geo, frames=1, device_pending=True)


def _record(plan, accepted, tokens_per_lane, cursor_delta=0):
    """Well-formed lane records for `plan`: `accepted[i]` drafts accepted, emitted ids
    `tokens_per_lane[i]` (len accepted + 1)."""
    rows = []
    for row, a, ids in zip(plan.rows, accepted, tokens_per_lane, strict=True):
        rec = [row.generation, row.lane_length, a, a + 1,
               row.start_position + a + 1 + cursor_delta, -1]
        rec += list(ids) + [-1] * (WIDTH - len(ids))
        rows.append(rec)
    return np.asarray(rows, np.int32)


def _to_decode(s: Scheduler, prompt=(1, 2, 3, 4, 5), max_out=10, width_one=False):
    s.add(SchedRequest(request_id=7, prompt_tokens=prompt, max_output_tokens=max_out,
                       width_one=width_one))
    plan = s.schedule()
    assert plan.kind is StepKind.PREFILL
    s.complete(plan, [9])
    return s.schedule()


def test_lane_lengths_follow_width_budget_and_width_one():
    s = _scheduler()
    plan = _to_decode(s, max_out=10)
    assert plan.kind is StepKind.SPECULATIVE
    (row,) = plan.rows
    assert (row.lane_length, row.start_position, row.tokens) == (WIDTH, 5, (9,))
    # Pages cover the lane's full ceiling: positions 0 .. 8 (4-token pages).
    assert len(row.page_ids) == 3
    s2 = _scheduler()
    assert _to_decode(s2, max_out=3).rows[0].lane_length == 2  # 1 output so far, 2 left
    s3 = _scheduler()
    assert _to_decode(s3, width_one=True).rows[0].lane_length == 1


def test_completion_emits_each_token_and_rewinds_to_the_consumed_endpoint():
    s = _scheduler()
    plan = _to_decode(s)
    results = s.complete(plan, _record(plan, [2], [[11, 12, 13]]))
    assert [(r.token_id, r.output_tokens) for r in results] == [(11, 2), (12, 3), (13, 4)]
    nxt = s.schedule()
    (row,) = nxt.rows
    # consumed: prompt 5 + pending 9 + drafts 11, 12 -> the new pending 13 sits at 8.
    assert row.start_position == 8 and row.lane_length == WIDTH
    stats = s.stats()
    assert (stats.speculative_steps, stats.spec_draft_tokens, stats.spec_accepted_tokens) == (
        2, 3, 2)
    assert stats.spec_accepted_per_position == (1, 1, 0)
    assert stats.spec_accepted_lengths == (0, 0, 0, 1, 0)


def test_output_limit_is_never_exceeded():
    s = _scheduler()
    plan = _to_decode(s, max_out=3)  # 1 token from prefill, lane of 2
    results = s.complete(plan, _record(plan, [1], [[11, 12]]))
    assert results[-1].output_tokens == 3
    assert s.schedule() is None  # the budget is spent: nothing more is planned


def test_finish_inside_a_run_discards_the_rest_and_publishes_nothing_of_it():
    s = _scheduler(page_tokens=4)
    plan = _to_decode(s, prompt=(1, 2, 3, 4, 5, 6, 7), max_out=20)
    published = s.stats().pages_published
    s.complete(plan, _record(plan, [3], [[11, 12, 13, 14]]))
    # Positions 7..10 hold pending + 3 drafts: page 1 (4..7) and 2 (8..11) are complete
    # only through tokens that may still be cut; page 1 holds the pending token (kept).
    assert s.stats().pages_published == published + 1
    summary = s.finish(7, FinishReason.STOP, output_tokens=2)  # stop at the 2nd token
    assert summary.output_tokens == (9, 11)
    assert s.stats().pages_published == published + 1
    assert s.stats().idle


BAD_RECORDS = [
    ("generation", lambda r: r.__setitem__((0, 0), 99), "generation 99"),
    ("offers", lambda r: r.__setitem__((0, 1), 3), "3 offers, the lane reserved 4"),
    ("accepted", lambda r: r.__setitem__((0, 2), 4), "4 accepted and 3 emitted"),
    ("emitted", lambda r: r.__setitem__((0, 3), 2), "2 accepted and 2 emitted"),
    ("cursor", lambda r: r.__setitem__((0, 4), 7), "draft cursor 7, expected 8"),
    ("reserved", lambda r: r.__setitem__((0, 5), 0), "reserved field 0"),
    ("id", lambda r: r.__setitem__((0, 7), VOCAB), r"outside \[0, 64\)"),
    ("padding", lambda r: r.__setitem__((0, 9), 5), r"padding \[5\] not -1"),
]


@pytest.mark.parametrize("field,edit,message", BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_each_invalid_record_field_is_refused_before_any_change(field, edit, message):
    s = _scheduler()
    plan = _to_decode(s)
    record = _record(plan, [2], [[11, 12, 13]])
    edit(record)
    before = s.stats()
    with pytest.raises(CompletionError, match=message):
        s.complete(plan, record)
    assert s.stats() == before and s.outstanding_frames == 1
    failed = s.fail(plan)  # what the worker does: exactly this step's requests fail
    assert [f.request_id for f in failed] == [7] and failed[0].reason is FinishReason.ERROR
    assert s.stats().idle


def test_record_shape_and_submission_order_are_checked():
    s = _scheduler()
    plan = _to_decode(s)
    with pytest.raises(CompletionError, match="lane records of shape"):
        s.complete(plan, np.zeros(3, np.int32))
    other = s.schedule.__self__  # the same scheduler: a plan it never issued
    fake = type(plan)(plan.kind, plan.rows[:0])
    with pytest.raises(CompletionError, match="oldest outstanding"):
        other.complete(fake, np.zeros((0, 10), np.int32))


def _admit_all(s: Scheduler, requests, first_token=9):
    for r in requests:
        assert s.add(r) is None
    plan = s.schedule()
    assert plan.kind is StepKind.PREFILL
    s.complete(plan, [first_token] * len(plan.rows))


def test_logprobs_and_logit_bias_requests_run_as_decode_rows_in_alternate_steps():
    s = _scheduler()
    plain = [SamplingParams(logprobs=0), SamplingParams(logit_bias=((3, 5.0),))]
    _admit_all(s, [SchedRequest(request_id=i, prompt_tokens=(1, 2, 3), max_output_tokens=9,
                                sampling=p) for i, p in enumerate([SamplingParams(), *plain])])
    kinds = []
    for _ in range(4):
        plan = s.schedule()
        kinds.append((plan.kind, [r.request_id for r in plan.rows]))
        if plan.kind is StepKind.SPECULATIVE:
            s.complete(plan, _record(plan, [0] * len(plan.rows), [[11]] * len(plan.rows)))
        else:
            s.complete(plan, [11] * len(plan.rows))
    # Request 0 speculates; 1 (logprobs) and 2 (logit_bias) decode; the groups alternate.
    assert kinds == [(StepKind.SPECULATIVE, [0]), (StepKind.DECODE, [1, 2])] * 2


def test_lanes_stay_width_one_while_min_tokens_bans_the_next_token():
    s = _scheduler()
    sampling = SamplingParams(min_tokens=3, min_tokens_banned=(2,))
    _admit_all(s, [SchedRequest(request_id=7, prompt_tokens=(1, 2, 3), max_output_tokens=9,
                                sampling=sampling)])
    lengths = []
    for _ in range(3):
        plan = s.schedule()
        lengths.append(plan.rows[0].lane_length)
        s.complete(plan, _record(plan, [0], [[11]]))
    assert lengths == [1, 1, WIDTH]  # outputs 1, 2 < 3 masked; the third may speculate


def test_a_lane_without_its_pages_waits_and_is_never_shortened():
    # 7 pages of 4 tokens; two prompts of 9 tokens hold 3 pages each (positions 0..11);
    # each lane of 4 from position 9 needs a fourth. The last free page goes elsewhere:
    # no lane is cut to the 3 positions its pages cover; with nothing able to run, the
    # newest request is preempted and the other gets its whole lane.
    s = _scheduler(num_pages=7, page_tokens=4)
    _admit_all(s, [SchedRequest(request_id=i, prompt_tokens=tuple(range(1, 10)),
                                max_output_tokens=12) for i in range(2)])
    assert s.pages.acquire(None, 1) is not None and s.pages.available_pages == 0
    plan = s.schedule()
    assert [(r.request_id, r.lane_length) for r in plan.rows] == [(0, WIDTH)]
    assert s.stats().preemptions == 1 and s.stats().waiting == 1


def test_history_drafting_attaches_copied_candidates_and_counts_them():
    from dataclasses import replace

    from helios_serve.engine.plan import CopiedCandidates
    from helios_serve.testing.scripted import tiny_geometry

    geo = replace(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH)), copied_proposals=True)
    s = Scheduler(geo, frames=1, device_pending=True, history_drafting=True)
    plan = _to_decode(s, prompt=(1, 2, 3, 4, 1, 2), max_out=10)  # prefill samples 9
    (row,) = plan.rows
    assert row.candidates is None  # "... 1 2 9": no earlier "2 9" / "9"
    s.complete(plan, _record(plan, [0], [[3]]))
    (row,) = s.schedule().rows  # "... 1 2 9 3": no match either
    assert row.candidates is None
    s2 = Scheduler(geo, frames=1, device_pending=True, history_drafting=True)
    s2.add(SchedRequest(request_id=7, prompt_tokens=(1, 2, 3, 4, 1, 2), max_output_tokens=10))
    prefill = s2.schedule()
    s2.complete(prefill, [3])  # "1 2 3 4 1 2 3": "1 2 3" was followed by 4 1 2
    plan = s2.schedule()
    (row,) = plan.rows
    assert row.candidates == CopiedCandidates((4, 1, 2), row.generation, 7)
    s2.complete(plan, _record(plan, [2], [[4, 1, 9]]))
    stats = s2.stats()
    assert (stats.spec_copied_draft_tokens, stats.spec_copied_accepted_tokens) == (3, 2)
    assert (stats.spec_draft_tokens, stats.spec_accepted_tokens) == (3, 2)


@pytest.mark.parametrize("masks", [True, False])
def test_constrained_lanes_verify_the_copied_candidates_their_grammar_accepts(masks):
    """A constrained request (width_one) with history drafting on a core with per-position
    candidate masks: its lane is 1 + the candidates `candidate_filter` keeps (never a
    learned draft); on a core without them it stays at width one."""
    from dataclasses import replace

    from helios_serve.engine.plan import CopiedCandidates

    geo = replace(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH)),
                  copied_proposals=True, candidate_masks=masks)
    seen = []

    def grammar(ids):  # accepts the tokens below 5: a proposal is cut at its first 5+
        seen.append(ids)
        return next((i for i, t in enumerate(ids) if t >= 5), len(ids))

    s = Scheduler(geo, frames=1, device_pending=True, history_drafting=True)
    s.add(SchedRequest(request_id=7, prompt_tokens=(1, 2, 3, 4, 5, 1, 2), max_output_tokens=10,
                       width_one=True, needs_feedback=True, candidate_filter=grammar))
    prefill = s.schedule()
    s.complete(prefill, [3])  # "1 2 3 4 5 1 2 3": "1 2 3" was followed by 4 5 1
    plan = s.schedule()
    (row,) = plan.rows
    if not masks:
        assert row.lane_length == 1 and row.candidates is None and seen == []
        return
    assert seen == [(4, 5, 1)]
    assert row.lane_length == 2 and row.candidates == CopiedCandidates((4,), 1, 8)
    assert s.lane_ceiling(s.live.requests[7]) == 2 and len(seen) == 1  # proposed once
    s.complete(plan, _record(plan, [1], [[4, 5]]))
    plan = s.schedule()  # "... 1 2 3 4 5": "2 3 4 5" was followed by 1 2 3
    (row,) = plan.rows
    assert seen[-1] == (1, 2, 3) and row.lane_length == 4
    assert row.candidates == CopiedCandidates((1, 2, 3), 1, 10)
    stats = s.stats()
    assert (stats.spec_copied_draft_tokens, stats.spec_copied_accepted_tokens) == (1, 1)
    assert stats.spec_draft_tokens == 1  # a constrained lane offers no learned draft


def test_history_drafting_needs_copied_token_inputs():
    with pytest.raises(ValueError, match="copied-token inputs"):
        Scheduler(tiny_geometry(VOCAB, speculative_widths=(1, WIDTH)), history_drafting=True)


def _policy_scheduler(costs):
    from dataclasses import replace

    geo = replace(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH)),
                  prefix_programs=((2, 4, WIDTH),))
    s = Scheduler(geo, frames=1, device_pending=True, width_policy=True)
    for key, seconds in costs.items():
        for _ in range(MIN_COST_SAMPLES):
            s.policy.observe_step(key, seconds)
    return s


def test_the_policy_may_choose_a_prefix_limit_program_and_its_record_is_checked():
    s = _policy_scheduler({("decode", 2): 1.0, ("speculative", 2, 2): 10.0,
                           ("speculative", 2, WIDTH): 10.0, ("prefix", 2, 4): 1.0})
    _admit_all(s, [SchedRequest(request_id=i, prompt_tokens=(1, 2, 3), max_output_tokens=9)
                   for i in range(2)])
    plan = s.schedule()
    assert plan.kind is StepKind.SPECULATIVE and plan.packed_rows == 4
    assert [r.lane_length for r in plan.rows] == [WIDTH, WIDTH]  # ceilings, sum 8 > P
    good = _record(plan, [2, 0], [[11, 12, 13], [14]])
    good[:, 1] = [3, 1]  # offers: the device allocated 3 + 1 = P rows
    for offers, message in (((4, 1), "5 offers exceed the 4"), ((0, 4), "0 offers, outside")):
        bad = good.copy()
        bad[:, 1] = offers
        with pytest.raises(CompletionError, match=message):
            s.complete(plan, bad)
    results = s.complete(plan, good)
    assert [r.token_id for r in results] == [11, 12, 13, 14]
    assert s.stats().spec_policy_decisions == {"prefix_w4_p4": 1}


def test_a_prefix_steps_proposal_confidence_is_validated_and_feeds_the_policy():
    s = _policy_scheduler({("decode", 2): 1.0, ("speculative", 2, 2): 10.0,
                           ("speculative", 2, WIDTH): 10.0, ("prefix", 2, 4): 1.0})
    _admit_all(s, [SchedRequest(request_id=i, prompt_tokens=(1, 2, 3), max_output_tokens=9)
                   for i in range(2)])
    plan = s.schedule()
    assert plan.packed_rows == 4
    record = _record(plan, [2, 0], [[11, 12, 13], [14]])
    record[:, 1] = [3, 1]
    good = np.asarray([[0.9, 0.8, 0.5], [0.25, 0.0, 1.0]], np.float32)
    for bad, message in ((good[:1], r"shape \(1, 3\) for 2 lanes"),
                         (good[:, :2], r"shape \(2, 2\) for 2 lanes of up to 3 drafts"),
                         (np.where([[0, 0, 1], [0, 0, 0]], np.nan, good), "lane 0: proposal"),
                         (good + np.asarray([[0, 0, 0], [0, 1.5, 0]], np.float32),
                          "lane 1: proposal confidence"),
                         (-good, "outside \\[0, 1\\]")):
        with pytest.raises(CompletionError, match=message):
            s.complete(plan, record, confidence=bad.astype(np.float32))
    results = s.complete(plan, record, confidence=good)  # nothing changed before
    assert [r.token_id for r in results] == [11, 12, 13, 14]
    survival = s.policy._survival
    assert survival[plan.rows[0].request_id] == pytest.approx([0.9, 0.72, 0.36])
    assert survival[plan.rows[1].request_id] == [0.25, 0.0, 0.0]
    # 2 accepted over survival 0.9 + 0.72 (lane 0's two offered drafts), + 0 over 0.
    assert s.policy.calibration == pytest.approx((2 + 4) / (1.62 + 4))


def test_the_policy_may_choose_plain_decode_for_speculating_requests():
    s = _policy_scheduler({("decode", 1): 1.0, ("speculative", 1, 2): 5.0,
                           ("speculative", 1, WIDTH): 9.0})
    plan = _to_decode(s)
    assert plan.kind is StepKind.DECODE
    s.complete(plan, [11])
    assert s.schedule().kind is StepKind.DECODE


def test_the_policy_weighs_the_copied_candidates_a_lane_carries():
    """History drafting: the policy knows, before the step, how many copied candidates
    each lane carries, and rates them by the copied drafts' own acceptance. Copies
    always accepted, learned drafts never: a lane with 3 copied candidates runs W = 4
    (4 tokens for 2 s), a lane without any runs plain decode (1 token for 1 s)."""
    from dataclasses import replace

    geo = replace(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH)), copied_proposals=True)
    for prefill_token, kind in ((3, StepKind.SPECULATIVE), (9, StepKind.DECODE)):
        s = Scheduler(geo, frames=1, device_pending=True, history_drafting=True,
                      width_policy=True)
        for key, seconds in {("decode", 1): 1.0, ("speculative", 1, 2): 1.6,
                             ("speculative", 1, WIDTH): 2.0}.items():
            for _ in range(MIN_COST_SAMPLES):
                s.policy.observe_step(key, seconds)
        for _ in range(20):
            s.policy.observe_lane(7, 3, 3, copied=3)
            s.policy.observe_lane(7, 3, 0, copied=0)
        s.add(SchedRequest(request_id=7, prompt_tokens=(1, 2, 3, 4, 1, 2),
                           max_output_tokens=10))
        s.complete(s.schedule(), [prefill_token])  # "1 2 3" was followed by 4 1 2
        plan = s.schedule()
        assert plan.kind is kind
        if kind is StepKind.SPECULATIVE:
            (row,) = plan.rows
            assert row.lane_length == WIDTH and row.candidates.ids == (4, 1, 2)


class _Clock:
    """Scripted seconds for the width policy's step costs."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ahead_scheduler(costs, clock=None, history=False, **geo):
    """Two frames, device-owned pending tokens, the adaptive policy with `costs`
    (program key -> seconds, observed MIN_COST_SAMPLES times: measured)."""
    from dataclasses import replace

    g = replace(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH), **geo),
                copied_proposals=history)
    s = Scheduler(g, frames=2, device_pending=True, width_policy=True,
                  history_drafting=history, clock=clock or _Clock())
    for key, seconds in costs.items():
        for _ in range(MIN_COST_SAMPLES):
            s.policy.observe_step(key, seconds)
    return s


DECODE_WINS = {(kind, b, *w): seconds for b in (1, 2) for kind, w, seconds in (
    ("decode", (), 1.0), ("speculative", (2,), 5.0), ("speculative", (WIDTH,), 9.0))}
SPECULATION_WINS = {("decode", 1): 10.0, ("speculative", 1, 2): 5.0,
                    ("speculative", 1, WIDTH): 1.0}


def test_a_policy_choosing_decode_plans_decode_rows_ahead_on_a_speculative_core():
    s = _ahead_scheduler(DECODE_WINS)
    first = _to_decode(s)
    assert first.kind is StepKind.DECODE and first.rows[0].tokens == (9,)
    assert s.can_schedule_ahead()
    ahead = s.schedule()  # planned before the first's token is known
    assert ahead.kind is StepKind.DECODE
    (row,) = ahead.rows
    assert (row.tokens, row.start_position) == ((PENDING_PLACEHOLDER,), 6)
    assert not s.can_schedule_ahead()  # both frames in flight
    assert [r.token_id for r in s.complete(first, [11])] == [11]
    assert [(r.token_id, r.output_tokens) for r in s.complete(ahead, [12])] == [(12, 3)]
    assert s.policy.decisions == {"decode": 2}


def test_a_policy_choosing_speculation_leaves_in_flight_requests_waiting_uncommitted():
    clock = _Clock()
    s = _ahead_scheduler(DECODE_WINS, clock)
    first = _to_decode(s)
    assert first.kind is StepKind.DECODE
    for _ in range(8):  # decode turns expensive: W = 4 is the best program now
        for key, seconds in SPECULATION_WINS.items():
            s.policy.observe_step(key, seconds)
    assert s.can_schedule_ahead()
    assert s.schedule() is None  # no lane ahead of the in-flight decode row
    assert s.policy.decisions == {"decode": 1}  # the waiting choice was not committed
    s.complete(first, [11])
    lane = s.schedule()
    assert lane.kind is StepKind.SPECULATIVE and lane.rows[0].lane_length == WIDTH
    assert lane.rows[0].tokens == (11,) and lane.rows[0].start_position == 6
    assert s.policy.decisions == {"decode": 1, "w4": 1}
    assert not s.can_schedule_ahead()  # a lane's completion comes first


def test_requests_that_cannot_speculate_still_decode_ahead_while_lanes_wait():
    s = _ahead_scheduler(DECODE_WINS)
    _admit_all(s, [SchedRequest(request_id=i, prompt_tokens=(1, 2, 3), max_output_tokens=9,
                                sampling=p)
                   for i, p in enumerate([SamplingParams(), SamplingParams(logprobs=0)])])
    first = s.schedule()
    assert first.kind is StepKind.DECODE and [r.request_id for r in first.rows] == [0, 1]
    for _ in range(8):  # the cohort is request 0 alone (1 cannot speculate): W = 4 wins
        for key, seconds in SPECULATION_WINS.items():
            s.policy.observe_step(key, seconds)
    ahead = s.schedule()
    assert ahead.kind is StepKind.DECODE and [r.request_id for r in ahead.rows] == [1]
    assert ahead.rows[0].tokens == (PENDING_PLACEHOLDER,)


def test_fixed_width_speculation_plans_nothing_ahead():
    s = Scheduler(tiny_geometry(VOCAB, speculative_widths=(1, 2, WIDTH)), frames=2,
                  device_pending=True)
    _admit_all(s, [SchedRequest(request_id=0, prompt_tokens=(1, 2, 3), max_output_tokens=9,
                                sampling=SamplingParams(logprobs=0))])
    first = s.schedule()
    assert first.kind is StepKind.DECODE and s.can_schedule_ahead()
    assert s.schedule() is None


def test_a_feedback_request_keeps_every_decode_serial_under_the_policy():
    s = _ahead_scheduler(DECODE_WINS)
    _admit_all(s, [SchedRequest(request_id=0, prompt_tokens=(1, 2, 3), max_output_tokens=9),
                   SchedRequest(request_id=1, prompt_tokens=(1, 2, 3), max_output_tokens=9,
                                needs_feedback=True)])
    for _ in range(3):
        plan = s.schedule()
        assert plan.kind is StepKind.DECODE and len(plan.rows) == 2
        assert not s.can_schedule_ahead()
        s.complete(plan, [11, 11])
    s.finish(1, FinishReason.STOP)
    plan = s.schedule()
    assert s.can_schedule_ahead()  # the feedback request left: decode goes ahead again
    assert s.schedule().rows[0].tokens == (PENDING_PLACEHOLDER,)
    del plan


def test_step_costs_are_what_a_run_of_such_steps_costs_per_step():
    """The width policy's cost rule (Scheduler._observe_cost): a SPECULATIVE step costs
    from the previous plan's completion to its own (the host time before its issue
    included: every such step waits for it); a DECODE step from its issue or the
    previous completion, whichever is later (steady pipelined decode: the interval
    between completions). Idle time (nothing to run, nothing in flight) is charged to no
    step."""
    clock = _Clock()
    s = _ahead_scheduler(DECODE_WINS, clock)
    seen = []
    s.policy.observe_step = lambda key, seconds: seen.append((key, seconds))
    clock.now = 50.0
    assert s.schedule() is None  # no request: idle until the next call finds work
    clock.now = 100.0
    d1 = _to_decode(s)  # prefill issued and completed at 100, then D1 issued at 100
    clock.now = 101.0
    d2 = s.schedule()  # ahead
    clock.now = 110.0
    s.complete(d1, [11])  # D1: prefill's completion 100 -> 110
    clock.now = 111.0
    d3 = s.schedule()  # ahead of D2
    clock.now = 113.5
    s.complete(d2, [12])  # D2: issued 101, the previous completion 110 -> 113.5
    clock.now = 117.0
    s.complete(d3, [13])  # D3: previous completion 113.5 -> 117
    assert seen == [(("decode", 1), 10.0), (("decode", 1), 3.5), (("decode", 1), 3.5)]
    seen.clear()
    del s.policy.observe_step  # the policy's own method again
    for _ in range(8):
        for key, seconds in SPECULATION_WINS.items():
            s.policy.observe_step(key, seconds)
    s.policy.observe_step = lambda key, seconds: seen.append((key, seconds))
    clock.now = 120.0
    lane = s.schedule()  # serial: planned and issued 3 s after D3's completion at 117
    assert lane.kind is StepKind.SPECULATIVE
    clock.now = 126.0
    s.complete(lane, _record(lane, [0], [[14]]))
    assert seen == [(("speculative", 1, WIDTH), 9.0)]  # the host's 3 s included
    s.finish(7, FinishReason.STOP)
    clock.now = 130.0
    assert s.schedule() is None  # nothing to run, nothing in flight: idle from here
    clock.now = 200.0
    _admit_all(s, [SchedRequest(request_id=1, prompt_tokens=(1, 2, 3), max_output_tokens=9)])
    lane = s.schedule()  # the prefill was planned and completed at 200
    clock.now = 204.0
    s.complete(lane, _record(lane, [0], [[15]]))
    assert seen[-1] == (("speculative", 1, WIDTH), 4.0)  # not from 126 or 130


@pytest.mark.parametrize("costs,width", [(SPECULATION_WINS, WIDTH),
                                         ({("decode", 1): 10.0, ("speculative", 1, 2): 1.0,
                                           ("speculative", 1, WIDTH): 10.0}, 2)])
def test_a_lane_proposes_its_copied_candidates_once_per_step(costs, width):
    """The policy's copied counts and the lane's candidates come from one proposal per
    lane per step, made for the lane's ceiling; a narrower chosen width takes its
    prefix (the ids a proposal for that width gives)."""
    from helios_serve.speculation import HistoryIndex

    calls = []

    class Counting(HistoryIndex):
        def propose(self, tokens, count):
            calls.append((len(tokens), count))
            return super().propose(tokens, count)

    s = _ahead_scheduler(costs, history=True)
    s.lanes.history_index = Counting
    prompt = (5, 6, 7, 8, 9, 10, 5, 6, 7)  # ... 5 6 7, then 8 9 10 copied
    s.add(SchedRequest(request_id=7, prompt_tokens=prompt, max_output_tokens=20))
    s.complete(s.schedule(), [8])
    lane = s.schedule()
    assert lane.kind is StepKind.SPECULATIVE and lane.rows[0].lane_length == width
    assert calls == [(10, WIDTH - 1)]  # one proposal, for the ceiling
    fresh = HistoryIndex().propose(list(prompt) + [8], width - 1)
    assert lane.rows[0].candidates.ids == fresh == (9, 10, 5)[:width - 1]
    assert lane.rows[0].candidates.endpoint == len(prompt) + 1


def test_the_policy_weighs_copied_candidates_of_requests_planned_ahead():
    """A request whose decode row is in flight proposes from the tokens known: the
    proposal's first id stands for its in-flight token, the rest are the candidates its
    next lane would carry. (Costs where decode wins but W = 4 with every draft accepted
    would not lose: the policy has to weigh the lanes.)"""
    s = _ahead_scheduler({("decode", 1): 1.0, ("speculative", 1, 2): 2.5,
                          ("speculative", 1, WIDTH): 3.0}, history=True)
    seen = []
    decide = s.policy.decide
    s.policy.decide = lambda lanes, copied: seen.append((lanes, copied)) or decide(lanes, copied)
    prompt = (5, 6, 7, 8, 9, 10, 5, 6, 7)
    s.add(SchedRequest(request_id=7, prompt_tokens=prompt, max_output_tokens=20))
    s.complete(s.schedule(), [8])
    first = s.schedule()  # D1 feeds 8; 9 10 5 are its lane's candidates now
    ahead = s.schedule()  # its token (9, if it copies) is in flight: 10 5 6 would follow
    assert first.kind is ahead.kind is StepKind.DECODE
    assert seen == [([(7, WIDTH)], {7: 3}), ([(7, WIDTH)], {7: 3})]
    assert s.complete(first, [9])[0].token_id == 9
    third = s.schedule()  # after D1: tokens ... 7 8 9, D2's token in flight
    assert third.kind is StepKind.DECODE
    assert seen[-1] == ([(7, WIDTH)], {7: 3})


def test_decode_certain_skips_the_proposals_and_the_choice():
    """When no program could beat plain decode even with every draft accepted
    (WidthPolicy.decode_certain), the scheduler plans decode without proposing copied
    candidates or deciding: the host's step is the one of speculation off."""
    from helios_serve.speculation import HistoryIndex

    calls = []

    class Counting(HistoryIndex):
        def propose(self, tokens, count):
            calls.append(count)
            return super().propose(tokens, count)

    for costs, certain in ((DECODE_WINS, True),
                           ({("decode", 1): 1.0, ("speculative", 1, 2): 2.5,
                             ("speculative", 1, WIDTH): 3.0}, False)):
        s = _ahead_scheduler(costs, history=True)
        s.lanes.history_index = Counting
        decided = []
        decide = s.policy.decide
        s.policy.decide = (lambda lanes, copied, d=decide, seen=decided:
                           seen.append(1) or d(lanes, copied))
        calls.clear()
        s.add(SchedRequest(request_id=7, prompt_tokens=(5, 6, 7, 8, 9, 10, 5, 6, 7),
                           max_output_tokens=20))
        s.complete(s.schedule(), [8])
        first, ahead = s.schedule(), s.schedule()
        assert first.kind is ahead.kind is StepKind.DECODE
        assert s.policy.decode_certain(1) is certain
        assert (calls, decided) == (([], []) if certain else ([WIDTH - 1, WIDTH], [1, 1]))
        assert s.policy.decisions == {"decode": 2}


def test_the_host_time_before_a_decode_after_a_lane_is_charged_to_the_lane():
    """A decode right after a SPECULATIVE step cannot be planned ahead of it: the host
    time between that completion and the decode's issue is part of speculating's cost
    (WidthPolicy.observe_switch on the lane's program), not of the decode's."""
    clock = _Clock()
    s = _ahead_scheduler(SPECULATION_WINS, clock)
    seen = []
    s.policy.observe_step = lambda key, seconds: seen.append(("step", key, seconds))
    s.policy.observe_switch = lambda key, seconds: seen.append(("switch", key, seconds))
    clock.now = 100.0
    lane = _to_decode(s)
    assert lane.kind is StepKind.SPECULATIVE
    clock.now = 106.0
    s.complete(lane, _record(lane, [0], [[14]]))
    del s.policy.observe_step
    for _ in range(8):  # decode is the best program now
        for key, seconds in DECODE_WINS.items():
            s.policy.observe_step(key, seconds)
    s.policy.observe_step = lambda key, seconds: seen.append(("step", key, seconds))
    clock.now = 108.0
    decode = s.schedule()  # issued 2 s after the lane's completion
    assert decode.kind is StepKind.DECODE
    clock.now = 111.0
    s.complete(decode, [15])
    assert seen == [("step", ("speculative", 1, WIDTH), 6.0),
                    ("switch", ("speculative", 1, WIDTH), 2.0), ("step", ("decode", 1), 3.0)]
