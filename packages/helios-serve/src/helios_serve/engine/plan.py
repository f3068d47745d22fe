"""Step plans: what the scheduler asks the runtime to execute in one graph launch.

The scheduler produces a `StepPlan`; shared packing (helios_serve.runtime.packing)
resolves the contract's value bindings from it; the backend executes one graph
variant and returns the completion record (sampled ids per plan row). Plans are
plain data: the scheduler never sees buffers, the runtime never
sees the allocator's lists.

Index spaces: `RowPlan.slot` is a physical request row (0 <= slot < geometry.slots);
the position of a row in `StepPlan.rows` is its submission row.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

# Token value of a decode row whose pending token is still on the device (sampled by an
# outstanding step, read by the graph from the pending-token state view).
PENDING_PLACEHOLDER = -1


class StepKind(enum.Enum):
    """Which captured operation a step runs (TRANSFER: a RESTORE-operation program)."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"  # decode lanes and prefill chunks in one packed step (OPERATION_MIXED)
    SPECULATIVE = "speculative"
    TRANSFER = "transfer"


class Tier(enum.Enum):
    """Storage whose rows a TRANSFER step copies (the specification, "Attention histories
    and cache policy"). A row is one page-shaped record of every plane of the tier."""

    PAGES = "pages"  # paged history planes; row = page id
    CONTINUATION = "continuation"  # continuation storage; row = continuation row
    HOST = "host"  # host-memory tier; row = host row


@dataclass(frozen=True)
class Route:
    """Direction of a TRANSFER step: rows of `source` are copied to rows of `destination`."""

    source: Tier
    destination: Tier

    def __str__(self) -> str:
        return f"{self.source.value}->{self.destination.value}"


@dataclass(frozen=True)
class RowCopy:
    """One row of a TRANSFER step: source row -> destination row (each in its route's
    tier index space: page id, continuation row or host row)."""

    source: int
    destination: int


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters after defaults are applied.

    temperature 0 selects greedy decoding; top_k 0, top_p 1, min_p 0,
    penalties 0 (presence/frequency) and 1 (repetition) disable each filter.
    seed is 64 bits; the worker draws one for requests that give none.

    Attributes:
        logit_bias: (token id, bias) pairs, ids ascending and unique, added to the raw
            logits before penalties, mask and temperature (OpenAI ``logit_bias``; vLLM's
            order). Validated by ``frontend.bias.parse_logit_bias``.
        logprobs: None when the request reports no logprobs; else the number of top
            alternatives (0..ModelGeometry.top_logprobs) reported beside each sampled
            token's logprob (OpenAI ``top_logprobs``).
        min_tokens: the ids in ``min_tokens_banned`` cannot be sampled while fewer than
            this many output tokens exist (vLLM ``min_tokens``).
        min_tokens_banned: EOS and stop-token ids banned before ``min_tokens``.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    min_tokens: int = 0
    min_tokens_banned: tuple[int, ...] = ()


@dataclass(frozen=True)
class CopiedCandidates:
    """History drafting's copied proposals for one speculative lane: `ids[i]` proposes
    the token at the lane's pending position + 1 + i. `generation` and `endpoint` (the
    slot generation and consumed endpoint, pending token included, they were proposed
    for) let the program ignore stale candidates.

    `grammar_masks` (constrained lanes: int32 ``[len(ids), mask_words]``, attached by the
    worker at submission like RowPlan.grammar_mask): row i is the bitmask of the tokens
    the request's grammar allows after ids[0..i] (the lane's verified position i + 1;
    its pending position takes RowPlan.grammar_mask). Packed as CANDIDATE_GRAMMAR_MASKS.
    """

    ids: tuple[int, ...]
    generation: int
    endpoint: int
    grammar_masks: np.ndarray | None = field(default=None, compare=False)


