"""The capacity rules: whether a request fits the prepared capacities at all, which
captured capacity a step pads to, a MIXED step's token budget, and whether evicted pages
go to the host tier.

Plain functions over ModelGeometry; preparation and the scheduler both call them, so each
rule is written only here.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from helios_serve.engine.plan import ModelGeometry
from helios_serve.scheduler.request import (
    AdmissionError,
    AdmissionReason,
    SchedRequest,
    TransferCost,
)


def smallest_capacity(capacities: Seq[int], n: int) -> int | None:
    """Smallest captured capacity >= n (capacities ascending), or None."""
    for c in capacities:
        if c >= n:
            return c
    return None


def widest_mixed(capacities: Seq[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Each captured MIXED token capacity with the rows of its widest variant.

    Args:
        capacities: geometry.mixed_capacities, (rows, packed tokens) pairs.

    Returns:
        (packed tokens, rows) pairs, token capacity ascending, one per token capacity.
    """
    rows: dict[int, int] = {}
    for b, t in capacities:
        rows[t] = max(rows.get(t, 0), b)
    return tuple(sorted(rows.items()))


# A MIXED step's small budget must clear the owed prompt tokens within this many steps;
# a larger backlog takes the largest budget (mixed_budget).
DRAIN_STEPS = 8


def mixed_budget(widest: Seq[tuple[int, int]], owing: int, lanes: int,
                 owed: int) -> tuple[int, int]:
    """The token budget of one MIXED step and the rows its plan may take (the rule of
    docs/mixed.md, "Token budget"; Scheduler._build_mixed calls it once per mixed step).

    The step delays the first tokens of the `owing` requests (W) and the next tokens of
    its `lanes` decode lanes (L). When W >= L, it delays at least as many first tokens as
    next tokens: the largest capacity, so prompts finish in the fewest steps. When W < L,
    the smallest capacity that holds the lanes and at least one prompt token in both its
    packed tokens and its widest variant's rows, and whose prompt share (tokens - L) clears
    the `owed` prompt tokens within DRAIN_STEPS steps, so the running streams' step stays
    short while a few prompts arrive; the largest when none does. The drain condition is
    what keeps a burst from trickling in beside many lanes: on the H100 at dab75f2, 256
    requests of 1,024 prompt tokens under the W rule alone ran 679 MIXED steps of ~140
    lanes with at most ~370 prompt tokens each (885 output tokens/s; 2,052 with plain
    prefill steps at cc2503e; bench/results/h100_2026-12-06k/; the steps themselves were
    slow too: docs/mixed.md, "A model of the rule"). Sarathi-Serve (Agrawal et
    al., OSDI 2024) sizes one budget per deployment from a time-between-tokens target (its
    strict and relaxed targets: 512 and 2,048 tokens), as vLLM V1
    (max_num_batched_tokens) and SGLang (chunked_prefill_size) take one fixed budget; this
    rule picks per step among the captured capacities by who waits and how much, with no
    timing input, so it is deterministic.

    Args:
        widest: `widest_mixed(geometry.mixed_capacities)`; nonempty.
        owing: W, requests owing prompt tokens that the step could advance (running
            requests mid-prompt and admissible waiting requests).
        lanes: L, decode lanes the step takes (each one packed token and one row).
        owed: the prompt tokens those W requests still owe (before prefix reuse).

    Returns:
        (packed tokens, rows): the budget, a captured token capacity, and the rows of
        its widest variant (lanes and prefill chunks together).
    """
    if owing < lanes:
        for tokens, rows in widest:
            if tokens > lanes and rows > lanes and owed <= DRAIN_STEPS * (tokens - lanes):
                return tokens, rows
    return widest[-1]


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for positive b, in integers."""
    return -(-a // b)


def check_capacity(geometry: ModelGeometry, request: SchedRequest) -> AdmissionError | None:
    """The admission rule: whether a request fits the prepared capacities at all.

    Preparation calls it (so a request that can never fit is refused before any
    response byte) and `Scheduler.add` calls it again; it is written only here.

    Returns:
        None, or the first capacity the prompt plus the output limit exceeds
        (context, page-table width, cache pages); `prompt_fits` tells whether the
        prompt with a single output token would have fit.
    """
    g = geometry
    prompt = len(request.prompt_tokens)
    rid = request.request_id
    if prompt == 0:
        return AdmissionError(rid, AdmissionReason.EMPTY_PROMPT, "prompt has no tokens", False)
    if request.max_output_tokens < 1:
        return AdmissionError(
            rid,
            AdmissionReason.INVALID_OUTPUT_LIMIT,
            f"max_output_tokens {request.max_output_tokens} < 1",
        )
    return _exceeded(g, rid, prompt, request.max_output_tokens)


def _exceeded(g: ModelGeometry, rid: int, prompt: int, output: int) -> AdmissionError | None:
    # A sliding-window region (g.window_tokens) bounds no request: a request holds at most
    # ceil(window / page_tokens) + 1 of its pages while decoding, which the pool holds
    # (rule capacity.window_pages), and a prefill chunk shortens to the pages free.
    total = prompt + output
    pages = ceil_div(total, g.page_tokens)  # entries of each page-table view
    owned = pages + g.extra_pages_per_request  # pages the request holds at its end
    if total <= g.context_tokens and pages <= g.max_pages_per_request and owned <= g.num_pages:
        return None
    prompt_fits = output > 1 and _exceeded(g, rid, prompt, 1) is None
    if total > g.context_tokens:
        return AdmissionError(
            rid,
            AdmissionReason.CONTEXT_EXCEEDED,
            f"prompt {prompt} + max output {output} tokens exceeds the context of "
            f"{g.context_tokens} tokens",
            prompt_fits,
        )
    if pages > g.max_pages_per_request:
        return AdmissionError(
            rid,
            AdmissionReason.PAGE_TABLE_EXCEEDED,
            f"{total} tokens need {pages} pages; the page table holds {g.max_pages_per_request}",
            prompt_fits,
        )
    if owned > g.num_pages:
        return AdmissionError(
            rid,
            AdmissionReason.CACHE_EXCEEDED,
            f"{total} tokens need {owned} pages; the cache has {g.num_pages}",
            prompt_fits,
        )
    raise AssertionError("unreachable: some capacity is exceeded")


def host_tier_pays(geometry: ModelGeometry, cost: TransferCost) -> bool:
    """Whether pages leaving the device go to the host tier (and come back by copy) or
    are dropped and recomputed; decided once, at startup, for every page alike.

    Cost rule (TransferCost.swap_pays): a page kept in the host tier is copied out once
    (at its eviction, or ahead of it while idle) and back once (at a revisit), each copy
    one row of a TRANSFER step holding up to `transfer_rows` copies, so a step's fixed
    cost is shared by that many pages:

        swap      = 2 * (transfer_step_s / transfer_rows + page_copy_s)
        recompute = page_tokens / prefill_tokens_per_s

    Swap when swap < recompute. A revisit of H host pages then takes ceil(H /
    transfer_rows) steps (one for SmolLM2's 512-row programs: a whole 8,192-token
    history), its snapshot's row joining them when the host tier holds it too.
    """
    rows = geometry.transfer_rows
    return rows > 0 and cost.swap_pays(geometry.page_tokens, 1, 1 / rows)
