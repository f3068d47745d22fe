"""The width policy: each speculative step's program chosen from completed observations.

Issue "Speculative generation II", item 3; the specification: "The host chooses the
cohort and physical program from completed observations before that program generates
proposals." The cohort is every request ready to generate; the policy picks its
physical program -- plain DECODE, a SPECULATIVE program of width W (lanes of
min(W, their ceiling)), or a SPECULATIVE_PREFIX_LIMIT program (B lanes sharing P rows)
-- from two kinds of observations, both taken from completed steps only:

- step costs: the wall seconds the batch waited for each completed step (the scheduler's
  rule, Scheduler._observe_cost: from the previous completion to its own, so a serial
  step pays the host work before its issue and pipelined decode does not), the median
  of the last COST_WINDOW per program and batch capacity (`StepCosts`);
- acceptance: per request and draft position k, how often draft k was accepted when
  reached (drafts 0..k-1 accepted), smoothed towards the pooled rate of all requests;
  copied drafts (history drafting) and learned drafts counted apart, since a copy in
  step with its source is accepted far more often than the head's guess, and the host
  knows before the step how many copied candidates each lane carries.

Measuring a program is itself a step of it, and at batch 64 a step of a losing program
costs several decode steps (H200, sampled W = 4: ~5), so measurements are bounded
(`WidthPolicy.decide` states the rule): a program is measured only when it could beat
the best measured rate at a floor on its cost, and only while the measurements'
estimated loss stays within EXPLORE_SHARE of all step time.

Nothing here changes what a program computes (greedy text is identical whatever it
picks; sampled text follows the lane lengths it picks: docs/speculative.md).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# A program's cost is the median of its last COST_WINDOW observations: a step the host
# held up (admitting a round of requests, another thread holding the GIL) and the step
# completed right behind it are one outlier each way, and a mean let one such step decide
# for hundreds (H200, 9f51a62: batch-64 decode at 13.3 ms against 4.7 ms measured, so
# W = 3 ran where it lost; docs/speculative.md, "The width policy").
COST_WINDOW = 9
# Observations of a program before its cost is trusted: the median of three ignores one
# outlier either way.
MIN_COST_SAMPLES = 3
# Pseudo-counts pulling a request's acceptance rate towards the pooled one.
PRIOR_WEIGHT = 4.0
# Decisions after which a program's cost counts as stale and is measured again ...
STALE_DECISIONS = 256
# ... unless its rate at that cost is below STALE_MARGIN x the best rate: then only after
# LOSER_STALE_DECISIONS (a step of a clearly slower program is a loss each time; at batch
# 64 on the H200 one sampled W = 4 step costs ~2.4 decode steps).
STALE_MARGIN = 0.8
LOSER_STALE_DECISIONS = 4 * STALE_DECISIONS
# Bound on what measuring costs: a measurement is made only while the measurements'
# summed loss (each one's seconds minus the time the best measured program would have
# taken for the tokens it was expected to emit; never below 0) is at most this share of
# all measured step seconds -- so exploring costs about 1 % of throughput however slow
# the measured program is (issue 13: >= 0.97x speculation off at batch 32 / 64).
EXPLORE_SHARE = 0.01
# A program is measured only if it could win with the pooled acceptance counted as if the
# next OPTIMISTIC_DRAFTS drafts at every position were accepted: a draft position never
# seen counts as always accepted, one seen in a few lanes (batch 1) stays optimistic, one
# seen in hundreds (a batch-64 step offers 64) is its observed rate.
OPTIMISTIC_DRAFTS = 8


@dataclass
class StepCosts:
    """Cost (seconds) per program key: the median of its last COST_WINDOW observations."""

    cost: dict[tuple, float] = field(default_factory=dict)
    samples: dict[tuple, int] = field(default_factory=dict)
    when: dict[tuple, int] = field(default_factory=dict)  # decision count at the last one
    decisions: int = 0
    _window: dict[tuple, deque[float]] = field(default_factory=dict)

    def observe(self, key: tuple, seconds: float) -> None:
        window = self._window.get(key)
        if window is None:
            window = self._window[key] = deque(maxlen=COST_WINDOW)
        window.append(seconds)
        self.cost[key] = statistics.median(window)
        self.samples[key] = self.samples.get(key, 0) + 1
        self.when[key] = self.decisions

    def add_to_latest(self, key: tuple, seconds: float) -> None:
        """Add `seconds` to `key`'s latest observation (no-op when it has none)."""
        window = self._window.get(key)
        if window:
            window[-1] += seconds
            self.cost[key] = statistics.median(window)

    def measured(self, key: tuple) -> bool:
        """Measured MIN_COST_SAMPLES times."""
        return self.samples.get(key, 0) >= MIN_COST_SAMPLES

    def age(self, key: tuple, decisions: int | None = None) -> int:
        """Decisions since the last measurement of `key` (at `decisions`, default now)."""
        return (self.decisions if decisions is None else decisions) - self.when.get(key, 0)

    def known(self, key: tuple) -> bool:
        """Measured MIN_COST_SAMPLES times, the last within STALE_DECISIONS decisions."""
        return self.measured(key) and self.age(key) <= STALE_DECISIONS