@dataclass(frozen=True)
class PromptImage:
    """One image of a prompt, as prepared (frontend/images.py) and laid out.

    Its span [start, end) (prompt positions) is atomic: a prefill chunk never ends
    inside it, so one step encodes the whole image (the windows of an image whose span a
    cached prefix cut are encoded again; the step reads only the features of its own
    positions). Feature k of the image fills prompt position ``feature_positions[k]``.

    Attributes:
        start / end: the span, prompt positions.
        feature_positions: positions of its feature sentinels, ascending.
        pixels: f32 ``[windows, 3, window_pixels, window_pixels]`` as bytes (plain data:
            it crosses to the engine process).
        windows / window_pixels: that shape.
        content_hash: SHA-256 of the pixels: the span's prefix-cache key.
    """

    start: int
    end: int
    feature_positions: tuple[int, ...]
    pixels: bytes = field(repr=False, compare=False)
    windows: int = 0
    window_pixels: int = 0
    content_hash: bytes = b""

    def array(self) -> np.ndarray:
        """The windows, f32 ``[windows, 3, window_pixels, window_pixels]`` (a view)."""
        s = self.window_pixels
        return np.frombuffer(self.pixels, np.float32).reshape(self.windows, 3, s, s)

    def cache_keys(self) -> list[int]:
        """Prefix-cache keys of the feature positions: the content hash and the feature
        index, above every token id (2^62 + ...), so equal sentinels of different images
        never share a cached page."""
        base = (1 << 62) | (int.from_bytes(self.content_hash[:5], "little") << 20)
        return [base | k for k in range(len(self.feature_positions))]


@dataclass(frozen=True, init=False)
class RowPlan:
    """One request lane of a step.

    Attributes:
        request_id: scheduler-internal id (never leaves the process).
        slot: physical request row owning the page table and histogram row.
        generation: slot generation; bumps each time the slot is reassigned.
        tokens: token ids fed this step: a prefill chunk, or [pending token] for decode.
        start_position: position (tokens) of tokens[0] in the request's sequence.
        page_ids: the slot's full page list covering positions
            [0, start_position + len(tokens)), plus `extra_pages_per_request` more;
            unshifted, page i holds positions [i * page_tokens, (i + 1) * page_tokens).
        sample: whether the sampled token is used (final prefill chunk, decode);
            when False the histogram is not updated.
        sampling: the request's sampling parameters.
        histogram_tokens: set on the step that first places this request in its
            slot (admission or readmission): the tokens whose counts initialize the
            slot's histogram row (the prompt, plus output already generated on
            readmission). None otherwise.
        grammar_mask: int32 [mask_words] bitmask for a constrained row, else None.
        query_length: SPECULATIVE lanes only: the host-selected lane length n (target
            positions verified, the pending token included; n - 1 drafts); 0 means
            len(tokens). `tokens` is then (pending token,) and `page_ids` cover
            [0, start_position + n). In a prefix-limit step (StepPlan.packed_rows) it is
            the lane's ceiling; the program chooses the length.
        candidates: SPECULATIVE lanes only: copied proposals (history drafting) that
            replace the head's first drafts, or None.
        score_targets: PREFILL rows of a request asking for prompt log probabilities:
            per token of `tokens`, the prompt token after it (scored against the model's
            distribution at that token's position), or -1 where it has none (the
            prompt's last token, positions scored before a preemption); None when the row
            scores nothing. A step with such a row runs a SCORED_PREFILL program.
        images: PREFILL rows only: the request's images whose spans overlap this chunk
            (each encoded whole by the step; PromptImage).
        window_page_ids: the slot's sliding-window page list (ModelGeometry
            .window_tokens > 0), unshifted like `page_ids` and as long; entries of pages
            wholly behind the window of every query still to compute are -1 (returned
            to the pool; never read). Empty when the core has no window region.
    """

    request_id: int
    slot: int
    generation: int
    tokens: tuple[int, ...]
    start_position: int
    page_ids: tuple[int, ...]
    sample: bool
    sampling: SamplingParams
    histogram_tokens: tuple[int, ...] | None = None
    grammar_mask: np.ndarray | None = field(default=None, compare=False)
    query_length: int = 0
    candidates: CopiedCandidates | None = None
    score_targets: tuple[int, ...] | None = None
    images: tuple[PromptImage, ...] = ()
    window_page_ids: tuple[int, ...] = ()

    # The generated __init__ of a frozen dataclass calls object.__setattr__ once per field
    # (~4 us for these 12 on CPython 3.11); rows are built for every lane of every step, so
    # this one fills the instance dict directly (~1 us). Same signature (a test checks).
    def __init__(self, request_id: int, slot: int, generation: int, tokens: tuple[int, ...],
                 start_position: int, page_ids: tuple[int, ...], sample: bool,
                 sampling: SamplingParams, histogram_tokens: tuple[int, ...] | None = None,
                 grammar_mask: np.ndarray | None = None, query_length: int = 0,
                 candidates: CopiedCandidates | None = None,
                 score_targets: tuple[int, ...] | None = None,
                 images: tuple[PromptImage, ...] = (),
                 window_page_ids: tuple[int, ...] = ()) -> None:
        d = self.__dict__
        d["request_id"] = request_id
        d["slot"] = slot
        d["generation"] = generation
        d["tokens"] = tokens
        d["start_position"] = start_position
        d["page_ids"] = page_ids
        d["sample"] = sample
        d["sampling"] = sampling
        d["histogram_tokens"] = histogram_tokens
        d["grammar_mask"] = grammar_mask
        d["query_length"] = query_length
        d["candidates"] = candidates
        d["score_targets"] = score_targets
        d["images"] = images
        d["window_page_ids"] = window_page_ids

    @property
    def lane_length(self) -> int:
        """Target positions this row occupies in the packed-token index space."""
        return self.query_length or len(self.tokens)


