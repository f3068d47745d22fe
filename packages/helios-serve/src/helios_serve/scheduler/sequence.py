"""Mutable per-request state owned by the scheduler (never leaves it).

A request's progress counters live in one row of int64 fields (`FIELDS`): a private row
while it waits, the row of its slot in `SlotState` while it runs (SequencePages.allocate
moves it in, SequencePages.release back out), so that the steady decode step reads and
advances the running cohort as arrays (Scheduler._ready, Scheduler._build_cohort,
Lifecycle._complete_columns) while every other reader sees the same values through
`Sequence`'s properties.
"""

from __future__ import annotations

from array import array

import numpy as np

from helios_serve.scheduler.request import FinishReason, SchedRequest

# A request's fields in its state row (SlotState.grid columns). SCHEDULED to FORK hold
# Sequence's properties of the same meaning; RETIRING and WATCH follow its finish flags
# and endpoint fields; KNOWN and LAST_TOKEN follow `tokens`; PROMPT to FEEDBACK are fixed
# copies of the request's (what the array tests read without a Sequence).
# SCHEDULED to SAMPLES, LAST_DECODE to HISTOGRAM, and KNOWN and LAST_TOKEN are adjacent:
# the decode step writes each group as one slice.
SCHEDULED = 0  # num_scheduled
ROWS = 1  # inflight_rows
SAMPLES = 2  # inflight_samples
COMPUTED = 3  # num_computed
PUBLISHED = 4  # num_published
PREFILL = 5  # prefill_tokens
LAST_DECODE = 6  # last_row_decode (0 / 1)
LAST_STEP = 7  # last_step
HISTOGRAM = 8  # needs_histogram (0 / 1)
ENDPOINTS = 9  # endpoints_done
FORK = 10  # fork_endpoint, -1 for None
RETIRING = 11  # retiring (0 / 1): cancelled, failed or a finish reason
KNOWN = 12  # len(tokens)
LAST_TOKEN = 13  # tokens[-1]
PROMPT = 14  # num_prompt_tokens (fixed)
BUDGET = 15  # num_prompt_tokens + request.max_output_tokens (fixed): len(tokens) bound
MARKS = 16  # len(request.publish_endpoints) (fixed)
FEEDBACK = 17  # request.needs_feedback (fixed, 0 / 1)
WATCH = 18  # 1 while a completion must visit the request's row: retiring, an endpoint to
#             capture (endpoints_done < MARKS, or fork_endpoint truthy)
FIELDS = 19


