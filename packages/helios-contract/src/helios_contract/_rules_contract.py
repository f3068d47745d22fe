"""Rules a version 3 ServingContract must satisfy on its own (no execution manifest).

Each rule is a generator of ``Finding``s (helios_contract.findings) naming the field path
from the ``ServingContract`` root. Sections follow the specification. A rule
that needs a value another rule rejects (a positive page size, a known region) skips what
it cannot judge, so lint lists each fault once and never crashes on it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract.errors import (
    BindingError,
    CapacityMismatchError,
    DuplicateIdentifierError,
    ExtentError,
    LengthSourceError,
    MissingFieldError,
    PendingTokenError,
    SamplingDefaultsError,
    SpeculativeExtentError,
    UnknownIdentifierError,
    UnspecifiedSelectorError,
    UnsupportedFeatureError,
    ViewBoundsError,
    VocabularyRangeError,
)
from helios_contract.findings import Finding

F = Finding.of
Findings = Iterator[Finding]

PAGED_KINDS = (pb.HISTORY_KIND_PAGED_KV, pb.HISTORY_KIND_PAGED_LATENT)
# Regions whose page ids a page-table view holds.
VIEWED_KINDS = (*PAGED_KINDS, pb.HISTORY_KIND_SLIDING_WINDOW)
# Operations that consume the pending token and produce the next one.
GENERATING_OPERATIONS = (pb.OPERATION_DECODE, pb.OPERATION_SPECULATIVE, pb.OPERATION_MIXED)
# Operations that run request rows over packed tokens (need nonzero capacities).
ROW_OPERATIONS = (
    pb.OPERATION_PREFILL,
    pb.OPERATION_SCORED_PREFILL,
    pb.OPERATION_DECODE,
    pb.OPERATION_SPECULATIVE,
    pb.OPERATION_MIXED,
)
LENGTH_SOURCES = {
    pb.VALUE_SOURCE_QUERY_LENGTH: pb.LENGTH_SOURCE_QUERY_LENGTH,
    pb.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT: pb.LENGTH_SOURCE_SPECULATIVE_PREFIX_LIMIT,
}
READS = (pb.ACCESS_READ, pb.ACCESS_READ_WRITE)
WRITES = (pb.ACCESS_WRITE, pb.ACCESS_READ_WRITE)


def enum_name(enum: object, number: int) -> str:
    """Name of ``number`` in a generated enum wrapper (or the number itself if unknown)."""
    try:
        return enum.Name(number)  # type: ignore[attr-defined]
    except ValueError:
        return str(number)


def context_pages(serving: pb.ServingContract) -> int:
    """Pages one request of ``context_tokens`` references (0 while page_tokens is 0)."""
    page_tokens = serving.model.cache.page_tokens
    return math.ceil(serving.context_tokens / page_tokens) if page_tokens else 0


# --- presence and selectors ------------------------------------------------------------------


def required(serving: pb.ServingContract) -> Findings:
    """Messages and lists without which no runtime can serve the contract."""
    for name in ("vocabulary", "input_vocabulary", "cache", "frontend"):
        if not serving.model.HasField(name):
            yield F("contract.required", MissingFieldError, f"model.{name}",
                    detail="required message is absent")
    if not serving.model.graphs:
        yield F("contract.required", MissingFieldError, "model.graphs",
                detail="a contract declares at least one graph")
    if not serving.served_id:
        yield F("contract.required", MissingFieldError, "served_id", "",
                "the served identifier is empty")
    if not serving.HasField("defaults") or not serving.defaults.HasField("sampling"):
        yield F("contract.required", MissingFieldError, "defaults.sampling",
                detail="complete sampling defaults required")
    if not serving.eos_token_ids:
        yield F("contract.required", MissingFieldError, "eos_token_ids",
                detail="generation ends only at the core's EOS IDs")


def selectors(message: Message, path: str) -> Findings:
    """Every enum field left at its UNSPECIFIED zero value in ``message``'s tree.

    Every enum of the schema reserves 0 for UNSPECIFIED, which cannot select an
    implementation; absent sub-messages are not visited.
    """
    for fd in message.DESCRIPTOR.fields:
        here = f"{path}.{fd.name}"
        repeated = fd.is_repeated
        value = getattr(message, fd.name)
        if fd.type == FieldDescriptor.TYPE_ENUM:
            numbers = list(value) if repeated else [value]
            for index, number in enumerate(numbers):
                if number == 0:
                    yield F("contract.selector", UnspecifiedSelectorError,
                            f"{here}[{index}]" if repeated else here,
                            fd.enum_type.values_by_number[0].name,
                            "an UNSPECIFIED selector cannot select an implementation")
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                continue  # the contract has no maps of messages or enums
            if repeated:
                for index, item in enumerate(value):
                    yield from selectors(item, f"{here}[{index}]")
            elif message.HasField(fd.name):
                yield from selectors(value, here)


# --- vocabulary, extents, sampling -----------------------------------------------------------


def vocabulary(serving: pb.ServingContract) -> Findings:
    """Sampled range, histogram/mask geometry, input range, image sentinels, EOS ids."""
    vocab = serving.model.vocabulary
    if vocab.sampled_tokens == 0:
        yield F("vocabulary.sampled_tokens", VocabularyRangeError,
                "model.vocabulary.sampled_tokens", 0, "must be positive")
    if vocab.histogram_width < vocab.sampled_tokens:
        yield F("vocabulary.histogram_width", VocabularyRangeError,
                "model.vocabulary.histogram_width", vocab.histogram_width,
                f"must be >= sampled_tokens ({vocab.sampled_tokens})")
    words = math.ceil(vocab.histogram_width / 32)
    if vocab.mask_words != words:
        yield F("vocabulary.mask_words", VocabularyRangeError, "model.vocabulary.mask_words",
                vocab.mask_words, f"must equal ceil(histogram_width / 32) = {words}")
    inputs = serving.model.input_vocabulary
    if inputs.input_tokens < vocab.sampled_tokens:
        yield F("vocabulary.input_tokens", VocabularyRangeError,
                "model.input_vocabulary.input_tokens", inputs.input_tokens,
                f"sampled ids are inputs too: must be >= sampled_tokens ({vocab.sampled_tokens})")
    seen: set[int] = set()
    for index, sentinel in enumerate(inputs.image_sentinel_ids):
        path = f"model.input_vocabulary.image_sentinel_ids[{index}]"
        if not vocab.sampled_tokens <= sentinel < inputs.input_tokens:
            yield F("vocabulary.image_sentinel", VocabularyRangeError, path, sentinel,
                    f"image sentinels are nonsampled inputs: need {vocab.sampled_tokens} <= id "
                    f"< {inputs.input_tokens}")
        if sentinel in seen:
            yield F("vocabulary.image_sentinel_duplicate", DuplicateIdentifierError, path,
                    sentinel, "image sentinel declared twice")
        seen.add(sentinel)
    for index, eos in enumerate(serving.eos_token_ids):
        if eos >= vocab.sampled_tokens:
            yield F("vocabulary.eos", VocabularyRangeError, f"eos_token_ids[{index}]", eos,
                    f"EOS ids are sampled ids: must be < sampled_tokens ({vocab.sampled_tokens})")


def sampling_defaults(serving: pb.ServingContract) -> Findings:
    """Model-card sampling defaults lie in the ranges the sampler accepts."""
    s = serving.defaults.sampling
    checks = (
        ("temperature", s.temperature, math.isfinite(s.temperature) and s.temperature >= 0,
         "must be finite and >= 0 (0 = greedy)"),
        ("top_p", s.top_p, 0 < s.top_p <= 1, "must lie in (0, 1] (1 disables)"),
        ("top_k", s.top_k, s.top_k >= 0, "must be >= 0 (0 disables)"),
        ("min_p", s.min_p, 0 <= s.min_p <= 1, "must lie in [0, 1] (0 disables)"),
        ("presence_penalty", s.presence_penalty, -2 <= s.presence_penalty <= 2,
         "must lie in [-2, 2]"),
        ("frequency_penalty", s.frequency_penalty, -2 <= s.frequency_penalty <= 2,
         "must lie in [-2, 2]"),
        ("repetition_penalty", s.repetition_penalty,
         math.isfinite(s.repetition_penalty) and s.repetition_penalty > 0,
         "must be finite and > 0 (1 disables)"),
        ("max_output_tokens", s.max_output_tokens,
         0 < s.max_output_tokens <= serving.context_tokens,
         f"must lie in [1, context_tokens = {serving.context_tokens}]"),
    )
    for name, value, ok, detail in checks:
        if not ok:
            yield F("sampling.defaults", SamplingDefaultsError, f"defaults.sampling.{name}",
                    value, detail)


def serving_extents(serving: pb.ServingContract) -> Findings:
    """Context, prefill, concurrency and speculative-width extents agree with the graphs."""
    if serving.context_tokens == 0:
        yield F("capacity.context", ExtentError, "context_tokens", 0, "must be positive")
    graphs = serving.model.graphs
    prefill = [g.token_capacity for g in graphs if g.operation == pb.OPERATION_PREFILL]
    if prefill and serving.prefill_chunk_tokens != max(prefill):
        yield F("capacity.prefill", CapacityMismatchError, "prefill_chunk_tokens",
                serving.prefill_chunk_tokens,
                f"must equal the largest captured prefill chunk ({max(prefill)} tokens)")
    if serving.prefill_chunk_tokens > serving.context_tokens:
        yield F("capacity.prefill_context", ExtentError, "prefill_chunk_tokens",
                serving.prefill_chunk_tokens,
                f"exceeds context_tokens ({serving.context_tokens})")
    decode = [g.batch_capacity for g in graphs if g.operation == pb.OPERATION_DECODE]
    if decode and not 0 < serving.selected_concurrency <= max(decode):
        yield F("capacity.concurrency", CapacityMismatchError, "selected_concurrency",
                serving.selected_concurrency,
                f"must lie in [1, largest captured decode batch = {max(decode)}]")
    widths = {
        g.speculative.token_capacity for g in graphs if g.operation == pb.OPERATION_SPECULATIVE
    }
    seen: set[int] = set()
    for index, width in enumerate(serving.speculative_widths):
        if width not in widths:
            yield F("capacity.speculative_width", SpeculativeExtentError,
                    f"speculative_widths[{index}]", width,
                    f"no SPECULATIVE graph captures W = {width} (captured: {sorted(widths)})")
        if width in seen:
            yield F("capacity.speculative_width_duplicate", DuplicateIdentifierError,
                    f"speculative_widths[{index}]", width, "listed twice")
        seen.add(width)
    paged = any(r.kind in PAGED_KINDS for r in serving.model.cache.regions)
    if paged and serving.prepared_pages == 0:
        yield F("capacity.prepared_pages", ExtentError, "prepared_pages", 0,
                "paged histories need a prepared page capacity")


# --- cache -----------------------------------------------------------------------------------


def cache(serving: pb.ServingContract) -> Findings:
    """Page tokens, history regions (planes, ratios, windows) and page-table views."""
    c = serving.model.cache
    if c.page_tokens == 0:
        yield F("cache.page_tokens", ExtentError, "model.cache.page_tokens", 0, "must be positive")
    if not c.regions:
        yield F("cache.regions", MissingFieldError, "model.cache.regions",
                detail="no attention-history storage")
    names: dict[str, int] = {}
    planes: set[str] = set()
    for index, region in enumerate(c.regions):
        path = f"model.cache.regions[{index}]"
        if not region.name:
            yield F("cache.region_name", MissingFieldError, f"{path}.name", "",
                    "history regions are named")
        elif region.name in names:
            yield F("cache.region_duplicate", DuplicateIdentifierError, f"{path}.name",
                    region.name, "region declared twice")
        else:
            names[region.name] = region.kind
        for p, plane in enumerate(region.planes):
            if plane in planes:
                yield F("cache.plane_duplicate", DuplicateIdentifierError, f"{path}.planes[{p}]",
                        plane, "a cache plane belongs to one region once")
            planes.add(plane)
        if region.kind in PAGED_KINDS:
            if not region.planes:
                yield F("cache.paged_planes", MissingFieldError, f"{path}.planes",
                        detail="paged regions name their planes")
            if region.tokens_per_record == 0:
                yield F("cache.tokens_per_record", ExtentError, f"{path}.tokens_per_record", 0,
                        "paged regions declare tokens per record >= 1")
        if region.kind == pb.HISTORY_KIND_SLIDING_WINDOW:
            yield from _window_region(region, path)
        elif region.window_tokens:
            yield F("cache.window", ExtentError, f"{path}.window_tokens", region.window_tokens,
                    "only sliding-window regions have a window extent")
    viewed: set[str] = set()
    offsets: dict[str, int] = {}  # view buffer -> page offset of its first view
    windowed: dict[str, bool] = {}  # view buffer -> whether its first view is a window's
    for index, view in enumerate(c.page_table_views):
        path = f"model.cache.page_table_views[{index}]"
        kind = names.get(view.region)
        if kind not in VIEWED_KINDS:
            yield F("cache.view_region", UnknownIdentifierError, f"{path}.region", view.region,
                    "not a paged or sliding-window history region of model.cache.regions")
        window = kind == pb.HISTORY_KIND_SLIDING_WINDOW
        if window and view.page_offset:
            yield F("cache.window_view_offset", ViewBoundsError, f"{path}.page_offset",
                    view.page_offset, "a sliding-window view is unshifted: entry i holds "
                    "the page of positions [i * page_tokens, (i + 1) * page_tokens)")
        if view.buffer and windowed.setdefault(view.buffer, window) != window:
            # A window's pages come from its own pool and leave it behind the window.
            yield F("cache.window_view_shared", DuplicateIdentifierError, f"{path}.buffer",
                    view.buffer, "a sliding-window region's page table holds its own page "
                    "ids: no paged region's view shares its buffer")
        if not view.buffer:
            yield F("cache.view_buffer", MissingFieldError, f"{path}.buffer", "",
                    "page-table views name their buffer")
        elif offsets.setdefault(view.buffer, view.page_offset) != view.page_offset:
            # Version 1 gives every paged region the one implicit "page_table" view.
            yield F("cache.view_buffer_shared", DuplicateIdentifierError, f"{path}.buffer",
                    view.buffer, f"views sharing a buffer agree on page_offset "
                    f"({offsets[view.buffer]})")
        # PageTableView (contract.proto): entry i of a view references page i + page_offset.
        if view.page_offset < 0:
            yield F("cache.view_offset", ViewBoundsError, f"{path}.page_offset",
                    view.page_offset, "a view cannot reference pages before a request's first")
        viewed.add(view.region)
    for index, region in enumerate(c.regions):
        if region.kind in VIEWED_KINDS and region.name not in viewed:
            yield F("cache.region_view", MissingFieldError, f"model.cache.regions[{index}]",
                    region.name, "paged or sliding-window region has no page-table view")
    if any(r.kind == pb.HISTORY_KIND_SLIDING_WINDOW for r in c.regions):
        for index, region in enumerate(c.regions):
            if region.kind == pb.HISTORY_KIND_CONTINUATION:
                yield F("cache.window_snapshots", UnsupportedFeatureError,
                        f"model.cache.regions[{index}].kind", "HISTORY_KIND_CONTINUATION",
                        "exact-endpoint snapshots restore paged regions only: a "
                        "sliding-window region's pages leave it behind the window, so a "
                        "snapshot could not restore the window's last tokens")


def _window_region(region: pb.HistoryRegion, path: str) -> Findings:
    """A sliding-window region (the specification, "Attention histories and cache
    policy"): its window extent, its planes (one record per token), no host tier."""
    if region.window_tokens == 0:
        yield F("cache.window", ExtentError, f"{path}.window_tokens", 0,
                "sliding windows declare their extent")
    if not region.planes:
        yield F("cache.window_planes", MissingFieldError, f"{path}.planes",
                detail="sliding-window regions name their planes")
    if region.tokens_per_record != 1:
        yield F("cache.window_records", ExtentError, f"{path}.tokens_per_record",
                region.tokens_per_record, "a sliding window stores one record per token")
    if region.host_planes:
        yield F("cache.window_host", ExtentError, f"{path}.host_planes",
                len(region.host_planes), "a sliding window's pages are private to their "
                "request and released behind the window: no host tier")


# --- graphs ----------------------------------------------------------------------------------


def _covers(outer: pb.StateView, inner: pb.StateView) -> bool:
    return (
        outer.buffer == inner.buffer
        and outer.row_stride == inner.row_stride
        and outer.byte_offset <= inner.byte_offset
        and inner.byte_offset + inner.byte_extent <= outer.byte_offset + outer.byte_extent
    )


def _bindings(serving: pb.ServingContract, graph: pb.GraphContract, path: str) -> Findings:
    page_tables = {v.buffer for v in serving.model.cache.page_table_views}
    destinations: set[str] = set()
    for index, binding in enumerate(graph.bindings):
        here = f"{path}.bindings[{index}]"
        if not binding.destination:
            yield F("binding.destination_missing", MissingFieldError, f"{here}.destination", "",
                    "bindings name a destination")
        elif binding.destination in destinations:
            yield F("binding.destination_duplicate", DuplicateIdentifierError,
                    f"{here}.destination", binding.destination,
                    "destination bound twice in one graph")
        destinations.add(binding.destination)
        image = binding.source == pb.VALUE_SOURCE_IMAGE_TENSOR
        if image and not binding.image_output:
            yield F("binding.image_output", BindingError, f"{here}.image_output", "",
                    "image tensor bindings name an output")
        if not image and binding.image_output:
            yield F("binding.image_output", BindingError, f"{here}.image_output",
                    binding.image_output,
                    f"only VALUE_SOURCE_IMAGE_TENSOR names an image output, not "
                    f"{enum_name(pb.ValueSource, binding.source)}")
        if binding.source != pb.VALUE_SOURCE_CONSTANT and binding.constant_value:
            yield F("binding.constant", BindingError, f"{here}.constant_value",
                    binding.constant_value,
                    f"only VALUE_SOURCE_CONSTANT carries a constant, not "
                    f"{enum_name(pb.ValueSource, binding.source)}")
        if binding.source == pb.VALUE_SOURCE_PAGE_TABLE and binding.destination not in page_tables:
            yield F("binding.page_table", UnknownIdentifierError, f"{here}.destination",
                    binding.destination,
                    f"page tables are written to page-table view buffers {sorted(page_tables)}")


def _scored_targets(graph: pb.GraphContract, path: str) -> Findings:
    """A SCORED_PREFILL graph scores each packed token against its target (the next
    prompt token): it binds VALUE_SOURCE_SCORED_TARGET_TOKENS per packed token, padding
    -1 (no target: nothing is written for that token). No other operation binds targets
    (the specification, "Host values and graph state": scored-prefill target tokens)."""
    scored = graph.operation == pb.OPERATION_SCORED_PREFILL
    targets = [(i, b) for i, b in enumerate(graph.bindings)
               if b.source == pb.VALUE_SOURCE_SCORED_TARGET_TOKENS]
    if scored and not targets:
        yield F("scored.targets", BindingError, f"{path}.bindings",
                "no VALUE_SOURCE_SCORED_TARGET_TOKENS",
                "SCORED_PREFILL graphs bind the target token of every packed token")
    for i, binding in targets:
        here = f"{path}.bindings[{i}]"
        if not scored:
            yield F("scored.targets", BindingError, f"{here}.source",
                    "VALUE_SOURCE_SCORED_TARGET_TOKENS",
                    f"only SCORED_PREFILL graphs bind target tokens, not "
                    f"{enum_name(pb.Operation, graph.operation)}")
        elif binding.indexing != pb.INDEXING_PACKED_TOKEN:
            yield F("scored.targets", BindingError, f"{here}.indexing",
                    enum_name(pb.Indexing, binding.indexing),
                    "target tokens are indexed per packed token (INDEXING_PACKED_TOKEN)")
        elif binding.padding != -1 or binding.offset:
            yield F("scored.targets", BindingError, f"{here}.padding", binding.padding,
                    "target tokens pad with -1 (no target) and take no offset")


def _speculative(graph: pb.GraphContract, path: str) -> Findings:
    rule = "speculative.extent"
    if graph.operation != pb.OPERATION_SPECULATIVE:
        if graph.HasField("speculative"):
            yield F(rule, SpeculativeExtentError, f"{path}.speculative", "set",
                    f"only SPECULATIVE graphs carry a speculative descriptor, not "
                    f"{enum_name(pb.Operation, graph.operation)}")
        return
    if not graph.HasField("speculative"):
        yield F("speculative.descriptor", MissingFieldError, f"{path}.speculative",
                detail="SPECULATIVE graphs declare B, D, W, P")
        return
    spec = graph.speculative
    here = f"{path}.speculative"
    b, d, w, p = spec.batch_capacity, spec.draft_tokens, spec.token_capacity, spec.packed_token_capacity
    zero = [name for name, value in (("batch_capacity", b), ("token_capacity", w),
                                     ("packed_token_capacity", p)) if value == 0]
    for name in zero:
        yield F(rule, SpeculativeExtentError, f"{here}.{name}", 0, "must be explicit and positive")
    if b != graph.batch_capacity:
        yield F(rule, SpeculativeExtentError, f"{here}.batch_capacity", b,
                f"B must equal the graph's batch_capacity ({graph.batch_capacity})")
    if p != graph.token_capacity:
        yield F(rule, SpeculativeExtentError, f"{here}.packed_token_capacity", p,
                f"P must equal the graph's token_capacity ({graph.token_capacity})")
    if not zero and not b <= p <= b * w:
        yield F(rule, SpeculativeExtentError, f"{here}.packed_token_capacity", p,
                f"every lane starts with one pending position: need B ({b}) <= P <= B x W "
                f"({b * w})")
    if w == 1 and d:
        yield F(rule, SpeculativeExtentError, f"{here}.draft_tokens", d,
                "width-one speculative programs draw no proposals")
    ceiling = min(d + 1, w)
    if not 1 <= spec.lane_limit <= ceiling:
        yield F("speculative.lane_limit", SpeculativeExtentError, f"{here}.lane_limit",
                spec.lane_limit, f"must lie in [1, min(D + 1, W) = {ceiling}]")
    if spec.produces_confidence:
        if d == 0 or spec.confidence_width != d:
            yield F("speculative.confidence_width", SpeculativeExtentError,
                    f"{here}.confidence_width", spec.confidence_width,
                    f"a program producing confidence declares confidence_width = D ({d}), D > 0")
    elif spec.confidence_width:
        yield F("speculative.confidence_width", SpeculativeExtentError,
                f"{here}.confidence_width", spec.confidence_width,
                "only programs producing confidence declare a confidence width")
    length_bindings = [
        (index, binding) for index, binding in enumerate(graph.bindings)
        if binding.source in LENGTH_SOURCES
    ]
    if len(length_bindings) != 1:
        yield F("speculative.length_source", LengthSourceError, f"{path}.bindings",
                len(length_bindings),
                "a speculative program binds exactly one of QUERY_LENGTH / SPECULATIVE_PREFIX_LIMIT")
        return
    yield from _candidate_masks(graph, path)
    index, binding = length_bindings[0]
    if LENGTH_SOURCES[binding.source] != spec.length_source:
        yield F("speculative.length_source", LengthSourceError, f"{path}.bindings[{index}].source",
                enum_name(pb.ValueSource, binding.source),
                f"disagrees with length_source {enum_name(pb.LengthSource, spec.length_source)}")


# What per-position candidate grammar masks are relative to: the copied candidates (mask
# i follows candidate i, for the generation and endpoint they were proposed for) and the
# lane's own grammar mask (its pending position, and whether the lane is constrained).
CANDIDATE_MASK_NEEDS = (
    pb.VALUE_SOURCE_CANDIDATE_IDS, pb.VALUE_SOURCE_CANDIDATE_COUNT,
    pb.VALUE_SOURCE_CANDIDATE_GENERATION, pb.VALUE_SOURCE_CANDIDATE_CONSUMED_ENDPOINT,
    pb.VALUE_SOURCE_GRAMMAR_MASK, pb.VALUE_SOURCE_GRAMMAR_MASK_ENABLED,
)


def _candidate_masks(graph: pb.GraphContract, path: str) -> Findings:
    """A program binding CANDIDATE_GRAMMAR_MASKS binds what the masks follow."""
    bound = {b.source for b in graph.bindings}
    if pb.VALUE_SOURCE_CANDIDATE_GRAMMAR_MASKS not in bound:
        return
    missing = [enum_name(pb.ValueSource, s) for s in CANDIDATE_MASK_NEEDS if s not in bound]
    if missing:
        yield F("speculative.candidate_masks", BindingError, f"{path}.bindings", missing,
                "per-position candidate grammar masks follow the copied candidates and the "
                "lane's grammar mask")


# What a MIXED graph binds (rule mixed.bindings): its packed tokens fed from the host
# (prefill chunks' prompt tokens and decode lanes' completed pending tokens), each packed
# token's row and position, and each row's slot, token count and sampling decision.
MIXED_TOKEN_SOURCES = (pb.VALUE_SOURCE_PROMPT_TOKENS, pb.VALUE_SOURCE_PENDING_TOKEN)
_PER_TOKEN = (pb.INDEXING_PACKED_TOKEN,)
_PER_ROW = (pb.INDEXING_SUBMISSION_ROW, pb.INDEXING_ACTIVE_ROW)
MIXED_NEEDS = (
    (pb.VALUE_SOURCE_MIXED_PREFILL_ROW, _PER_TOKEN),
    (pb.VALUE_SOURCE_PROMPT_POSITIONS, _PER_TOKEN),
    (pb.VALUE_SOURCE_QUERY_LENGTH, _PER_ROW),
    (pb.VALUE_SOURCE_SAMPLING_DECISION, _PER_ROW),
    (pb.VALUE_SOURCE_SLOT, _PER_ROW),
)


def _mixed(graph: pb.GraphContract, path: str) -> Findings:
    """A MIXED graph (mixed generation) runs decode lanes and prefill chunks as rows of
    one packed step: it binds its packed tokens from the host (PROMPT_TOKENS or
    PENDING_TOKEN per packed token: a decode lane's pending token is the completed one,
    since a step that changes phase waits for completion feedback), each packed token's
    row (MIXED_PREFILL_ROW), positions, each row's slot, length and sampling decision."""
    if graph.operation != pb.OPERATION_MIXED:
        return
    bound = {(b.source, b.indexing) for b in graph.bindings}
    missing = []
    if not any((s, pb.INDEXING_PACKED_TOKEN) in bound for s in MIXED_TOKEN_SOURCES):
        missing.append("VALUE_SOURCE_PROMPT_TOKENS or VALUE_SOURCE_PENDING_TOKEN per packed "
                       "token")
    for source, indexings in MIXED_NEEDS:
        if not any((source, i) in bound for i in indexings):
            per = "packed token" if indexings is _PER_TOKEN else "row"
            missing.append(f"{enum_name(pb.ValueSource, source)} per {per}")
    if missing:
        yield F("mixed.bindings", BindingError, f"{path}.bindings", missing,
                "a MIXED graph packs host-fed decode lanes and prefill chunks: it binds "
                + "; ".join(missing))


def _pending_token(graph: pb.GraphContract, path: str) -> Findings:
    rule = "graph.pending_token"
    device = graph.HasField("pending_token") and bool(graph.pending_token.buffer)
    host = [i for i, b in enumerate(graph.bindings) if b.source == pb.VALUE_SOURCE_PENDING_TOKEN]
    if graph.HasField("pending_token") and not device:
        yield F(rule, MissingFieldError, f"{path}.pending_token.buffer", "",
                "state views name a buffer")
    if graph.operation == pb.OPERATION_MIXED:
        # Host-fed lanes (rule mixed.bindings); a device view is only written: the
        # tokens its sampling rows produce, read by the next decode.
        if device and not any(a.access in WRITES and _covers(a.view, graph.pending_token)
                              for a in graph.state_accesses):
            yield F(rule, PendingTokenError, f"{path}.pending_token", graph.pending_token.buffer,
                    "a MIXED graph writes the pending tokens it samples: declare WRITE state "
                    "access covering the view")
        return
    generating = graph.operation in GENERATING_OPERATIONS
    if device and host:
        yield F(rule, PendingTokenError, f"{path}.bindings[{host[0]}].source",
                "VALUE_SOURCE_PENDING_TOKEN",
                "pending token is device-owned (pending_token) and host-bound at once")
    if generating and not (device or host):
        yield F(rule, PendingTokenError, f"{path}.pending_token",
                enum_name(pb.Operation, graph.operation),
                "generating graphs name a pending-token state view or bind "
                "VALUE_SOURCE_PENDING_TOKEN")
    if not device:
        return
    views = [(a.access, a.view) for a in graph.state_accesses]
    readable = any(access in READS and _covers(v, graph.pending_token) for access, v in views)
    written = any(access in WRITES and _covers(v, graph.pending_token) for access, v in views)
    if generating and not (readable and written):
        yield F(rule, PendingTokenError, f"{path}.pending_token", graph.pending_token.buffer,
                "generating graphs read the pending token and write the next: declare "
                "READ_WRITE state access covering the view")
    elif not (readable or written):
        yield F(rule, PendingTokenError, f"{path}.pending_token", graph.pending_token.buffer,
                "no state access of this graph covers the pending-token view")


def graphs(serving: pb.ServingContract) -> Findings:
    """Names, capacities, bindings, state accesses, speculative extents, pending tokens."""
    names: set[str] = set()
    for index, graph in enumerate(serving.model.graphs):
        path = f"model.graphs[{index}]"
        if not graph.name:
            yield F("graph.name", MissingFieldError, f"{path}.name", "",
                    "graphs name their captured program")
        elif graph.name in names:
            yield F("graph.duplicate", DuplicateIdentifierError, f"{path}.name", graph.name,
                    "graph declared twice")
        names.add(graph.name)
        if graph.operation in ROW_OPERATIONS:
            zero = [f for f in ("batch_capacity", "token_capacity") if getattr(graph, f) == 0]
            for fd in zero:
                yield F("graph.capacity_zero", ExtentError, f"{path}.{fd}", 0,
                        "captured capacities are positive")
            if not zero and graph.token_capacity < graph.batch_capacity:
                yield F("graph.tokens_per_row", ExtentError, f"{path}.token_capacity",
                        graph.token_capacity,
                        f"every row carries a token: must be >= batch_capacity "
                        f"({graph.batch_capacity})")
        if graph.operation == pb.OPERATION_DECODE and graph.token_capacity != graph.batch_capacity:
            yield F("graph.decode_tokens", ExtentError, f"{path}.token_capacity",
                    graph.token_capacity,
                    f"DECODE packs one token per row: must equal batch_capacity "
                    f"({graph.batch_capacity})")
        for a, access in enumerate(graph.state_accesses):
            if not access.view.buffer:
                yield F("graph.state_view_buffer", MissingFieldError,
                        f"{path}.state_accesses[{a}].view.buffer", "",
                        "state views name a buffer")
        for t, tuned in enumerate(graph.tuned_bindings):
            for fd in ("buffer", "producer_graph"):
                if not getattr(tuned, fd):
                    yield F("tuned.explicit", MissingFieldError,
                            f"{path}.tuned_bindings[{t}].{fd}", "", "tuned bindings are explicit")
        cursor = graph.completion_cursor
        if not cursor.has_draft_cursor and cursor.lag_tokens:
            yield F("graph.cursor_lag", ExtentError, f"{path}.completion_cursor.lag_tokens",
                    cursor.lag_tokens, "a graph without a draft cursor has no cursor lag")
        yield from _bindings(serving, graph, path)
        yield from _scored_targets(graph, path)
        yield from _speculative(graph, path)
        yield from _mixed(graph, path)
        yield from _pending_token(graph, path)
    yield from _lane_limits(serving)


def _lane_limits(serving: pb.ServingContract) -> Findings:
    """Every SPECULATIVE graph of one width W declares the same lane_limit.

    The host picks each lane's length from its request and the served widths before it
    selects the batch variant that runs the step (the specification, "Complete
    speculative generation": the host chooses the cohort and physical program), so the
    longest lane a width serves is a property of the width: one lane limit per W, for
    every batch capacity and both length sources. The one rule for it; lint and startup
    both apply it (PreparedContract.lane_limits reads the limits it leaves consistent).
    """
    first: dict[int, tuple[int, int]] = {}  # W -> (graph index, its lane_limit)
    for index, graph in enumerate(serving.model.graphs):
        if graph.operation != pb.OPERATION_SPECULATIVE or not graph.HasField("speculative"):
            continue
        spec = graph.speculative
        width = spec.token_capacity
        if width not in first:
            first[width] = (index, spec.lane_limit)
            continue
        other, limit = first[width]
        if spec.lane_limit != limit:
            yield F("speculative.lane_limit_consistency", SpeculativeExtentError,
                    f"model.graphs[{index}].speculative.lane_limit", spec.lane_limit,
                    f"W = {width} programs declare one lane limit: model.graphs[{other}] "
                    f"({serving.model.graphs[other].name}) declares {limit}")