class RowColumns:
    """A DECODE plan's per-row host values as NumPy columns, kept by the scheduler across
    the steps of an unchanged decode cohort (Scheduler._build_plain), so that shared
    packing writes them with array operations instead of a pass over the rows per binding.

    They describe `rows` only (`describes`): a plan rebuilt with other rows (the worker
    attaching grammar masks with dataclasses.replace) keeps the object, which then no
    longer applies. Every row they describe feeds one token, samples, and carries no
    grammar mask, histogram, candidates, score targets or images.

    Columns that carry every row value (`complete`: built with `request_ids`, `fed` and
    `pages`) let a plan leave its RowPlans unbuilt until something reads `StepPlan.rows`
    (`rows` None until then; `materialize` builds them, equal to the rows the scheduler
    would have built): the steady decode step's scheduling, packing and completion read
    the columns alone.

    Attributes:
        rows: the plan rows the columns were built from (compared by identity), or None
            while they are unbuilt.
        slots: intp [rows] RowPlan.slot.
        generations: int64 [rows] RowPlan.generation.
        positions: int64 [rows] RowPlan.start_position.
        logprobs: int64 [rows] RowPlan.sampling.logprobs, -1 where None.
        holders: RowPlan.sampling of each row.
        request_ids: RowPlan.request_id of each row (list of int), or None.
        fed: int64 [rows] each row's one token (RowPlan.tokens[0]: PENDING_PLACEHOLDER
            while it is on the device), or None.
        pages: each row's page list (RowPlan.page_ids is `tuple(pages[i][:page_counts[i]])`;
            the scheduler's lists are only appended to or replaced, so the prefix holds),
            or None.
        page_counts: int64 [rows] len(RowPlan.page_ids), or None.
        sequences: the scheduler's per-row request state (opaque here: Lifecycle.complete
            reads it), or None.
        holders_at: with `sequences`, the scheduler's count of slot holder changes when
            the plan was built (opaque here: Lifecycle.complete reads it), else None.
    """

    __slots__ = ("rows", "slots", "generations", "positions", "logprobs", "holders",
                 "request_ids", "fed", "pages", "page_counts", "sequences", "holders_at")

    def __init__(self, rows: tuple[RowPlan, ...] | None, slots: np.ndarray,
                 generations: np.ndarray, positions: np.ndarray, logprobs: np.ndarray,
                 holders: tuple[SamplingParams, ...], *, request_ids: list[int] | None = None,
                 fed: np.ndarray | None = None, pages: list[list[int]] | None = None,
                 page_counts: np.ndarray | None = None, sequences: tuple | None = None,
                 holders_at: int | None = None) -> None:
        self.rows = rows
        self.slots = slots
        self.generations = generations
        self.positions = positions
        self.logprobs = logprobs
        self.holders = holders
        self.request_ids = request_ids
        self.fed = fed
        self.pages = pages
        self.page_counts = page_counts
        self.sequences = sequences
        self.holders_at = holders_at

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def complete(self) -> bool:
        """Whether these columns carry every row value (the plan's rows may be unbuilt)."""
        return self.pages is not None

    def describes(self, plan: StepPlan) -> bool:
        """Whether these columns are `plan`'s rows' values."""
        rows = plan.__dict__.get("rows")
        if rows is None:  # unbuilt: the plan's rows are these columns' (StepPlan.rows)
            return plan.columns is self
        return self.rows is rows

    def materialize(self) -> tuple[RowPlan, ...]:
        """The RowPlans these columns describe (built once; `rows` holds them after)."""
        if self.rows is None:
            assert self.pages is not None, "columns without row values need their rows"
            self.rows = tuple([
                RowPlan(request_id, slot, generation, (fed,), position,
                        tuple(pages[:count]), True, holder)
                for request_id, slot, generation, fed, position, pages, count, holder in zip(
                    self.request_ids, self.slots.tolist(), self.generations.tolist(),
                    self.fed.tolist(), self.positions.tolist(), self.pages,
                    self.page_counts.tolist(), self.holders, strict=True)])
        return self.rows


