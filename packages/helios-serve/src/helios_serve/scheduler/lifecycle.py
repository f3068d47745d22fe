"""The live requests' lifecycle: queued, running, retiring, retired; and the completion
records that advance them.

A request is queued by `Scheduler.add` (the waiting FIFO; a preempted one goes back to its
front), runs once admitted (the running list, admission order, oldest first), retires
when the worker finishes or cancels it, a failure ends it, or a copy into its pages fails,
and leaves when its in-flight frames drain: its slot and pages return then
(SequencePages.release), never while a plan still writes them.

Every completion record is validated against its plan before any state changes
(`CompletionError` otherwise): the oldest outstanding plan, one entry per row, the slot
generations, ids inside the vocabulary (lane records: SpeculativeLanes.check). Then each
row of a live request yields its RowResult and completed pages are published
(scheduler/publication.py); rows of retiring requests yield none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence as Seq
from operator import attrgetter

import numpy as np
from helios_tools.kernels.speculative import RECORD_FIELDS

from helios_serve.engine.plan import ModelGeometry, RowColumns, RowPlan, StepKind, StepPlan
from helios_serve.scheduler.allocation import SequencePages
from helios_serve.scheduler.frames import Frames
from helios_serve.scheduler.lanes import SpeculativeLanes
from helios_serve.scheduler.publication import Publisher
from helios_serve.scheduler.request import (
    CompletionError,
    FinishedRequest,
    FinishReason,
    RowResult,
    RowResults,
)
from helios_serve.scheduler.sequence import (
    COMPUTED,
    ENDPOINTS,
    FORK,
    KNOWN,
    LAST_TOKEN,
    MARKS,
    PROMPT,
    PUBLISHED,
    RETIRING,
    ROWS,
    SAMPLES,
    WATCH,
    Sequence,
)
from helios_serve.scheduler.step_clock import StepClock
from helios_serve.scheduler.transfers import PendingCopy, TransferQueue

_SLOT = attrgetter("slot")
_TOKENS = attrgetter("tokens")
# Completion records of at least this many rows have their ids tested as one array.
ARRAY_CHECK_ROWS = 16


class Lifecycle:
    """Every live request, the waiting FIFO and the running list, and their ends.

    Args:
        geometry: execution geometry (page_tokens, vocab_size are read).
        alloc: releases a leaving request's slot and pages.
        publisher: publishes what completions committed.
        lanes: validates and counts lane records; forgets a request that left.
        frames: the outstanding plans (completions pop them in issue order).
        clock: the step clock (each completion feeds it).
        transfers: the fence actions of TRANSFER plans.
    """

    def __init__(self, geometry: ModelGeometry, alloc: SequencePages, publisher: Publisher,
                 lanes: SpeculativeLanes, frames: Frames, clock: StepClock,
                 transfers: TransferQueue) -> None:
        self.geometry = geometry
        self.alloc = alloc
        self.publisher = publisher
        self.lanes = lanes
        self._frames = frames
        self._clock = clock
        self._transfers = transfers
        self.requests: dict[int, Sequence] = {}  # every live request
        self.waiting: deque[Sequence] = deque()  # FIFO; preempted go to the front
        self.running: list[Sequence] = []  # slot holders, admission order (oldest first)
        self.feedback = 0  # live requests that need feedback and are not retiring
        self.finished = dict.fromkeys(FinishReason, 0)  # requests retired, by reason

    def queue(self, seq: Sequence) -> None:
        """A new request waits (last in the FIFO)."""
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)
        self.feedback += seq.request.needs_feedback

    # -- completion -----------------------------------------------------------------------

    def complete(self, plan: StepPlan, sampled: Seq[int],
                 confidence: np.ndarray | None = None) -> Seq[RowResult]:
        """Apply the completion record of the oldest outstanding plan.

        Args:
            plan: the plan `schedule()` returned (equal to it: the worker may
                attach grammar masks with dataclasses.replace, which equality
                ignores).
            sampled: one token id per plan row, submission-row order; entries of
                rows with sample=False are ignored.
            confidence: a prefix-limit step's proposal confidence (StepCompletion.
                confidence: f32 [rows, draft capacity], lane order), validated with the
                lane records and fed to the width policy; None when the program
                reports none.

        Returns:
            One RowResult per row of a live request, in submission-row order;
            rows of cancelled, failed or finished requests produce none (a list, or for
            a plan whose rows stayed unbuilt RowResults: the same results as columns).

        Raises:
            CompletionError: not the oldest outstanding plan, wrong length, a
                slot generation mismatch or a sampled id outside the vocabulary;
                nothing is changed then.
        """
        if plan.kind is StepKind.SPECULATIVE:
            return self._complete_speculative(plan, sampled, confidence)
        if plan.kind is StepKind.TRANSFER:
            for copy in self._pop_transfer(plan):
                copy.done()
            return []
        columns = plan.columns
        if columns is not None and columns.sequences is not None and columns.describes(plan):
            return self._complete_columns(plan, columns, sampled)
        tokens = self._check_completion(plan, sampled)
        self._frames.pop(plan)
        self._clock.complete()
        results: list[RowResult] = []
        requests = self.requests
        pt = self.geometry.page_tokens
        publisher = self.publisher
        shared = publisher.shared  # else it publishes no page
        for row, token in zip(plan.rows, tokens, strict=True):
            seq = requests[row.request_id]
            t, b = seq._t, seq._b  # the state row (Sequence's properties, read directly)
            t[b + ROWS] -= 1
            end = row.start_position + len(row.tokens)
            if end > t[b + COMPUTED]:
                t[b + COMPUTED] = end
                if row.window_page_ids:  # pages now behind the window go back at once
                    self.alloc.trim_window(seq)
            sample = row.sample
            if sample:
                t[b + SAMPLES] -= 1
            watch = t[b + WATCH]  # retiring, or an endpoint to capture
            if watch and t[b + RETIRING]:
                if t[b + ROWS] == 0:
                    self._retire(seq)
                continue
            # The calls only where they have work: a decode row completes a page once in
            # page_tokens steps, and requests rarely mark prompt-turn ends.
            if shared and t[b + PUBLISHED] < t[b + COMPUTED] // pt:
                publisher.pages(seq)
            if watch and (t[b + ENDPOINTS] < t[b + MARKS] or t[b + FORK] > 0):
                publisher.endpoints(seq)
            if sample:
                seq.tokens.append(token)  # Sequence.append_token, spelled out
                t[b + KNOWN] += 1
                t[b + LAST_TOKEN] = token
            else:
                token = None
            # Sequence.num_output_tokens, spelled out
            results.append(RowResult(row.request_id, token, t[b + KNOWN] - t[b + PROMPT]))
        return results

    def _complete_columns(self, plan: StepPlan, columns: RowColumns,
                          sampled: Seq[int]) -> RowResults | list[RowResult]:
        """`complete` of a plain decode plan whose rows are its columns (RowColumns with
        the requests' state: Scheduler._build_plain): the same validation and the same
        state changes, read from the columns instead of RowPlans (every row feeds one
        token at its position and samples; no window pages). Returns RowResults."""
        seqs = columns.sequences
        n = len(seqs)
        self._frames.check_oldest(plan)
        if len(sampled) != n:
            raise CompletionError(f"{len(sampled)} sampled ids for {n} rows")
        vocab = self.geometry.vocab_size
        if isinstance(sampled, np.ndarray) and sampled.ndim == 1 and sampled.dtype.kind in "iu":
            tokens = sampled.tolist()
            in_vocab = int(sampled.min()) >= 0 and int(sampled.max()) < vocab
            known = sampled  # the ids as a column (the state rows' last tokens)
        else:
            tokens = [int(t) for t in sampled]
            in_vocab = all(0 <= t < vocab for t in tokens)
            known = tokens
        requests = self.requests
        generations = self.alloc.generations
        grid = self.alloc.state.grid
        slot_column = columns.slots
        slots = slot_column.tolist()
        v = grid[slot_column]  # the cohort's state rows (SlotState), row order
        # Every row at once (one pass per test, no loop body per row); the rows one by one
        # only to name the first error. The plan's requests were running in its slots
        # when it was built (Scheduler._build_cohort); a request leaves or changes slot
        # only by SequencePages.release / allocate, so with no holder change since, each
        # is still live in its slot.
        held = columns.holders_at == self.alloc.changes or (
            all(map(requests.__contains__, columns.request_ids))
            and list(map(_SLOT, seqs)) == slots)
        if not (in_vocab and held
                and int(v[:, ROWS].min()) >= 1
                and list(map(generations.__getitem__, slots)) == columns.generations.tolist()):
            for i, (seq, slot, generation) in enumerate(zip(
                    seqs, slots, columns.generations.tolist(), strict=True)):
                if seq.request_id not in requests or seq.slot != slot or seq.inflight_rows < 1:
                    raise CompletionError(f"row {i}: request {seq.request_id} not in flight")
                if generations[slot] != generation:
                    raise CompletionError(f"row {i}: stale generation of slot {slot}")
                if not 0 <= tokens[i] < vocab:
                    raise CompletionError(f"row {i}: sampled id {tokens[i]} outside "
                                          f"[0, {vocab})")
        self._frames.pop(plan)
        self._clock.complete()
        pt = self.geometry.page_tokens
        publisher = self.publisher
        # The state advance of every row as array operations: one row and one sample in
        # flight less, computed up to its position; a live row's sample is known
        # (Sequence.append_token: KNOWN and LAST_TOKEN here, the token list below).
        v[:, ROWS:SAMPLES + 1] -= 1
        np.maximum(v[:, COMPUTED], columns.positions + 1, out=v[:, COMPUTED])
        # Per row in Python only the rows with work beyond that, in row order (the cache
        # sees retirements and publications in the per-row path's order): retiring rows
        # and rows with an endpoint to capture (WATCH), rows whose computed pages are not
        # all published.
        work = v[:, WATCH] != 0
        if publisher.shared:  # else it publishes no page
            work |= v[:, PUBLISHED] < v[:, COMPUTED] // pt
        visit = np.flatnonzero(work).tolist()
        retiring = v[:, RETIRING] != 0 if visit else None
        if retiring is None or not retiring.any():
            v[:, KNOWN] += 1
            v[:, LAST_TOKEN] = known
            live = None
        else:
            live = np.flatnonzero(~retiring)
            v[live, KNOWN] += 1
            v[live, LAST_TOKEN] = [tokens[i] for i in live.tolist()]
        grid[slot_column] = v
        for i in visit:
            seq = seqs[i]
            if retiring[i]:
                if seq.inflight_rows == 0:
                    self._retire(seq)
                continue
            if publisher.shared and seq.num_published < seq.num_computed // pt:
                publisher.pages(seq)
            if seq.endpoints_done < len(seq.request.publish_endpoints) or seq.fork_endpoint:
                publisher.endpoints(seq)
        request_ids = columns.request_ids
        if live is None:
            outputs = (v[:, KNOWN] - v[:, PROMPT]).tolist()
        else:
            kept = live.tolist()
            request_ids = [request_ids[i] for i in kept]
            tokens = [tokens[i] for i in kept]
            seqs = [seqs[i] for i in kept]
            outputs = (v[live, KNOWN] - v[live, PROMPT]).tolist()
        # Each live row's token appended to its request's list (one C-level pass).
        deque(map(list.append, map(_TOKENS, seqs), tokens), 0)
        return RowResults(request_ids, tokens, outputs)

    def _check_completion(self, plan: StepPlan, sampled: Seq[int]) -> list[int]:
        """Validate a completion record against its plan before any state changes.

        Returns:
            The sampled ids as ints (submission rows).
        """
        self._frames.check_oldest(plan)
        if len(sampled) != len(plan.rows):
            raise CompletionError(f"{len(sampled)} sampled ids for {len(plan.rows)} rows")
        # One conversion for an integer record (an int() per NumPy scalar costs more); the
        # entries of rows that sample nothing are ignored, never converted.
        vocab = self.geometry.vocab_size
        if isinstance(sampled, np.ndarray) and sampled.ndim == 1 and sampled.dtype.kind in "iu":
            tokens = sampled.tolist()
            # Every id inside the vocabulary (one array test): the rows need no id test.
            # Below ARRAY_CHECK_ROWS the two reductions cost more than the row tests.
            check_ids = len(tokens) < ARRAY_CHECK_ROWS or not (
                int(sampled.min()) >= 0 and int(sampled.max()) < vocab)
        else:
            tokens = [int(t) if row.sample else t for row, t in zip(plan.rows, sampled, strict=True)]
            check_ids = True
        requests = self.requests
        generations = self.alloc.generations
        for i, (row, token) in enumerate(zip(plan.rows, tokens, strict=True)):
            seq = requests.get(row.request_id)
            if seq is None or seq.slot != row.slot or seq._t[seq._b + ROWS] < 1:
                raise CompletionError(f"row {i}: request {row.request_id} not in flight")
            if generations[row.slot] != row.generation:
                raise CompletionError(f"row {i}: stale generation of slot {row.slot}")
            if check_ids and row.sample and not 0 <= token < vocab:
                raise CompletionError(f"row {i}: sampled id {token} outside [0, {vocab})")
        return tokens

    def _complete_speculative(self, plan: StepPlan, record,
                              confidence: np.ndarray | None = None) -> list[RowResult]:
        self._frames.check_oldest(plan)
        lanes = self.lanes.check(plan, record, confidence, self._in_flight,
                                 self.alloc.generation)
        self._frames.pop(plan)
        self._clock.complete()
        results: list[RowResult] = []
        for i, (row, lane) in enumerate(zip(plan.rows, lanes, strict=True)):
            seq = self.requests[row.request_id]
            seq.inflight_rows -= 1
            seq.inflight_samples -= 1
            emitted = self.lanes.observe(i, row, lane, confidence)
            consumed = row.start_position + emitted
            seq.num_computed = seq.num_scheduled = consumed  # rejected positions rewind
            if seq.retiring:
                if seq.inflight_rows == 0:
                    self._retire(seq)
                continue
            self.publisher.pages(seq, row.start_position + 1)  # the run: next completion
            for token in lane[RECORD_FIELDS:RECORD_FIELDS + emitted]:
                seq.append_token(int(token))
                results.append(RowResult(row.request_id, int(token), seq.num_output_tokens))
        return results

    def _in_flight(self, row: RowPlan) -> bool:
        """Whether a row's request is live, holds the row's slot and has a row in flight."""
        seq = self.requests.get(row.request_id)
        return seq is not None and seq.slot == row.slot and seq.inflight_rows >= 1

    def fail(self, plan: StepPlan) -> list[FinishedRequest]:
        """Retire the oldest outstanding plan after an execution failure.

        Nothing it computed is published. Each live request in it finishes with
        ERROR; resources return once its frames drain.

        Raises:
            CompletionError: not the oldest outstanding plan.
        """
        if plan.kind is StepKind.TRANSFER:
            return [s for copy in self._pop_transfer(plan) if (s := copy.failed()) is not None]
        self._frames.pop(plan)
        self._clock.skip()
        failed: list[FinishedRequest] = []
        for row in plan.rows:
            seq = self.requests[row.request_id]
            seq.inflight_rows -= 1
            if row.sample:
                seq.inflight_samples -= 1
            if not seq.retiring:
                self.feedback -= seq.request.needs_feedback
                seq.failed = True
                seq.finish_reason = FinishReason.ERROR
                failed.append(self._summary(seq))
            if seq.inflight_rows == 0:
                self._retire(seq)
        return failed

    def _pop_transfer(self, plan: StepPlan) -> tuple[PendingCopy, ...]:
        issued = self._frames.pop(plan)
        self._clock.skip()  # a TRANSFER step's cost is no program's the policy weighs
        return self._transfers.fence(issued)

    def transfer_failed(self, seq: Sequence) -> FinishedRequest | None:
        """A copy into `seq`'s pages failed: its history is invalid, so it fails (once)."""
        if seq.retiring:
            return None
        self.feedback -= seq.request.needs_feedback
        seq.failed = True
        seq.finish_reason = FinishReason.ERROR
        summary = self._summary(seq)
        self._unplan(seq)
        self._leave(seq)
        return summary

    def _unplan(self, seq: Sequence) -> None:
        """Remove `seq`'s rows from plans built but not issued (their inputs are invalid)."""
        for row in self._frames.unplan(seq.request_id):
            seq.inflight_rows -= 1
            seq.inflight_samples -= int(row.sample)

    # -- leaving --------------------------------------------------------------------

    def finish(self, request_id: int, reason: FinishReason,
               output_tokens: int | None = None, publish: bool = False) -> FinishedRequest:
        """End a request the worker decided is done; release its slot and pages
        now, or when its in-flight frames complete.

        `output_tokens` cuts the output there: the tokens after it (the rest of a
        speculative run the worker stopped inside) are discarded, never counted or
        published. `publish` (EOS or output limit: the request's end is a publishable
        endpoint) publishes a snapshot of its committed state, every token but the last
        sampled one; a matched stop or host stop passes False, so its private candidate
        is discarded and only the pages published before stay cached.

        Returns the request's summary; an already retiring request keeps its
        first reason.

        Raises:
            KeyError: unknown request (a caller bug).
        """
        seq = self.requests[request_id]
        if output_tokens is not None and not seq.retiring and output_tokens < seq.num_output_tokens:
            seq.cut_output(output_tokens)
        if publish and not seq.retiring and seq.slot is not None:
            self.publisher.end(seq)
        if not seq.retiring:
            self.feedback -= seq.request.needs_feedback
            seq.finish_reason = reason
            if reason is FinishReason.CANCELLED:
                seq.cancelled = True
            self._leave(seq)
        return self._summary(seq)

    def cancel(self, request_id: int) -> FinishedRequest | None:
        """Cancel a request: nothing more is planned or published for it.

        A waiting request leaves at once; a running one keeps its slot and pages
        until the in-flight plan containing it completes (then releases).

        Returns:
            Its summary, or None if the request is no longer live (a race with
            finish, not an error).
        """
        seq = self.requests.get(request_id)
        if seq is None:
            return None
        return self.finish(request_id, FinishReason.CANCELLED)

    def _leave(self, seq: Sequence) -> None:
        if seq.slot is None:  # waiting
            self.waiting.remove(seq)
            self._retire(seq)
        elif seq.inflight_rows == 0:
            self._retire(seq)

    def _retire(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.release(seq)
        del self.requests[seq.request_id]
        self.lanes.forget(seq.request_id)
        assert seq.finish_reason is not None
        self.finished[seq.finish_reason] += 1

    def release(self, seq: Sequence) -> None:
        self.alloc.release(seq)
        self.running.remove(seq)

    def _summary(self, seq: Sequence) -> FinishedRequest:
        assert seq.finish_reason is not None
        return FinishedRequest(
            request_id=seq.request_id,
            reason=seq.finish_reason,
            output_tokens=seq.output_tokens,
            reused_prompt_tokens=seq.reused_prompt_tokens or 0,
            preemptions=seq.preemptions,
        )
