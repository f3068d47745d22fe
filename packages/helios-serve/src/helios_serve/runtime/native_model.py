"""NativeModel.load: choose capacities, allocate every buffer once, bind every graph.

Specification: "Ownership and bootstrap". NativeModel owns the backend (buffers,
weights, cache storage, bound programs) and shared packing. `manifests` exposes the
resulting execution geometry to the scheduler. `submit(plan)` selects the smallest
captured variant that fits the plan, packs the plan's value bindings into a free execution
frame and launches the graph; `wait_step(ticket)` returns that frame's completion record
(a `StepCompletion`: one sampled id per plan row, and the logprobs of rows that asked),
`wait(ticket)` its sampled ids alone. `execute(plan)` is submit and wait at once.

Two execution frames: the host may pack and submit step N + 1 while step N runs; frames
complete in submission order. Whether step N + 1 may be submitted before step N's
completion is the scheduler's decision (completion-feedback rules): with a host-fed
pending token it never is; with a device-owned pending token (`device_pending`) the graph
reads each row's fed token from the pending-token state view, so the plan's decode token
values are ignored and may be placeholders.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from helios_contract import PreparedContract, capability_findings, rank_count
from helios_contract.prepared import request_slots
from helios_contract.schema import contract_pb2 as cpb
from helios_tools.capabilities import BACKENDS as CAPABILITIES

from ..engine.plan import ModelGeometry, StepCompletion, StepKind, StepPlan
from ..scheduler.request import TransferCost
from ..startup import StartupLog
from .cache_sizing import HOST_MEMORY, CacheSizing, check_fits, host_available_bytes
from .completion import CompletionReader
from .cpu_backend import CpuBackend
from .errors import RuntimeLoadError, SpeculativeWidthError, UnknownBackend, UnsupportedContract
from .packing import SharedPacking
from .ranks import load_thread_ranks
from .tiers import TierChoice, choose_tiers

BACKENDS = tuple(CAPABILITIES)  # ("cpu", "cuda")

# Reads the decoded bytes of one resource of the core (helios_tools Core.read_resource).
ResourceReader = Callable[[str], bytes]


@dataclass(frozen=True)
class Ticket:
    """A submitted step: its execution frame, graph variant, live row count, and whether
    a row asked for logprobs (then `wait_step` reads them)."""

    frame: int
    graph: str
    rows: int
    logprobs: bool = False
    scored_tokens: int = 0  # packed tokens whose scores `wait_step` reads (scored steps)


class NativeModel:
    """The loaded model: backend, packing and graph selection.

    Use `NativeModel.load`; the constructor takes already-built parts.
    """

    def __init__(self, prepared: PreparedContract, backend, geometry: ModelGeometry,
                 tiers: TierChoice | None = None):
        self.prepared = prepared
        self.backend = backend
        self.manifests = geometry
        manifest = prepared.manifest
        graphs = list(prepared.graphs.values())
        self._programs = {g.name: g for g in manifest.graphs}
        self._decode = sorted((g.batch_capacity, g.name)
                              for g in prepared.graphs_for(cpb.OPERATION_DECODE)
                              if g.batch_capacity <= max(geometry.decode_capacities))
        self._prefill = sorted((g.token_capacity, g.name)
                               for g in prepared.graphs_for(cpb.OPERATION_PREFILL)
                               if not _image_graph(g))
        self._scored = sorted((g.token_capacity, g.name)
                              for g in prepared.graphs_for(cpb.OPERATION_SCORED_PREFILL))
        # MIXED programs as (packed tokens, rows, name): the fewest tokens first.
        self._mixed = sorted((g.token_capacity, g.batch_capacity, g.name)
                             for g in prepared.graphs_for(cpb.OPERATION_MIXED)
                             if (g.batch_capacity, g.token_capacity)
                             in geometry.mixed_capacities)
        # Image prefill programs (they bind the image inputs): steps carrying images.
        self._image_prefill = sorted((g.token_capacity, g.name)
                                     for g in prepared.graphs_for(cpb.OPERATION_PREFILL)
                                     if _image_graph(g))
        # SPECULATIVE programs of the served widths as (lane limit, W, B, name): the
        # shortest lane limit first, then the narrowest, then by batch.
        served = set(geometry.speculative_widths)
        self._speculative = sorted((g.speculative.lane_limit, g.speculative.token_capacity,
                                    g.batch_capacity, g.name)
                                   for g in prepared.graphs_for(cpb.OPERATION_SPECULATIVE)
                                   if g.speculative.token_capacity in served
                                   and not _prefix_limit(g))
        # SPECULATIVE_PREFIX_LIMIT programs by (B, P) (geometry.prefix_programs).
        self._prefix = {(g.batch_capacity, g.speculative.packed_token_capacity): g.name
                        for g in prepared.graphs_for(cpb.OPERATION_SPECULATIVE)
                        if _prefix_limit(g) and g.speculative.token_capacity in served}
        self.frames = int(backend.frames)
        staging = [backend.staging(f) for f in range(self.frames)]
        self.packing = SharedPacking(graphs, staging, prepared.page_table_views,
                                     _window_regions(prepared.serving.model.cache))
        self._completion = CompletionReader(list(manifest.graphs), staging)
        # One pending-token view for every decode graph: a capability rule checked at load.
        decode = prepared.graphs_for(cpb.OPERATION_DECODE)[0]
        self._pending_view = decode.pending_token if decode.pending_token.buffer else None
        # RESTORE programs of each served TRANSFER route: (capacity, name), ascending.
        self.tiers = tiers
        self._transfers = dict(tiers.routes) if tiers else {}
        self._inflight: deque[Ticket] = deque()
        self._next_frame = 0
        self.launches = Counter()  # graph launches by operation name

    @classmethod
    def load(cls, prepared: PreparedContract, read_resource: ResourceReader,
             backend: str = "cpu", *, cache: CacheSizing | None = None,
             max_concurrency: int | None = None, cpu_frames: int = 1,
             speculative_width: int | None = None, log: StartupLog | None = None,
             ranks=None, snapshots: int | None = None, host_cache_bytes: int = 0
             ) -> NativeModel:
        """Load a validated contract's execution manifest onto `backend`: weights and
        every other buffer, the kernels, the KV cache sized from what is left, the
        continuation and host-tier planes, the graphs, then the tuning producers the
        selected graphs need (run once, before any graph is exposed).

        Args:
            prepared: the core's PreparedContract, validated against its execution
                manifest (``PreparedContract.from_contract(contract, manifest)``, as
                ``Bootstrap.load`` does); every implicit version 1/2 value is explicit in it.
            read_resource: resource id -> decoded bytes (weights, kernel binaries), e.g.
                the verified core's ``read_resource``.
            backend: "cpu" (NumPy reference kernels) or "cuda".
            cache: how the physical KV page count is chosen (runtime.cache_sizing; default:
                cpu the prepared count, cuda 0.9 of the free device memory).
            max_concurrency: serve at most this many decode rows (load-time selection may
                reduce captured concurrency, never raise it).
            cpu_frames: execution frames of the cpu backend (1, or 2 to exercise the
                cuda backend's two-frame submission on the CPU); cuda always has 2.
            speculative_width: serve SPECULATIVE programs of width W <= this (0 turns
                speculation off; None serves every captured width). Load-time selection
                may reduce the captured width, never raise it (served_speculative_widths).
            log: startup phases are recorded here (weights, kernels, cache sizing, graphs,
                tuning).
            ranks: this process is rank 0 of RankPeers::Processes
                (runtime.rank_processes.ProcessRanks); None: a tensor-parallel core runs
                every rank here as a thread (RankPeers::Threads, runtime.ranks).
            snapshots: continuation rows for exact-endpoint snapshots (None: the
                contract's prepared_snapshots; 0 turns snapshots off).
            host_cache_bytes: bytes of the host-memory cache tier (0: none; pinned host
                memory on cuda), allocated here, before serving.

        Raises:
            UnknownBackend: `backend` is not one of BACKENDS.
            SpeculativeWidthError: `speculative_width` is negative, above 0 on a core
                without SPECULATIVE programs, or above the widest captured width.
            UnsupportedContract: the contract declares a field the backend does not
                execute (the first ``capability_findings`` of its capability table; ``rule``
                names it, as ``helios-tools lint-core --backend`` does).
            RuntimeLoadError: `prepared` carries no manifest, an option is out of range,
                or the backend cannot load it (a weight of the wrong size, no binary for
                the GPU). CacheSizingError (one): an allocation does not fit, checked
                before any is made (cache_sizing.check_fits: the tier rows in host memory
                here, the device buffers, snapshot rows and KV cache in the cuda backend).
        """
        if backend not in BACKENDS:
            raise UnknownBackend(f"unknown backend {backend!r}; known backends: "
                                 f"{', '.join(BACKENDS)}")
        manifest = prepared.manifest
        if manifest is None:
            raise RuntimeLoadError("NativeModel.load needs a PreparedContract validated against "
                                   "its execution manifest")
        served_speculative_widths(prepared, speculative_width)  # before anything loads
        for finding in capability_findings(prepared.serving, manifest, CAPABILITIES[backend],
                                           speculative_width=speculative_width):
            raise UnsupportedContract(f"unsupported contract: {finding}", finding.rule)
        log = log if log is not None else StartupLog()
        serving = prepared.serving
        tiers = choose_tiers(serving.model.cache, list(prepared.graphs.values()),
                             {b.name: b for b in manifest.buffers},
                             prepared_snapshots=serving.prepared_snapshots,
                             snapshots=snapshots, host_cache_bytes=host_cache_bytes)
        # Before anything is allocated (the cuda backend checks its device memory itself).
        check_fits(tiers.host_asks(backend), memory=HOST_MEMORY,
                   available=host_available_bytes())
        if set(tiers.rows.rows) - tiers.rows.window:  # continuation or host-tier planes
            with log.phase("cache tiers") as phase:
                phase.detail = tiers.describe(backend)
        if backend == "cuda":
            from .cuda_backend import CudaBackend  # imports cuda-python only when asked

            engine = CudaBackend(manifest, read_resource, cache, log=log, tiers=tiers.rows,
                                 snapshot_option=tiers.snapshot_option)
        elif ranks is not None:  # RankPeers::Processes: this process is rank 0
            from .rank_processes import load_process_ranks  # imports MPI only when asked

            # The other ranks back the manifest's tier planes (the prepared snapshot rows,
            # one host row): rank 0 may use fewer snapshot rows, never more or a host tier.
            if tiers.host_rows or tiers.snapshot_rows > serving.prepared_snapshots:
                raise RuntimeLoadError("--host-cache-bytes and --snapshots above the core's "
                                       f"{serving.prepared_snapshots} are not served across "
                                       "rank processes (--world) yet; run the ranks as threads")
            engine = load_process_ranks(manifest, read_resource, ranks, cache,
                                        frames=cpu_frames, log=log)
        elif rank_count(manifest) > 1:  # RankPeers::Threads: every rank in this process
            engine = load_thread_ranks(manifest, read_resource, cache, frames=cpu_frames,
                                       log=log, tiers=tiers.rows)
        else:
            engine = CpuBackend(manifest, read_resource, cache, frames=cpu_frames, log=log,
                                tiers=tiers.rows)
        try:
            _run_tuning(engine, prepared, log)
            geometry = _geometry(prepared, engine.num_pages, max_concurrency, speculative_width)
            geometry = dataclasses.replace(
                geometry, snapshot_rows=tiers.snapshot_rows, host_rows=tiers.host_rows,
                transfer_rows=tiers.transfer_rows, routes=tuple(tiers.routes),
                page_bytes=tiers.page_bytes)
        except BaseException:
            getattr(engine, "close", lambda: None)()
            raise
        return cls(prepared, engine, geometry, tiers)

    @property
    def top_logprobs(self) -> int | None:
        """Top alternatives the completion record holds per row (None: no logprobs)."""
        return self._completion.top_logprobs

    def select_graph(self, plan: StepPlan) -> str:
        """The smallest captured variant that holds `plan`.

        Raises:
            ValueError: no captured variant holds it (the scheduler's admission bug).
        """
        if plan.kind is StepKind.TRANSFER:
            for capacity, name in self._transfers.get(plan.route, ()):
                if capacity >= len(plan.copies):
                    return name
            raise ValueError(f"no served transfer program copies {len(plan.copies)} rows "
                             f"along {plan.route}")
        if plan.kind is StepKind.SPECULATIVE and plan.packed_rows:
            for batch, packed, _width in self.manifests.prefix_programs:
                if batch >= len(plan.rows) and packed == plan.packed_rows:
                    return self._prefix[batch, packed]
            raise ValueError(f"no served prefix-limit variant holds {len(plan.rows)} lanes "
                             f"in {plan.packed_rows} rows")
        if plan.kind is StepKind.SPECULATIVE:
            width = max(r.lane_length for r in plan.rows)
            for limit, _w, capacity, name in self._speculative:
                if limit >= width and capacity >= len(plan.rows):
                    return name
            raise ValueError(f"no served speculative variant holds {len(plan.rows)} lanes of "
                             f"width {width}")
        if plan.kind is StepKind.MIXED:
            rows, need = len(plan.rows), plan.token_count
            for tokens, batch, name in self._mixed:
                if tokens >= need and batch >= rows:
                    return name
            raise ValueError(f"no captured mixed variant holds {rows} rows of {need} tokens")
        if plan.kind is StepKind.DECODE:
            need, table = plan.row_count, self._decode
        else:  # a scoring row: a SCORED_PREFILL program; rows with images: an image prefill
            need, table = plan.token_count, self._prefill
            imaged = any(r.images for r in plan.rows)
            if plan.scored and imaged:  # Scheduler._build_prefill never joins them
                raise ValueError("a scored prefill plan carries images; no captured "
                                 "variant scores image rows")
            if plan.scored:
                table = self._scored
            elif imaged:
                table = self._image_prefill
            if len(plan.rows) > self.manifests.prefill_row_capacity:
                raise ValueError(f"prefill plan has {len(plan.rows)} rows; capacity "
                                 f"{self.manifests.prefill_row_capacity}")
        for capacity, name in table:
            if capacity >= need:
                return name
        raise ValueError(f"no captured {'scored ' if plan.scored else ''}{plan.kind.value} "
                         f"variant holds {need}")

    @property
    def device_pending(self) -> bool:
        """Whether decode graphs read a device-owned pending token (contract
        GraphContract.pending_token); then decode may be submitted ahead of completion."""
        return self._pending_view is not None

    @property
    def outstanding(self) -> int:
        """Steps submitted and not yet waited for (0..frames)."""
        return len(self._inflight)

    def submit(self, plan: StepPlan) -> Ticket:
        """Pack `plan` into a free execution frame and launch its graph (no waiting).

        Raises:
            RuntimeError: every frame is in flight (wait for the oldest first).
            ValueError: no captured variant holds the plan.
        """
        if len(self._inflight) == self.frames:
            raise RuntimeError(f"all {self.frames} execution frames are in flight")
        name = self.select_graph(plan)
        program = self._programs[name]
        frame = self._next_frame
        dirty = self.packing.pack(name, plan, program.batch_capacity, program.token_capacity,
                                  frame)
        self.backend.launch(name, frame, dirty)
        self._next_frame = (frame + 1) % self.frames
        # Only a record that holds logprobs is read for them (no row scan otherwise); the
        # list is the cheaper first pass (no request asks, mostly), the sample test second.
        # A plain decode's RowColumns hold each row's ask (-1: none; every row samples).
        columns = plan.columns
        if columns is not None and columns.describes(plan):
            logprobs = self._completion.top_logprobs is not None and bool(
                (columns.logprobs >= 0).any())
        else:
            logprobs = self._completion.top_logprobs is not None and any(
                [r.sampling.logprobs is not None for r in plan.rows]) and any(
                r.sample and r.sampling.logprobs is not None for r in plan.rows)
        ticket = Ticket(frame, name, plan.row_count, logprobs,
                        plan.token_count if plan.scored else 0)
        self._inflight.append(ticket)
        self.launches[plan.kind.value] += 1
        return ticket

    def wait_step(self, ticket: Ticket) -> StepCompletion:
        """Wait for the oldest submitted step; returns its completion record: int32
        `[rows]` sampled ids (and the logprobs when a row of the step asked for them), or
        for a SPECULATIVE step its int32 `[rows, 6 + W]` lane records (columns as
        manifest SpeculativeCompletion: generation, offers, accepted, emitted, draft
        cursor, reserved, then W emitted ids) in `StepCompletion.sampled`.

        Raises:
            RuntimeError: `ticket` is not the oldest step in flight.
            Backend errors of the step (the frame is released either way).
        """
        if not self._inflight or self._inflight[0] != ticket:
            raise RuntimeError("steps complete in submission order: wait for the oldest")
        self._inflight.popleft()
        self.backend.wait(ticket.frame)
        return self._completion.read(ticket.graph, ticket.frame, ticket.rows, ticket.logprobs,
                                     ticket.scored_tokens)

    def wait(self, ticket: Ticket) -> np.ndarray:
        """`wait_step`'s sampled ids (or speculative lane records)."""
        return self.wait_step(ticket).sampled

    @property
    def transfer_cost(self) -> TransferCost:
        """What copies and prefill cost on this backend, for the scheduler's
        swap-or-recompute rule (estimates; bench/results/snapshots_cpu.json and
        bench/results/gpu_smollm2*.json measure them for SmolLM2)."""
        if self.backend.name == "cuda":
            # ~60 row_copy launches (~3 us each) per step; a 0.7 MiB page over the host
            # link at ~25 GB/s; prefill at ~84k tokens/s (chunk 1024, H200).
            return TransferCost(transfer_step_s=2e-4, page_copy_s=3e-5,
                                prefill_tokens_per_s=8e4)
        return TransferCost()  # NumPy: one memcpy per plane row; ~600 prefill tokens/s

    def execute(self, plan: StepPlan) -> np.ndarray:
        """Run one step; returns int32 `[len(plan.rows)]` sampled ids (submission rows)."""
        return self.wait(self.submit(plan))

    def write_pending_tokens(self, slots: list[int], tokens: list[int]) -> None:
        """Host restoration of device-owned pending tokens: slot `slots[i]` will feed
        `tokens[i]` at its next decode (teacher forcing, tests). Only between steps.

        Raises:
            RuntimeError: the contract's pending token is host-owned, or a step is in
                flight.
            ValueError: a slot outside `[0, slots)`.
        """
        if self._pending_view is None:
            raise RuntimeError("this core's pending token is host-owned: feed it in the plan")
        if self._inflight:
            raise RuntimeError("write pending tokens only with no step in flight")
        view = self._pending_view
        for slot, token in zip(slots, tokens, strict=True):
            if not 0 <= slot < self.manifests.slots:
                raise ValueError(f"slot {slot} outside [0, {self.manifests.slots})")
            self.backend.write_state(view.buffer, view.byte_offset + slot * view.row_stride,
                                     np.array([token], np.int32))

    def close(self) -> None:
        """Release the backend's storage (steps in flight are waited for first)."""
        while self._inflight:
            try:
                self.wait(self._inflight[0])
            except Exception:  # closing: the step's failure no longer matters
                pass
        close = getattr(self.backend, "close", None)
        if close:
            close()


def _run_tuning(engine, prepared: PreparedContract, log: StartupLog) -> None:
    """Run, once and in catalog order, every tuning producer a selected graph depends on
    (specification: startup executes required producers before exposing the dependent
    serving graphs). What each writes is the producer's choice; the log shows it."""
    manifest = prepared.manifest
    programs = {g.name: g for g in manifest.graphs}
    needed = {p for name in prepared.graphs for p in programs[name].tuning_producers}
    order = [p.name for p in manifest.tuning.producers if p.name in needed]
    with log.phase("tuning") as phase:
        engine.run_producers(order)
        tuned = sorted({(t.producer_graph, t.buffer) for g in prepared.graphs.values()
                        for t in g.tuned_bindings})
        phase.detail = ", ".join(
            f"{producer} wrote {buffer} = {engine.read_buffer(buffer).reshape(-1)[:4].tolist()}"
            for producer, buffer in tuned) or "no tuning producers"


def served_speculative_widths(prepared: PreparedContract,
                              speculative_width: int | None) -> tuple[int, ...]:
    """The SPECULATIVE widths W served under the load option `speculative_width`
    (``helios-serve --speculative-width``): the captured widths W <= it, ascending, or ()
    when no wider lane than one is left (plain decode; 0 turns speculation off, None
    serves every captured width). The one rule for this option: NativeModel.load and
    helios-serve's startup check (loading.check_options) both apply it before anything loads.

    the specification, "Serving metadata": load-time selection may reduce the captured
    speculative width, never raise it.

    Raises:
        SpeculativeWidthError: `speculative_width` is negative, asks for speculation
            (> 0) on a core without SPECULATIVE programs, or exceeds the widest captured
            width (the message names it).
    """
    captured = prepared.speculative_widths
    if speculative_width is None:
        widths = list(captured)
    elif speculative_width < 0:
        raise SpeculativeWidthError(f"--speculative-width {speculative_width}: must be >= 0 "
                                    "(0 turns speculation off)")
    elif speculative_width > 0 and not captured:
        raise SpeculativeWidthError(f"--speculative-width {speculative_width}: the core has no "
                                    "speculative programs (0 or no option serves plain decode)")
    elif speculative_width > max(captured, default=0):
        raise SpeculativeWidthError(
            f"--speculative-width {speculative_width}: the core's widest captured speculative "
            f"width is {max(captured)} (captured: {', '.join(map(str, captured))}); "
            "load-time selection may reduce it, never raise it")
    else:
        widths = [w for w in captured if w <= speculative_width]
    return tuple(widths) if widths != [1] else ()


def _geometry(prepared: PreparedContract, pages: int, max_concurrency: int | None,
              speculative_width: int | None) -> ModelGeometry:
    """The execution geometry the scheduler plans against, from the validated contract.

    Page-table views (contract.proto, PageTableView): entry i of a view references the
    request's page i + page_offset, so a request whose tokens span n pages owns
    n + max(page_offset) pages, and every view holds the n entries its columns allow.
    Speculative widths, draft cursors, logprobs and logit-bias bindings were checked
    against the backend's capability table.
    """
    manifest = prepared.manifest
    buffers = {b.name: b for b in manifest.buffers}
    tables = [buffers[v.buffer] for v in prepared.page_table_views]
    window = next((r for r in prepared.serving.model.cache.regions
                   if r.kind == cpb.HISTORY_KIND_SLIDING_WINDOW), None)
    slots = request_slots(prepared.serving, manifest)
    width = min(int(t.shape[1]) for t in tables)
    decode = list(prepared.decode_capacities)
    if max_concurrency is not None:
        decode = [b for b in decode if b <= max_concurrency] or decode[:1]
    prefill = [(g.batch_capacity, g.token_capacity)
               for g in prepared.graphs_for(cpb.OPERATION_PREFILL) if not _image_graph(g)]
    image_windows = min((int(buffers[b.destination].shape[0])
                         for g in prepared.graphs_for(cpb.OPERATION_PREFILL)
                         for b in g.bindings if b.image_output == "windows"), default=0)
    widths = list(served_speculative_widths(prepared, speculative_width))
    speculative = prepared.graphs_for(cpb.OPERATION_SPECULATIVE)
    cursor = speculative[0].completion_cursor if speculative else None
    limits = prepared.lane_limits
    prefix = tuple(sorted((g.batch_capacity, g.speculative.packed_token_capacity,
                           g.speculative.lane_limit) for g in speculative
                          if _prefix_limit(g) and g.speculative.token_capacity in widths
                          and g.batch_capacity <= max(decode)))
    history = [g for g in speculative if g.speculative.token_capacity in widths
               and g.speculative.token_capacity > 1]
    sampling = [g for g in prepared.graphs.values()
                if g.operation in (cpb.OPERATION_PREFILL, cpb.OPERATION_DECODE)]
    programs = {g.name: g for g in manifest.graphs}
    layouts = {programs[g.name].completion.top_logprobs
               if programs[g.name].completion.logprobs_buffer else None for g in sampling}
    top_logprobs = layouts.pop() if len(layouts) == 1 else None  # CompletionReader rejects
    return ModelGeometry(
        page_tokens=prepared.page_tokens, num_pages=pages, slots=slots,
        max_pages_per_request=width, decode_capacities=tuple(decode),
        prefill_token_capacities=tuple(sorted(tokens for _, tokens in prefill)),
        prefill_row_capacity=min(rows for rows, _ in prefill),
        context_tokens=min(prepared.context_tokens, width * prepared.page_tokens),
        vocab_size=prepared.sampled_tokens, mask_words=prepared.mask_words,
        eos_token_ids=prepared.eos_token_ids,
        speculative_widths=tuple(widths),
        lane_limits=tuple(limits[w] for w in widths),
        draft_cursor_lag=int(cursor.lag_tokens) if cursor and cursor.has_draft_cursor else None,
        top_logprobs=top_logprobs,
        logit_bias=bool(sampling) and all(_binds(g, cpb.VALUE_SOURCE_LOGIT_BIAS)
                                          for g in sampling),
        extra_pages_per_request=max(v.page_offset for v in prepared.page_table_views),
        prefix_programs=prefix,
        copied_proposals=bool(history) and all(
            _binds(g, cpb.VALUE_SOURCE_CANDIDATE_IDS) for g in history),
        candidate_masks=bool(widths) and prepared.constrained_speculation(widths),
        scored_token_capacities=tuple(sorted(
            g.token_capacity for g in prepared.graphs_for(cpb.OPERATION_SCORED_PREFILL))),
        image_windows=image_windows, image_feature_slots=prepared.vision.feature_slots,
        window_tokens=window.window_tokens if window else 0,
        window_pages=int(buffers[window.planes[0]].shape[0]) if window else 0,
        mixed_capacities=tuple(sorted((g.batch_capacity, g.token_capacity)
                                      for g in prepared.graphs_for(cpb.OPERATION_MIXED)
                                      if g.batch_capacity <= max(decode))))


def _window_regions(cache: cpb.CacheContract) -> frozenset[str]:
    return frozenset(r.name for r in cache.regions if r.kind == cpb.HISTORY_KIND_SLIDING_WINDOW)


def _prefix_limit(graph: cpb.GraphContract) -> bool:
    return (graph.operation == cpb.OPERATION_SPECULATIVE and graph.speculative.length_source
            == cpb.LENGTH_SOURCE_SPECULATIVE_PREFIX_LIMIT)


def _image_graph(graph: cpb.GraphContract) -> bool:
    """A prefill program that encodes images (it binds the image layout's outputs)."""
    return _binds(graph, cpb.VALUE_SOURCE_IMAGE_TENSOR)


def _binds(graph: cpb.GraphContract, source: int) -> bool:
    return any(b.source == source for b in graph.bindings)