@dataclass(frozen=True, init=False)
class StepPlan:
    """One graph launch: a PREFILL over packed chunks, a DECODE over rows, or a TRANSFER.

    Prefill packs every row's tokens back to back in row order (packed-token
    index space); its total must fit one captured prefill token capacity and its
    row count the prefill row capacity. Decode rows carry exactly one token each
    and must fit one captured decode batch capacity. A SPECULATIVE step's lanes
    occupy `lane_length` packed rows each (pending token, then drafts the program
    proposes); its completion is one lane record per row (SpeculativeCompletion).
    A TRANSFER step has no request rows: it copies `copies` (one submission row each,
    at most geometry.transfer_rows) along `route`, and completes with no record.

    A MIXED step packs like a PREFILL step (rows' tokens back to back) with its first
    `lanes` rows decode lanes (one completed pending token each, sampling) and the rest
    prefill chunks; it must fit one captured MIXED variant (rows, packed tokens).

    Attributes:
        packed_rows: SPECULATIVE steps with device allocation (SPECULATIVE_PREFIX_LIMIT
            programs): P, the verification rows the program shares among the lanes,
            whose `query_length` are then ceilings that may sum to more; 0 otherwise.
        lanes: MIXED steps: the leading rows that are decode lanes; 0 otherwise.
        token_budget: MIXED steps: the packed tokens the scheduler allowed the step (a
            captured mixed token capacity, scheduler/capacity.py `mixed_budget`; the
            runtime runs the smallest variant that holds the rows, which may be a smaller
            capacity); 0 otherwise.
        columns: DECODE steps the scheduler built from an unchanged decode cohort: the
            rows' host values as arrays (RowColumns; packing reads them where
            `columns.describes(plan)`), else None. Not compared.
    """

    kind: StepKind
    rows: tuple[RowPlan, ...]
    packed_rows: int = 0
    # TRANSFER steps only; keyword-only (fields added after them stay positional-safe).
    copies: tuple[RowCopy, ...] = field(default=(), kw_only=True)
    route: Route | None = field(default=None, kw_only=True)
    lanes: int = field(default=0, kw_only=True)
    token_budget: int = field(default=0, kw_only=True)
    columns: RowColumns | None = field(default=None, kw_only=True, compare=False, repr=False)

    # One per step: fills the instance dict (see RowPlan.__init__). Same signature.
    # rows=None with complete columns (RowColumns.complete): the rows are built on first
    # read (`__getattr__`), which the steady decode step never does.
    def __init__(self, kind: StepKind, rows: tuple[RowPlan, ...] | None,
                 packed_rows: int = 0, *,
                 copies: tuple[RowCopy, ...] = (), route: Route | None = None,
                 lanes: int = 0, token_budget: int = 0,
                 columns: RowColumns | None = None) -> None:
        d = self.__dict__
        d["kind"] = kind
        if rows is not None:
            d["rows"] = rows
        elif columns is None or not columns.complete:
            raise ValueError("a plan without rows needs columns that carry them")
        d["packed_rows"] = packed_rows
        d["copies"] = copies
        d["route"] = route
        d["lanes"] = lanes
        d["token_budget"] = token_budget
        d["columns"] = columns

    def __getattr__(self, name: str):
        # Only reached for an attribute the instance dict lacks: the unbuilt rows of a
        # plan whose complete columns carry them.
        if name == "rows":
            columns = self.__dict__.get("columns")
            if columns is not None and columns.complete:
                rows = self.__dict__["rows"] = columns.materialize()
                return rows
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __eq__(self, other: object) -> bool:
        # The dataclass comparison (columns not compared), with identity first: the
        # scheduler checks each completion against the plan it issued, which is the same
        # object in the steady step (and whose rows it then leaves unbuilt).
        if self is other:
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return ((self.kind, self.rows, self.packed_rows, self.copies, self.route, self.lanes,
                 self.token_budget)
                == (other.kind, other.rows, other.packed_rows, other.copies, other.route,
                    other.lanes, other.token_budget))

    @property
    def row_count(self) -> int:
        """Rows of the step (`len(rows)`, without building unbuilt rows)."""
        rows = self.__dict__.get("rows")
        return len(rows) if rows is not None else len(self.columns)

    @property
    def token_count(self) -> int:
        """Packed tokens of the step."""
        return sum(r.lane_length for r in self.rows)

    @property
    def scored(self) -> bool:
        """A PREFILL step with a row that scores its prompt tokens (RowPlan.score_targets):
        it runs a SCORED_PREFILL program, whose token capacity must hold it."""
        return self.kind is StepKind.PREFILL and any(
            r.score_targets is not None for r in self.rows)