@dataclass(frozen=True)
class Choice:
    """A step's program: `width` 0 = plain DECODE; else SPECULATIVE lanes of up to
    `width` positions, with `packed_rows` P > 0 for a prefix-limit program."""

    width: int
    packed_rows: int = 0
    reason: str = ""


class _Acceptance:
    """Per draft position k (0-based): how often draft k was reached (drafts 0..k-1
    accepted) and accepted, separately for copied drafts (history drafting: the lane's
    first `copied` drafts) and learned ones."""

    def __init__(self, positions: int) -> None:
        self.offered = [0] * positions
        self.accepted = [0] * positions
        self.copied_offered = [0] * positions
        self.copied_accepted = [0] * positions

    def add(self, drafts: int, accepted: int, copied: int = 0) -> None:
        # drafts past the first rejected one were never tested: not counted
        for k in range(min(drafts, accepted + 1, len(self.offered))):
            if k < copied:
                self.copied_offered[k] += 1
                self.copied_accepted[k] += int(k < accepted)
            else:
                self.offered[k] += 1
                self.accepted[k] += int(k < accepted)


class WidthPolicy:
    """Chooses each step's program; see the module docstring.

    Args:
        widths: served lane widths (ModelGeometry.lane_widths: the served programs'
            lane limits, ascending, 1 included when served).
        batches: captured batch capacities of the decode and speculative programs.
        prefix_programs: served prefix-limit programs (B, P, L), L their lane limit.
        bounded_exploration: measure only what could win, within EXPLORE_SHARE
            (`decide`); False measures every program as soon as it is a candidate (the
            rule before, kept for the reference test of the rates).
    """

    def __init__(self, widths: Sequence[int], batches: Sequence[int],
                 prefix_programs: Sequence[tuple[int, int, int]] = (),
                 bounded_exploration: bool = True) -> None:
        self.widths = tuple(w for w in widths if w > 1)
        self.batches = tuple(sorted(batches))
        self.prefix = tuple(prefix_programs)
        depth = max(self.widths, default=1) - 1
        self.costs = StepCosts()
        self._pooled = _Acceptance(depth)
        self._requests: dict[int, _Acceptance] = {}
        self.decisions: dict[str, int] = {}
        self.measurements: dict[str, int] = {}  # the decisions made to measure, by label
        # Proposal confidence of completed prefix-limit steps: per request the survival
        # products of its last lane's drafts, and the pooled calibration of survival
        # against acceptance over every verified draft (accepted count, summed survival).
        self._survival: dict[int, list[float]] = {}
        self._calibration = [0.0, 0.0]
        # (request id, copied) -> its lane's expected tokens per length and survival
        # products (`_lane_table`); cleared by every acceptance observation (each one moves
        # the pooled rates every request's are smoothed towards), so a run of decode steps
        # computes each request's table once.
        self._tables: dict[tuple[int, int], tuple[list[float], list[float]]] = {}
        # Exploration accounting (`decide`): all measured step seconds, the measurements'
        # summed loss, per program key the committed measurements not yet completed
        # (seconds the best program would have taken for their expected tokens), and the
        # last measurement `decide` returned (choice, key, those seconds) for `commit`.
        self.bounded_exploration = bounded_exploration
        self.spent = 0.0
        self.exploration_loss = 0.0
        self._exploring: dict[tuple, list[float]] = {}
        self._decided: tuple[Choice, tuple, float | None] | None = None

    # -- observations --------------------------------------------------------------

    def observe_lane(self, request_id: int, drafts: int, accepted: int,
                     copied: int = 0) -> None:
        """A completed lane of `request_id`: `drafts` drafts offered, of which the first
        `copied` were copied candidates, `accepted` taken."""
        if drafts < 1:
            return
        stats = self._requests.get(request_id)
        if stats is None:
            stats = self._requests[request_id] = _Acceptance(len(self._pooled.offered))
        stats.add(drafts, accepted, copied)
        self._pooled.add(drafts, accepted, copied)
        self._tables.clear()

    def observe_confidence(self, request_id: int, confidence: Sequence[float], offers: int,
                           accepted: int) -> None:
        """A completed prefix-limit lane's proposal confidence (validated, in [0, 1]):
        the head's confidence in each draft it made, of which the first `offers` - 1 were
        verified and `accepted` taken."""
        survival, s = [], 1.0
        for c in confidence:
            s *= float(c)
            survival.append(s)
        self._survival[request_id] = survival
        verified = survival[:max(offers - 1, 0)]
        self._calibration[0] += accepted
        self._calibration[1] += sum(verified)

    @property
    def calibration(self) -> float:
        """Accepted drafts per unit of survival probability over verified prefix-limit
        drafts (1 = the head's confidence is calibrated), smoothed towards 1."""
        accepted, survival = self._calibration
        return (accepted + PRIOR_WEIGHT) / (survival + PRIOR_WEIGHT)

    def forget(self, request_id: int) -> None:
        self._requests.pop(request_id, None)
        self._survival.pop(request_id, None)
        for key in [k for k in self._tables if k[0] == request_id]:
            del self._tables[key]

    def observe_step(self, key: tuple, seconds: float) -> None:
        """A completed step of program `key` (`program_key`): the seconds the batch
        waited for it."""
        self.costs.observe(key, seconds)
        self.spent += seconds
        pending = self._exploring.get(key)
        if pending:  # a measurement: its loss against the best program of its decision
            self.exploration_loss += max(0.0, seconds - pending.pop(0))

    def observe_switch(self, key: tuple, seconds: float) -> None:
        """Host seconds the first decode after a completed step of speculative program
        `key` waited before its issue (it could not be planned ahead of that step):
        added to `key`'s latest observation, as part of its cost."""
        self.costs.add_to_latest(key, seconds)
        self.spent += seconds

    def bucket(self, rows: int) -> int:
        for b in self.batches:
            if b >= rows:
                return b
        return self.batches[-1]

    def program_key(self, rows: int, choice: Choice) -> tuple:
        """The program a step of `rows` rows runs under `choice` (the cost table key)."""
        if choice.width == 0:
            return ("decode", self.bucket(rows))
        if choice.packed_rows:
            return ("prefix", self.bucket(rows), choice.packed_rows)
        return ("speculative", self.bucket(rows), choice.width)

    # -- decisions -------------------------------------------------------------------

    def acceptance(self, request_id: int, copied: int = 0) -> list[float]:
        """alpha_k: the chance draft k (0-based) is accepted given drafts 0..k-1 were,
        for a lane whose first `copied` drafts are copied candidates."""
        pooled = self._pooled
        own = self._requests.get(request_id)
        rates = []
        for k in range(len(pooled.offered)):
            if k < copied:
                p_acc, p_off = pooled.copied_accepted[k], pooled.copied_offered[k]
                o_acc, o_off = ((own.copied_accepted[k], own.copied_offered[k]) if own
                                else (0, 0))
            else:
                p_acc, p_off = pooled.accepted[k], pooled.offered[k]
                o_acc, o_off = (own.accepted[k], own.offered[k]) if own else (0, 0)
            prior = (p_acc + 1.0) / (p_off + 2.0)
            rates.append((o_acc + PRIOR_WEIGHT * prior) / (o_off + PRIOR_WEIGHT))
        return rates

    def expected_tokens(self, request_id: int, length: int, copied: int = 0) -> float:
        """Tokens a lane of `length` positions is expected to emit: 1 + sum over
        j < length - 1 of alpha_0 * ... * alpha_j (`acceptance`)."""
        expected = self._lane_table(request_id, copied)[0]
        return expected[min(max(length, 1), len(expected) - 1)]

    def _lane_table(self, request_id: int, copied: int) -> tuple[list[float], list[float]]:
        """(expected, survive) of a lane of `request_id` with `copied` copied drafts:
        expected[n] = `expected_tokens` of length n (n = 0 .. depth + 1; 0 and 1 emit 1),
        survive[j] = alpha_0 * ... * alpha_j, from one pass over `acceptance` in draft
        order (the same float operations in the same order as summing per length)."""
        key = (request_id, copied)
        table = self._tables.get(key)
        if table is None:
            total, s = 1.0, 1.0
            expected, survive = [1.0, 1.0], []
            for alpha in self.acceptance(request_id, copied):
                s *= alpha
                survive.append(s)
                total += s
                expected.append(total)
            table = self._tables[key] = (expected, survive)
        return table

    def choose(self, lanes: Sequence[tuple[int, int]],
               copied: Mapping[int, int] | None = None) -> Choice:
        """`decide`, then `commit`: the program for one step over `lanes` that runs."""
        return self.commit(self.decide(lanes, copied))

    def commit(self, choice: Choice) -> Choice:
        """Count `choice` (from `decide`) as a decision: the step it chose is planned now.
        A choice that is not committed (the scheduler leaves the cohort waiting and
        decides again at its completion) leaves no trace."""
        if choice.reason != "no speculation":
            self.costs.decisions += 1
            self._record(choice)
        decided, self._decided = self._decided, None
        if decided is not None and decided[0] is choice and decided[2] is not None:
            self._exploring.setdefault(decided[1], []).append(decided[2])
        return choice

    def decide(self, lanes: Sequence[tuple[int, int]],
               copied: Mapping[int, int] | None = None) -> Choice:
        """The program for one step over `lanes` = (request id, lane ceiling); `copied`:
        request id -> copied candidates its lane carries this step (history drafting).
        Changes nothing (`commit` counts it).

        Rule: among plain DECODE, each served width W > 1 and each prefix-limit program
        that holds the batch, take the highest expected tokens per second among the
        programs measured MIN_COST_SAMPLES times at this batch capacity -- expected
        tokens from each request's acceptance rates, copied rates for its lane's copied
        drafts and learned rates after them (a lane of length n emits
        1 + a_0 + a_0 a_1 + ...; a prefix-limit program's B + P - B likeliest next
        positions, ranked for a request seen in a prefix-limit step by its last lane's
        proposal-confidence survival times the observed calibration of confidence
        against acceptance), seconds from the measured cost of that program at this
        batch capacity (`StepCosts`: the median of its last COST_WINDOW steps). Before
        that, measure (reason "measure"):
        1. plain DECODE while it is not measured (everything is compared with it);
        2. else, only while the measurements' summed loss is at most EXPLORE_SHARE of all
           measured step seconds (`exploration_loss` <= EXPLORE_SHARE x `spent`; a
           measurement's loss is its seconds minus the time the best measured program
           would have taken for the tokens it was expected to emit, never below 0):
           a. an unmeasured program (narrowest first) that could beat the best measured
              rate: its tokens at optimistic acceptance (the pooled rates with
              OPTIMISTIC_DRAFTS more drafts accepted at every position: `_optimistic`)
              over a floor on its cost -- the largest measured cost of DECODE at this
              capacity, of a SPECULATIVE width w <= W with B x w <= its rows at this
              capacity, or of the same program at a smaller capacity (a step never costs
              less than those);
           b. a measured program whose last measurement is more than STALE_DECISIONS
              decisions old, if it is DECODE (the baseline: a wrong decode cost would
              misjudge every other program, and nothing but a decode step corrects it)
              or its rate at that cost is at least STALE_MARGIN x the best rate (and,
              for a speculative program, its best case -- every draft accepted: sum of
              min(W, ceiling), at most P -- at that cost is at least the best rate),
              else once it is LOSER_STALE_DECISIONS old.
        Ages count committed decisions, this one included. With bounded_exploration
        False, 2 has no budget and 2a no floor test: every program is measured as
        soon as it is a candidate (before any comparison), as before.
        """
        if not self.widths or not lanes:
            return Choice(0, 0, "no speculation")
        costs = self.costs
        self._decided = None
        decisions = costs.decisions + 1  # this decision, once committed
        rows = len(lanes)
        bucket = self.bucket(rows)
        options = [Choice(0)] + [Choice(w) for w in self.widths]
        options += [Choice(w, p) for b, p, w in self.prefix if b == bucket and b >= rows]
        keys = [self.program_key(rows, option) for option in options]
        measured = [costs.measured(key) for key in keys]
        bounded = self.bounded_exploration
        if not measured[0] or not (bounded or all(measured)):
            option = options[measured.index(False)]
            return self._measure(option, keys[measured.index(False)], None)
        copied = copied or {}
        tables = [self._lane_table(rid, copied.get(rid, 0)) for rid, _ in lanes]
        tokens = [self._tokens(lanes, tables, option) for option in options]
        rates = [t / costs.cost[key] if known else -1.0
                 for t, key, known in zip(tokens, keys, measured, strict=True)]
        best_rate = max(rates)
        if not bounded or self.exploration_loss <= EXPLORE_SHARE * self.spent:
            hopes = None
            for option, key, known, t in zip(options, keys, measured, tokens, strict=True):
                if known:
                    continue
                if hopes is None:  # optimistic lane tables, one per copied count
                    hopes = {c: self._optimistic(c) for c in {copied.get(r, 0) for r, _ in lanes}}
                hope = self._tokens(lanes, [hopes[copied.get(rid, 0)] for rid, _ in lanes],
                                    option)
                if hope >= best_rate * self._cost_floor(key, keys[0]):
                    return self._measure(option, key, t / best_rate)
            for option, key, known, rate, t in zip(options, keys, measured, rates, tokens,
                                                    strict=True):
                age = costs.age(key, decisions)
                if known and (age > LOSER_STALE_DECISIONS or (age > STALE_DECISIONS and (
                        not option.width or rate >= STALE_MARGIN * best_rate
                        and (not bounded or self._best_case(
                            lanes, option) >= best_rate * costs.cost[key])))):
                    return self._measure(option, key, t / best_rate)
        best = options[rates.index(best_rate)]
        return Choice(best.width, best.packed_rows, "best")

    def _best_case(self, lanes: Sequence[tuple[int, int]], option: Choice) -> int:
        """Tokens one step of speculative `option` emits if every draft is accepted."""
        total = sum(min(option.width, ceiling) for _, ceiling in lanes)
        return min(total, max(option.packed_rows, len(lanes))) if option.packed_rows else total

    def decode_certain(self, rows: int) -> bool:
        """Whether `decide` picks plain DECODE for a cohort of `rows` requests whatever
        their lane ceilings, copied candidates and acceptance, so the scheduler need not
        propose copied candidates or decide (a decode step on a speculative core then
        costs the host what it costs with speculation off).

        Rule (`decide`'s, bounded by the best case): every draft accepted, a program of
        width W emits at most rows x W tokens (at most P for a prefix program); DECODE is
        certain when it is measured, bounded exploration is on, and for every other
        program that best case over its measured cost is below DECODE's rate (so
        `decide` measures it again only once it is LOSER_STALE_DECISIONS old) and it is
        not that old or the exploration budget is spent; an unmeasured one only while
        the budget is spent or its best case over its cost floor is below DECODE's rate.
        """
        if not self.widths or rows < 1 or not self.bounded_exploration:
            return False
        costs = self.costs
        bucket = self.bucket(rows)
        decode = ("decode", bucket)
        if not costs.measured(decode):
            return False
        rate = rows / costs.cost[decode]
        budget = self.exploration_loss <= EXPLORE_SHARE * self.spent
        decisions = costs.decisions + 1
        options = [Choice(w) for w in self.widths]
        options += [Choice(w, p) for b, p, w in self.prefix if b == bucket and b >= rows]
        for option in options:
            key = self.program_key(rows, option)
            most = rows * option.width
            if option.packed_rows:
                most = min(most, max(option.packed_rows, rows))
            if costs.measured(key):
                hope = most / costs.cost[key]
                if hope >= rate or (budget and costs.age(key, decisions)
                                    > LOSER_STALE_DECISIONS):
                    return False
            elif budget and most >= rate * self._cost_floor(key, decode):
                return False
        return True

    def _measure(self, option: Choice, key: tuple, worth: float | None) -> Choice:
        """A "measure" choice of `option`; `worth`: seconds the best measured program
        would take for its expected tokens (None: nothing to compare yet), charged
        against its cost once committed and completed (`commit`, `observe_step`)."""
        choice = Choice(option.width, option.packed_rows, "measure")
        if self.bounded_exploration:
            self._decided = (choice, key, worth)
        return choice

    def _optimistic(self, copied: int) -> tuple[list[float], list[float]]:
        """`_lane_table` of a lane with `copied` copied drafts at the pooled rates with
        OPTIMISTIC_DRAFTS more drafts accepted at every position (no request's own)."""
        pooled, extra = self._pooled, OPTIMISTIC_DRAFTS
        total, s = 1.0, 1.0
        expected, survive = [1.0, 1.0], []
        for k in range(len(pooled.offered)):
            acc, off = ((pooled.copied_accepted[k], pooled.copied_offered[k]) if k < copied
                        else (pooled.accepted[k], pooled.offered[k]))
            s *= (acc + extra) / (off + extra)
            survive.append(s)
            total += s
            expected.append(total)
        return expected, survive

    def _cost_floor(self, key: tuple, decode: tuple) -> float:
        """A lower bound on the cost of unmeasured program `key` (`program_key`): the
        largest measured cost of DECODE (`decode`) at its capacity B, of a SPECULATIVE
        width w at B that it contains (w < W; a prefix program of P rows: B x w <= P),
        and of the same program at a smaller capacity."""
        costs = self.costs
        floor = costs.cost[decode]
        kind, bucket, size = key  # size: W, or P of a prefix program
        for other, cost in costs.cost.items():
            if cost <= floor or not costs.measured(other) or other[0] == "decode":
                continue
            same = other[0] == kind and other[1] < bucket and other[2] == size
            inside = other[0] == "speculative" and other[1] == bucket and (
                other[2] < size if kind == "speculative" else bucket * other[2] <= size)
            if same or inside:
                floor = cost
        return floor

    def step_tokens(self, lanes: Sequence[tuple[int, int]], option: Choice,
                    copied: Mapping[int, int] | None = None) -> float:
        """Expected tokens of one step of `option` over `lanes` (the rule's numerator)."""
        copied = copied or {}
        return self._tokens(lanes, [self._lane_table(rid, copied.get(rid, 0))
                                    for rid, _ in lanes], option)

    def _tokens(self, lanes: Sequence[tuple[int, int]],
                tables: Sequence[tuple[list[float], list[float]]], option: Choice) -> float:
        """Expected tokens of one step of `option` over `lanes` (`_lane_table` each)."""
        if option.width == 0:
            return float(len(lanes))
        width = option.width
        if not option.packed_rows:
            return sum(expected[min(width, ceiling, len(expected) - 1)]
                       for (_, ceiling), (expected, _) in zip(lanes, tables, strict=True))
        # Prefix allocation: each lane's pending row, then the P - B likeliest positions:
        # a lane seen in a prefix-limit step by its last drafts' survival products (the
        # proposal confidence the device allocates by) times the observed calibration,
        # else by its acceptance rates.
        gains = []
        calibration = self.calibration
        for (rid, ceiling), (_, survive) in zip(lanes, tables, strict=True):
            depth = max(min(width, ceiling) - 1, 0)
            seen = self._survival.get(rid)
            if seen:
                gains += [min(1.0, calibration * s) for s in seen[:depth]]
            else:
                gains += survive[:depth]
        gains.sort(reverse=True)
        return len(lanes) + sum(gains[:max(option.packed_rows - len(lanes), 0)])

    def _record(self, choice: Choice) -> Choice:
        label = "decode" if choice.width == 0 else (
            f"prefix_w{choice.width}_p{choice.packed_rows}" if choice.packed_rows
            else f"w{choice.width}")
        self.decisions[label] = self.decisions.get(label, 0) + 1
        if choice.reason == "measure":
            self.measurements[label] = self.measurements.get(label, 0) + 1
        return choice
