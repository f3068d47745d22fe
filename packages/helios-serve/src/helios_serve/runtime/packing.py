"""Shared packing: resolve each graph's value bindings from a StepPlan into staging.

Specification: "Host values and graph state". Sources, types, extents and indexing are
resolved once at startup (`SharedPacking.__init__`); a step only computes the values of
the plan's rows and writes them. Which (source, indexing) pairs exist is the capability
table `helios_tools.capabilities.PACKED_BINDINGS`, which `NativeModel.load` checks a
contract against; tests/serve/runtime/test_capabilities.py packs every pair of it.

Page tables are uploaded incrementally: only entries assigned since the slot's last
upload, unless the slot generation changed. Entry i of a page-table view holds the
request's page i + page_offset (PageTableView, contract.proto): a shifted view skips the
first page_offset pages of `RowPlan.page_ids`. A slot's histogram row is initialized
once, on the step that places the request in the slot.

Index spaces: PACKED_TOKEN entries follow each row's actual token count in row order;
SUBMISSION_ROW entries cover every captured row (padding past the live ones);
ACTIVE_ROW entries cover live rows only; PHYSICAL_REQUEST_ROW entries are slot rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from helios_contract.schema import contract_pb2 as cpb

from ..engine.plan import RowCopy, RowPlan, StepKind, StepPlan

V = cpb

Rows = Sequence[RowPlan]

# Per-row scalar sources: one value per plan row, in submission order (one comprehension
# per binding: packing runs on the host every step, so no call per row).
ROW_VALUES: dict[int, Callable[[Rows], list]] = {
    V.VALUE_SOURCE_SLOT: lambda rows: [r.slot for r in rows],
    V.VALUE_SOURCE_GENERATION: lambda rows: [r.generation for r in rows],
    V.VALUE_SOURCE_QUERY_LENGTH: lambda rows: [r.lane_length for r in rows],
    V.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: lambda rows: [r.lane_length for r in rows],
    # Copied proposals: a lane without candidates has count 0 (and can match nothing).
    V.VALUE_SOURCE_CANDIDATE_COUNT: lambda rows: [len(r.candidates.ids) if r.candidates
                                                  else 0 for r in rows],
    V.VALUE_SOURCE_CANDIDATE_GENERATION: lambda rows: [r.candidates.generation if r.candidates
                                                       else -1 for r in rows],
    V.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT: lambda rows: [
        r.candidates.endpoint if r.candidates else -1 for r in rows],
    V.VALUE_SOURCE_SAMPLING_DECISION: lambda rows: [int(r.sample) for r in rows],
    V.VALUE_SOURCE_PENDING_TOKEN: lambda rows: [r.tokens[-1] for r in rows],
    V.VALUE_SOURCE_CONSUMED_ENDPOINT: lambda rows: [r.start_position + len(r.tokens)
                                                    for r in rows],
    V.VALUE_SOURCE_TEMPERATURE: lambda rows: [r.sampling.temperature for r in rows],
    V.VALUE_SOURCE_TOP_P: lambda rows: [r.sampling.top_p for r in rows],
    V.VALUE_SOURCE_TOP_K: lambda rows: [r.sampling.top_k for r in rows],
    V.VALUE_SOURCE_MIN_P: lambda rows: [r.sampling.min_p for r in rows],
    V.VALUE_SOURCE_PRESENCE_PENALTY: lambda rows: [r.sampling.presence_penalty for r in rows],
    V.VALUE_SOURCE_FREQUENCY_PENALTY: lambda rows: [r.sampling.frequency_penalty
                                                    for r in rows],
    V.VALUE_SOURCE_REPETITION_PENALTY: lambda rows: [r.sampling.repetition_penalty
                                                     for r in rows],
    V.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: lambda rows: [int(r.grammar_mask is not None)
                                                       for r in rows],
    V.VALUE_SOURCE_LOGIT_BIAS_ENABLED: lambda rows: [int(bool(r.sampling.logit_bias))
                                                     for r in rows],
    # -1: the row records no logprobs (non-sampling prefill chunks never do).
    V.VALUE_SOURCE_LOGPROBS: lambda rows: [r.sampling.logprobs if r.sample and
                                           r.sampling.logprobs is not None else -1
                                           for r in rows],
}

# Per-row sources of TRANSFER steps (RESTORE programs): one value per row copy.
COPY_VALUES: dict[int, Callable[[Sequence[RowCopy]], list]] = {
    V.VALUE_SOURCE_RESTORE_SOURCE: lambda copies: [c.source for c in copies],
    V.VALUE_SOURCE_SNAPSHOT_DESTINATION: lambda copies: [c.destination for c in copies],
}

# Per-token sources: the packed values of all rows' tokens, in row order (a speculative
# lane occupies `lane_length` rows: positions, lane and slot of each verified position).
TOKEN_VALUES: dict[int, Callable[[Rows], np.ndarray]] = {
    V.VALUE_SOURCE_PROMPT_TOKENS: lambda rows: np.fromiter(
        (t for r in rows for t in r.tokens), np.int64),
    V.VALUE_SOURCE_PENDING_TOKEN: lambda rows: np.fromiter(
        (t for r in rows for t in r.tokens), np.int64),
    V.VALUE_SOURCE_PROMPT_POSITIONS: lambda rows: np.concatenate(
        [np.arange(r.start_position, r.start_position + r.lane_length) for r in rows]),
    V.VALUE_SOURCE_MIXED_PREFILL_ROW: lambda rows: np.repeat(
        np.arange(len(rows)), [r.lane_length for r in rows]),
    V.VALUE_SOURCE_SLOT: lambda rows: np.repeat(
        np.asarray([r.slot for r in rows], np.int64), [r.lane_length for r in rows]),
}

# The same sources when every row feeds exactly one token (decode): one value per row.
ONE_TOKEN_VALUES: dict[int, Callable[[Rows], list | np.ndarray]] = {
    V.VALUE_SOURCE_PROMPT_TOKENS: lambda rows: [r.tokens[0] for r in rows],
    V.VALUE_SOURCE_PENDING_TOKEN: lambda rows: [r.tokens[0] for r in rows],
    V.VALUE_SOURCE_PROMPT_POSITIONS: lambda rows: [r.start_position for r in rows],
    V.VALUE_SOURCE_MIXED_PREFILL_ROW: lambda rows: np.arange(len(rows)),
    V.VALUE_SOURCE_SLOT: lambda rows: [r.slot for r in rows],
}


@dataclass(frozen=True)
class DirtyRange:
    """Elements [start, end) of row `row` of physical-row buffer `destination`."""

    destination: str
    row: int
    start: int
    end: int


@dataclass(frozen=True)
class _Resolved:
    """One binding with its protobuf fields copied to plain values (read every step)."""

    binding: cpb.ValueBinding
    dest: tuple[np.ndarray, ...]  # per execution frame
    source: int
    indexing: int
    offset: int
    padding: int


class SharedPacking:
    """Bindings of every graph, resolved against the backend's staging buffers.

    Args:
        graphs: the validated contract's GraphContracts (every binding a pair of
            PACKED_BINDINGS and a registered transport destination: checked at load).
        staging: per execution frame, destination name -> host array the backend executes
            that frame from. Request inputs have one array per frame (step N + 1 is packed
            while step N runs); physical-request-row state (page tables, histogram rows)
            is the same host mirror in every frame.
        page_table_views: the contract's page-table views (their page offsets).
    """

    def __init__(self, graphs: Sequence[cpb.GraphContract],
                 staging: Sequence[Mapping[str, np.ndarray]],
                 page_table_views: Sequence[cpb.PageTableView] = ()):
        self._graphs: dict[str, list[_Resolved]] = {}
        for graph in graphs:
            self._graphs[graph.name] = [
                _Resolved(b, tuple(frame[b.destination] for frame in staging), b.source,
                          b.indexing, b.offset, b.padding) for b in graph.bindings]
        # page-table buffer -> pages of RowPlan.page_ids before its entry 0.
        self._page_offset = {v.buffer: v.page_offset for v in page_table_views}
        # slot -> (generation, page entries uploaded); see the module docstring.
        self._uploaded: dict[tuple[str, int], tuple[int, int]] = {}

    def pack(self, graph: str, plan: StepPlan, rows: int, tokens: int,
             frame: int = 0) -> list[DirtyRange]:
        """Write every binding of `graph` for `plan` into `frame`'s staging (rows/tokens:
        captured capacities).

        Returns:
            The physical-request-row ranges written this step (destination, slot row,
            first and end element within the row), so a device backend uploads only those
            from its host mirror; the other bindings are rewritten whole every step.
        """
        dirty: list[DirtyRange] = []
        for item in self._graphs[graph]:
            dest = item.dest[frame]
            if item.indexing == V.INDEXING_PHYSICAL_REQUEST_ROW:
                self._pack_physical(item.binding, dest, plan, dirty)
            elif item.indexing == V.INDEXING_PACKED_TOKEN:
                self._pack_tokens(item, dest, plan, tokens)
            elif item.indexing == V.INDEXING_SCALAR:
                dest.reshape(-1)[0] = _scalar(item.binding, plan)
            else:
                self._pack_rows(item, dest, plan, rows)
        return dirty

    def _pack_tokens(self, item: _Resolved, dest: np.ndarray, plan: StepPlan,
                     capacity: int) -> None:
        rows = plan.rows
        if all(r.lane_length == 1 for r in rows):
            values = np.asarray(ONE_TOKEN_VALUES[item.source](rows), dtype=dest.dtype)
        else:
            values = TOKEN_VALUES[item.source](rows)
        n = len(values)
        dest[:n] = values + dest.dtype.type(item.offset)
        if capacity > n:
            dest[n:capacity] = item.padding

    def _pack_rows(self, item: _Resolved, dest: np.ndarray, plan: StepPlan,
                   capacity: int) -> None:
        rows = plan.rows
        n = len(plan.copies) if plan.kind is StepKind.TRANSFER else len(rows)
        pad_to = capacity if item.indexing == V.INDEXING_SUBMISSION_ROW else n
        source = item.source
        if source in COPY_VALUES:
            dest[:n] = COPY_VALUES[source](plan.copies)
        elif source == V.VALUE_SOURCE_SEED_BITS:
            for i, r in enumerate(rows):
                dest[i] = (r.sampling.seed & 0xFFFFFFFF, (r.sampling.seed >> 32) & 0xFFFFFFFF)
        elif source == V.VALUE_SOURCE_CANDIDATE_IDS:
            dest[:pad_to] = item.padding
            for i, r in enumerate(rows):
                if r.candidates:
                    ids = r.candidates.ids[:dest.shape[1]]
                    dest[i, :len(ids)] = ids
            return
        elif source == V.VALUE_SOURCE_GRAMMAR_MASK:
            for i, r in enumerate(rows):
                if r.grammar_mask is not None:
                    dest[i] = r.grammar_mask
            return  # rows without a mask are ignored by GRAMMAR_MASK_ENABLED = 0
        elif source == V.VALUE_SOURCE_CONSTANT:
            dest[:pad_to] = item.binding.constant_value
            return
        elif n == 1:  # batch 1: a scalar store is several times cheaper than a slice
            dest[0] = ROW_VALUES[source](rows)[0] + item.offset
        else:
            values = np.asarray(ROW_VALUES[source](rows), dtype=dest.dtype)
            dest[:n] = values + dest.dtype.type(item.offset)
        if pad_to > n:
            dest[n:pad_to] = item.padding

    def _pack_physical(self, b, dest: np.ndarray, plan: StepPlan,
                       dirty: list[DirtyRange]) -> None:
        if b.source == V.VALUE_SOURCE_PAGE_TABLE:
            shift = self._page_offset.get(b.destination, 0)
            for r in plan.rows:
                key = (b.destination, r.slot)
                generation, done = self._uploaded.get(key, (-1, 0))
                if generation != r.generation:
                    done = 0
                entries = max(len(r.page_ids) - shift, 0)  # view entry i = page i + shift
                if entries > done:
                    dest[r.slot, done:entries] = r.page_ids[shift + done:]
                    dirty.append(DirtyRange(b.destination, r.slot, done, entries))
                self._uploaded[key] = (r.generation, entries)
        elif b.source == V.VALUE_SOURCE_PROMPT_HISTOGRAM:
            for r in plan.rows:
                if r.histogram_tokens is not None:
                    width = dest.shape[1]
                    dest[r.slot] = np.bincount(np.asarray(r.histogram_tokens, dtype=np.int64),
                                               minlength=width)[:width]
                    dirty.append(DirtyRange(b.destination, r.slot, 0, width))
        elif b.source == V.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS:
            # Read only for lanes whose GRAMMAR_MASK_ENABLED is set, rows 1..count: a
            # constrained lane with candidates must carry their masks; only those slots'
            # rows are written (and uploaded).
            for i, r in enumerate(plan.rows):
                if r.candidates and r.grammar_mask is not None:
                    masks = r.candidates.grammar_masks
                    k = min(len(r.candidates.ids), dest.shape[1])
                    if masks is None or len(masks) < k:
                        raise ValueError(f"row {i}: a constrained lane's copied candidates "
                                         "need their grammar masks (CopiedCandidates."
                                         "grammar_masks)")
                    dest[r.slot, :k] = masks[:k]
                    dirty.append(DirtyRange(b.destination, r.slot, 0, k * dest.shape[2]))
        elif b.source == V.VALUE_SOURCE_LOGIT_BIAS:
            # Written on the step that places a request in its slot (histogram_tokens
            # set), only for a request with a bias: LOGIT_BIAS_ENABLED = 0 ignores the
            # stale row of any other request.
            for r in plan.rows:
                if r.histogram_tokens is not None and r.sampling.logit_bias:
                    row = dest[r.slot]
                    row[:] = 0
                    ids, values = zip(*r.sampling.logit_bias, strict=True)
                    row[list(ids)] = values
                    dirty.append(DirtyRange(b.destination, r.slot, 0, dest.shape[1]))


def _scalar(b: cpb.ValueBinding, plan: StepPlan) -> int:
    if b.source == V.VALUE_SOURCE_LIVE_ROW_COUNT:
        return len(plan.rows) + b.offset
    if b.source == V.VALUE_SOURCE_CONSTANT:
        return b.constant_value
    raise AssertionError("checked at load")