class SlotState:
    """The running requests' state rows, one per slot: int64 [slots, FIELDS] (`grid`,
    a NumPy view of `values`, an array.array whose items read as Python ints at list
    speed). A row holds a request's values only while it owns the slot; a free slot's
    row is zero."""

    def __init__(self, slots: int) -> None:
        self.values = array("q", bytes(8 * FIELDS * slots))
        self.grid = np.frombuffer(self.values, np.int64).reshape(slots, FIELDS)

    def adopt(self, seq: Sequence, slot: int) -> None:
        """`seq` now owns `slot`: its row moves into the slot's (values unchanged)."""
        base = slot * FIELDS
        self.values[base:base + FIELDS] = seq._t[seq._b:seq._b + FIELDS]
        seq._t, seq._b = self.values, base

    def detach(self, seq: Sequence) -> None:
        """`seq` gave its slot back: its row moves to a private one (values unchanged) and
        the slot's row is zeroed (a free slot's row reads as no request: not prefilling,
        nothing in flight)."""
        base = seq._b
        seq._t, seq._b = self.values[base:base + FIELDS], 0
        self.grid[base // FIELDS] = 0


def _field(index: int, doc: str) -> property:
    def get(self: Sequence) -> int:
        return self._t[self._b + index]

    def set_(self: Sequence, value: int) -> None:
        self._t[self._b + index] = value

    return property(get, set_, doc=doc)


def _flag(index: int, doc: str) -> property:
    def get(self: Sequence) -> bool:
        return self._t[self._b + index] != 0

    def set_(self: Sequence, value: bool) -> None:
        self._t[self._b + index] = 1 if value else 0

    return property(get, set_, doc=doc)


class Sequence:
    """One request's tokens, slot, pages and progress.

    Token counts are positions in the request's own sequence (prompt then
    output). `num_scheduled` counts positions handed to issued plans,
    `num_computed` those whose plans completed; pages cover [0, num_scheduled).
    `tokens` changes only through `append_token` and `cut_output` (the state row keeps
    its length and last token).
    """

    num_scheduled = _field(SCHEDULED, "Positions handed to issued plans.")
    num_computed = _field(COMPUTED, "Positions whose plans completed.")
    inflight_rows = _field(ROWS, "Issued rows not yet completed.")
    inflight_samples = _field(SAMPLES, "Issued sampling rows whose token is not yet known.")
    num_published = _field(PUBLISHED, "Leading pages whose publication was decided.")
    prefill_tokens = _field(PREFILL, "Tokens to prefill since admission (len(tokens) then).")
    last_row_decode = _flag(LAST_DECODE, "The latest issued row was a decode row.")
    last_step = _field(LAST_STEP, "Step index of the latest row issued (-1: none).")
    needs_histogram = _flag(HISTOGRAM, "The next row carries histogram_tokens.")

    def __init__(self, request: SchedRequest, order: int) -> None:
        self.request = request
        self.request_id = request.request_id
        self.order = order  # admission order; larger is newer
        self.tokens: list[int] = list(request.prompt_tokens)  # prompt + output
        self.num_prompt_tokens = len(request.prompt_tokens)
        self._t = array("q", bytes(8 * FIELDS))  # the state row: private until a slot
        self._b = 0
        t = self._t
        t[KNOWN] = len(self.tokens)
        t[LAST_TOKEN] = self.tokens[-1] if self.tokens else -1
        t[PROMPT] = self.num_prompt_tokens
        t[BUDGET] = self.num_prompt_tokens + request.max_output_tokens
        t[MARKS] = len(request.publish_endpoints)
        t[FEEDBACK] = 1 if request.needs_feedback else 0
        t[FORK] = -1
        t[LAST_STEP] = -1
        t[WATCH] = 1 if t[MARKS] else 0
        self._cancelled = self._failed = False
        self._finish_reason: FinishReason | None = None
        # Cache fields: set by SequencePages.allocate at (re)admission and reset by its
        # release (scheduler/allocation.py); publication advances page_hashes and
        # num_published (scheduler/publication.py); plans advance the positions.
        self.slot: int | None = None
        self.generation = 0
        self.page_ids: list[int] = []
        # page_prefix() cache: (the page_ids list it was cut from, the prefix). page_ids is
        # only appended to or replaced, so a prefix of the same list never changes.
        self._page_prefix: tuple[list[int], tuple[int, ...]] = ([], ())
        # Sliding-window region (scheduler/allocation.py, WindowPages): logical page list
        # as long as the token pages; the leading window_released entries went back to
        # the pool (-1).
        self.window_page_ids: list[int] = []
        self.window_released = 0
        self.page_hashes: list[bytes] = []  # chain hashes of complete pages, in order
        # score_prompt: positions whose targets were issued (a readmission after a
        # preemption scores none of them again); num_prompt_tokens - 1 when done.
        self.scored_upto = 0 if request.score_prompt else max(0, self.num_prompt_tokens - 1)
        # n > 1: the fork snapshot's key while it is captured (fork_endpoint: the endpoint).
        self.fork_snapshot: tuple | None = None
        # Lifecycle:
        self.reused_prompt_tokens: int | None = None  # first admission only
        self.preemptions = 0
        self.history = None  # speculation.HistoryIndex, made on the first copied proposal
        # A constrained request's grammar-accepted copied candidates, keyed by the
        # (generation, sequence length) they were proposed at (Scheduler.lane_ceiling).
        self.constrained_candidates: tuple[tuple[int, int], tuple[int, ...]] | None = None

    @property
    def endpoints_done(self) -> int:
        """Leading request.publish_endpoints already handled."""
        return self._t[self._b + ENDPOINTS]

    @endpoints_done.setter
    def endpoints_done(self, value: int) -> None:
        self._t[self._b + ENDPOINTS] = value
        self._mark_watch()

    @property
    def fork_endpoint(self) -> int | None:
        """n > 1: the endpoint len(prompt) - 1 published for the choices forking from this
        one (None: none asked; 0: done)."""
        value = self._t[self._b + FORK]
        return None if value < 0 else value

    @fork_endpoint.setter
    def fork_endpoint(self, value: int | None) -> None:
        self._t[self._b + FORK] = -1 if value is None else value
        self._mark_watch()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._cancelled = value
        self._mark_retiring()

    @property
    def failed(self) -> bool:
        return self._failed

    @failed.setter
    def failed(self, value: bool) -> None:
        self._failed = value
        self._mark_retiring()

    @property
    def finish_reason(self) -> FinishReason | None:
        return self._finish_reason

    @finish_reason.setter
    def finish_reason(self, value: FinishReason | None) -> None:
        self._finish_reason = value
        self._mark_retiring()

    def _mark_retiring(self) -> None:
        self._t[self._b + RETIRING] = 1 if (
            self._cancelled or self._failed or self._finish_reason is not None) else 0
        self._mark_watch()

    def _mark_watch(self) -> None:
        t, b = self._t, self._b
        t[b + WATCH] = 1 if (t[b + RETIRING] or t[b + ENDPOINTS] < t[b + MARKS]
                             or t[b + FORK] > 0) else 0

    def append_token(self, token: int) -> None:
        """A sampled token is known: appended to `tokens`."""
        self.tokens.append(token)
        t, b = self._t, self._b
        t[b + KNOWN] += 1
        t[b + LAST_TOKEN] = token

    def cut_output(self, count: int) -> None:
        """Keep the first `count` output tokens (0 <= count <= num_output_tokens)."""
        del self.tokens[self.num_prompt_tokens + count:]
        t, b = self._t, self._b
        t[b + KNOWN] = len(self.tokens)
        t[b + LAST_TOKEN] = self.tokens[-1] if self.tokens else -1

    @property
    def scoring(self) -> bool:
        """Prompt positions still need their scores (SchedRequest.score_prompt)."""
        return self.scored_upto < self.num_prompt_tokens - 1

    @property
    def cache_tokens(self) -> list[int]:
        """What the prefix cache keys this sequence's positions by: its tokens, with each
        image feature position keyed by the image's content (PromptImage.cache_keys)."""
        if not self.request.images:
            return self.tokens
        keys = list(self.tokens)
        for image in self.request.images:
            for position, key in zip(image.feature_positions, image.cache_keys(), strict=True):
                keys[position] = key
        return keys

    def chunk_images(self, start: int, end: int) -> tuple:
        """The images whose spans overlap prompt positions [start, end)."""
        return tuple(i for i in self.request.images if i.start < end and i.end > start)

    def image_cut(self, start: int, n: int, windows_left: int) -> tuple[int, int]:
        """The longest chunk [start, start + m), m <= n, that ends outside every image
        span and whose images have at most `windows_left` windows; returns (m, windows
        it encodes). m = 0: the next span does not fit this step."""
        end, used = start + n, 0
        for image in self.request.images:
            if image.end <= start:
                continue
            if image.start >= end:
                break
            if image.end > end or used + image.windows > windows_left:
                return max(image.start - start, 0), used
            used += image.windows
        return n, used

    @property
    def output_tokens(self) -> tuple[int, ...]:
        return tuple(self.tokens[self.num_prompt_tokens :])

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def in_prefill(self) -> bool:
        """Prompt (or recompute) tokens remain to be scheduled."""
        return self.num_scheduled < self.prefill_tokens

    @property
    def retiring(self) -> bool:
        """Cancelled, failed or finished: no more rows; released when frames drain."""
        return self._t[self._b + RETIRING] != 0

    @property
    def can_decode(self) -> bool:
        """Exactly one pending token, its sample known, output budget left."""
        return (
            not self.retiring
            and self.inflight_samples == 0
            and not self.in_prefill
            and self.num_scheduled == len(self.tokens) - 1
            and self.num_output_tokens < self.request.max_output_tokens
        )

    @property
    def can_decode_ahead(self) -> bool:
        """One decode row in flight whose sampled token (not yet known to the host) the
        next decode can feed from the device, and output budget for one more token."""
        return (
            not self.retiring
            and not self.request.needs_feedback
            and self.inflight_rows == 1
            and self.inflight_samples == 1
            and self.last_row_decode
            and self.num_scheduled == len(self.tokens)
            and self.num_output_tokens + 1 < self.request.max_output_tokens
        )

    def decode_ready(self, ahead: bool) -> bool:
        """`can_decode`, or `can_decode_ahead` when `ahead` (one test per running request
        per step: the two properties spelled out over the state row; Scheduler._ready is
        the same test over the running cohort's rows at once)."""
        t, b = self._t, self._b
        if t[b + RETIRING]:
            return False
        scheduled, known, budget = t[b + SCHEDULED], t[b + KNOWN], t[b + BUDGET]
        samples = t[b + SAMPLES]
        if samples == 0:
            return scheduled >= t[b + PREFILL] and scheduled == known - 1 and known < budget
        return (ahead and samples == 1 and t[b + ROWS] == 1 and t[b + LAST_DECODE] != 0
                and scheduled == known and known + 1 < budget and not t[b + FEEDBACK])

    def issue(self, end: int, sample: bool, decode: bool, step: int) -> None:
        """A row of step `step` was built for positions [num_scheduled, end): advance the
        scheduled state (the row samples a token when `sample`; `decode`: a decode row)."""
        self.num_scheduled = end
        self.inflight_rows += 1
        self.inflight_samples += sample
        self.last_row_decode = decode
        self.needs_histogram = False
        self.last_step = step

    def page_prefix(self, count: int) -> tuple[int, ...]:
        """`tuple(page_ids[:count])`, rebuilt only when it changes (a decode row carries
        the same pages for `page_tokens` steps)."""
        source, prefix = self._page_prefix
        if source is not self.page_ids or len(prefix) != count:
            prefix = tuple(self.page_ids[:count])
            self._page_prefix = (self.page_ids, prefix)
        return prefix

    @property
    def can_prefill(self) -> bool:
        """Prompt tokens remain and no sampling row is outstanding."""
        return not self.retiring and self.inflight_samples == 0 and self.in_prefill
