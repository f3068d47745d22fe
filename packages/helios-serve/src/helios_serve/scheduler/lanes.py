"""Speculative lanes: how long a request's next lane is, which copied candidates it
verifies, which program the width policy chooses, and what a completed lane record says.

Every generation row of a request that can speculate (`speculates`) is a SPECULATIVE
lane of length n = min(longest served lane limit, output budget left) -- 1 while its next token is
masked (min_tokens; grammar unless the core masks a constrained lane's copied candidates
per position: then 1 + the copied candidates its grammar accepts) -- with pages reserved
for all n positions by the scheduler (the lane's full ceiling); a lane whose pages are not
available waits, it is never shortened for them (lane lengths depend on the request
alone, so a seeded request samples the same text alone and in any batch). Requests whose
tokens need what speculative programs do not compute (logit_bias, logprobs) run as DECODE
rows of the same core.

A completion is one lane record per row (helios_tools.kernels.speculative), validated as
a whole (`check`) before any request state changes; `observe` then counts each lane and
feeds the width policy.

Plain Python over plain data (no CUDA); the scheduler owns the requests, this module
reads them and writes only the Sequence fields of its proposer (`history`,
`constrained_candidates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from helios_tools.kernels.speculative import (
    FIELD_ACCEPTED,
    FIELD_EMITTED,
    FIELD_OFFERS,
    RECORD_FIELDS,
)

from helios_serve.engine.plan import CopiedCandidates, ModelGeometry, RowPlan, StepPlan
from helios_serve.scheduler.request import CompletionError, SchedRequest
from helios_serve.scheduler.sequence import Sequence
from helios_serve.speculation import HistoryIndex, WidthPolicy
from helios_serve.speculation.policy import Choice


def speculates(request: SchedRequest) -> bool:
    """Whether a request's generation rows may be SPECULATIVE lanes: speculative
    programs apply no logit bias and record no logprobs (helios_tools.kernels.
    speculative.spec_verify_coupled), so such requests run as DECODE rows instead."""
    sampling = request.sampling
    return not sampling.logit_bias and sampling.logprobs is None


# Proposal sources of a lane's drafts: its first drafts are the copied candidates it
# carries (history drafting), the rest the learned head's.
SOURCES = ("learned", "copied")


@dataclass
class LaneCounts:
    """Counters of completed lanes (SchedulerStats' spec_* fields).

    Attributes:
        draft: drafts offered (lane length - 1 per lane of 2 or more).
        accepted: drafts accepted.
        per_position: lanes whose draft k was accepted, k = 0..max_width - 2.
        lengths: lanes by accepted + 1 (tokens emitted), 0..max_width.
        copied_draft: drafts that were copied candidates.
        copied_accepted: copied candidates accepted.
        offered_by_source / accepted_by_source: source (SOURCES) -> per draft position
            k = 0..max_width - 2, the lanes that offered a draft of that source at k /
            in which it was accepted (the acceptance rate at k is their ratio).
    """

    max_width: int
    draft: int = 0
    accepted: int = 0
    copied_draft: int = 0
    copied_accepted: int = 0
    per_position: list[int] = field(init=False)
    lengths: list[int] = field(init=False)
    offered_by_source: dict[str, list[int]] = field(init=False)
    accepted_by_source: dict[str, list[int]] = field(init=False)

    def __post_init__(self) -> None:
        depth = max(self.max_width - 1, 0)
        self.per_position = [0] * depth
        self.lengths = [0] * (self.max_width + 1)
        self.offered_by_source = {s: [0] * depth for s in SOURCES}
        self.accepted_by_source = {s: [0] * depth for s in SOURCES}

    def count(self, length: int, accepted: int, copied: int = 0) -> None:
        """Count one lane of `length` offers: `copied` of its drafts (the first ones)
        were copied candidates, the rest learned."""
        if length < 2:
            return  # width-one lanes draw no proposals
        self.draft += length - 1
        self.accepted += accepted
        self.copied_draft += copied
        self.copied_accepted += min(accepted, copied)
        for k in range(accepted):
            self.per_position[k] += 1
        for k in range(length - 1):
            source = SOURCES[k < copied]
            self.offered_by_source[source][k] += 1
            self.accepted_by_source[source][k] += k < accepted
        self.lengths[accepted + 1] += 1


class SpeculativeLanes:
    """Lane lengths, copied candidates, the width policy's choice and lane records.

    Args:
        geometry: execution geometry (speculative_widths, copied_proposals, ...).
        history_drafting: lanes carry copied candidates from the request's own sequence
            (speculation.HistoryIndex); needs geometry.copied_proposals.
        history_index: makes each request's copied-token proposer.
        width_policy: True: choose each step's program with a new speculation.WidthPolicy;
            a WidthPolicy instance: continue from its observations; False (or no served
            widths): every lane is `lane_ceiling` long in the narrowest program holding it.

    Raises:
        ValueError: history drafting on a geometry without copied-token inputs.
    """

    def __init__(self, geometry: ModelGeometry, *, history_drafting: bool = False,
                 history_index: Callable[[], HistoryIndex] = HistoryIndex,
                 width_policy: bool | WidthPolicy = False) -> None:
        g = geometry
        self.geometry = g
        self.widths = g.lane_widths  # lane lengths: the served widths' lane limits
        self.max_width = max(self.widths) if self.widths else 0
        if history_drafting and not g.copied_proposals:
            raise ValueError("history drafting needs speculative programs with copied-token "
                             "inputs")
        self.history_drafting = history_drafting
        self.history_index = history_index
        self.policy: WidthPolicy | None
        if isinstance(width_policy, WidthPolicy) or not width_policy or not self.widths:
            self.policy = width_policy if width_policy and self.widths else None  # type: ignore[assignment]
        else:
            self.policy = WidthPolicy(self.widths, g.decode_capacities,
                                      g.prefix_programs)
        self.counts = LaneCounts(self.max_width)
        self._choice: Choice | None = None  # the policy's choice for the plan being built
        # request id -> its lane's copied candidates, proposed for the plan being built
        self._proposed: dict[int, CopiedCandidates | None] = {}

    # -- planning ---------------------------------------------------------------------

    def split(self, ready: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
        """Split the decode-ready requests of the step being built into DECODE rows and
        SPECULATIVE lanes, committing the width policy's choice for the lanes.

        The policy decides for the whole cohort, in-flight requests included (their
        ceilings and copied counts estimated from the tokens known: `_copied_counts`); it
        picks plain DECODE: every ready request gets a DECODE row; it picks speculation:
        a request with an in-flight row never gets a lane (a lane needs its completed
        record), so if any lane's request has one, no lane is planned and the choice is
        not committed (it is decided again at the completion).

        Returns:
            (plain, lanes), each in the order of `ready`.
        """
        self._choice = None
        self._proposed = {}
        if not self.widths or not ready:
            return ready, []
        lanes = [s for s in ready if speculates(s.request)]
        plain = [s for s in ready if not speculates(s.request)]
        if lanes and self.policy is not None:
            if self.policy.decode_certain(len(lanes)):  # no lane could win: skip the
                choice = Choice(0, 0, "certain")  # proposals and the choice (host time)
            else:
                ceilings = [(s.request_id, self.lane_ceiling(s)) for s in lanes]
                copied = (self._copied_counts(lanes, ceilings) if self.history_drafting
                          else None)
                choice = self.policy.decide(ceilings, copied)
            if choice.width == 0:  # plain decode is the best program for them now
                plain, lanes = ready, []
            elif any(s.inflight_samples for s in lanes):
                lanes, choice = [], None  # they wait for their completion (not committed)
            if choice is not None:
                self._choice = self.policy.commit(choice)
        return plain, lanes

    def _copied_counts(self, lanes: list[Sequence],
                       ceilings: list[tuple[int, int]]) -> dict[int, int]:
        """request id -> copied candidates its lane would carry now (the width policy
        weighs them before the step). A request with no row in flight proposes for its
        lane (`_candidates`, kept for `candidates`: one proposal per lane per step); one
        whose decode row is in flight (planned ahead: its pending token is not known yet)
        proposes from the tokens known, the proposal's first id standing for the pending
        token, so its count is one less."""
        copied = {}
        for seq, (rid, n) in zip(lanes, ceilings, strict=True):
            if seq.inflight_samples:
                copied[rid] = max(len(self._propose(seq, n)) - 1, 0) if n > 1 else 0
            else:
                candidates = self._proposed[rid] = self._candidates(seq, n)
                copied[rid] = len(candidates.ids) if candidates else 0
        return copied

    def length(self, seq: Sequence) -> int:
        """Positions `seq`'s lane in the step being built verifies: its `lane_ceiling`,
        at most the committed choice's width."""
        n = self.lane_ceiling(seq)
        return min(n, self._choice.width) if self._choice is not None else n

    def candidates(self, seq: Sequence, n: int) -> CopiedCandidates | None:
        """The copied candidates of `seq`'s lane of `n` positions in the step being built
        (the proposal `split` made for its ceiling, cut to n - 1, or a new one)."""
        if seq.request_id not in self._proposed:
            return self._candidates(seq, n)
        candidates = self._proposed[seq.request_id]
        if candidates is not None and len(candidates.ids) >= n:
            candidates = (dataclasses.replace(candidates, ids=candidates.ids[:n - 1])
                          if n > 1 else None)
        return candidates

    def packed_rows(self, lanes: int) -> int:
        """StepPlan.packed_rows of a step of `lanes` lanes: the committed choice's prefix
        program, or 0 when there is none or it cannot hold them."""
        packed = self._choice.packed_rows if self._choice is not None else 0
        if packed and lanes > packed // 2:  # the prefix program holds `lanes` lanes
            packed = 0
        return packed

    def _candidates(self, seq: Sequence, n: int) -> CopiedCandidates | None:
        """History drafting: up to n - 1 tokens copied from the request's own sequence
        for the lane starting at its pending token (speculation.HistoryIndex); for a
        constrained request, only those its grammar accepts (`_constrained_candidates`)."""
        if not self.history_drafting or n < 2:
            return None
        if seq.request.width_one:
            ids = self._constrained_candidates(seq)[:n - 1]
        else:
            ids = self._propose(seq, n - 1)
        if not ids:
            return None
        return CopiedCandidates(ids, seq.generation, seq.num_scheduled + 1)

    def _propose(self, seq: Sequence, count: int) -> tuple[int, ...]:
        if seq.history is None:
            seq.history = self.history_index()
        return seq.history.propose(seq.tokens, count)  # tokens end with the pending one

    def _constrained_candidates(self, seq: Sequence) -> tuple[int, ...]:
        """The copied candidates a constrained request's lane verifies: the longest
        prefix of the history proposal that its grammar accepts (the worker then sends
        the grammar mask of every position after one). Proposed once per endpoint."""
        key = (seq.generation, len(seq.tokens))
        if seq.constrained_candidates is None or seq.constrained_candidates[0] != key:
            ids = self._propose(seq, self.max_width - 1)
            check = seq.request.candidate_filter
            keep = check(ids) if ids and check is not None else 0
            seq.constrained_candidates = (key, ids[:keep])
        return seq.constrained_candidates[1]

    def lane_ceiling(self, seq: Sequence) -> int:
        """Positions a request's next speculative lane may verify (pending included).

        1 while the next token is masked by a mask that covers only the lane's first
        position (min_tokens; a grammar without per-position candidate masks); a
        constrained request whose grammar masks its copied candidates position by
        position (history drafting on a core with ModelGeometry.candidate_masks) verifies
        those candidates and no learned draft: 1 + the candidates its grammar accepts;
        else min(longest served lane limit (ModelGeometry.lane_widths: min(D + 1, W)
        unless the core declares less), output budget left; a token still in flight
        counts as emitted: the policy weighs requests planned ahead). The request alone
        decides it, never other requests or free pages: cores exported before coupled
        verification sample seeded text that depends on the lane lengths (which
        position's token is a bonus draw and which an acceptance test); with coupled
        verification the text is the decode text whatever the lengths.
        """
        request = seq.request
        sampling = request.sampling
        outputs = seq.num_output_tokens + seq.inflight_samples  # an in-flight token counts
        budget = request.max_output_tokens - outputs
        if sampling.min_tokens_banned and outputs < sampling.min_tokens:
            return 1
        if request.width_one:
            if not (self.history_drafting and self.geometry.candidate_masks
                    and request.candidate_filter is not None):
                return 1
            return min(1 + len(self._constrained_candidates(seq)), self.max_width, budget)
        return min(self.max_width, budget)

    # -- completion -------------------------------------------------------------------

    def check(self, plan: StepPlan, record, confidence: np.ndarray | None,
              in_flight: Callable[[RowPlan], bool],
              slot_generation: Callable[[int], int]) -> list[list[int]]:
        """Validate a speculative completion record (and a prefix-limit step's proposal
        confidence) against the plan before any state changes (the specification:
        generations, submission order, offers against the reserved lane ceilings and the
        aggregate, accepted counts, endpoints, ids).

        Args:
            plan: the SPECULATIVE plan (the oldest outstanding: the caller checked).
            record: i32 [lanes, RECORD_FIELDS + width] lane records, lane order.
            confidence: f32 [lanes, >= drafts] or None.
            in_flight: whether a row's request is live, holds the row's slot and has a
                row in flight.
            slot_generation: the current generation of a physical request row.

        Returns:
            The record as Python ints, one list per lane (one conversion: reading NumPy
            scalars field by field costs milliseconds at 64 lanes).

        Raises:
            CompletionError: the first disagreement found.
        """
        shape = getattr(record, "shape", ())
        if len(shape) != 2 or shape[0] != len(plan.rows) or shape[1] <= RECORD_FIELDS:
            raise CompletionError(f"lane records of shape {shape} for {len(plan.rows)} lanes")
        width = shape[1] - RECORD_FIELDS
        lanes = np.asarray(record).astype(np.int64, copy=False).tolist()
        vocab = self.geometry.vocab_size
        lag = self.geometry.draft_cursor_lag
        offered = 0
        for i, (row, lane) in enumerate(zip(plan.rows, lanes, strict=True)):
            if not in_flight(row):
                raise CompletionError(f"lane {i}: request {row.request_id} not in flight")
            generation, offers, accepted, emitted, cursor, reserved = (
                int(v) for v in lane[:RECORD_FIELDS])
            if slot_generation(row.slot) != row.generation or generation != row.generation:
                raise CompletionError(f"lane {i}: generation {generation} of slot {row.slot}, "
                                      f"expected {row.generation}")
            if plan.packed_rows and not 1 <= offers <= row.lane_length:
                raise CompletionError(f"lane {i}: {offers} offers, outside 1..its ceiling "
                                      f"{row.lane_length}")
            if not plan.packed_rows and offers != row.lane_length:
                raise CompletionError(f"lane {i}: {offers} offers, the lane reserved "
                                      f"{row.lane_length} positions")
            offered += offers
            if not 0 <= accepted < offers or emitted != accepted + 1 or emitted > width:
                raise CompletionError(f"lane {i}: {accepted} accepted and {emitted} emitted "
                                      f"of {offers} offers")
            expected = -1 if lag is None else max(row.start_position + emitted - lag, 0)
            if cursor != expected:
                raise CompletionError(f"lane {i}: draft cursor {cursor}, expected {expected}")
            if reserved != -1:
                raise CompletionError(f"lane {i}: reserved field {reserved}, expected -1")
            ids = [int(t) for t in lane[RECORD_FIELDS:]]
            bad = [t for t in ids[:emitted] if not 0 <= t < vocab]
            if bad or any(t != -1 for t in ids[emitted:]):
                raise CompletionError(f"lane {i}: emitted ids {ids[:emitted]} outside "
                                      f"[0, {vocab}) or padding {ids[emitted:]} not -1")
        capacity = plan.packed_rows or plan.token_count
        if offered > capacity:
            raise CompletionError(f"{offered} offers exceed the {capacity} packed "
                                  "positions of the step")
        if confidence is not None:
            self._check_confidence(plan, confidence)
        return lanes

    def _drafted(self, row: RowPlan) -> int:
        """Drafts a prefix-limit lane made (it drafts up to its ceiling): the columns of
        its proposal confidence the program wrote."""
        return max(min(row.lane_length, self.max_width) - 1, 0)

    def _check_confidence(self, plan: StepPlan, confidence) -> None:
        """Validate a prefix-limit step's proposal confidence before any state changes
        (the specification, "Complete speculative generation": FP32, lane order, one
        value per draft each lane made): finite probabilities in [0, 1]."""
        shape = getattr(confidence, "shape", ())
        need = max((self._drafted(r) for r in plan.rows), default=0)
        if len(shape) != 2 or shape[0] != len(plan.rows) or shape[1] < need:
            raise CompletionError(f"proposal confidence of shape {shape} for "
                                  f"{len(plan.rows)} lanes of up to {need} drafts")
        for i, row in enumerate(plan.rows):
            values = np.asarray(confidence[i, :self._drafted(row)], np.float64)
            bad = ~(np.isfinite(values) & (values >= 0.0) & (values <= 1.0))
            if bad.any():
                raise CompletionError(f"lane {i}: proposal confidence {values.tolist()} "
                                      "outside [0, 1]")

    def observe(self, i: int, row: RowPlan, lane: list[int],
                confidence: np.ndarray | None) -> int:
        """Count lane `i` of a checked record and feed the width policy its acceptance
        (and proposal confidence).

        Returns:
            The tokens the lane emitted (accepted + 1).
        """
        offers, accepted = lane[FIELD_OFFERS], lane[FIELD_ACCEPTED]
        copied = min(len(row.candidates.ids), offers - 1) if row.candidates else 0
        self.counts.count(offers, accepted, copied)
        if self.policy is not None:
            self.policy.observe_lane(row.request_id, offers - 1, accepted, copied)
            if confidence is not None:
                self.policy.observe_confidence(
                    row.request_id, confidence[i, :self._drafted(row)], offers, accepted)
        return lane[FIELD_EMITTED]

    def stats(self) -> dict:
        """The SchedulerStats spec_* fields: lane counts and the policy's decisions."""
        c = self.counts
        return dict(
            spec_draft_tokens=c.draft,
            spec_accepted_tokens=c.accepted,
            spec_accepted_per_position=tuple(c.per_position),
            spec_accepted_lengths=tuple(c.lengths),
            spec_offered_by_source={s: tuple(v) for s, v in c.offered_by_source.items()},
            spec_accepted_by_source={s: tuple(v) for s, v in c.accepted_by_source.items()},
            spec_copied_draft_tokens=c.copied_draft,
            spec_copied_accepted_tokens=c.copied_accepted,
            spec_policy_decisions=dict(self.policy.decisions) if self.policy else {},
        )

    def forget(self, request_id: int) -> None:
        """A request left: the policy drops what it kept for it."""
        if self.policy is not None:
            self.policy.forget(request_id)
