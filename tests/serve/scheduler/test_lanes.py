"""SpeculativeLanes and StepClock on their own: lane lengths, the DECODE/lane split,
copied candidates, record validation and counting, step costs (tiny geometry, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
from helios_serve.engine.plan import RowPlan, SamplingParams, StepKind, StepPlan
from helios_serve.scheduler import CompletionError, SchedRequest
from helios_serve.scheduler.lanes import LaneCounts, SpeculativeLanes
from helios_serve.scheduler.sequence import Sequence
from helios_serve.scheduler.step_clock import StepClock
from helios_serve.testing.scripted import tiny_geometry

GEO = tiny_geometry(64, speculative_widths=(1, 2, 4), copied_proposals=True)
GREEDY = SamplingParams()


def _seq(rid: int, prompt=(1, 2, 3, 4, 5), max_out=10, sampling=GREEDY,
         **kw) -> Sequence:
    seq = Sequence(SchedRequest(rid, tuple(prompt), max_out, sampling=sampling, **kw), rid)
    seq.slot, seq.generation = rid, 1
    seq.prefill_tokens = seq.num_scheduled = seq.num_computed = len(prompt) - 1
    return seq


def test_lane_counts_count_offers_acceptance_and_copies_exactly():
    c = LaneCounts(4)
    c.count(1, 0)  # a width-one lane draws no proposal
    c.count(4, 2, copied=1)
    c.count(3, 0)
    assert (c.draft, c.accepted, c.copied_draft, c.copied_accepted) == (5, 2, 1, 1)
    assert c.per_position == [1, 1, 0] and c.lengths == [0, 1, 0, 1, 0]
    # per position and source: the lane of 4 offered a copied draft 0 (accepted) and
    # learned drafts 1 (accepted) and 2; the lane of 3 learned drafts 0 and 1
    assert c.offered_by_source == {"learned": [1, 2, 1], "copied": [1, 0, 0]}
    assert c.accepted_by_source == {"learned": [0, 1, 0], "copied": [1, 0, 0]}


def test_lane_ceiling_follows_width_budget_min_tokens_and_width_one():
    lanes = SpeculativeLanes(GEO)
    assert lanes.lane_ceiling(_seq(1)) == 4
    assert lanes.lane_ceiling(_seq(1, max_out=2)) == 2
    seq = _seq(1, max_out=3)
    seq.inflight_samples = 1  # a token in flight counts as emitted
    assert lanes.lane_ceiling(seq) == 2
    banned = SamplingParams(min_tokens=2, min_tokens_banned=(2,))
    assert lanes.lane_ceiling(_seq(1, sampling=banned)) == 1
    assert lanes.lane_ceiling(_seq(1, width_one=True)) == 1


def test_split_keeps_logprobs_and_logit_bias_requests_as_decode_rows():
    lanes = SpeculativeLanes(GEO)
    a, b, c = _seq(1), _seq(2, sampling=SamplingParams(logprobs=0)), \
        _seq(3, sampling=SamplingParams(logit_bias=((5, 1.0),)))
    assert lanes.split([a, b, c]) == ([b, c], [a])
    assert lanes.split([]) == ([], [])
    assert SpeculativeLanes(tiny_geometry(64)).split([a]) == ([a], [])  # no widths
    assert lanes.length(a) == 4 and lanes.packed_rows(1) == 0


def test_candidates_copy_the_requests_own_history_cut_to_the_lane():
    lanes = SpeculativeLanes(GEO, history_drafting=True)
    seq = _seq(1, prompt=(1, 2, 3, 1, 2))  # pending token 2 at position 4; 2-gram (1, 2)
    assert lanes.split([seq]) == ([], [seq])
    got = lanes.candidates(seq, 4)
    assert (got.ids, got.generation, got.endpoint) == ((3, 1, 2), 1, 5)
    assert lanes.candidates(seq, 2).ids == (3,)
    assert lanes.candidates(seq, 1) is None
    assert SpeculativeLanes(GEO).candidates(seq, 4) is None  # no history drafting
    with pytest.raises(ValueError, match="copied-token"):
        SpeculativeLanes(tiny_geometry(64, speculative_widths=(1, 2)), history_drafting=True)


def _plan(lengths=(2, 1)) -> StepPlan:
    rows = tuple(RowPlan(rid, rid, 1, (9,), 4, (0, 1), True, SamplingParams(), None, None, n)
                 for rid, n in enumerate(lengths, start=1))
    return StepPlan(StepKind.SPECULATIVE, rows)


def _record(*lanes):
    return np.asarray([list(lane) + [-1] * (4 - (len(lane) - 6)) for lane in lanes], np.int32)


def test_check_returns_ints_and_observe_counts_each_lane():
    lanes = SpeculativeLanes(GEO)
    plan = _plan()
    record = _record((1, 2, 1, 2, 6, -1, 11, 12), (1, 1, 0, 1, 5, -1, 13))
    got = lanes.check(plan, record, None, lambda row: True, lambda slot: 1)
    assert got == [[1, 2, 1, 2, 6, -1, 11, 12, -1, -1], [1, 1, 0, 1, 5, -1, 13, -1, -1, -1]]
    assert [lanes.observe(i, r, lane, None) for i, (r, lane) in
            enumerate(zip(plan.rows, got, strict=True))] == [2, 1]
    assert (lanes.counts.draft, lanes.counts.accepted, lanes.counts.lengths) == \
        (1, 1, [0, 0, 1, 0, 0])


@pytest.mark.parametrize(("lane", "in_flight", "message"), [
    ((1, 2, 1, 2, 6, -1, 11, 12), False, "lane 0: request 1 not in flight"),
    ((2, 2, 1, 2, 6, -1, 11, 12), True, "lane 0: generation 2 of slot 1, expected 1"),
    ((1, 3, 1, 2, 6, -1, 11, 12), True, "lane 0: 3 offers, the lane reserved 2 positions"),
    ((1, 2, 1, 2, 5, -1, 11, 12), True, "lane 0: draft cursor 5, expected 6"),
    ((1, 2, 1, 2, 6, -1, 11, 64), True, "outside \\[0, 64\\)"),
])
def test_check_rejects_each_bad_field(lane, in_flight, message):
    plan = _plan((2,))
    with pytest.raises(CompletionError, match=message):
        SpeculativeLanes(GEO).check(plan, _record(lane), None, lambda row: in_flight,
                                    lambda slot: 1)


class _Policy:
    def __init__(self) -> None:
        self.seen: list = []

    def program_key(self, rows, choice):
        return ("decode", rows) if choice.width == 0 else (f"w{choice.width}", rows)

    def observe_step(self, key, seconds):
        self.seen.append(("step", key, seconds))

    def observe_switch(self, key, seconds):
        self.seen.append(("switch", key, seconds))


def test_step_clock_charges_speculative_steps_from_the_previous_completion():
    times = iter([10.0, 11.0, 13.0, 14.0, 17.0, 30.0, 31.0, 35.0])
    policy = _Policy()
    clock = StepClock(lambda: next(times), policy, (1, 2, 4))  # type: ignore[arg-type]
    spec = _plan((2, 1))
    decode = StepPlan(StepKind.DECODE, spec.rows)
    clock.wake()  # 10
    clock.issue(spec)  # 11
    clock.complete()  # 13: cost from the wake at 10
    clock.issue(decode)  # 14
    clock.complete()  # 17: a switch back; the decode costs from its issue
    clock.rest()
    clock.wake()  # 30: idle time is nobody's
    clock.issue(StepPlan(StepKind.TRANSFER, ()))  # 31
    clock.skip()  # 35
    assert policy.seen == [("step", ("w2", 2), 3.0), ("switch", ("w2", 2), 1.0),
                           ("step", ("decode", 2), 3.0)]


def test_lane_widths_are_the_served_widths_lane_limits_and_none_once_widths_are_cleared():
    from dataclasses import replace

    geometry = tiny_geometry(64, speculative_widths=(1, 2, 4), lane_limits=(1, 2, 2))
    assert geometry.lane_widths == (1, 2)
    assert SpeculativeLanes(geometry).max_width == 2
    assert tiny_geometry(64, speculative_widths=(1, 2, 4)).lane_widths == (1, 2, 4)
    off = replace(geometry, speculative_widths=())  # speculation off keeps no lane width
    assert off.lane_widths == () and SpeculativeLanes(off).max_width == 0
