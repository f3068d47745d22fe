"""Shared packing: resolve each graph's value bindings from a StepPlan into staging.

Specification: "Host values and graph state". Sources, types, extents and indexing are
resolved once at startup (`SharedPacking.__init__`); a step only computes the values of
the plan's rows and writes them. Page tables are uploaded incrementally: only entries
assigned since the slot's last upload, unless the slot generation changed. A slot's
histogram row is initialized once, on the step that places the request in the slot.

Index spaces: PACKED_TOKEN entries follow each row's actual token count in row order;
SUBMISSION_ROW entries cover every captured row (padding past the live ones);
ACTIVE_ROW entries cover live rows only; PHYSICAL_REQUEST_ROW entries are slot rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from helios_contract.schema import contract_pb2 as cpb

from ..engine.plan import RowPlan, StepPlan
from .errors import UnsupportedBinding

V = cpb

# Per-row scalar sources: value of one row.
ROW_VALUES: dict[int, Callable[[int, RowPlan], float | int]] = {
    V.VALUE_SOURCE_SLOT: lambda i, r: r.slot,
    V.VALUE_SOURCE_GENERATION: lambda i, r: r.generation,
    V.VALUE_SOURCE_QUERY_LENGTH: lambda i, r: len(r.tokens),
    V.VALUE_SOURCE_SAMPLING_DECISION: lambda i, r: int(r.sample),
    V.VALUE_SOURCE_PENDING_TOKEN: lambda i, r: r.tokens[-1],
    V.VALUE_SOURCE_CONSUMED_ENDPOINT: lambda i, r: r.start_position + len(r.tokens),
    V.VALUE_SOURCE_TEMPERATURE: lambda i, r: r.sampling.temperature,
    V.VALUE_SOURCE_TOP_P: lambda i, r: r.sampling.top_p,
    V.VALUE_SOURCE_TOP_K: lambda i, r: r.sampling.top_k,
    V.VALUE_SOURCE_MIN_P: lambda i, r: r.sampling.min_p,
    V.VALUE_SOURCE_PRESENCE_PENALTY: lambda i, r: r.sampling.presence_penalty,
    V.VALUE_SOURCE_FREQUENCY_PENALTY: lambda i, r: r.sampling.frequency_penalty,
    V.VALUE_SOURCE_REPETITION_PENALTY: lambda i, r: r.sampling.repetition_penalty,
    V.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: lambda i, r: int(r.grammar_mask is not None),
}

# Per-token sources: values of one row's tokens.
TOKEN_VALUES: dict[int, Callable[[int, RowPlan], np.ndarray]] = {
    V.VALUE_SOURCE_PROMPT_TOKENS: lambda i, r: np.asarray(r.tokens),
    V.VALUE_SOURCE_PENDING_TOKEN: lambda i, r: np.asarray(r.tokens),
    V.VALUE_SOURCE_PROMPT_POSITIONS: lambda i, r: np.arange(
        r.start_position, r.start_position + len(r.tokens)),
    V.VALUE_SOURCE_MIXED_PREFILL_ROW: lambda i, r: np.full(len(r.tokens), i),
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
    binding: cpb.ValueBinding
    dest: tuple[np.ndarray, ...]  # per execution frame


class SharedPacking:
    """Bindings of every graph, resolved against the backend's staging buffers.

    Args:
        graphs: the contract's GraphContracts.
        staging: per execution frame, destination name -> host array the backend executes
            that frame from. Request inputs have one array per frame (step N + 1 is packed
            while step N runs); physical-request-row state (page tables, histogram rows)
            is the same host mirror in every frame.

    Raises:
        UnsupportedBinding: a source/indexing pair this runtime cannot supply, or a
            destination that is not a staging buffer.
    """

    def __init__(self, graphs: list[cpb.GraphContract],
                 staging: Sequence[Mapping[str, np.ndarray]]):
        self._graphs: dict[str, list[_Resolved]] = {}
        for graph in graphs:
            resolved = []
            for b in graph.bindings:
                if any(b.destination not in frame for frame in staging):
                    raise UnsupportedBinding(f"graph {graph.name}: binding destination "
                                             f"{b.destination!r} is not a buffer")
                _check_supported(graph.name, b)
                resolved.append(_Resolved(b, tuple(frame[b.destination] for frame in staging)))
            self._graphs[graph.name] = resolved
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
            b = item.binding
            dest = item.dest[frame]
            if b.indexing == V.INDEXING_PHYSICAL_REQUEST_ROW:
                self._pack_physical(b, dest, plan, dirty)
            elif b.indexing == V.INDEXING_PACKED_TOKEN:
                self._pack_tokens(b, dest, plan, tokens)
            elif b.indexing == V.INDEXING_SCALAR:
                dest.reshape(-1)[0] = _scalar(b, plan)
            else:
                self._pack_rows(b, dest, plan, rows)
        return dirty

    def _pack_tokens(self, b, dest: np.ndarray, plan: StepPlan, capacity: int) -> None:
        values = np.concatenate([TOKEN_VALUES[b.source](i, r) for i, r in enumerate(plan.rows)])
        n = len(values)
        dest[:n] = values + b.offset
        dest[n:capacity] = b.padding

    def _pack_rows(self, b, dest: np.ndarray, plan: StepPlan, capacity: int) -> None:
        n = len(plan.rows)
        pad_to = capacity if b.indexing == V.INDEXING_SUBMISSION_ROW else n
        if b.source == V.VALUE_SOURCE_SEED_BITS:
            for i, r in enumerate(plan.rows):
                dest[i] = (r.sampling.seed & 0xFFFFFFFF, (r.sampling.seed >> 32) & 0xFFFFFFFF)
            dest[n:pad_to] = b.padding
            return
        if b.source == V.VALUE_SOURCE_GRAMMAR_MASK:
            for i, r in enumerate(plan.rows):
                if r.grammar_mask is not None:
                    dest[i] = r.grammar_mask
            return  # rows without a mask are ignored by GRAMMAR_MASK_ENABLED = 0
        if b.source == V.VALUE_SOURCE_CONSTANT:
            dest[:pad_to] = b.constant_value
            return
        values = [ROW_VALUES[b.source](i, r) for i, r in enumerate(plan.rows)]
        dest[:n] = np.asarray(values, dtype=dest.dtype) + dest.dtype.type(b.offset)
        dest[n:pad_to] = b.padding

    def _pack_physical(self, b, dest: np.ndarray, plan: StepPlan,
                       dirty: list[DirtyRange]) -> None:
        if b.source == V.VALUE_SOURCE_PAGE_TABLE:
            for r in plan.rows:
                key = (b.destination, r.slot)
                generation, done = self._uploaded.get(key, (-1, 0))
                if generation != r.generation:
                    done = 0
                if len(r.page_ids) > done:
                    dest[r.slot, done:len(r.page_ids)] = r.page_ids[done:]
                    dirty.append(DirtyRange(b.destination, r.slot, done, len(r.page_ids)))
                self._uploaded[key] = (r.generation, len(r.page_ids))
        elif b.source == V.VALUE_SOURCE_PROMPT_HISTOGRAM:
            for r in plan.rows:
                if r.histogram_tokens is not None:
                    width = dest.shape[1]
                    dest[r.slot] = np.bincount(np.asarray(r.histogram_tokens, dtype=np.int64),
                                               minlength=width)[:width]
                    dirty.append(DirtyRange(b.destination, r.slot, 0, width))


def _scalar(b: cpb.ValueBinding, plan: StepPlan) -> int:
    if b.source == V.VALUE_SOURCE_LIVE_ROW_COUNT:
        return len(plan.rows) + b.offset
    if b.source == V.VALUE_SOURCE_CONSTANT:
        return b.constant_value
    raise AssertionError("checked at load")


def _check_supported(graph: str, b: cpb.ValueBinding) -> None:
    ok = {
        V.INDEXING_PACKED_TOKEN: set(TOKEN_VALUES),
        V.INDEXING_SUBMISSION_ROW: set(ROW_VALUES) | {V.VALUE_SOURCE_SEED_BITS,
                                                      V.VALUE_SOURCE_GRAMMAR_MASK,
                                                      V.VALUE_SOURCE_CONSTANT},
        V.INDEXING_PHYSICAL_REQUEST_ROW: {V.VALUE_SOURCE_PAGE_TABLE,
                                          V.VALUE_SOURCE_PROMPT_HISTOGRAM},
        V.INDEXING_SCALAR: {V.VALUE_SOURCE_LIVE_ROW_COUNT, V.VALUE_SOURCE_CONSTANT},
    }
    ok[V.INDEXING_ACTIVE_ROW] = ok[V.INDEXING_SUBMISSION_ROW]
    if b.source not in ok.get(b.indexing, set()):
        raise UnsupportedBinding(
            f"graph {graph}: binding {b.destination!r} source "
            f"{V.ValueSource.Name(b.source)} with {V.Indexing.Name(b.indexing)} is not "
            "supported by this runtime")
