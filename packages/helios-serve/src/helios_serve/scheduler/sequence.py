"""Mutable per-request state owned by the scheduler (never leaves it)."""

from __future__ import annotations

from helios_serve.scheduler.request import FinishReason, SchedRequest


class Sequence:
    """One request's tokens, slot, pages and progress.

    Token counts are positions in the request's own sequence (prompt then
    output). `num_scheduled` counts positions handed to issued plans,
    `num_computed` those whose plans completed; pages cover [0, num_scheduled).
    """

    def __init__(self, request: SchedRequest, order: int) -> None:
        self.request = request
        self.request_id = request.request_id
        self.order = order  # admission order; larger is newer
        self.tokens: list[int] = list(request.prompt_tokens)  # prompt + output
        self.num_prompt_tokens = len(request.prompt_tokens)
        # Cache fields: set by SequencePages.allocate at (re)admission and reset by its
        # release (scheduler/allocation.py); publication advances page_hashes and
        # num_published (scheduler/publication.py); plans advance the positions.
        self.prefill_tokens = 0  # tokens to prefill since admission (len(tokens) then)
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
        self.num_published = 0  # leading pages whose publication was decided
        self.num_scheduled = 0
        self.num_computed = 0
        self.needs_histogram = False  # next row carries histogram_tokens
        self.endpoints_done = 0  # leading request.publish_endpoints already handled
        # score_prompt: positions whose targets were issued (a readmission after a
        # preemption scores none of them again); num_prompt_tokens - 1 when done.
        self.scored_upto = 0 if request.score_prompt else max(0, self.num_prompt_tokens - 1)
        # n > 1: the endpoint len(prompt) - 1 published for the choices forking from this
        # one (None: none asked), and the key of that snapshot while it is captured.
        self.fork_endpoint: int | None = None
        self.fork_snapshot: tuple | None = None
        # Frames:
        self.inflight_rows = 0
        self.inflight_samples = 0  # issued sampling rows whose token is not yet known
        self.last_row_decode = False  # the latest issued row was a decode row
        self.last_step = -1  # step index of the latest row issued
        # Lifecycle:
        self.reused_prompt_tokens: int | None = None  # first admission only
        self.preemptions = 0
        self.cancelled = False
        self.failed = False
        self.finish_reason: FinishReason | None = None
        self.history = None  # speculation.HistoryIndex, made on the first copied proposal
        # A constrained request's grammar-accepted copied candidates, keyed by the
        # (generation, sequence length) they were proposed at (Scheduler.lane_ceiling).
        self.constrained_candidates: tuple[tuple[int, int], tuple[int, ...]] | None = None

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
        return self.cancelled or self.failed or self.finish_reason is not None

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
        per step: the two properties spelled out with shared reads)."""
        if self.cancelled or self.failed or self.finish_reason is not None:
            return False
        scheduled, known = self.num_scheduled, len(self.tokens)
        outputs, limit = known - self.num_prompt_tokens, self.request.max_output_tokens
        if self.inflight_samples == 0:
            return (scheduled >= self.prefill_tokens and scheduled == known - 1
                    and outputs < limit)
        return (ahead and self.inflight_samples == 1 and self.inflight_rows == 1
                and self.last_row_decode and scheduled == known
                and outputs + 1 < limit and not self.request.needs_feedback)

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
