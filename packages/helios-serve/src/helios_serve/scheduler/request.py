"""Data-only types crossing the scheduler boundary."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from helios_serve.engine.plan import PromptImage, SamplingParams


@dataclass(frozen=True)
class SchedRequest:
    """A prepared request as the scheduler sees it.

    Stop tokens, stop strings and grammar are the worker's business; the
    scheduler only needs the token budget.

    Attributes:
        request_id: process-local id, unique among live requests.
        prompt_tokens: prompt token ids (input vocabulary).
        max_output_tokens: output limit (tokens), >= 1.
        sampling: sampling parameters after defaults.
        needs_feedback: the worker must see each sampled token before another round is
            submitted (grammar, host stops): while such a request is live, the scheduler
            keeps one plan outstanding (specification: completion feedback).
        width_one: the request's speculative lanes are one position long (no drafts):
            constrained requests, whose grammar mask covers only the next token --
            unless `candidate_filter` is set, history drafting is on and the core binds
            per-position candidate grammar masks (ModelGeometry.candidate_masks): then
            its lanes verify the copied candidates its grammar accepts, and no more.
        candidate_filter: a constrained request's grammar check of copied candidates:
            given candidate ids (following the request's tokens so far), how many
            leading ones the grammar accepts (frontend.grammar.GrammarState.
            candidate_prefix). None: lanes stay at width one.
        fork_of: another choice of the same prompt (n > 1): this request is admitted
            only once that one's prompt has been computed, so it shares the prompt's
            complete cached pages and computes only the tokens of the last, partial
            page (its own private page) before sampling.
        publish_endpoints: prompt positions (tokens, ascending, each in
            [1, len(prompt_tokens)]) where the template marks the end of a prompt turn:
            once the committed state reaches one, a snapshot is published there.
        score_prompt: score every prompt token after the first (prompt log
            probabilities): its prefill rows carry targets (RowPlan.score_targets) and
            run SCORED_PREFILL programs, and it reuses no cached prefix (every position's
            logits are needed).
        images: the prompt's images, spans ascending (PromptImage): chunks never end
            inside a span, and the prefix cache keys feature positions by content.
    """

    request_id: int
    prompt_tokens: tuple[int, ...]
    max_output_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    needs_feedback: bool = False
    width_one: bool = False
    fork_of: int | None = None
    publish_endpoints: tuple[int, ...] = ()
    score_prompt: bool = False
    images: tuple[PromptImage, ...] = ()
    candidate_filter: Callable[[tuple[int, ...]], int] | None = field(
        default=None, compare=False, repr=False)


class AdmissionReason(enum.Enum):
    """Why a request is outside the prepared capacities."""

    EMPTY_PROMPT = "empty_prompt"
    INVALID_OUTPUT_LIMIT = "invalid_output_limit"  # max_output_tokens < 1
    CONTEXT_EXCEEDED = "context_exceeded"  # prompt + output > context_tokens
    PAGE_TABLE_EXCEEDED = "page_table_exceeded"  # > max_pages_per_request pages
    CACHE_EXCEEDED = "cache_exceeded"  # more pages than the cache has


@dataclass(frozen=True)
class AdmissionError:
    """A rejected request (a value, not an exception: docs/architecture.md).

    Attributes:
        request_id: the rejected request.
        reason: which prepared capacity it exceeds.
        detail: one human-readable line with the numbers.
        prompt_fits: the prompt with one output token would fit: the output limit is
            at fault, not the prompt.
    """

    request_id: int
    reason: AdmissionReason
    detail: str
    prompt_fits: bool = True


class FinishReason(enum.StrEnum):
    """Why a request ended: the one enum of the output pipeline, worker, scheduler and
    responses. stop, length and tool_calls are OpenAI finish reasons; cancelled and
    error are never presented (the reader left; a terminal error event is sent)."""

    STOP = "stop"  # EOS, stop token or stop string
    LENGTH = "length"  # output limit
    TOOL_CALLS = "tool_calls"  # EOS after completed tool calls
    CANCELLED = "cancelled"  # the reader dropped the response
    ERROR = "error"  # execution or output failure


class CompletionError(RuntimeError):
    """A completion record disagrees with the plan it claims to complete."""


@dataclass(frozen=True, init=False)
class RowResult:
    """One completed plan row of a live request.

    Attributes:
        request_id: the request.
        token_id: the sampled token appended to its output, or None for a row
            that does not sample (a non-final prefill chunk).
        output_tokens: output length after this row (tokens).
    """

    request_id: int
    token_id: int | None
    output_tokens: int

    # One per completed row per step: fills the instance dict directly instead of the
    # frozen dataclass's object.__setattr__ per field (~1.5 -> ~0.4 us on CPython 3.11).
    def __init__(self, request_id: int, token_id: int | None, output_tokens: int) -> None:
        d = self.__dict__
        d["request_id"] = request_id
        d["token_id"] = token_id
        d["output_tokens"] = output_tokens


class RowResults:
    """The RowResults of a completed plain decode step as three lists (Lifecycle.complete
    returns it for a plan whose rows stayed unbuilt): a sequence of RowResult, each built
    when read, so the steady step builds none; `columns` gives the lists themselves.

    Attributes:
        request_ids: int per result.
        token_ids: the sampled id per result (int: every row of such a step samples).
        output_tokens: output length after the row, per result.
    """

    __slots__ = ("request_ids", "token_ids", "output_tokens")

    def __init__(self, request_ids: list[int], token_ids: list[int],
                 output_tokens: list[int]) -> None:
        self.request_ids = request_ids
        self.token_ids = token_ids
        self.output_tokens = output_tokens

    def columns(self) -> zip:
        """(request_id, token_id, output_tokens) per result, in order."""
        return zip(self.request_ids, self.token_ids, self.output_tokens, strict=True)

    def __len__(self) -> int:
        return len(self.request_ids)

    def __getitem__(self, i: int) -> RowResult:
        return RowResult(self.request_ids[i], self.token_ids[i], self.output_tokens[i])

    def __iter__(self):
        return (RowResult(*r) for r in self.columns())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowResults | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # mutable lists: unhashable, as a list of results is

    def __repr__(self) -> str:
        return f"RowResults({list(self)!r})"


@dataclass(frozen=True)
class FinishedRequest:
    """Summary returned by `Scheduler.finish` / `Scheduler.cancel`.

    Attributes:
        request_id: the request.
        reason: finish reason.
        output_tokens: generated ids (including a final EOS/stop token).
        reused_prompt_tokens: prompt tokens served from the cache at first admission
            (complete pages, host-tier pages and a snapshot's tail; 0 if it never ran).
        preemptions: times it was preempted and recomputed.
    """

    request_id: int
    reason: FinishReason
    output_tokens: tuple[int, ...]
    reused_prompt_tokens: int
    preemptions: int


@dataclass(frozen=True)
class TransferCost:
    """What moving cache rows and recomputing tokens cost on a backend (seconds), for the
    swap-or-recompute rule (`swap_pays`). Defaults: the CPU backend serving SmolLM2
    (NativeModel.transfer_cost gives each backend's figures and their sources).

    Attributes:
        transfer_step_s: fixed cost of one TRANSFER step (launch and fence).
        page_copy_s: one page row copied one way between tiers.
        prefill_tokens_per_s: prefill throughput.
    """

    transfer_step_s: float = 1e-3
    page_copy_s: float = 2e-4
    prefill_tokens_per_s: float = 600.0

    def swap_pays(self, tokens: float, rows: float, steps: float) -> bool:
        """Whether keeping `tokens` of history by copy beats recomputing them.

        Cost rule: keeping them copies `rows` page rows out of the device and back in,
        in `steps` TRANSFER steps each way; recomputing prefills them again:

            swap      = 2 * (steps * transfer_step_s + rows * page_copy_s)
            recompute = tokens / prefill_tokens_per_s

        Swap when swap < recompute.
        """
        swap = 2 * (steps * self.transfer_step_s + rows * self.page_copy_s)
        return swap < tokens / self.prefill_tokens_per_s


@dataclass(frozen=True)
class SchedulerStats:
    """Counters and gauges for the metrics layer (a snapshot; no request ids).

    Gauges: running, waiting, outstanding_frames, slots_*, pages_*.
    Counters: everything else, monotonic over the scheduler's life.
    At idle: running == waiting == outstanding_frames == 0,
    slots_free == slots_total and pages_used == 0 (see `idle`).
    """

    running: int
    waiting: int
    outstanding_frames: int
    slots_total: int
    slots_free: int
    pages_total: int
    pages_free: int
    pages_used: int
    pages_cached: int
    pages_evictable: int
    prefix_queries: int
    prefix_hit_tokens: int
    prefix_hit_pages: int
    page_evictions: int
    pages_published: int
    preemptions: int
    admitted: int
    readmitted: int
    prefill_steps: int
    decode_steps: int
    prompt_tokens_computed: int
    rejected: dict[AdmissionReason, int]
    finished: dict[FinishReason, int]
    speculative_steps: int = 0
    spec_draft_tokens: int = 0  # drafts offered to verification (lane length - 1)
    spec_accepted_tokens: int = 0
    # accepted drafts by draft position (index 0 = first draft), and lanes with drafts by
    # emitted length (index n = n tokens emitted by one lane in one round)
    spec_accepted_per_position: tuple[int, ...] = ()
    spec_accepted_lengths: tuple[int, ...] = ()
    # of spec_draft_tokens / spec_accepted_tokens: the copied candidates (history drafting)
    spec_copied_draft_tokens: int = 0
    spec_copied_accepted_tokens: int = 0
    # source ("learned", "copied") -> per draft position k, lanes that offered a draft of
    # that source at k / in which it was accepted
    spec_offered_by_source: dict[str, tuple[int, ...]] = field(default_factory=dict)
    spec_accepted_by_source: dict[str, tuple[int, ...]] = field(default_factory=dict)
    spec_policy_decisions: dict[str, int] = field(default_factory=dict)  # program -> steps
    # Exact-endpoint snapshots and the host tier (counters except the *_rows gauges).
    snapshot_publications: int = 0
    snapshot_evictions: int = 0
    snapshot_hits: int = 0
    snapshots_resident: int = 0
    continuation_rows_used: int = 0
    host_rows_total: int = 0
    host_rows_used: int = 0
    host_hits: int = 0
    host_swap_ins: int = 0
    host_swap_outs: int = 0
    host_evictions: int = 0
    transfer_steps: int = 0
    preemption_swaps: int = 0
    # The sliding-window region's pool (gauges; released: counter of pages returned
    # behind the window); all 0 without a window region.
    window_pages_total: int = 0
    window_pages_used: int = 0
    window_pages_released: int = 0
    mixed_steps: int = 0  # MIXED steps issued (decode lanes and prefill chunks together)

    @property
    def idle(self) -> bool:
        """No requests, no frames, every slot free, no page referenced."""
        return (
            self.running == 0
            and self.waiting == 0
            and self.outstanding_frames == 0
            and self.slots_free == self.slots_total
            and self.pages_used == 0
            and self.window_pages_used == 0
        )
