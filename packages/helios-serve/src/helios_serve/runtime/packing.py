"""Shared packing: resolve each graph's value bindings from a StepPlan into staging.

Specification: "Host values and graph state". Sources, types, extents and indexing are
resolved once at startup (`SharedPacking.__init__`); a step only computes the values of
the plan's rows and writes them. Which (source, indexing) pairs exist is the capability
table `helios_tools.capabilities.PACKED_BINDINGS`, which `NativeModel.load` checks a
contract against; tests/serve/runtime/test_capabilities.py packs every pair of it.

Page tables are uploaded incrementally: only entries assigned since the slot's last
upload, unless the slot generation changed. Entry i of a page-table view holds the
request's page i + page_offset (PageTableView, contract.proto): a shifted view skips the
first page_offset pages of `RowPlan.page_ids` (a sliding-window region's view holds
`RowPlan.window_page_ids`; entries behind the window are never read, so the stale
ids uploaded there earlier stay). A slot's histogram row is initialized
once, on the step that places the request in the slot.

Index spaces: PACKED_TOKEN entries follow each row's actual token count in row order;
SUBMISSION_ROW entries cover every captured row (padding past the live ones);
ACTIVE_ROW entries cover live rows only; PHYSICAL_REQUEST_ROW entries are slot rows.

Host cost (bench/packing.py): a step's per-row work is one pass per binding over the rows
for the values that change per row and step (ROW_VALUES; values several bindings share
are computed once per step, `_Step`), and one gather for the values that depend only on
the request's SamplingParams (SAMPLING_VALUES): those are kept per slot, written when a
slot's rows start carrying another SamplingParams object, and a destination only these
bindings write is not rewritten while its rows' SamplingParams stay the same.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from helios_contract.schema import contract_pb2 as cpb

from ..engine.plan import RowColumns, RowCopy, RowPlan, SamplingParams, StepKind, StepPlan

V = cpb

Rows = Sequence[RowPlan]

# Per-row scalar sources: one value per plan row, in submission order (one comprehension
# per binding: packing runs on the host every step, so no call per row).
ROW_VALUES: dict[int, Callable[[Rows], list]] = {
    V.VALUE_SOURCE_SLOT: lambda rows: [r.slot for r in rows],
    V.VALUE_SOURCE_GENERATION: lambda rows: [r.generation for r in rows],
    # RowPlan.lane_length, spelled out (a property call per row costs more than the read).
    V.VALUE_SOURCE_QUERY_LENGTH: lambda rows: [r.query_length or len(r.tokens) for r in rows],
    V.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: lambda rows: [r.query_length or len(r.tokens)
                                                           for r in rows],
    # Copied proposals: a lane without candidates has count 0 (and can match nothing).
    V.VALUE_SOURCE_CANDIDATE_COUNT: lambda rows: [len(r.candidates.ids) if r.candidates
                                                  else 0 for r in rows],
    V.VALUE_SOURCE_CANDIDATE_GENERATION: lambda rows: [r.candidates.generation if r.candidates
                                                       else -1 for r in rows],
    V.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT: lambda rows: [
        r.candidates.endpoint if r.candidates else -1 for r in rows],
    # Booleans: stored as 0 / 1 in the integer destination.
    V.VALUE_SOURCE_SAMPLING_DECISION: lambda rows: [r.sample for r in rows],
    V.VALUE_SOURCE_PENDING_TOKEN: lambda rows: [r.tokens[-1] for r in rows],
    V.VALUE_SOURCE_CONSUMED_ENDPOINT: lambda rows: [r.start_position + len(r.tokens)
                                                    for r in rows],
    V.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: lambda rows: [r.grammar_mask is not None
                                                       for r in rows],
    # -1: the row records no logprobs (non-sampling prefill chunks never do).
    V.VALUE_SOURCE_LOGPROBS: lambda rows: [r.sampling.logprobs if r.sample and
                                           r.sampling.logprobs is not None else -1
                                           for r in rows],
}

# Per-row sources that are a function of the row's SamplingParams alone (one request's
# value, the same in each of its rows): kept per slot and gathered (SharedPacking._hold).
SAMPLING_VALUES: dict[int, Callable[[SamplingParams], object]] = {
    V.VALUE_SOURCE_TEMPERATURE: lambda s: s.temperature,
    V.VALUE_SOURCE_TOP_P: lambda s: s.top_p,
    V.VALUE_SOURCE_TOP_K: lambda s: s.top_k,
    V.VALUE_SOURCE_MIN_P: lambda s: s.min_p,
    V.VALUE_SOURCE_PRESENCE_PENALTY: lambda s: s.presence_penalty,
    V.VALUE_SOURCE_FREQUENCY_PENALTY: lambda s: s.frequency_penalty,
    V.VALUE_SOURCE_REPETITION_PENALTY: lambda s: s.repetition_penalty,
    V.VALUE_SOURCE_LOGIT_BIAS_ENABLED: lambda s: int(bool(s.logit_bias)),
    # [2] per row: the 64-bit seed's low and high 32-bit words.
    V.VALUE_SOURCE_SEED_BITS: lambda s: (s.seed & 0xFFFFFFFF, (s.seed >> 32) & 0xFFFFFFFF),
}

# Image inputs (IMAGE_TENSOR outputs "windows" / "window_count", IMAGE_FEATURE_INDEX):
# the step's RowPlan.images (SharedPacking._pack_images).
IMAGE_SOURCES = frozenset({V.VALUE_SOURCE_IMAGE_TENSOR, V.VALUE_SOURCE_IMAGE_FEATURE_INDEX})

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
    V.VALUE_SOURCE_SCORED_TARGET_TOKENS: lambda rows: np.fromiter(
        (t for r in rows for t in (r.score_targets or (-1,) * r.lane_length)), np.int64),
}

# The same sources when every row feeds exactly one token (decode): one value per row.
ONE_TOKEN_VALUES: dict[int, Callable[[Rows], list | np.ndarray]] = {
    V.VALUE_SOURCE_PROMPT_TOKENS: lambda rows: [r.tokens[0] for r in rows],
    V.VALUE_SOURCE_PENDING_TOKEN: lambda rows: [r.tokens[0] for r in rows],
    V.VALUE_SOURCE_PROMPT_POSITIONS: lambda rows: [r.start_position for r in rows],
    V.VALUE_SOURCE_MIXED_PREFILL_ROW: lambda rows: np.arange(len(rows)),
    V.VALUE_SOURCE_SLOT: lambda rows: [r.slot for r in rows],
    V.VALUE_SOURCE_SCORED_TARGET_TOKENS: lambda rows: [(r.score_targets or (-1,))[0]
                                                       for r in rows],
}


# ROW_VALUES and ONE_TOKEN_VALUES sources of a plan whose rows are described by
# RowColumns (a plain DECODE: one token per row, every row samples, no grammar mask).
# Every source of a plain decode graph is here, so packing such a plan never builds the
# rows a plan with complete columns leaves unbuilt (engine.plan.RowColumns).
COLUMN_ROW_VALUES: dict[int, Callable[[RowColumns], np.ndarray]] = {
    V.VALUE_SOURCE_GENERATION: lambda c: c.generations,
    V.VALUE_SOURCE_PENDING_TOKEN: lambda c: c.fed,
    V.VALUE_SOURCE_CANDIDATE_COUNT: lambda c: np.zeros(len(c.slots), np.int64),
    V.VALUE_SOURCE_CANDIDATE_GENERATION: lambda c: np.full(len(c.slots), -1, np.int64),
    V.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT: lambda c: np.full(len(c.slots), -1, np.int64),
    V.VALUE_SOURCE_QUERY_LENGTH: lambda c: np.ones(len(c.slots), np.int64),
    V.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: lambda c: np.ones(len(c.slots), np.int64),
    V.VALUE_SOURCE_SAMPLING_DECISION: lambda c: np.ones(len(c.slots), np.int64),
    V.VALUE_SOURCE_CONSUMED_ENDPOINT: lambda c: c.positions + 1,
    V.VALUE_SOURCE_GRAMMAR_MASK_ENABLED: lambda c: np.zeros(len(c.slots), np.int64),
    V.VALUE_SOURCE_LOGPROBS: lambda c: c.logprobs,
}
COLUMN_TOKEN_VALUES: dict[int, Callable[[RowColumns], np.ndarray]] = {
    V.VALUE_SOURCE_PROMPT_TOKENS: lambda c: c.fed,
    V.VALUE_SOURCE_PENDING_TOKEN: lambda c: c.fed,
    V.VALUE_SOURCE_SCORED_TARGET_TOKENS: lambda c: np.full(len(c.slots), -1, np.int64),
    V.VALUE_SOURCE_PROMPT_POSITIONS: lambda c: c.positions,
    V.VALUE_SOURCE_MIXED_PREFILL_ROW: lambda c: np.arange(len(c.slots)),
}


@dataclass(frozen=True, init=False)
class DirtyRange:
    """Elements [start, end) of row `row` of physical-row buffer `destination`."""

    destination: str
    row: int
    start: int
    end: int

    # A few per step (a page-table entry each time a row crosses a page): fills the
    # instance dict, as engine.plan.RowPlan does. Same signature.
    def __init__(self, destination: str, row: int, start: int, end: int) -> None:
        d = self.__dict__
        d["destination"] = destination
        d["row"] = row
        d["start"] = start
        d["end"] = end


@dataclass(frozen=True)
class _Resolved:
    """One binding with its protobuf fields copied to plain values (read every step)."""

    binding: cpb.ValueBinding
    dest: tuple[np.ndarray, ...]  # per execution frame
    source: int
    indexing: int
    offset: int
    padding: int
    # SAMPLING_VALUES sources: key of the per-slot table (source, dtype, row shape), and
    # whether no other kind of binding writes the destination (then a step that would
    # write the values it already holds skips it: SharedPacking._pack_sampling).
    table: tuple | None = None
    sole: bool = False


class _once:  # a decorator, named like functools.cached_property
    """functools.cached_property without its lock (CPython 3.11 takes one on each first
    read; a step reads several): computes on first read, then the instance dict answers."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__

    def __get__(self, obj, cls=None):
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


