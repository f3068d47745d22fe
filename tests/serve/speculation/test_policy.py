"""The width policy (helios_serve.speculation.policy): every program is measured before
comparisons count, then the highest expected tokens per second wins."""

from __future__ import annotations

import pytest
from helios_serve.speculation import WidthPolicy
from helios_serve.speculation.policy import (
    COST_WINDOW,
    EXPLORE_SHARE,
    LOSER_STALE_DECISIONS,
    MIN_COST_SAMPLES,
    STALE_DECISIONS,
    STALE_MARGIN,
    Choice,
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
    for _ in range(100):  # a while of decode: W = 4's three measurements (each ~0.26 s
        policy.observe_step(("decode", 8), 1.0)  # worse than decode) fit in EXPLORE_SHARE
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
    # W = 2: 1.5 expected tokens (prior 1 / 2) in 3.0 s, half decode's 1 token/s
    policy = WidthPolicy((1, 2), (1,), ())
    cost = {0: 1.0, 2: 3.0}
    _decode_served(policy, 1, 1.0, 500)  # a budget for W = 2's three measurements
    assert _measured(policy, 1, {(0, 0): 1.0, (2, 0): 3.0}).width == 0
    assert (1.5 / 3.0) / 1.0 < STALE_MARGIN
    assert _remeasured(policy, STALE_DECISIONS + 2, cost) == []
    assert _remeasured(policy, LOSER_STALE_DECISIONS - STALE_DECISIONS, cost) == [2]


def test_decode_is_measured_again_when_stale_even_where_it_loses():
    # decode: 1 token/s against W = 2's 1.5 / 0.5 = 3 tokens/s (a third of it); decode is
    # what every program is compared with, so it is never a clear loser for staleness
    policy = WidthPolicy((1, 2), (1,), ())
    cost = {0: 1.0, 2: 0.5}
    assert _measured(policy, 1, {(0, 0): 1.0, (2, 0): 0.5}).width == 2
    assert _remeasured(policy, STALE_DECISIONS + 2, cost) == [0]


def test_proposal_confidence_ranks_prefix_rows_calibrated_by_acceptance():
    """A prefix-limit option's spare rows go to the positions with the highest survival
    of the lanes' last proposal confidences, scaled by the observed calibration of
    confidence against acceptance (accepted per unit of survival over verified drafts)."""
    policy = WidthPolicy((1, 4), (2,), ((2, 4, 4),))
    option = type(policy.choose([(0, 4)]))(4, 4)
    assert policy.calibration == 1.0  # nothing seen: smoothed to 1
    before = policy.step_tokens([(0, 4), (1, 4)], option)  # acceptance priors: 2 + 2 x 0.5
    assert before == 3.0
    # Lane 0's head is sure of its drafts, lane 1's is not; both accepted what they offered.
    policy.observe_confidence(0, [1.0, 1.0, 1.0], offers=3, accepted=2)
    policy.observe_confidence(1, [0.5, 0.5, 0.5], offers=2, accepted=1)
    assert policy.calibration == (3 + 4) / (2.5 + 4)
    c = policy.calibration
    assert policy.step_tokens([(0, 4), (1, 4)], option) == 2 + min(1.0, c) + min(1.0, c)
    # Lanes of ceiling 2 rank only their first draft.
    assert policy.step_tokens([(0, 2), (1, 2)], option) == 2 + min(1.0, c) + min(1.0, 0.5 * c)
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
    for _ in range(300):  # a while of decode: W = 4's three measurements without copies
        policy2.observe_step(("decode", 1), 1.0)  # (1 s worse each) fit in EXPLORE_SHARE
    assert _measured(policy2, 1, costs).width == 0  # no copy known: decode
    assert policy2.choose([(0, 4)], copied={0: 3}).width == 4


def _random_run(seed: int, steps: int, batches=(1, 8, 64)):
    """Feed the same random observations to the policy and to its code of before; yield
    both choices at every decision (lanes of 1..64 requests, copied counts, prefix
    programs, proposal confidence, forgotten requests, costs near each other so that
    rates are close and staleness re-measures)."""
    import random

    from .policy_before import PolicyBefore

    rng = random.Random(seed)
    widths, prefix = (1, 2, 3, 4), ((8, 16, 4), (64, 96, 4), (64, 128, 3))
    new = WidthPolicy(widths, batches, prefix, bounded_exploration=False)
    old = PolicyBefore(widths, batches, prefix)
    live = list(range(80))
    for step in range(steps):
        rows = rng.choice((1, 2, 5, 8, 20, 64))
        lanes = [(rid, rng.choice((1, 2, 3, 4, 4, 4))) for rid in rng.sample(live, rows)]
        copied = ({rid: rng.choice((0, 0, 1, 2, 3)) for rid, _ in lanes}
                  if rng.random() < 0.7 else None)
        yield step, new.choose(lanes, copied), old.choose(lanes, copied)
        assert new.decisions == old.decisions
        assert new.costs.decisions == old.costs.decisions
        r = random.Random(seed * 1_000_003 + step)
        for _ in range(r.randint(0, 3)):
            option = r.choice([Choice(0), Choice(2), Choice(3), Choice(4),
                               Choice(4, 96), Choice(3, 128), Choice(4, 16)])
            seconds = r.uniform(0.9, 1.6) * (1 + option.width / 8)
            for policy in (new, old):
                policy.observe_step(policy.program_key(rows, option), seconds)
        for rid, ceiling in lanes:
            if r.random() < 0.5 and ceiling > 1:
                drafts = r.randint(1, ceiling - 1)
                accepted = r.randint(0, drafts)
                cop = r.randint(0, drafts)
                for policy in (new, old):
                    policy.observe_lane(rid, drafts, accepted, cop)
            if r.random() < 0.05:
                conf = [r.random() for _ in range(3)]
                offers = r.randint(1, 4)
                accepted = r.randint(0, offers - 1)
                for policy in (new, old):
                    policy.observe_confidence(rid, conf, offers, accepted)
        if r.random() < 0.1:
            gone = r.choice(live)
            for policy in (new, old):
                policy.forget(gone)


def test_choose_decides_as_before_on_random_observations():
    """The per-request tables (cached between acceptance observations, one pass for every
    width) give the same choice, reason included, as the code of before, decision for
    decision, and the same expected tokens to the last bit."""
    seen = set()
    for seed in range(3):
        for _step, new, old in _random_run(seed, 400):
            assert new == old
            seen.add((new.width, new.packed_rows, new.reason))
    # the run reaches decode, every width, prefix programs, best and re-measure choices
    assert {(0, 0, "best"), (4, 0, "best")} <= seen
    assert any(c[1] for c in seen) and any(c[2] == "measure" for c in seen)
    assert len(seen) >= 6, seen


def test_expected_tokens_are_bit_identical_to_the_sum_per_length():
    from .policy_before import PolicyBefore

    new, old = WidthPolicy((1, 4), (1,), ()), PolicyBefore((1, 4), (1,), ())
    for drafts, accepted, copied in ((3, 1, 0), (3, 3, 2), (2, 0, 1), (3, 2, 3)) * 5:
        for rid in (0, 1):
            for policy in (new, old):
                policy.observe_lane(rid, drafts, accepted, copied)
        for rid in (0, 1, 2):  # 2: pooled rates only
            for copied_now in (0, 1, 3):
                for length in range(0, 6):
                    assert new.expected_tokens(rid, length, copied_now) == \
                        old.expected_tokens(rid, length, copied_now)


def _decode_served(policy, rows, seconds, steps):
    """`steps` completed decode steps of `rows` rows, `seconds` each (a served while)."""
    for _ in range(steps):
        policy.observe_step(("decode", policy.bucket(rows)), seconds)


def test_a_program_that_cannot_win_at_its_cost_floor_is_not_measured():
    # 64 lanes, decode at batch capacity 64: 64 tokens in 1.0 s; no draft seen, so the
    # optimistic acceptance is 1. W = 2 and W = 4 measured at capacity 32 (2.2 s, 4.5 s):
    # at 64 they cost at least that, so even with every draft accepted they give
    # 128 / 2.2 = 58 and 256 / 4.5 = 57 < 64 tokens/s. W = 3 has only decode's floor
    # (192 / 1.0): measured; then its 3.4 s is W = 4's floor too.
    lanes = [(i, 4) for i in range(64)]
    seen = []
    for bounded in (True, False):
        policy = WidthPolicy((1, 2, 3, 4), (32, 64), (), bounded_exploration=bounded)
        _decode_served(policy, 64, 1.0, 1000)  # a budget that is no obstacle here
        for key, seconds in ((("speculative", 32, 2), 2.2), (("speculative", 32, 4), 4.5)):
            for _ in range(MIN_COST_SAMPLES):
                policy.observe_step(key, seconds)
        choices = []
        for _ in range(9):
            choice = policy.choose(lanes)
            choices.append((choice.width, choice.reason))
            if choice.width:
                policy.observe_step(policy.program_key(64, choice), 1.0 + choice.width * 0.8)
        seen.append(choices)
    assert seen[0] == [(3, "measure")] * MIN_COST_SAMPLES + [(0, "best")] * 6
    # the rule before measured every width first, each a loss at these costs
    assert seen[1] == [(w, "measure") for w in (2, 3, 4) for _ in range(MIN_COST_SAMPLES)]


def test_measuring_a_losing_program_stops_at_the_explore_share():
    # Sampled batch 64 on the H200, roughly: every speculative step costs 5 decode steps
    # and nothing is accepted. W = 2 is measured at once (nothing lost yet), and again
    # only when each ~400 s of steps cover its ~4 s loss at EXPLORE_SHARE; then W = 3,
    # W = 4 and the prefix program (P = 128 holds W = 2's 64 x 2 rows) have W = 2's 5 s
    # as their cost floor, where their expected ~66 tokens lose to decode's 64 / 1 s:
    # never measured. The rule before measured every program MIN_COST_SAMPLES = 3 times
    # at once (12 steps of 5 s).
    lanes = [(i, 4) for i in range(64)]
    runs = {}
    for bounded in (True, False):
        policy = WidthPolicy((1, 2, 3, 4), (64,), ((64, 128, 4),), bounded_exploration=bounded)
        for rid, _ in lanes:
            policy.observe_lane(rid, 3, 0)
        spent, speculative = 0.0, []
        for step in range(1000):
            choice = policy.choose(lanes)
            seconds = 1.0 if choice.width == 0 else 5.0
            policy.observe_step(policy.program_key(64, choice), seconds)
            spent += seconds
            if choice.width:
                speculative.append(step)
        runs[bounded] = (spent, speculative, policy)
    spent, speculative, policy = runs[True]
    assert policy.spent == spent
    worst = 5.0 - 64 * policy.expected_tokens(0, 2) / 64  # one measurement's loss
    assert policy.exploration_loss == pytest.approx(3 * worst)
    assert policy.exploration_loss <= EXPLORE_SHARE * spent + worst
    assert speculative == [3, 395, 790]
    assert policy.measurements == {"decode": MIN_COST_SAMPLES, "w2": MIN_COST_SAMPLES}
    old_spent, old_speculative, _ = runs[False]
    assert old_speculative == list(range(3, 3 + 4 * MIN_COST_SAMPLES))
    assert old_spent - spent == (4 * MIN_COST_SAMPLES - 3) * 4.0


def test_measurements_that_pay_are_not_bounded():
    # Batch 1 with copies accepted (editing): W = 2 / 3 / 4 cost 1.26 / 1.36 / 1.40 decode
    # steps (H200, spec_step_cost_815b6d7.json) and emit more than that: no loss, so the
    # bounded rule measures and chooses exactly as the rule before.
    costs = {0: 1.0, 2: 1.26, 3: 1.36, 4: 1.40}
    seen = []
    for bounded in (True, False):
        policy = WidthPolicy((1, 2, 3, 4), (1,), (), bounded_exploration=bounded)
        choices = []
        for _ in range(40):
            choice = policy.choose([(0, 4)], copied={0: 3})
            choices.append(choice)
            policy.observe_step(policy.program_key(1, choice), costs[choice.width])
            if choice.width:
                policy.observe_lane(0, choice.width - 1, choice.width - 1, copied=3)
        seen.append(choices)
        if bounded:
            assert policy.exploration_loss == 0.0
    assert seen[0] == seen[1]
    assert [c.width for c in seen[0][:12]] == [0, 0, 0, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    assert seen[0][-1] == Choice(4, 0, "best")


def test_decode_is_certain_only_when_no_program_could_win():
    """WidthPolicy.decode_certain: True only where `decide` picks plain decode whatever
    the lanes (ceilings, copied candidates, acceptance): checked against `decide` on
    random cohorts."""
    import random

    rng = random.Random(4)
    policy = WidthPolicy((1, 2, 3, 4), (8, 64), ((64, 128, 4),))
    assert not policy.decode_certain(64)  # decode not measured
    _decode_served(policy, 64, 1.0, 200)
    assert not policy.decode_certain(64)  # W = 2 unmeasured, floor 1 s: 128 tokens could win
    for key, seconds in ((("speculative", 64, 2), 3.5), (("speculative", 64, 4), 4.5)):
        for _ in range(MIN_COST_SAMPLES):
            policy.observe_step(key, seconds)
    # best cases: W = 2 128 / 3.5, W = 3 192 / 3.5 (floor: W = 2), W = 4 256 / 4.5, the
    # prefix program 128 / 3.5 (it holds W = 2's rows): all below decode's 64 / 1
    assert policy.decode_certain(64)
    assert not policy.decode_certain(8)  # nothing measured at capacity 8
    for _ in range(300):
        rows = rng.choice((33, 50, 64))
        lanes = [(rid, rng.choice((1, 2, 4))) for rid in range(rows)]
        copied = {rid: rng.choice((0, 3)) for rid, _ in lanes}
        for rid, _ in lanes[:5]:
            policy.observe_lane(rid, 3, rng.randint(0, 3), copied=rng.choice((0, 3)))
        certain = policy.decode_certain(rows)
        choice = policy.choose(lanes, copied)
        if certain:
            assert choice.width == 0, choice
        policy.observe_step(policy.program_key(rows, choice),
                            {0: 1.0, 2: 3.5, 3: 3.8, 4: 4.5}[choice.width])
    # W = 4 cheap now (256 / 1.2 > 64): one observation is an outlier to the median of
    # its window; a majority of them is its cost
    key = ("speculative", 64, 4)
    policy.observe_step(key, 1.2)
    assert policy.decode_certain(64)
    for _ in range(COST_WINDOW // 2):
        policy.observe_step(key, 1.2)
    assert policy.costs.cost[key] == 1.2
    assert not policy.decode_certain(64)


def test_a_program_that_loses_even_with_every_draft_accepted_is_a_clear_loser():
    # decode: 1 token in 1.0 s; W = 2 at 2.2 s with its draft nearly always accepted:
    # ~1.95 / 2.2 = 0.89 of decode's rate (within STALE_MARGIN), but even 2 / 2.2 = 0.91
    # is below decode's, so it is measured again only once LOSER_STALE_DECISIONS old (the
    # rule before: once STALE_DECISIONS old)
    cost = {0: 1.0, 2: 2.2}
    first = {}
    for bounded in (True, False):
        policy = WidthPolicy((1, 2), (1,), (), bounded_exploration=bounded)
        for _ in range(60):
            policy.observe_lane(0, 1, 1)
        _decode_served(policy, 1, 1.0, 500)
        assert _measured(policy, 1, {(0, 0): 1.0, (2, 0): 2.2}).width == 0
        assert policy.expected_tokens(0, 2) / 2.2 >= STALE_MARGIN and 2 / 2.2 < 1.0
        measured_at = policy.costs.decisions
        for _ in range(LOSER_STALE_DECISIONS + 2):
            choice = policy.choose([(0, 2)])
            policy.observe_step(policy.program_key(1, choice), cost[choice.width])
            if choice.width:
                first[bounded] = policy.costs.decisions - measured_at
                break
    # (ages count from W = 2's last measurement, the decision before `measured_at`)
    assert first == {True: LOSER_STALE_DECISIONS, False: STALE_DECISIONS}


def test_a_switch_back_to_decode_adds_to_the_speculative_programs_latest_cost():
    policy = WidthPolicy((1, 4), (1,), ())
    key = ("speculative", 1, 4)
    policy.observe_switch(key, 0.5)  # nothing observed of it yet: no cost to add to
    assert key not in policy.costs.cost and policy.spent == 0.5
    policy.observe_step(key, 2.0)
    policy.observe_switch(key, 0.5)  # one observation: it was 2.5
    assert policy.costs.cost[key] == 2.5
    policy.observe_step(key, 2.0)  # the median of 2.5 and 2.0
    assert policy.costs.cost[key] == 2.25
    policy.observe_switch(key, 1.0)  # as if that observation had been 3.0
    assert policy.costs.cost[key] == 2.75
    assert policy.spent == 6.0


def _b64_policy():
    """Batch 64 as on the H200 (greedy editing, 9f51a62, roughly): decode 4.7 ms; every
    lane's first draft accepted, its second never (W = 2 and W = 3 emit ~2 tokens a
    lane); W = 2 10 ms, W = 3 11.3 ms. Decode wins: 64 / 4.7 = 13.6 tokens/ms against
    W = 2's ~128 / 10 = 12.7 and W = 3's ~11.2."""
    policy = WidthPolicy((1, 2, 3), (64,), ())
    lanes = [(rid, 3) for rid in range(64)]
    for _ in range(20):
        for rid, _ in lanes:
            policy.observe_lane(rid, 2, 1)
    _decode_served(policy, 64, 4.7e-3, COST_WINDOW)
    for key, seconds in ((("speculative", 64, 2), 10e-3), (("speculative", 64, 3), 11.3e-3)):
        for _ in range(MIN_COST_SAMPLES):
            policy.observe_step(key, seconds)
    assert policy.choose(lanes) == Choice(0, 0, "best")
    return policy, lanes


def test_one_outlier_step_does_not_change_the_choice():
    # A decode step the host held up 20x (94 ms) and the one completed right behind it
    # (0.1 ms). A running mean (the rule before: 0.8 old + 0.2 new) would put decode at
    # 18 ms, and W = 2 would run where it loses; the median of the window ignores both.
    policy, lanes = _b64_policy()
    mean = 4.7e-3
    for seconds in (94e-3, 0.1e-3):
        policy.observe_step(("decode", 64), seconds)
        mean += 0.2 * (seconds - mean)
        assert policy.costs.cost[("decode", 64)] == 4.7e-3
    assert 64 / mean < policy.step_tokens(lanes, Choice(2)) / 10e-3  # W = 2 under a mean
    assert policy.choose(lanes) == Choice(0, 0, "best")


def test_a_lasting_change_of_cost_is_followed_within_half_the_window():
    policy, lanes = _b64_policy()
    for n in range(1, COST_WINDOW // 2 + 2):  # decode twice as slow from now on
        policy.observe_step(("decode", 64), 9.4e-3)
        assert (policy.costs.cost[("decode", 64)] == 9.4e-3) == (n > COST_WINDOW // 2)
    assert policy.choose(lanes) == Choice(2, 0, "best")
