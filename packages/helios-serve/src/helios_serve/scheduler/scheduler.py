"""Continuous batching over prepared capacities, with paged KV and prefix reuse.

The worker drives one loop:

    plan = scheduler.schedule()          # StepPlan or None
    sampled = runtime.execute(plan)      # one id per plan row, submission order
    for r in scheduler.complete(plan, sampled):
        stop = check_stop(rule, r.token_id, r.output_tokens)   # scheduler/finish.py
        scheduler.finish(r.request_id, stop.reason, ...)        # when it ends

and must call `finish` for every decided request before the next `schedule()`.

Policy (exact, deterministic):
- Admission is strict FIFO into the lowest free slot once pages for the next
  chunk exist; cached complete prefix pages are shared first (hash chain,
  reference counts) and reported as reused_prompt_tokens.
- PREFILL packs unfinished prompts (admission order) then new admissions, up
  to the largest prefill token capacity and the prefill row capacity; the
  runtime pads to the smallest captured capacity that fits (`smallest_capacity`).
  A long prompt takes several chunks; only the final chunk samples.
- DECODE takes one row per request with a pending token, at most the largest
  decode capacity (least recently served first when over it), rows in
  admission order; the runtime pads to the smallest capacity >= rows.
- After a PREFILL, a DECODE goes first whenever a request has a pending token.
- MIXED (geometry.mixed_capacities, not on a speculative core): when decode lanes and
  prefill work meet, one step holds both, decode lanes first and prefill chunks filling
  the rest of a token budget chosen per step among the captured mixed token capacities
  (`capacity.mixed_budget`: the largest when as many requests owe prompt tokens as the
  step has lanes, else the smallest with room whose prompt share clears the owed prompt
  tokens within DRAIN_STEPS steps; `_build_mixed`; docs/mixed.md).
- Page shortage: a request without pages waits while others progress or
  frames are in flight; with no progress possible, the newest running request
  is preempted (recompute) and readmitted later from the front of the queue.

Index spaces: a row's position in `StepPlan.rows` is its submission row;
`RowPlan.slot` a physical request row; positions count tokens of the
request's own sequence (prompt, then output).

Speculative generation (geometry.speculative_widths non-empty; scheduler/lanes.py): a
request that can speculate gets SPECULATIVE lanes, with pages reserved for the lane's full
ceiling (a lane whose pages are not available waits, never shortened); the others get
DECODE rows of the same core; a DECODE step and a SPECULATIVE step alternate when both
kinds are ready (least recently served group first). A speculative plan needs its
completion before the same requests are planned again; each lane then yields one
RowResult per emitted token and its consumed endpoint rewinds to start + emitted.

Two execution frames (the specification: completion feedback): `schedule()` may
be called again before `complete()` of the previous plan only while
`can_schedule_ahead()` is True: fewer than `frames` plans are outstanding, no live
request needs feedback (grammar, host stops), and the newest outstanding plan either
samples nothing (non-final prefill chunks) or is a DECODE whose pending tokens are
device-owned. In the latter case a request whose only in-flight row is that decode
row is planned again at once: its row feeds the token the device has not yet
reported (`PENDING_PLACEHOLDER` in the plan; the graph reads it from the device's
pending-token state). A prefill-to-decode change of phase always waits for the
completion. If the in-flight token ends the request (EOS, a stop), the worker
finishes it and the ahead row's result is discarded; slot and pages are released
when that frame completes. Plans complete in issue order.

On a speculative core rows go ahead only as DECODE rows, and only under the width policy
(`_build_decode` states the rule); fixed-width speculation plans nothing ahead.

Exact-endpoint snapshots and the host tier (scheduler/cache.py, scheduler/publication.py):
every copy that reuse, publication or eviction needs is issued as TRANSFER plans ahead of
the plan that depends on it (`schedule` returns them first, then the generation plan built
with them). With nothing else to run (no live request, no step in flight), `schedule`
writes published pages and captured snapshots back to free host rows
(CacheManager.queue_write_backs), so that their later eviction costs no copy. A failed
TRANSFER publishes nothing and fails the requests whose pages it was filling.

Collaborators, each owning its state (the scheduler owns admission and planning, and
reads the rest):

    lifecycle.Lifecycle        the live requests (waiting, running), completion records
                               and the requests' ends
    frames.Frames              plans built and issued, and when another may be issued
    allocation.SequencePages   slots and pages; sets and resets a Sequence's cache fields
    publication.Publisher      pages and snapshots published from committed state
    lanes.SpeculativeLanes     lane lengths, copied candidates, the width policy's choice,
                               lane-record validation and counts
    step_clock.StepClock       the step costs the width policy weighs
    transfers.TransferQueue    copies batched into TRANSFER plans, and their fences
    cache.CacheManager         the tiers: device pages, continuation rows, host rows
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from helios_serve.engine.plan import (
    PENDING_PLACEHOLDER,
    CopiedCandidates,
    ModelGeometry,
    RowColumns,
    RowPlan,
    StepKind,
    StepPlan,
)
from helios_serve.scheduler.allocation import SequencePages
from helios_serve.scheduler.cache import CacheManager
from helios_serve.scheduler.capacity import (
    ceil_div,
    check_capacity,
    host_tier_pays,
    mixed_budget,
    widest_mixed,
)
from helios_serve.scheduler.frames import Frames
from helios_serve.scheduler.lanes import SpeculativeLanes, speculates
from helios_serve.scheduler.lifecycle import Lifecycle
from helios_serve.scheduler.publication import Publisher
from helios_serve.scheduler.request import (
    AdmissionError,
    AdmissionReason,
    FinishedRequest,
    FinishReason,
    RowResult,
    SchedRequest,
    SchedulerStats,
    TransferCost,
)
from helios_serve.scheduler.sequence import (
    BUDGET,
    FEEDBACK,
    HISTOGRAM,
    KNOWN,
    LAST_DECODE,
    LAST_STEP,
    LAST_TOKEN,
    PREFILL,
    RETIRING,
    ROWS,
    SAMPLES,
    SCHEDULED,
    Sequence,
)
from helios_serve.scheduler.step_clock import StepClock
from helios_serve.scheduler.transfers import TransferQueue
from helios_serve.speculation import HistoryIndex, WidthPolicy

MAX_FRAMES = 2
# Plain decode plans of at least this many rows carry RowColumns (`_columns`): below it the
# arrays cost more to build than the passes over the rows they replace (bench/packing.py).
COLUMN_ROWS = 16
_NO_MIX = object()  # Scheduler._build_mixed: mixing does not apply to this step
_PLACEHOLDER = (PENDING_PLACEHOLDER,)  # a decode row's tokens while its token is on the device
# Copies of one idle-time write-back step: bounds what a request arriving meanwhile waits
# behind (64 SmolLM2 f32 pages = 47 MB: ~2 ms over the H200's host link).
WRITE_BACK_ROWS = 64


@dataclass
class _Counts:
    """The SchedulerStats counters the scheduler keeps itself (its collaborators keep
    theirs)."""

    admitted: int = 0
    readmitted: int = 0
    preemptions: int = 0
    preemption_swaps: int = 0
    rejected: dict[AdmissionReason, int] = field(
        default_factory=lambda: dict.fromkeys(AdmissionReason, 0))


class Scheduler:
    """Plans steps for one model worker.

    Args:
        geometry: execution geometry (NativeModel.manifests).
        frames: execution frames the runtime offers (1..MAX_FRAMES).
        device_pending: decode graphs read the pending token on the device, so a
            decode may be planned before the previous one's token is known.
        history_drafting: lanes carry copied candidates from the request's own sequence
            (speculation.HistoryIndex); needs geometry.copied_proposals.
        history_index: makes each request's copied-token proposer (benchmarks compare
            proposers: `HistoryIndex(cursor=False, candidates=1, resume=0)` is the
            latest-occurrence lookup of before the copy cursor).
        width_policy: each speculative step's program is chosen by speculation.
            WidthPolicy from measured step costs and acceptance (else every lane is
            `lane_ceiling` long in the narrowest program holding it); a WidthPolicy
            instance continues from its observations.
        clock: seconds, for the step costs the width policy measures.
        transfer_cost: what copies and prefill cost on the backend (the swap-or-recompute
            rule: `host_tier_pays`, `_preempt_newest`).
        write_back: with a host tier, copy published pages and captured snapshots to free
            host rows while idle (CacheManager.queue_write_backs); False: only at eviction.
        column_rows: plain DECODE plans of at least this many rows carry RowColumns
            (`_build_plain`); None: COLUMN_ROWS. A count above every decode capacity plans
            every row as a RowPlan (the per-row path tests compare the columns with).

    Raises:
        ValueError: an empty geometry, frames outside 1..MAX_FRAMES, or history drafting
            on a geometry without copied-token inputs.
    """

    def __init__(self, geometry: ModelGeometry, *, frames: int = MAX_FRAMES,
                 device_pending: bool = False, history_drafting: bool = False,
                 history_index: Callable[[], HistoryIndex] = HistoryIndex,
                 width_policy: bool | WidthPolicy = False,
                 clock: Callable[[], float] = time.perf_counter,
                 transfer_cost: TransferCost | None = None, write_back: bool = True,
                 column_rows: int | None = None) -> None:
        g = geometry
        if not 1 <= frames <= MAX_FRAMES:
            raise ValueError(f"frames must be in 1..{MAX_FRAMES}, got {frames}")
        self._frames = Frames(frames, device_pending)
        if g.slots < 1 or g.prefill_row_capacity < 1:
            raise ValueError("geometry needs at least one slot and one prefill row")
        for name in ("decode_capacities", "prefill_token_capacities"):
            caps = getattr(g, name)
            if not caps or list(caps) != sorted(set(caps)) or caps[0] < 1:
                raise ValueError(f"{name} must be nonempty, positive and ascending: {caps}")
        self.geometry = g
        self.transfer_cost = transfer_cost or TransferCost()
        self._transfers = TransferQueue(g.transfer_rows)
        self.swap_pages = host_tier_pays(g, self.transfer_cost)
        self.cache = CacheManager(g.num_pages, g.page_tokens, snapshot_rows=g.snapshot_rows,
                                  host_rows=g.host_rows if self.swap_pages else 0,
                                  routes=g.routes, queue=self._transfers,
                                  sharing=_shares_pages(g), write_back=write_back)
        self.alloc = SequencePages(g, self.cache)
        self.publisher = Publisher(self.cache, g.page_tokens, shared=_shares_pages(g))
        self._order = 0
        self._counts = _Counts()
        self.lanes = SpeculativeLanes(g, history_drafting=history_drafting,
                                      history_index=history_index, width_policy=width_policy)
        self._clock = StepClock(clock, self.lanes.policy, self.lanes.widths)
        self.live = Lifecycle(g, self.alloc, self.publisher, self.lanes, self._frames,
                              self._clock, self._transfers)
        # MIXED steps (`_build_mixed`): not on a speculative core, whose lanes the width
        # policy plans. Each mixed token capacity with its widest variant's rows: a plan
        # within both of the budget `mixed_budget` picks fits that variant.
        self._mixes = bool(g.mixed_capacities) and not self.lanes.widths
        self._mixed_widest = widest_mixed(g.mixed_capacities)
        self._mix_blocked = False  # the last mixed attempt placed no chunk
        # The plain decode cohort (`_kept_cohort`): its requests in row order, their slot,
        # generation and logprobs columns, SamplingParams, request ids and page lists;
        # None after another step.
        self._cohort: tuple | None = None
        # The running list's slots as an array (`_ready`): (the running tuple, the slot
        # changes counted then, slots); rebuilt when either changed.
        self._running: tuple | None = None
        # `_ready`'s list of every running request and their state rows, for the
        # `_build_cohort` of the same list; None otherwise.
        self._ready_rows: tuple | None = None
        self._column_rows = COLUMN_ROWS if column_rows is None else column_rows

    # -- admission --------------------------------------------------------------

    def add(self, request: SchedRequest) -> AdmissionError | None:
        """Queue a request, or reject it if it exceeds the prepared capacities.

        Rejected requests are never queued. Temporary shortages (slots, pages)
        are not rejections: the request waits.

        Raises:
            ValueError: request_id is already live, or it scores its prompt on a geometry
                without scored programs (caller bugs: preparation rejects those).
        """
        if request.request_id in self.live.requests:
            raise ValueError(f"request {request.request_id} is already live")
        if request.score_prompt and not self.geometry.scored_token_capacities:
            raise ValueError("the core has no SCORED_PREFILL programs to score a prompt")
        error = check_capacity(self.geometry, request)
        if error is not None:
            self._counts.rejected[error.reason] += 1
            return error
        seq = Sequence(request, order=-1)
        parent = self.live.requests.get(request.fork_of) if request.fork_of is not None else None
        if parent is not None and self.cache.snapshots and parent.fork_endpoint is None \
                and parent.request.prompt_tokens == request.prompt_tokens:
            # The choice restores the parent's state after all but the last prompt token
            # (one continuation row) instead of recomputing the prompt's partial page.
            parent.fork_endpoint = len(request.prompt_tokens) - 1
        self.live.queue(seq)
        return None

    # -- planning ---------------------------------------------------------------

    def can_schedule_ahead(self) -> bool:
        """Whether `schedule()` may be called now.

        True with no plan outstanding. With fewer than `frames` outstanding and no live
        request needing feedback: True when the newest outstanding plan samples nothing
        (non-final prefill chunks), or is a DECODE and pending tokens are device-owned.
        False otherwise: complete the oldest plan first.
        """
        return self._frames.may_issue(self.live.feedback > 0)

    @property
    def frames(self) -> int:
        """Execution frames the runtime offers."""
        return self._frames.frames

    @property
    def device_pending(self) -> bool:
        """Decode graphs read the pending token on the device."""
        return self._frames.device_pending

    def schedule(self) -> StepPlan | None:
        """Plan the next step, or None when nothing can run now.

        Raises:
            RuntimeError: `can_schedule_ahead()` is False (complete first).
        """
        # Invariant: every running request owns one slot and pages covering every
        # position an issued plan writes ([0, num_scheduled)); each request has at
        # most one sampling row in flight and is planned again only once that
        # token is known; a page enters the prefix cache only after the plan that
        # completed it has completed, and never for a retiring request. A step is
        # one captured operation: PREFILL over packed chunks or DECODE over pending
        # tokens. After a PREFILL, a DECODE goes first when any request has a
        # pending token, so running requests are never starved by admissions.
        # Page shortage: wait while frames are in flight (they may release pages);
        # with nothing in flight and no plan possible, preempt the newest running
        # request and retry without admitting in this call.
        # Plans built together are issued in order: the TRANSFER plans first (the copies
        # the generation plan's admissions, evictions and earlier publications need),
        # then the generation plan; one per call.
        if not self.can_schedule_ahead():
            raise RuntimeError("complete the outstanding plan before scheduling again")
        self._clock.wake()  # after idle time (nothing to run), step costs start now
        frames = self._frames
        if (plan := frames.next_ready()) is not None:
            return self._issue(plan)
        admit = True
        while True:
            plan = self._build(admit)
            ready = self._transfers.drain()
            if plan is not None:
                ready.append(plan)
            elif not ready and self._idle() and self.cache.queue_write_backs(
                    min(self.geometry.transfer_rows, WRITE_BACK_ROWS)):
                ready = self._transfers.drain()  # idle: write back ahead of eviction
            if ready:
                frames.hold(ready[1:])
                return self._issue(ready[0])
            if frames.outstanding:
                return None
            if not self._preempt_newest():
                self._clock.rest()  # nothing in flight, nothing to run: idle time
                return None
            admit = False

    def _idle(self) -> bool:
        """No live request and no step in flight: what runs now delays nobody."""
        return not self.live.requests and not self._frames.outstanding and not self._frames.ready

    def _build(self, admit: bool) -> StepPlan | None:
        if self._mixes:
            plan = self._build_mixed(admit)
            if plan is not _NO_MIX:
                return plan
        decode_first = self._frames.last_kind is StepKind.PREFILL and any(
            s.can_decode for s in self.live.running
        )
        if decode_first:
            return self._build_decode() or self._build_prefill(admit)
        return self._build_prefill(admit) or self._build_decode()

    def _build_mixed(self, admit: bool) -> StepPlan | None | object:
        """A MIXED step when decode lanes and prefill work meet (geometry.mixed_capacities):
        the decode lanes take one token each first (least recently served first when over
        the largest mixed token capacity's widest rows less one, or that capacity less
        one); the step's token budget is then `mixed_budget` of the W requests owing
        prompt tokens that the step could advance (running requests mid-prompt, waiting
        requests up to the free slots), the prompt tokens they owe, and its L lanes: the
        largest capacity when W >= L, else the smallest that holds the lanes and a prompt
        token and clears the owed tokens within DRAIN_STEPS steps. Prefill chunks fill the
        rest (`_prefill_rows`, at most the budget's widest rows less the lanes and the
        prefill row capacity). Running streams so get a token every step while a long
        prompt is prefilled across steps.

        A mixed step feeds its lanes' completed pending tokens and changes phases, so it
        waits for completion feedback: with a plan outstanding and prefill work meeting
        requests that decode, nothing is planned (None) until it completes. A mixed
        attempt that places no chunk (pages, a scoring or image chunk the mixed program
        does not run) issues its lanes as a DECODE step and lets the next step plan as
        without mixed programs (`_build`), so no prefill waits for ever.

        Returns:
            The plan, None (wait for the outstanding plan), or _NO_MIX: mixing does not
            apply now (no prefill work or no decoding request); plan as without it.
        """
        if self._mix_blocked:
            self._mix_blocked = False
            return _NO_MIX
        live = self.live
        prefilling = [s for s in self._prefilling() if s.can_prefill]
        admissible = min(len(live.waiting), self.alloc.free_slots) if admit else 0
        owing = len(prefilling) + admissible
        if not owing:
            return _NO_MIX
        if self._frames.outstanding:
            # Requests past their prompts would be lanes of the mixed step once it completes.
            decoding = any(not s.retiring and s.num_scheduled >= s.prefill_tokens
                           for s in live.running)
            return None if decoding else _NO_MIX
        ready = self._ready(False)
        if not ready:
            return _NO_MIX
        g = self.geometry
        largest, widest = self._mixed_widest[-1]
        cap = min(widest - 1, largest - 1, g.decode_capacities[-1])
        if len(ready) > cap:
            keep = {id(s) for s in sorted(ready, key=lambda s: (s.last_step, s.order))[:cap]}
            ready = [s for s in ready if id(s) in keep]
        plan = self._build_plain(ready)
        lanes = plan.rows if plan is not None else ()
        if not lanes:
            return _NO_MIX
        # The prompt tokens the W requests owe, only for a step that mixes.
        owed = (sum(s.prefill_tokens - s.num_scheduled for s in prefilling)
                + sum(len(s.tokens) for s in islice(live.waiting, admissible)))
        budget, rows = mixed_budget(self._mixed_widest, owing, len(lanes), owed)
        chunks = self._prefill_rows(admit, budget - len(lanes),
                                    min(rows - len(lanes), g.prefill_row_capacity),
                                    mixed=True)
        if not chunks:
            self._mix_blocked = True
            return plan
        return StepPlan(StepKind.MIXED, lanes + tuple(chunks), lanes=len(lanes),
                        token_budget=budget)

    def _build_prefill(self, admit: bool) -> StepPlan | None:
        """Pack chunks up to the largest prefill token capacity and row capacity:
        unfinished prompts first (admission order), then waiting requests FIFO.

        A row scoring its prompt (Sequence.scoring) makes the step a scored one: its
        packed tokens must then fit the largest SCORED_PREFILL capacity, so the first
        scoring row cuts the budget to what that capacity has left (and waits for the
        next step when the rows before it already exceed it). No SCORED_PREFILL program
        encodes images: a scored step's image rows stop before their next image, and a
        scoring row waits when the step already encodes one."""
        g = self.geometry
        rows = self._prefill_rows(admit, g.prefill_token_capacities[-1], g.prefill_row_capacity)
        return StepPlan(StepKind.PREFILL, tuple(rows)) if rows else None

    def _prefill_rows(self, admit: bool, budget: int, max_rows: int,
                      mixed: bool = False) -> list[RowPlan]:
        """The prefill chunks of one step (`_build_prefill`'s rule): at most `budget`
        packed tokens in at most `max_rows` rows. `mixed`: the chunks of a MIXED step,
        whose program neither scores nor encodes images: a scoring request is skipped
        (the head of the queue waits) and chunks stop before their next image span
        (Scheduler._build_mixed gives them a PREFILL step when nothing else moves)."""
        g = self.geometry
        rows: list[RowPlan] = []
        scored = False

        def room(seq: Sequence) -> int:
            nonlocal budget, scored
            if seq.scoring and mixed:
                return 0
            if seq.scoring and windows < g.image_windows:
                return 0  # no SCORED_PREFILL program encodes images: the next step
            if seq.scoring and not scored:
                used = g.prefill_token_capacities[-1] - budget
                budget = max(0, min(budget, g.scored_token_capacities[-1] - used))
                scored = budget > 0
            return budget

        # Sequence.in_prefill as one filter first: in steady decode no running request is.
        windows = 0 if mixed else g.image_windows  # image windows the step may still encode
        for seq in self._prefilling():
            if budget == 0 or len(rows) == max_rows:
                break
            if seq.can_prefill and room(seq):
                n, used = self._image_cut(seq, budget, 0 if scored else windows)
                n = self.alloc.grow(seq, n) if n else 0
                # pages may shorten it
                n, used = self._image_cut(seq, n, 0 if scored else windows)
                if n:
                    rows.append(self._prefill_row(seq, n))
                    budget -= n
                    windows -= used
        while admit and self.live.waiting and self.alloc.free_slots:
            if budget == 0 or len(rows) == max_rows:
                break
            seq = self.live.waiting[0]
            if self._awaits_fork_parent(seq):
                break  # strict FIFO: the choice waits for its prompt's pages
            if not room(seq) or not self._admit(seq, budget):
                break  # strict FIFO: later requests don't overtake the head
            self.live.waiting.popleft()
            n = min(seq.prefill_tokens - seq.num_scheduled, budget)
            n = min(n, self.alloc.token_pages(seq) * g.page_tokens - seq.num_scheduled)
            n, used = self._image_cut(seq, n, 0 if scored else windows)
            if n:  # else its next span waits for a step with room (it is running now)
                rows.append(self._prefill_row(seq, n))
                budget -= n
                windows -= used
        return rows

    @staticmethod
    def _image_cut(seq: Sequence, n: int, windows: int) -> tuple[int, int]:
        """The next chunk of `seq`, at most `n` tokens, shortened so it ends outside every
        image span and its images fit `windows` (Sequence.image_cut): (tokens, windows)."""
        if not seq.request.images or n <= 0:
            return max(n, 0), 0
        return seq.image_cut(seq.num_scheduled, min(n, seq.prefill_tokens - seq.num_scheduled),
                             windows)

    def _awaits_fork_parent(self, seq: Sequence) -> bool:
        """A choice of n > 1 waits while the choice it forks from still computes the
        prompt (then the prompt's complete pages are published and shared), and while
        the snapshot of all but the prompt's last token is being captured (then it
        restores that instead of recomputing the partial page: one prefilled token)."""
        parent_id = seq.request.fork_of
        parent = self.live.requests.get(parent_id) if parent_id is not None else None
        if parent is None:
            return False
        if parent.fork_snapshot is not None and self.cache.capturing(parent.fork_snapshot):
            return True  # its fence is one TRANSFER step away (a failure frees it)
        return not parent.retiring and parent.num_computed < parent.num_prompt_tokens

    def _admit(self, seq: Sequence, budget: int) -> bool:
        """Give the waiting head a slot and pages for its first chunk (SequencePages.
        allocate: the longest cached prefix is reused); False (no change) if the pages for
        the reused part and one computed token are not there."""
        readmission = seq.order >= 0
        if not self.alloc.allocate(seq, budget, lambda: self.live.transfer_failed(seq)):
            return False
        self._order += 1
        seq.order = self._order
        if readmission:
            self._counts.readmitted += 1
        else:
            self._counts.admitted += 1
        self.live.running.append(seq)
        return True

    def _prefill_row(self, seq: Sequence, n: int) -> RowPlan:
        assert seq.slot is not None and n > 0
        start = seq.num_scheduled
        end = start + n
        histogram = tuple(seq.tokens) if seq.needs_histogram else None
        targets = None
        if seq.scoring:  # position p scores prompt token p + 1, each position once
            last, done = seq.num_prompt_tokens - 1, seq.scored_upto
            targets = tuple(seq.tokens[p + 1] if done <= p < last else -1
                            for p in range(start, end))
            seq.scored_upto = max(done, min(end, last))
        return self._row(
            seq, seq.tokens[start:end], sample=end == seq.prefill_tokens, histogram=histogram,
            score_targets=targets,
            images=seq.chunk_images(start, end) if seq.request.images else (),
        )

    def _build_decode(self) -> StepPlan | None:
        """One row per request with a pending token, at most the largest decode
        capacity (least recently served first when over it), pages permitting; with
        speculation, SPECULATIVE lanes and DECODE rows (requests that cannot speculate)
        in separate steps, the group of the least recently served request first."""
        # Ahead rule. While the newest outstanding plan is a DECODE whose pending tokens
        # are device-owned (`can_schedule_ahead`), a request whose only in-flight row is
        # that decode row may get a DECODE row now (fed from the device). On a speculative
        # core that needs the width policy, and only where the step is plain decode anyway:
        # - the policy decides for the whole cohort, in-flight requests included (their
        #   ceilings and copied counts estimated from the tokens known: SpeculativeLanes.split);
        # - it picks plain DECODE: every ready request gets a DECODE row, ahead or not;
        # - it picks speculation: a request with an in-flight row never gets a SPECULATIVE
        #   lane (a lane needs its completed record: the consumed endpoint, the tokens its
        #   copied candidates follow), so if any lane's request has one, no lane is
        #   planned: they wait for the completion and the choice is not committed (it is
        #   decided again then); requests that cannot speculate still get DECODE rows.
        # Fixed-width speculation (no policy) plans no row ahead: every speculating
        # request's next row is a lane.
        lanes_of = self.lanes
        ahead = bool(self._frames.outstanding) and self.device_pending and (
            not lanes_of.widths or lanes_of.policy is not None)
        ready = self._ready(ahead)
        cap = self.geometry.decode_capacities[-1]
        if len(ready) > cap:
            keep = {id(s) for s in sorted(ready, key=lambda s: (s.last_step, s.order))[:cap]}
            ready = [s for s in ready if id(s) in keep]
        plain, lanes = lanes_of.split(ready)  # the width policy decides (SpeculativeLanes)
        if not lanes:
            return self._build_plain(plain)
        if speculates(min(ready, key=lambda s: (s.last_step, s.order)).request):
            return self._build_speculative(lanes) or self._build_plain(plain)
        return self._build_plain(plain) or self._build_speculative(lanes)

    def _ready(self, ahead: bool) -> list[Sequence]:
        """The running requests that may decode now (Sequence.decode_ready(ahead)), in
        running order: from `column_rows` running requests on, one array test over their
        state rows (SlotState) instead of a test per request."""
        running = self.live.running
        self._ready_rows = None
        if len(running) < self._column_rows:
            return [s for s in running if s.decode_ready(ahead)]
        v = self.alloc.state.grid[self._running_slots()]
        scheduled, samples = v[:, SCHEDULED], v[:, SAMPLES]
        # Sequence.decode_ready's two cases, column by column: `unknown` tokens scheduled
        # past the known ones (-1: one pending token known), `room` tokens of budget left.
        unknown = scheduled - v[:, KNOWN]
        room = v[:, BUDGET] - v[:, KNOWN]
        ready = (unknown == -1) & (samples == 0) & (room > 0) & (scheduled >= v[:, PREFILL])
        if ahead:
            ready |= ((unknown == 0) & (samples == 1) & (room > 1) & (v[:, ROWS] == 1)
                      & (v[:, LAST_DECODE] != 0) & (v[:, FEEDBACK] == 0))
        ready &= v[:, RETIRING] == 0
        picked = np.flatnonzero(ready)
        if len(picked) == len(running):
            # Every running request: `_build_cohort` of this list reuses these rows.
            everyone = list(running)
            self._ready_rows = (everyone, v)
            return everyone
        return [running[i] for i in picked.tolist()]

    def _running_slots(self) -> np.ndarray:
        """The running requests' slots, running order (intp [running]; kept while the
        running list and every slot's holder are unchanged)."""
        key = tuple(self.live.running)
        changes = self.alloc.changes
        kept = self._running
        if kept is None or kept[1] != changes or kept[0] != key:
            kept = self._running = (key, changes, np.array([s.slot for s in key], np.intp))
        return kept[2]

    def _prefilling(self) -> list[Sequence]:
        """The running requests with prompt (or recompute) tokens left to schedule
        (Sequence.in_prefill), running order. From `column_rows` running requests on, one
        array test over every slot's state row first (a free slot's row is zero; every
        slot holder is running): in steady decode none is."""
        running = self.live.running
        if len(running) >= self._column_rows:
            grid = self.alloc.state.grid
            if not (grid[:, SCHEDULED] < grid[:, PREFILL]).any():
                return []
        return [s for s in running if s._t[s._b + SCHEDULED] < s._t[s._b + PREFILL]]

    def _build_plain(self, ready: list[Sequence]) -> StepPlan | None:
        """A DECODE row per ready request whose next page is available.

        A plan of `column_rows` or more rows carries them as RowColumns (`_columns`); on a
        core without a sliding-window region its RowPlans stay unbuilt (StepPlan.rows
        builds them when read), so the steady decode step builds no object per row."""
        pt = self.geometry.page_tokens
        extra = self.geometry.extra_pages_per_request
        step = self._frames.step
        alloc = self.alloc
        windowed = alloc.window is not None
        # Rows left unbuilt: decided by the ready count (a plan that pages cut below
        # column_rows gets its rows from the lists after all).
        unbuilt = len(ready) >= self._column_rows and not windowed
        if unbuilt:
            return self._build_cohort(ready)
        rows: list[RowPlan] = []
        append = rows.append
        built: list[Sequence] = []  # the requests that got a row, row order
        positions: list[int] = []  # each row's pending-token position
        # Every decode row of a small step runs this body: Sequence.page_prefix,
        # SequencePages.window_prefix and Sequence.issue are spelled out (a call per row
        # each costs more than their reads; bench/packing.py).
        for seq in ready:
            t, b = seq._t, seq._b  # the state row (Sequence's properties, read directly)
            pos = t[b + SCHEDULED]  # the pending token's position
            page_ids = seq.page_ids
            # The pending token opens a page: a page for it, or it waits for reclamation
            # (or preemption).
            if pos == (len(page_ids) - extra) * pt:
                if not alloc.extend(seq, pos + 1):
                    continue
                page_ids = seq.page_ids
            tokens = seq.tokens
            # The pending token, or a placeholder while it is still on the device.
            token = tokens[pos] if pos < len(tokens) else PENDING_PLACEHOLDER
            # _row of a one-token sampling row: pages cover [0, pos + 1), plus the extra
            # pages (Sequence.page_prefix: the cached prefix while the count holds).
            count = pos // pt + 1
            source, prefix = seq._page_prefix
            if source is not page_ids or len(prefix) != count + extra:
                prefix = seq.page_prefix(count + extra)
            append(RowPlan(seq.request_id, seq.slot, seq.generation, (token,), pos,
                           prefix, True, seq.request.sampling, None, None, 0, None, None,
                           (), tuple(seq.window_page_ids[:count]) if windowed else ()))
            # Sequence.issue(pos + 1, sample=True, decode=True, step)
            t[b + SCHEDULED] = pos + 1
            t[b + ROWS] += 1
            t[b + SAMPLES] += 1
            t[b + LAST_DECODE] = 1
            t[b + HISTOGRAM] = 0
            t[b + LAST_STEP] = step
            built.append(seq)
            positions.append(pos)
        if not rows:
            return None
        if len(rows) < self._column_rows:
            return StepPlan(StepKind.DECODE, tuple(rows))
        rows_ = tuple(rows)
        kept = self._kept_cohort(tuple(built))
        return StepPlan(StepKind.DECODE, rows_, columns=RowColumns(
            rows_, kept[1], kept[2], np.array(positions, np.int64), kept[3], kept[4],
            request_ids=kept[5], fed=np.array([r.tokens[0] for r in rows_], np.int64)))

    def _build_cohort(self, ready: list[Sequence]) -> StepPlan | None:
        """`_build_plain` of `column_rows` or more requests on a core without a
        sliding-window region, over the cohort's state rows (SlotState): positions, fed
        tokens and the scheduled-state advance as array operations; per row in Python
        only the rows whose pending token opens a page (1 in page_tokens steps). The
        plan's RowPlans stay unbuilt (RowColumns carry every row value)."""
        g = self.geometry
        pt, extra = g.page_tokens, g.extra_pages_per_request
        grid = self.alloc.state.grid
        kept = self._kept_cohort(tuple(ready))
        # The cohort's state rows, row order: `_ready`'s when `ready` is its list of every
        # running request (nothing changed a row since: the same step's build).
        stash, self._ready_rows = self._ready_rows, None
        v = stash[1] if stash is not None and stash[0] is ready else grid[kept[1]]
        positions = v[:, SCHEDULED].copy()  # each pending token's position
        # Pages cover [0, position): only a position on a page boundary can open one.
        dropped: list[int] = []
        for i in np.flatnonzero(positions % pt == 0).tolist():
            seq = kept[0][i]
            pos = int(positions[i])
            # The pending token opens a page: a page for it, or it waits for reclamation
            # (or preemption).
            if pos == (len(seq.page_ids) - extra) * pt and not self.alloc.extend(seq, pos + 1):
                dropped.append(i)
        if dropped:
            if len(dropped) == len(positions):
                return None
            keep = np.ones(len(positions), bool)
            keep[dropped] = False
            positions, v = positions[keep], v[keep]
            kept = self._kept_cohort(tuple(s for s, k in zip(kept[0], keep.tolist(),
                                                             strict=True) if k))
        cohort, slots = kept[0], kept[1]
        # Sequence.issue(position + 1, sample=True, decode=True, step) of every row.
        fed = np.where(positions < v[:, KNOWN], v[:, LAST_TOKEN], PENDING_PLACEHOLDER)
        v[:, SCHEDULED:SAMPLES + 1] += 1  # scheduled, rows and samples in flight
        v[:, LAST_DECODE:HISTOGRAM + 1] = (1, self._frames.step, 0)  # and no histogram
        grid[slots] = v
        if len(cohort) < self._column_rows:  # pages cut it: RowPlans after all
            return StepPlan(StepKind.DECODE, tuple(
                RowPlan(seq.request_id, seq.slot, seq.generation, (token,), pos,
                        tuple(seq.page_ids[:pos // pt + 1 + extra]), True, seq.request.sampling)
                for seq, pos, token in zip(cohort, positions.tolist(), fed.tolist(),
                                           strict=True)))
        return StepPlan(StepKind.DECODE, None, columns=RowColumns(
            None, slots, kept[2], positions, kept[3], kept[4], request_ids=kept[5], fed=fed,
            pages=kept[6], page_counts=positions // pt + (1 + extra), sequences=cohort,
            holders_at=self.alloc.changes))

    def _kept_cohort(self, cohort: tuple[Sequence, ...]) -> tuple:
        """The plain decode cohort's row values: (requests, slots intp, generations int64,
        logprobs asks int64 (-1: none), SamplingParams, request ids, page lists). Kept
        while the same requests get rows in the same order and no other plan is issued
        between (`_issue` drops them): a request's slot, generation and page list change
        only by a release and a new allocation, whose prefill (or mixed) plan is issued
        before it decodes again (its page list is only appended to meanwhile)."""
        kept = self._cohort
        if kept is None or kept[0] != cohort:  # Sequence has no __eq__: identity per item
            holders = tuple([s.request.sampling for s in cohort])
            kept = self._cohort = (
                cohort,
                np.array([s.slot for s in cohort], np.intp),
                np.array([s.generation for s in cohort], np.int64),
                np.array([-1 if h.logprobs is None else h.logprobs for h in holders],
                         np.int64),
                holders,
                [s.request_id for s in cohort],
                [s.page_ids for s in cohort])
        return kept

    def _build_speculative(self, ready: list[Sequence]) -> StepPlan | None:
        """One SPECULATIVE lane per ready request (`lane_ceiling`), pages for all of it
        reserved first; a lane whose pages are not available waits."""
        lanes = self.lanes
        rows: list[RowPlan] = []
        for seq in ready:
            start = seq.num_scheduled  # the pending token's position
            n = lanes.length(seq)
            if not self.alloc.extend(seq, start + n):
                continue  # waits for reclamation (or preemption), never shortened
            fed = seq.tokens[start : start + 1] or [PENDING_PLACEHOLDER]
            rows.append(self._row(seq, fed, sample=True, histogram=None, decode=True,
                                  lane_length=n, candidates=lanes.candidates(seq, n)))
        if not rows:
            return None
        return StepPlan(StepKind.SPECULATIVE, tuple(rows), lanes.packed_rows(len(rows)))

    def lane_ceiling(self, seq: Sequence) -> int:
        """Positions a request's next speculative lane may verify (SpeculativeLanes.
        lane_ceiling)."""
        return self.lanes.lane_ceiling(seq)

    @property
    def pages(self):
        """The device page allocator (scheduler/pages.py)."""
        return self.cache.pages

    @property
    def policy(self):
        """The width policy (speculation.WidthPolicy), or None."""
        return self.lanes.policy

    def _row(
        self,
        seq: Sequence,
        tokens: Seq[int],
        sample: bool,
        histogram: tuple[int, ...] | None,
        decode: bool = False,
        lane_length: int = 0,
        candidates: CopiedCandidates | None = None,
        score_targets: tuple[int, ...] | None = None,
        images: tuple = (),
    ) -> RowPlan:
        """Build a row and advance the request's scheduled state (a speculative lane
        schedules all `lane_length` positions it may write)."""
        assert seq.slot is not None
        start = seq.num_scheduled
        end = start + (lane_length or len(tokens))
        token_pages = ceil_div(end, self.geometry.page_tokens)
        pages = token_pages + self.geometry.extra_pages_per_request
        row = RowPlan(seq.request_id, seq.slot, seq.generation, tuple(tokens), start,
                      seq.page_prefix(pages), sample, seq.request.sampling, histogram, None,
                      lane_length, candidates, score_targets, images,
                      self.alloc.window_prefix(seq, token_pages))
        seq.issue(end, sample, decode, self._frames.step)
        return row

    def _issue(self, plan: StepPlan) -> StepPlan:
        if plan.columns is None:  # another kind of step may move slots (`_kept_cohort`)
            self._cohort = None
        self._clock.issue(plan)
        return self._frames.issue(plan)

    def _preempt_newest(self) -> bool:
        """Preempt the newest running request if one is starved, swapping its state out
        where that is cheaper than recomputing it.

        Only when some running request wants to progress (nothing is in flight,
        so its only obstacle is pages). The victim releases slot and pages and
        goes to the FRONT of the waiting queue with its output appended; it is
        readmitted as a prefill of prompt + output (histogram_tokens likewise), of
        which every token still cached is reused.

        Swap or recompute (TransferCost.swap_pays): the victim's complete pages are
        published already; released into the prefix cache, they move to the host tier
        when evicted while it waits, and come back by copy at readmission, exactly when
        one page row out and back (a TRANSFER step amortized over transfer_rows copies)
        costs less than prefilling page_tokens tokens (`swap_pages`, decided at startup:
        the same for every page); otherwise evicted pages are dropped and recomputed.
        Its partial last page (t committed tokens past the last complete page) is
        captured as a snapshot when two TRANSFER steps and one page row out and back cost
        less than prefilling t tokens.
        """
        if not any(s.can_decode or s.can_prefill for s in self.live.running):
            return False
        victims = [s for s in self.live.running if not s.retiring]
        victim = max(victims, key=lambda s: s.order)
        tail = victim.num_computed % self.geometry.page_tokens
        if tail and self.transfer_cost.swap_pays(tail, 1, 1) and \
                self.publisher.capture(victim, victim.num_computed):
            self._counts.preemption_swaps += 1
        self.live.release(victim)
        victim.preemptions += 1
        self._counts.preemptions += 1
        self.live.waiting.appendleft(victim)
        return True

    # -- completion and leaving (Lifecycle) --------------------------------------------

    def complete(self, plan: StepPlan, sampled: Seq[int],
                 confidence: np.ndarray | None = None) -> Seq[RowResult]:
        """Apply the completion record of the oldest outstanding plan (Lifecycle.complete
        states the record and its validation; a plan whose rows stayed unbuilt gets
        RowResults)."""
        return self.live.complete(plan, sampled, confidence)

    def fail(self, plan: StepPlan) -> list[FinishedRequest]:
        """Retire the oldest outstanding plan after an execution failure (Lifecycle.fail)."""
        return self.live.fail(plan)

    def finish(self, request_id: int, reason: FinishReason,
               output_tokens: int | None = None, publish: bool = False) -> FinishedRequest:
        """End a request the worker decided is done (Lifecycle.finish)."""
        return self.live.finish(request_id, reason, output_tokens, publish)

    def cancel(self, request_id: int) -> FinishedRequest | None:
        """Cancel a request; None when it is no longer live (Lifecycle.cancel)."""
        return self.live.cancel(request_id)

    # -- observation ------------------------------------------------------------------

    @property
    def outstanding_frames(self) -> int:
        """Plans issued and not yet completed (0..MAX_FRAMES)."""
        return self._frames.outstanding

    def has_work(self) -> bool:
        """Whether any request is waiting, running or in flight, a plan or copy is
        waiting to be issued, or an idle-time write-back is due."""
        frames = self._frames
        return bool(self.live.requests or frames.outstanding or frames.ready or len(self._transfers)
                    or self.cache.write_back_due())

    def is_live(self, request_id: int) -> bool:
        """Whether the request is waiting, running or draining its frames."""
        return request_id in self.live.requests

    def slot_generation(self, slot: int) -> int:
        """Current generation of a physical request row."""
        return self.alloc.generation(slot)

    def stats(self) -> SchedulerStats:
        """Snapshot of counters and gauges for the metrics layer (the collaborators add
        theirs: CacheManager.stats, SpeculativeLanes.stats)."""
        n = self._counts
        steps = self._frames.issued
        return SchedulerStats(
            running=sum(not s.retiring for s in self.live.running),
            waiting=len(self.live.waiting),
            outstanding_frames=self._frames.outstanding,
            slots_total=self.geometry.slots,
            slots_free=self.alloc.free_slots,
            prefix_hit_tokens=self.alloc.reused_tokens,
            preemptions=n.preemptions,
            admitted=n.admitted,
            readmitted=n.readmitted,
            prefill_steps=steps[StepKind.PREFILL],
            decode_steps=steps[StepKind.DECODE],
            prompt_tokens_computed=self._frames.prefill_tokens,
            rejected=dict(n.rejected),
            finished=dict(self.live.finished),
            speculative_steps=steps[StepKind.SPECULATIVE],
            transfer_steps=steps[StepKind.TRANSFER],
            preemption_swaps=n.preemption_swaps,
            window_pages_total=self.alloc.window.num_pages if self.alloc.window else 0,
            window_pages_used=self.alloc.window.used_pages if self.alloc.window else 0,
            window_pages_released=self.alloc.window.released if self.alloc.window else 0,
            mixed_steps=steps[StepKind.MIXED],
            **self.cache.stats(),
            **self.lanes.stats(),
        )


def _shares_pages(g: ModelGeometry) -> bool:
    """Whether requests share cached pages (prefix reuse, snapshots, the host tier): not
    with a shifted page-table view (a shifted history does not lie in the page of the
    tokens it belongs to), nor with a sliding-window region (its pages are private and
    released behind the window, so a cached prefix holds no window pages to reuse)."""
    return not g.extra_pages_per_request and not g.window_tokens
