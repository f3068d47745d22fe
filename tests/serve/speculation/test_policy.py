"""The width policy (helios_serve.speculation.policy): every program is measured before
comparisons count, then the highest expected tokens per second wins."""

from __future__ import annotations

from helios_serve.speculation import WidthPolicy
from helios_serve.speculation.policy import (
    LOSER_STALE_DECISIONS,
    MIN_COST_SAMPLES,
    STALE_DECISIONS,
    STALE_MARGIN,
)


def _measured(policy, rows, costs):
    """Feed each program's cost until the policy stops measuring."""
    for _ in range(20):
        choice = policy.choose([(i, 4) for i in range(rows)])
        if choice.reason != "measure":
            return choice
        policy.observe_step(policy.program_key(rows, choice),
                            costs[(choice.width, choice.packed_rows)])
    raise AssertionError("the policy kept measuring")


def test_every_program_is_measured_first_narrowest_first():
    policy = WidthPolicy((1, 2, 4), (1, 8), ())
    seen = []
    for _ in range(3 * MIN_COST_SAMPLES):
        choice = policy.choose([(0, 4)])
        assert choice.reason == "measure"
        seen.append(choice.width)
        policy.observe_step(policy.program_key(1, choice), 1.0)
    assert seen == [0] * MIN_COST_SAMPLES + [2] * MIN_COST_SAMPLES + [4] * MIN_COST_SAMPLES


def test_high_acceptance_and_cheap_verification_pick_the_widest():
    policy = WidthPolicy((1, 2, 4), (1,), ())
    for _ in range(50):
        policy.observe_lane(0, 3, 3)  # every draft accepted
    choice = _measured(policy, 1, {(0, 0): 1.0, (2, 0): 1.1, (4, 0): 1.2})
    assert choice.width == 4 and choice.reason == "best"
    assert policy.expected_tokens(0, 4) > 3.5


def test_expensive_verification_or_poor_acceptance_picks_plain_decode():
    policy = WidthPolicy((1, 2, 4), (8,), ())
    for rid in range(8):
        for _ in range(50):
            policy.observe_lane(rid, 3, 0)  # nothing accepted
    assert _measured(policy, 8, {(0, 0): 1.0, (2, 0): 1.3, (4, 0): 2.0}).width == 0


def test_expected_tokens_use_each_requests_rates_over_the_pooled_prior():
    policy = WidthPolicy((1, 4), (1,), ())
    for _ in range(40):
        policy.observe_lane(1, 3, 3)
        policy.observe_lane(2, 3, 0)
    assert policy.expected_tokens(1, 4) > 3.5 > 1.2 > policy.expected_tokens(2, 4)
    assert policy.expected_tokens(1, 1) == 1.0
    policy.forget(1)  # a finished request: back to the pooled rate
    assert 1.2 < policy.expected_tokens(1, 4) < 3.0


def test_a_prefix_program_wins_when_few_lanes_are_confident():
    # 8 lanes: 2 accept everything, 6 nothing. W = 4 verifies 32 rows for ~14 tokens; the
    # prefix program (P = 16) spends its 8 spare rows on the confident lanes.
    policy = WidthPolicy((1, 4), (8,), ((8, 16, 4),))
    for _ in range(50):
        for rid in range(8):
            policy.observe_lane(rid, 3, 3 if rid < 2 else 0)
    costs = {(0, 0): 1.0, (4, 0): 2.0, (4, 16): 1.2}
    choice = _measured(policy, 8, costs)
    assert (choice.width, choice.packed_rows) == (4, 16)


def _remeasured(policy, decisions, cost):
    widths = []
    for _ in range(decisions):
        choice = policy.choose([(0, 2)])
        if choice.reason == "measure":
            widths.append(choice.width)
        policy.observe_step(policy.program_key(1, choice), cost[choice.width])
    return widths


def test_costs_go_stale_and_are_measured_again():
    # decode: 1 token in 1.0 s; W = 2: 1.5 expected tokens (prior 1 / 2) in 1.3 s, the
    # best; decode's rate is 0.87 of it, within STALE_MARGIN: measured again when stale
    policy = WidthPolicy((1, 2), (1,), ())
    cost = {0: 1.0, 2: 1.3}
    assert _measured(policy, 1, {(0, 0): 1.0, (2, 0): 1.3}).width == 2
    assert 1.0 / (1.5 / 1.3) > STALE_MARGIN
    assert _remeasured(policy, STALE_DECISIONS + 2, cost) == [0]