@dataclass(frozen=True)
class ModelGeometry:
    """Execution geometry the scheduler plans against (NativeModel.manifests).

    Attributes:
        page_tokens: tokens per page (CacheContract.page_tokens).
        num_pages: physical pages backed at load.
        slots: physical request rows (page-table and histogram rows).
        max_pages_per_request: page-table width; context limit = this * page_tokens.
        decode_capacities: captured decode batch capacities, ascending.
        prefill_token_capacities: captured prefill packed-token capacities, ascending.
        prefill_row_capacity: request rows of each prefill variant.
        scored_token_capacities: captured SCORED_PREFILL packed-token capacities,
            ascending (their rows are the prefill row capacity); empty when the core
            computes no prompt log probabilities.
        context_tokens: largest prompt + output of one request.
        vocab_size: sampled vocabulary size.
        mask_words: int32 words per grammar mask row.
        eos_token_ids: ids that end generation.
        speculative_widths: SPECULATIVE widths W served (after load-time reduction),
            ascending; empty when speculation is off.
        draft_cursor_lag: lag of the speculative programs' draft cursor behind the
            consumed endpoint, or None when they report no draft cursor (-1).
        top_logprobs: top alternatives the completion record holds per row (the most a
            request may ask), or None when the core records no logprobs.
        logit_bias: whether the sampler applies a per-request logit bias (the core binds
            VALUE_SOURCE_LOGIT_BIAS).
        extra_pages_per_request: pages a request owns beyond those its tokens fill: the
            largest page-table view page_offset (entry i of a view references the
            request's page i + page_offset, contract.proto PageTableView), so a shifted
            view of a request's n token pages references page n + offset - 1. Pages are
            then not shared between requests (a shifted history does not lie in the page
            of the tokens it belongs to).
        lane_limits: the lane limit of each served width, in the order of
            speculative_widths (SpeculativeDescriptor.lane_limit: the longest lane, pending
            token included, the host may select for that width's programs; one per width,
            rule speculative.lane_limit_consistency); empty: each width's own W.
        prefix_programs: served SPECULATIVE_PREFIX_LIMIT programs as (B, P, L), ascending:
            B lanes of ceilings up to L (the program's lane limit) share P verification
            rows the device allocates.
        copied_proposals: every served wider SPECULATIVE program binds the copied-token
            inputs (history drafting may be enabled).
        candidate_masks: constrained lanes may verify copied candidates: every served
            wider program binds their per-position grammar masks
            (PreparedContract.constrained_speculation); else they stay at width one.
        snapshot_rows: continuation rows backed at load (the physical snapshot capacity;
            0 = no exact-endpoint snapshots).
        host_rows: host-tier rows backed at load (each holds one page or one snapshot's
            continuation row; 0 = no host tier).
        transfer_rows: copies one TRANSFER step holds (the RESTORE programs' captured
            batch capacity; 0 = no transfer programs).
        routes: TRANSFER routes served (one RESTORE program per route and capacity).
        page_bytes: bytes of one row across every plane of the paged region (what a page
            costs to move to the host tier and back).
        image_windows: windows one image prefill program encodes (0: no images); every
            image span of a step is encoded whole.
        image_feature_slots: image features one request may hold (vision.feature_slots).
        window_tokens: the sliding-window region's window (HistoryRegion.window_tokens;
            0: the core has none). Its pages come from their own pool, are private to
            their request, and go back to the pool once wholly behind the window of every
            position still to compute (scheduler/allocation.py, WindowPages); prefix
            reuse is then off (a cached prefix holds no window pages).
        window_pages: pages of the sliding-window region's pool (its planes' extent).
        mixed_capacities: captured MIXED variants as (rows, packed tokens), ascending
            (empty: no mixed steps; PREFILL and DECODE steps alternate). A mixed step's
            token budget is one of the token capacities, chosen per step
            (scheduler/capacity.py `mixed_budget`).
    """

    page_tokens: int
    num_pages: int
    slots: int
    max_pages_per_request: int
    decode_capacities: tuple[int, ...]
    prefill_token_capacities: tuple[int, ...]
    prefill_row_capacity: int
    context_tokens: int
    vocab_size: int
    mask_words: int
    eos_token_ids: tuple[int, ...]
    speculative_widths: tuple[int, ...] = ()
    lane_limits: tuple[int, ...] = ()
    draft_cursor_lag: int | None = None
    top_logprobs: int | None = None
    logit_bias: bool = False
    extra_pages_per_request: int = 0
    prefix_programs: tuple[tuple[int, int, int], ...] = ()
    copied_proposals: bool = False
    candidate_masks: bool = False
    snapshot_rows: int = 0
    host_rows: int = 0
    transfer_rows: int = 0
    routes: tuple[Route, ...] = ()
    page_bytes: int = 0
    scored_token_capacities: tuple[int, ...] = ()
    image_windows: int = 0
    image_feature_slots: int = 0
    window_tokens: int = 0
    window_pages: int = 0
    mixed_capacities: tuple[tuple[int, int], ...] = ()

    @property
    def lane_widths(self) -> tuple[int, ...]:
        """The lane lengths the scheduler plans against: the distinct lane limits of the
        served widths, ascending (a lane of n positions runs in the narrowest program whose
        limit holds n)."""
        limits = self.lane_limits or self.speculative_widths
        # pairs with the served widths: a geometry whose widths were cleared (speculation
        # off) has no lane widths, whatever limits it kept
        return tuple(sorted({limit for _, limit in zip(self.speculative_widths, limits,
                                                       strict=False)}))


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log probability and its most likely alternatives.

    The distribution is the raw model's: ``log_softmax`` of the unprocessed logits, before
    logit bias, penalties, grammar mask, temperature and truncation (vLLM's default
    ``raw_logprobs``). Natural log, float32 values widened to float.

    Attributes:
        token_id: the sampled token.
        logprob: its log probability.
        top: (token id, log probability) of the most likely tokens, most likely first
            (ties: lower id first); as many as the request asked.
    """

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class StepCompletion:
    """The host view of one step's completion record (submission rows).

    Attributes:
        sampled: int32 ``[rows]`` sampled ids.
        logprobs: float32 ``[rows, 1 + K]`` (column 0 the sampled token's logprob, then
            the top K alternatives, most likely first), or None when no row of the step
            asked for logprobs. Only rows that asked hold values.
        top_ids: int32 ``[rows, K]`` ids of those alternatives, or None with ``logprobs``.
        confidence: float32 ``[rows, draft_capacity]`` (SPECULATIVE programs producing
            proposal confidence: the frame's plane of proposal_confidence, lane order;
            column k = the head's confidence in the lane's draft k + 1), else None.
        scores: float32 ``[tokens, 1 + K]`` (a scored PREFILL step: per packed token,
            the logprob of its target, then the top K alternatives; only tokens with a
            target hold values), else None.
        score_ids: int32 ``[tokens, K]`` ids of those alternatives, or None with
            ``scores``.
    """

    sampled: np.ndarray
    logprobs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    confidence: np.ndarray | None = None
    scores: np.ndarray | None = None
    score_ids: np.ndarray | None = None

    def token_logprob(self, row: int, top: int) -> TokenLogprob:
        """Row ``row``'s sampled token with ``top`` alternatives (a row that asked).

        Raises:
            ValueError: the record holds no logprobs, or fewer than ``top`` alternatives.
        """
        if self.logprobs is None or self.top_ids is None:
            raise ValueError("this step's completion record holds no logprobs")
        if not 0 <= top <= self.top_ids.shape[1]:
            raise ValueError(f"top {top} outside [0, {self.top_ids.shape[1]}]")
        values = self.logprobs[row]
        ids = self.top_ids[row]
        return TokenLogprob(
            int(self.sampled[row]), float(values[0]),
            tuple((int(ids[j]), float(values[1 + j])) for j in range(top)))

    def prompt_scores(self, plan: StepPlan, tops: dict[int, int]
                      ) -> dict[int, tuple[TokenLogprob, ...]]:
        """The TokenLogprob of each target (a row token whose target is >= 0, in order)
        of the scoring rows whose request is in `tops` (request id -> alternatives to
        report), by request id.

        Raises:
            ValueError: the record holds no scores, or fewer alternatives than asked.
        """
        if self.scores is None or self.score_ids is None:
            raise ValueError("this step's completion record holds no prompt scores")
        values, ids = self.scores, self.score_ids
        out: dict[int, tuple[TokenLogprob, ...]] = {}
        start = 0  # packed-token index of the row's first token
        for row in plan.rows:
            targets, top = row.score_targets, tops.get(row.request_id)
            if targets is not None and top is not None:
                if not 0 <= top <= ids.shape[1]:
                    raise ValueError(f"top {top} outside [0, {ids.shape[1]}]")
                out[row.request_id] = tuple(
                    TokenLogprob(target, float(values[start + j, 0]),
                                 tuple((int(ids[start + j, i]), float(values[start + j, 1 + i]))
                                       for i in range(top)))
                    for j, target in enumerate(targets) if target >= 0)
            start += row.lane_length
        return out