class _Step:
    """Per-row values several bindings of one pack share, each computed at most once."""

    def __init__(self, plan: StepPlan, row_capacity: int, token_capacity: int):
        self.plan = plan
        rows = plan.__dict__.get("rows")  # None: unbuilt (the `rows` property builds them)
        if rows is not None:
            self.rows = rows
        self.count = len(rows) if rows is not None else plan.row_count  # rows of the step
        self.row_capacity = row_capacity  # captured capacities of the graph
        self.token_capacity = token_capacity
        self.held = False  # every row's slot holds its SamplingParams' values (_hold)
        # The rows' values as arrays (engine.plan.RowColumns), where the plan carries them.
        columns = plan.columns
        self.columns = columns if columns is not None and columns.describes(plan) else None

    @_once
    def rows(self) -> tuple[RowPlan, ...]:
        """The plan's rows, where they were unbuilt (read only where the columns do not
        answer: this first read builds them)."""
        return self.plan.rows

    @_once
    def lanes(self) -> list[int]:
        """Each row's RowPlan.lane_length (spelled out: a property call per row costs more
        than the reads); the QUERY_LENGTH and SPECULATIVE_PREFIX_LIMIT values."""
        return [r.query_length or len(r.tokens) for r in self.rows]

    @_once
    def one_token(self) -> bool:
        """Every row feeds exactly one token (decode): token sources take one per row."""
        return self.columns is not None or self.lanes.count(1) == len(self.rows)

    @_once
    def masked(self) -> list[int]:
        """Submission rows with a grammar mask."""
        if self.columns is not None:
            return []
        return [i for i, r in enumerate(self.rows) if r.grammar_mask is not None]

    @_once
    def slots(self) -> list[int] | np.ndarray:
        """Physical request row of each submission row."""
        if self.columns is not None:
            return self.columns.slots
        return [r.slot for r in self.rows]

    @_once
    def holders(self) -> tuple[SamplingParams, ...]:
        """Each row's SamplingParams (what its SAMPLING_VALUES values are a function of)."""
        if self.columns is not None:
            return self.columns.holders
        return tuple([r.sampling for r in self.rows])

    @_once
    def slot_index(self) -> np.ndarray:
        """`slots` as an index array (gathers from the per-slot tables)."""
        return np.asarray(self.slots, np.intp)

    @_once
    def placed(self) -> list[RowPlan]:
        """Rows placing their request in its slot this step (histogram_tokens set)."""
        if self.columns is not None:
            return []
        return [r for r in self.rows if r.histogram_tokens is not None]


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
        window_regions: names of the sliding-window regions: their views hold
            `RowPlan.window_page_ids` (the window region's own page list), the others
            `RowPlan.page_ids`.
    """

    def __init__(self, graphs: Sequence[cpb.GraphContract],
                 staging: Sequence[Mapping[str, np.ndarray]],
                 page_table_views: Sequence[cpb.PageTableView] = (),
                 window_regions: frozenset[str] = frozenset()):
        # SAMPLING_VALUES sources: one table per (source, dtype, row shape), shared by the
        # bindings that write it; `_holders[slot]` is the SamplingParams its row holds.
        self._tables: dict[tuple, tuple[int, np.ndarray]] = {}
        self._holders: list[SamplingParams | None] = []
        # graph -> (the method that packs it, binding) per binding, chosen once here.
        self._graphs: dict[str, list[tuple[Callable, _Resolved]]] = {}
        for graph in graphs:
            items = []
            for b in graph.bindings:
                dest = tuple(frame[b.destination] for frame in staging)
                table = None
                if b.source in IMAGE_SOURCES:
                    method = self._pack_images
                elif b.indexing == V.INDEXING_PHYSICAL_REQUEST_ROW:
                    method = self._pack_physical
                elif b.indexing == V.INDEXING_PACKED_TOKEN:
                    method = self._pack_tokens
                elif b.indexing == V.INDEXING_SCALAR:
                    method = self._pack_scalar
                elif b.source in SAMPLING_VALUES:
                    method = self._pack_sampling
                    table = (b.source, dest[0].dtype, dest[0].shape[1:])
                    if table not in self._tables:
                        self._tables[table] = (b.source, np.zeros((0, *table[2]), table[1]))
                else:
                    method = self._pack_rows
                items.append((method, (b, dest, table)))
            self._graphs[graph.name] = items
        # Destination -> the kinds of binding that write it, over every graph.
        writers: dict[str, set] = {}
        for graph in graphs:
            for b in graph.bindings:
                writers.setdefault(b.destination, set()).add(
                    (b.source, b.indexing, b.offset, b.padding))
        for items in self._graphs.values():
            items[:] = [(method, _Resolved(b, dest, b.source, b.indexing, b.offset, b.padding,
                                           table, len(writers[b.destination]) == 1))
                        for method, (b, dest, table) in items]
        # id(destination array) -> (rows written, holders whose values it holds) of the
        # last _pack_sampling write (sole destinations only; the arrays live as long).
        self._written: dict[int, tuple[int, tuple[SamplingParams, ...]]] = {}
        # page-table buffer -> pages of RowPlan.page_ids before its entry 0.
        self._page_offset = {v.buffer: v.page_offset for v in page_table_views}
        self._window_tables = {v.buffer for v in page_table_views if v.region in window_regions}
        self._extra = max((v.page_offset for v in page_table_views), default=0)
        # page-table buffer -> per slot: generation, page entries uploaded (see the module
        # docstring): array.array for the row-by-row rule (its items read and write as
        # fast as a list's), then NumPy views of the same memory for the array rule.
        self._uploaded: dict[str, tuple[array.array, array.array, np.ndarray, np.ndarray]] = {}
        # The slots and holders objects of the last `_hold`.
        self._last_held: tuple = (None, None)

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
        step = _Step(plan, rows, tokens)
        for method, item in self._graphs[graph]:
            method(item, item.dest[frame], step, dirty)
        return dirty

    # Each _pack_* method: (binding, its destination in this frame, the step, the dirty
    # physical-row ranges to extend).

    def _pack_scalar(self, item: _Resolved, dest: np.ndarray, step: _Step,
                     dirty: list[DirtyRange]) -> None:
        dest.reshape(-1)[0] = _scalar(item.binding, step.plan)

    def _pack_tokens(self, item: _Resolved, dest: np.ndarray, step: _Step,
                     dirty: list[DirtyRange]) -> None:
        capacity = step.token_capacity
        if step.count == 1 and step.one_token:  # batch 1: a scalar store (as _pack_rows)
            dest[0] = ONE_TOKEN_VALUES[item.source](step.rows)[0] + item.offset
            if capacity > 1:
                dest[1:capacity] = item.padding
            return
        if item.source == V.VALUE_SOURCE_SLOT and step.one_token:
            values = np.asarray(step.slots, dtype=dest.dtype)
        elif step.columns is not None and item.source in COLUMN_TOKEN_VALUES:
            values = COLUMN_TOKEN_VALUES[item.source](step.columns).astype(dest.dtype)
        elif step.one_token:
            values = np.asarray(ONE_TOKEN_VALUES[item.source](step.rows), dtype=dest.dtype)
        else:
            values = TOKEN_VALUES[item.source](step.rows)
        n = len(values)
        dest[:n] = values + dest.dtype.type(item.offset) if item.offset else values
        if capacity > n:
            dest[n:capacity] = item.padding

    def _pack_images(self, item: _Resolved, dest: np.ndarray, step: _Step,
                     dirty: list[DirtyRange]) -> None:
        """The image inputs of an image prefill (specification: "Image tensors" and
        image feature indices). The step's images, in row order, are encoded whole: their
        windows fill ``windows`` from window 0 (``window_count`` of them; later windows are
        never read), and their feature rows follow in the same order, each image's
        ``len(feature_positions)`` rows (its windows x features per window). Per packed
        token, IMAGE_FEATURE_INDEX is the feature row of a feature position, else the
        padding (-1)."""
        images = [image for r in step.rows for image in r.images]
        output = item.binding.image_output
        if output == "windows":
            at = 0
            for image in images:
                dest[at:at + image.windows] = image.array()
                at += image.windows
            return
        if output == "window_count":
            dest.reshape(-1)[0] = sum(image.windows for image in images)
            return
        # VALUE_SOURCE_IMAGE_FEATURE_INDEX, PACKED_TOKEN
        dest[:step.token_capacity] = item.padding
        base, at = 0, 0  # first feature row of the image; packed index of the row
        for r in step.rows:
            for image in r.images:
                for k, position in enumerate(image.feature_positions):
                    if r.start_position <= position < r.start_position + len(r.tokens):
                        dest[at + position - r.start_position] = base + k
                base += len(image.feature_positions)
            at += r.lane_length

    def _pack_sampling(self, item: _Resolved, dest: np.ndarray, step: _Step,
                       dirty: list[DirtyRange]) -> None:
        """A SAMPLING_VALUES source: gathered from its per-slot table, unless `dest` holds
        those values already (the same holders' values, padded alike, written last into
        this array: the values are a function of the SamplingParams alone)."""
        n = step.count
        pad_to = step.row_capacity if item.indexing == V.INDEXING_SUBMISSION_ROW else n
        if item.sole:
            written = self._written.get(id(dest))
            if written is not None and written[0] == pad_to and written[1] == step.holders:
                return
            self._written.pop(id(dest), None)  # set again once written
        table = self._hold(step)[item.table][1]
        if n == 1:  # batch 1: a scalar store is several times cheaper than a slice
            dest[0] = table[step.slots[0]]
        else:
            dest[:n] = table[step.slot_index]
        if item.offset:
            dest[:n] += dest.dtype.type(item.offset)
        if pad_to > n:
            dest[n:pad_to] = item.padding
        if item.sole:
            self._written[id(dest)] = (pad_to, step.holders)

    def _pack_rows(self, item: _Resolved, dest: np.ndarray, step: _Step,
                   dirty: list[DirtyRange]) -> None:
        plan = step.plan
        n = len(plan.copies) if plan.kind is StepKind.TRANSFER else step.count
        pad_to = step.row_capacity if item.indexing == V.INDEXING_SUBMISSION_ROW else n
        source = item.source
        if source in COPY_VALUES:
            dest[:n] = COPY_VALUES[source](plan.copies)
        elif source == V.VALUE_SOURCE_CANDIDATE_IDS:
            dest[:pad_to] = item.padding
            if step.columns is not None:
                return  # column rows carry no candidates
            for i, r in enumerate(step.rows):
                if r.candidates:
                    ids = r.candidates.ids[:dest.shape[1]]
                    dest[i, :len(ids)] = ids
            return
        elif source == V.VALUE_SOURCE_GRAMMAR_MASK:
            for i in step.masked:
                dest[i] = step.rows[i].grammar_mask
            return  # rows without a mask are ignored by GRAMMAR_MASK_ENABLED = 0
        elif source == V.VALUE_SOURCE_CONSTANT:
            dest[:pad_to] = item.binding.constant_value
            return
        elif n == 1:  # batch 1: a scalar store is several times cheaper than a slice
            dest[0] = ROW_VALUES[source](step.rows)[0] + item.offset
        else:
            if source == V.VALUE_SOURCE_SLOT:
                values = step.slots
            elif step.columns is not None and source in COLUMN_ROW_VALUES:
                values = COLUMN_ROW_VALUES[source](step.columns)
            elif source in _LANE_SOURCES:
                values = step.lanes
            else:
                values = ROW_VALUES[source](step.rows)
            values = np.asarray(values, dtype=dest.dtype)
            dest[:n] = values + dest.dtype.type(item.offset) if item.offset else values
        if pad_to > n:
            dest[n:pad_to] = item.padding

    def _hold(self, step: _Step) -> dict[tuple, tuple[int, np.ndarray]]:
        """The per-slot SAMPLING_VALUES tables, with every row's slot holding its
        request's values (written only for slots whose SamplingParams object changed)."""
        if step.held:
            return self._tables
        columns = step.columns
        if columns is not None:
            slots, held = columns.slots, columns.holders
            last = self._last_held
            if last[0] is slots and last[1] is held:
                step.held = True  # the last hold's slots and holders: the tables hold them
                return self._tables
            pairs = zip(slots.tolist(), held, strict=True)
        else:
            slots = held = None
            pairs = ((r.slot, r.sampling) for r in step.rows)
        holders = self._holders
        for slot, sampling in pairs:
            if slot >= len(holders):
                self._grow(slot + 1)
            if holders[slot] is not sampling:
                for source, table in self._tables.values():
                    table[slot] = SAMPLING_VALUES[source](sampling)
                holders[slot] = sampling  # held: no other object can take its id
        step.held = True
        # Only this method writes the tables: while the next hold is for the same slot
        # and holder objects (a kept decode cohort's columns), they hold its values.
        self._last_held = (slots, held)
        return self._tables

    def _grow(self, slots: int) -> None:
        slots = max(slots, 2 * len(self._holders))
        self._holders.extend([None] * (slots - len(self._holders)))
        for key, (source, table) in self._tables.items():
            grown = np.zeros((slots, *table.shape[1:]), table.dtype)
            grown[:len(table)] = table
            self._tables[key] = (source, grown)

    def _pack_physical(self, item: _Resolved, dest: np.ndarray, step: _Step,
                       dirty: list[DirtyRange]) -> None:
        b = item.binding
        if b.source == V.VALUE_SOURCE_PAGE_TABLE:
            shift = self._page_offset.get(b.destination, 0)
            window = b.destination in self._window_tables
            uploaded = self._uploaded.get(b.destination)
            if uploaded is None:
                generations = array.array("q", [-1] * len(dest))
                uploads = array.array("q", [0] * len(dest))
                uploaded = self._uploaded[b.destination] = (
                    generations, uploads, np.frombuffer(generations, np.int64),
                    np.frombuffer(uploads, np.int64))
            generations, uploads, generations_view, uploads_view = uploaded
            columns = step.columns
            if columns is not None and columns.complete:
                _page_tables(b.destination, dest, step.slot_index, columns.generations,
                             columns.page_counts - shift, columns.pages, shift,
                             generations_view, uploads_view, dirty)
                return
            rows = step.rows
            if window:
                for r in rows:
                    if len(r.window_page_ids) + self._extra != len(r.page_ids):
                        raise ValueError(
                            f"row of request {r.request_id}: a sliding-window view needs "
                            f"its window pages ({len(r.window_page_ids)} for "
                            f"{len(r.page_ids)} pages)")
            # Row by row: building the arrays from RowPlans costs more than this pass.
            for r in rows:
                slot = r.slot
                row_pages = r.window_page_ids if window else r.page_ids
                entries = len(row_pages) - shift  # view entry i = page i + shift
                if generations[slot] == r.generation:
                    done = uploads[slot]
                else:
                    done = 0
                    generations[slot] = r.generation
                if entries > done:
                    dest[slot, done:entries] = row_pages[shift + done:]
                    dirty.append(DirtyRange(b.destination, slot, done, entries))
                uploads[slot] = entries if entries > 0 else 0
            return
        if b.source == V.VALUE_SOURCE_PROMPT_HISTOGRAM:
            for r in step.placed:
                width = dest.shape[1]
                dest[r.slot] = np.bincount(np.asarray(r.histogram_tokens, dtype=np.int64),
                                           minlength=width)[:width]
                dirty.append(DirtyRange(b.destination, r.slot, 0, width))
        elif b.source == V.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS:
            # Read only for lanes whose GRAMMAR_MASK_ENABLED is set, rows 1..count: a
            # constrained lane with candidates must carry their masks; only those slots'
            # rows are written (and uploaded).
            for i in step.masked:
                r = step.rows[i]
                if r.candidates:
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
            for r in step.placed:
                if r.sampling.logit_bias:
                    row = dest[r.slot]
                    row[:] = 0
                    ids, values = zip(*r.sampling.logit_bias, strict=True)
                    row[list(ids)] = values
                    dirty.append(DirtyRange(b.destination, r.slot, 0, dest.shape[1]))


# ROW_VALUES sources whose values are the rows' lane lengths (_Step.lanes).
_LANE_SOURCES = frozenset({V.VALUE_SOURCE_QUERY_LENGTH, V.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT})


def _page_tables(destination: str, dest: np.ndarray, slots: np.ndarray,
                 row_generations: np.ndarray, entries: np.ndarray, pages: Sequence,
                 shift: int, generations: np.ndarray, uploads: np.ndarray,
                 dirty: list[DirtyRange]) -> None:
    """The page-table rule of `SharedPacking._pack_physical` as array operations over the
    rows (their slots are distinct): each slot's view entries [done, entries) past those
    uploaded for its generation (all of them after a new generation) are written from the
    row's pages (`pages[i][shift + e]` is view entry e) and reported dirty, in row order;
    then every slot's uploaded count is its row's entries (0 when negative).

    Args:
        slots: intp [rows]; row_generations, entries: int64 [rows] (entries: view
            entries the row's pages cover); generations, uploads: int64 [buffer rows],
            the per-slot state, updated in place.
    """
    done = np.where(generations[slots] == row_generations, uploads[slots], 0)
    generations[slots] = row_generations
    grown = np.flatnonzero(entries > done)
    if len(grown):
        for i, slot, start, end in zip(grown.tolist(), slots[grown].tolist(),
                                       done[grown].tolist(), entries[grown].tolist(),
                                       strict=True):
            dest[slot, start:end] = pages[i][shift + start:shift + end]
            dirty.append(DirtyRange(destination, slot, start, end))
    uploads[slots] = np.maximum(entries, 0)


def _scalar(b: cpb.ValueBinding, plan: StepPlan) -> int:
    if b.source == V.VALUE_SOURCE_LIVE_ROW_COUNT:
        return plan.row_count + b.offset
    if b.source == V.VALUE_SOURCE_CONSTANT:
        return b.constant_value
    raise AssertionError("checked at load")