def test_a_clearly_slower_program_is_measured_again_only_much_later():
    # decode: 1 token/s against W = 2's 1.5 / 0.5 = 3 tokens/s (a third of it)
    policy = WidthPolicy((1, 2), (1,), ())
    cost = {0: 1.0, 2: 0.5}
    _measured(policy, 1, {(0, 0): 1.0, (2, 0): 0.5})
    assert _remeasured(policy, STALE_DECISIONS + 2, cost) == []
    assert _remeasured(policy, LOSER_STALE_DECISIONS - STALE_DECISIONS, cost) == [0]


def test_proposal_confidence_ranks_prefix_rows_calibrated_by_acceptance():
    """A prefix-limit option's spare rows go to the positions with the highest survival
    of the lanes' last proposal confidences, scaled by the observed calibration of
    confidence against acceptance (accepted per unit of survival over verified drafts)."""
    policy = WidthPolicy((1, 4), (2,), ((2, 4, 4),))
    option = type(policy.choose([(0, 4)]))(4, 4)
    assert policy.calibration == 1.0  # nothing seen: smoothed to 1
    before = policy._tokens([(0, 4), (1, 4)], option)  # acceptance priors: 2 + 2 x 0.5
    assert before == 3.0
    # Lane 0's head is sure of its drafts, lane 1's is not; both accepted what they offered.
    policy.observe_confidence(0, [1.0, 1.0, 1.0], offers=3, accepted=2)
    policy.observe_confidence(1, [0.5, 0.5, 0.5], offers=2, accepted=1)
    assert policy.calibration == (3 + 4) / (2.5 + 4)
    c = policy.calibration
    assert policy._tokens([(0, 4), (1, 4)], option) == 2 + min(1.0, c) + min(1.0, c)
    # Lanes of ceiling 2 rank only their first draft.
    assert policy._tokens([(0, 2), (1, 2)], option) == 2 + min(1.0, c) + min(1.0, 0.5 * c)
    policy.forget(0)
    assert 0 not in policy._survival


def test_acceptance_counts_a_draft_only_when_the_drafts_before_it_were_accepted():
    policy = WidthPolicy((1, 4), (1,), ())
    for _ in range(10):
        policy.observe_lane(0, 3, 1)  # draft 0 accepted, draft 1 rejected, 2 never tested
    assert policy._pooled.offered == [10, 10, 0]
    assert policy._pooled.accepted == [10, 0, 0]
    # alpha_2 stays at its prior (1 / 2 pooled, nothing of request 0's own)
    assert policy.acceptance(0)[2] == 0.5


def test_copied_and_learned_drafts_have_their_own_rates():
    policy = WidthPolicy((1, 4), (1,), ())
    for _ in range(30):
        policy.observe_lane(0, 3, 3, copied=3)  # copies: always accepted
        policy.observe_lane(0, 3, 0, copied=0)  # the head: never
    assert policy._pooled.copied_offered == [30, 30, 30]
    assert policy._pooled.offered == [30, 0, 0]
    assert policy.expected_tokens(0, 4, copied=3) > 3.5
    assert policy.expected_tokens(0, 4, copied=0) < 1.1
    # a lane with one copied candidate: the copy at its rate, then the head's drafts at
    # positions 1 and 2, never tested: their prior 1 / 2
    c = (30 + 4 * 31 / 32) / (30 + 4)
    assert policy.acceptance(0, copied=1) == [c, 0.5, 0.5]
    assert policy.expected_tokens(0, 4, copied=1) == 1 + c + c * 0.5 + c * 0.25
    costs = {(0, 0): 1.0, (4, 0): 2.0}
    policy2 = WidthPolicy((1, 4), (1,), ())
    policy2._pooled, policy2._requests = policy._pooled, policy._requests
    assert _measured(policy2, 1, costs).width == 0  # no copy known: decode
    assert policy2.choose([(0, 4)], copied={0: 3}).width == 4
