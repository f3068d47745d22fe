"""Rules a version 3 ServingContract must satisfy on its own (no execution manifest).

Each check raises the first violation as a ``ContractError`` subclass naming the field
path from the ``ServingContract`` root. Sections follow shared/seed/model-contract.md.
"""

from __future__ import annotations

import math

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
    VocabularyRangeError,
)

PAGED_KINDS = (pb.HISTORY_KIND_PAGED_KV, pb.HISTORY_KIND_PAGED_LATENT)
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


# --- presence and selectors ------------------------------------------------------------------


def check_required(serving: pb.ServingContract) -> None:
    """Messages and lists without which no runtime can serve the contract."""
    if not serving.HasField("model"):
        raise MissingFieldError("model", detail="ServingContract carries no ModelContract")
    for name in ("vocabulary", "input_vocabulary", "cache", "frontend"):
        if not serving.model.HasField(name):
            raise MissingFieldError(f"model.{name}", detail="required message is absent")
    if not serving.model.graphs:
        raise MissingFieldError("model.graphs", detail="a contract declares at least one graph")
    if not serving.served_id:
        raise MissingFieldError("served_id", "", "the served identifier is empty")
    if not serving.HasField("defaults") or not serving.defaults.HasField("sampling"):
        raise MissingFieldError("defaults.sampling", detail="complete sampling defaults required")
    if not serving.eos_token_ids:
        raise MissingFieldError("eos_token_ids", detail="generation ends only at the core's EOS IDs")


def check_selectors(message: Message, path: str) -> None:
    """Reject any enum field left at its UNSPECIFIED zero value in ``message``'s tree.

    Every enum of the schema reserves 0 for UNSPECIFIED, which cannot select an
    implementation; absent sub-messages are not visited.
    """
    for field in message.DESCRIPTOR.fields:
        here = f"{path}.{field.name}"
        repeated = field.is_repeated
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_ENUM:
            numbers = list(value) if repeated else [value]
            for index, number in enumerate(numbers):
                if number == 0:
                    where = f"{here}[{index}]" if repeated else here
                    raise UnspecifiedSelectorError(
                        where, field.enum_type.values_by_number[0].name,
                        "an UNSPECIFIED selector cannot select an implementation",
                    )
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                continue  # the contract has no maps of messages or enums
            if repeated:
                for index, item in enumerate(value):
                    check_selectors(item, f"{here}[{index}]")
            elif message.HasField(field.name):
                check_selectors(value, here)


# --- vocabulary, extents, sampling -----------------------------------------------------------


def check_vocabulary(serving: pb.ServingContract) -> None:
    """Sampled range, histogram/mask geometry, input range, image sentinels, EOS ids."""
    vocab = serving.model.vocabulary
    if vocab.sampled_tokens == 0:
        raise VocabularyRangeError("model.vocabulary.sampled_tokens", 0, "must be positive")
    if vocab.histogram_width < vocab.sampled_tokens:
        raise VocabularyRangeError(
            "model.vocabulary.histogram_width", vocab.histogram_width,
            f"must be >= sampled_tokens ({vocab.sampled_tokens})",
        )
    words = math.ceil(vocab.histogram_width / 32)
    if vocab.mask_words != words:
        raise VocabularyRangeError(
            "model.vocabulary.mask_words", vocab.mask_words,
            f"must equal ceil(histogram_width / 32) = {words}",
        )
    inputs = serving.model.input_vocabulary
    if inputs.input_tokens < vocab.sampled_tokens:
        raise VocabularyRangeError(
            "model.input_vocabulary.input_tokens", inputs.input_tokens,
            f"sampled ids are inputs too: must be >= sampled_tokens ({vocab.sampled_tokens})",
        )
    seen: set[int] = set()
    for index, sentinel in enumerate(inputs.image_sentinel_ids):
        path = f"model.input_vocabulary.image_sentinel_ids[{index}]"
        if not vocab.sampled_tokens <= sentinel < inputs.input_tokens:
            raise VocabularyRangeError(
                path, sentinel,
                f"image sentinels are nonsampled inputs: need {vocab.sampled_tokens} <= id "
                f"< {inputs.input_tokens}",
            )
        if sentinel in seen:
            raise DuplicateIdentifierError(path, sentinel, "image sentinel declared twice")
        seen.add(sentinel)
    for index, eos in enumerate(serving.eos_token_ids):
        if eos >= vocab.sampled_tokens:
            raise VocabularyRangeError(
                f"eos_token_ids[{index}]", eos,
                f"EOS ids are sampled ids: must be < sampled_tokens ({vocab.sampled_tokens})",
            )


def check_sampling_defaults(serving: pb.ServingContract) -> None:
    """Model-card sampling defaults lie in the ranges the sampler accepts."""
    s = serving.defaults.sampling
    path = "defaults.sampling"
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
            raise SamplingDefaultsError(f"{path}.{name}", value, detail)


def check_serving_extents(serving: pb.ServingContract) -> None:
    """Context, prefill, concurrency and speculative-width extents agree with the graphs."""
    if serving.context_tokens == 0:
        raise ExtentError("context_tokens", 0, "must be positive")
    graphs = serving.model.graphs
    prefill = [g.token_capacity for g in graphs if g.operation == pb.OPERATION_PREFILL]
    if prefill and serving.prefill_chunk_tokens != max(prefill):
        raise CapacityMismatchError(
            "prefill_chunk_tokens", serving.prefill_chunk_tokens,
            f"must equal the largest captured prefill chunk ({max(prefill)} tokens)",
        )
    if serving.prefill_chunk_tokens > serving.context_tokens:
        raise ExtentError(
            "prefill_chunk_tokens", serving.prefill_chunk_tokens,
            f"exceeds context_tokens ({serving.context_tokens})",
        )
    decode = [g.batch_capacity for g in graphs if g.operation == pb.OPERATION_DECODE]
    if decode and not 0 < serving.selected_concurrency <= max(decode):
        raise CapacityMismatchError(
            "selected_concurrency", serving.selected_concurrency,
            f"must lie in [1, largest captured decode batch = {max(decode)}]",
        )
    widths = {
        g.speculative.token_capacity for g in graphs if g.operation == pb.OPERATION_SPECULATIVE
    }
    seen: set[int] = set()
    for index, width in enumerate(serving.speculative_widths):
        if width not in widths:
            raise SpeculativeExtentError(
                f"speculative_widths[{index}]", width,
                f"no SPECULATIVE graph captures W = {width} (captured: {sorted(widths)})",
            )
        if width in seen:
            raise DuplicateIdentifierError(f"speculative_widths[{index}]", width, "listed twice")
        seen.add(width)
    paged = any(r.kind in PAGED_KINDS for r in serving.model.cache.regions)
    if paged and serving.prepared_pages == 0:
        raise ExtentError("prepared_pages", 0, "paged histories need a prepared page capacity")


# --- cache -----------------------------------------------------------------------------------


def check_cache(serving: pb.ServingContract) -> None:
    """Page tokens, history regions (planes, ratios, windows) and page-table views."""
    cache = serving.model.cache
    if cache.page_tokens == 0:
        raise ExtentError("model.cache.page_tokens", 0, "must be positive")
    if not cache.regions:
        raise MissingFieldError("model.cache.regions", detail="no attention-history storage")
    names: dict[str, int] = {}
    planes: set[str] = set()
    for index, region in enumerate(cache.regions):
        path = f"model.cache.regions[{index}]"
        if not region.name:
            raise MissingFieldError(f"{path}.name", "", "history regions are named")
        if region.name in names:
            raise DuplicateIdentifierError(f"{path}.name", region.name, "region declared twice")
        names[region.name] = region.kind
        for p, plane in enumerate(region.planes):
            if plane in planes:
                raise DuplicateIdentifierError(
                    f"{path}.planes[{p}]", plane, "a cache plane belongs to one region once"
                )
            planes.add(plane)
        if region.kind in PAGED_KINDS:
            if not region.planes:
                raise MissingFieldError(f"{path}.planes", detail="paged regions name their planes")
            if region.tokens_per_record == 0:
                raise ExtentError(
                    f"{path}.tokens_per_record", 0, "paged regions declare tokens per record >= 1"
                )
        if region.kind == pb.HISTORY_KIND_SLIDING_WINDOW:
            if region.window_tokens == 0:
                raise ExtentError(f"{path}.window_tokens", 0, "sliding windows declare their extent")
        elif region.window_tokens:
            raise ExtentError(
                f"{path}.window_tokens", region.window_tokens,
                "only sliding-window regions have a window extent",
            )
    viewed: set[str] = set()
    for index, view in enumerate(cache.page_table_views):
        path = f"model.cache.page_table_views[{index}]"
        if names.get(view.region) not in PAGED_KINDS:
            raise UnknownIdentifierError(
                f"{path}.region", view.region, "not a paged history region of model.cache.regions"
            )
        if not view.buffer:
            raise MissingFieldError(f"{path}.buffer", "", "page-table views name their buffer")
        viewed.add(view.region)
    for index, region in enumerate(cache.regions):
        if region.kind in PAGED_KINDS and region.name not in viewed:
            raise MissingFieldError(
                f"model.cache.regions[{index}]", region.name, "paged region has no page-table view"
            )


# --- graphs ----------------------------------------------------------------------------------


def _covers(outer: pb.StateView, inner: pb.StateView) -> bool:
    return (
        outer.buffer == inner.buffer
        and outer.row_stride == inner.row_stride
        and outer.byte_offset <= inner.byte_offset
        and inner.byte_offset + inner.byte_extent <= outer.byte_offset + outer.byte_extent
    )


def _check_bindings(serving: pb.ServingContract, graph: pb.GraphContract, path: str) -> None:
    page_tables = {v.buffer for v in serving.model.cache.page_table_views}
    destinations: set[str] = set()
    for index, binding in enumerate(graph.bindings):
        here = f"{path}.bindings[{index}]"
        if not binding.destination:
            raise MissingFieldError(f"{here}.destination", "", "bindings name a destination")
        if binding.destination in destinations:
            raise DuplicateIdentifierError(
                f"{here}.destination", binding.destination, "destination bound twice in one graph"
            )
        destinations.add(binding.destination)
        image = binding.source == pb.VALUE_SOURCE_IMAGE_TENSOR
        if image and not binding.image_output:
            raise BindingError(f"{here}.image_output", "", "image tensor bindings name an output")
        if not image and binding.image_output:
            raise BindingError(
                f"{here}.image_output", binding.image_output,
                f"only VALUE_SOURCE_IMAGE_TENSOR names an image output, not "
                f"{enum_name(pb.ValueSource, binding.source)}",
            )
        if binding.source != pb.VALUE_SOURCE_CONSTANT and binding.constant_value:
            raise BindingError(
                f"{here}.constant_value", binding.constant_value,
                f"only VALUE_SOURCE_CONSTANT carries a constant, not "
                f"{enum_name(pb.ValueSource, binding.source)}",
            )
        if binding.source == pb.VALUE_SOURCE_PAGE_TABLE and binding.destination not in page_tables:
            raise UnknownIdentifierError(
                f"{here}.destination", binding.destination,
                f"page tables are written to page-table view buffers {sorted(page_tables)}",
            )


def _check_speculative(serving: pb.ServingContract, graph: pb.GraphContract, path: str) -> None:
    if graph.operation != pb.OPERATION_SPECULATIVE:
        if graph.HasField("speculative"):
            raise SpeculativeExtentError(
                f"{path}.speculative", "set",
                f"only SPECULATIVE graphs carry a speculative descriptor, not "
                f"{enum_name(pb.Operation, graph.operation)}",
            )
        return
    if not graph.HasField("speculative"):
        raise MissingFieldError(f"{path}.speculative", detail="SPECULATIVE graphs declare B, D, W, P")
    spec = graph.speculative
    here = f"{path}.speculative"
    b, d, w, p = spec.batch_capacity, spec.draft_tokens, spec.token_capacity, spec.packed_token_capacity
    for name, value in (("batch_capacity", b), ("token_capacity", w),
                        ("packed_token_capacity", p)):
        if value == 0:
            raise SpeculativeExtentError(f"{here}.{name}", 0, "must be explicit and positive")
    if b != graph.batch_capacity:
        raise SpeculativeExtentError(
            f"{here}.batch_capacity", b, f"B must equal the graph's batch_capacity "
            f"({graph.batch_capacity})",
        )
    if p != graph.token_capacity:
        raise SpeculativeExtentError(
            f"{here}.packed_token_capacity", p,
            f"P must equal the graph's token_capacity ({graph.token_capacity})",
        )
    if not b <= p <= b * w:
        raise SpeculativeExtentError(
            f"{here}.packed_token_capacity", p,
            f"every lane starts with one pending position: need B ({b}) <= P <= B x W ({b * w})",
        )
    if w == 1 and d:
        raise SpeculativeExtentError(
            f"{here}.draft_tokens", d, "width-one speculative programs draw no proposals"
        )
    ceiling = min(d + 1, w)
    if not 1 <= spec.lane_limit <= ceiling:
        raise SpeculativeExtentError(
            f"{here}.lane_limit", spec.lane_limit, f"must lie in [1, min(D + 1, W) = {ceiling}]"
        )
    if spec.produces_confidence:
        if d == 0 or spec.confidence_width != d:
            raise SpeculativeExtentError(
                f"{here}.confidence_width", spec.confidence_width,
                f"a program producing confidence declares confidence_width = D ({d}), D > 0",
            )
    elif spec.confidence_width:
        raise SpeculativeExtentError(
            f"{here}.confidence_width", spec.confidence_width,
            "only programs producing confidence declare a confidence width",
        )
    length_bindings = [
        (index, binding) for index, binding in enumerate(graph.bindings)
        if binding.source in LENGTH_SOURCES
    ]
    if len(length_bindings) != 1:
        raise LengthSourceError(
            f"{path}.bindings", len(length_bindings),
            "a speculative program binds exactly one of QUERY_LENGTH / SPECULATIVE_PREFIX_LIMIT",
        )
    index, binding = length_bindings[0]
    if LENGTH_SOURCES[binding.source] != spec.length_source:
        raise LengthSourceError(
            f"{path}.bindings[{index}].source", enum_name(pb.ValueSource, binding.source),
            f"disagrees with length_source {enum_name(pb.LengthSource, spec.length_source)}",
        )


def _check_pending_token(graph: pb.GraphContract, path: str) -> None:
    device = graph.HasField("pending_token") and bool(graph.pending_token.buffer)
    host = [i for i, b in enumerate(graph.bindings) if b.source == pb.VALUE_SOURCE_PENDING_TOKEN]
    if graph.HasField("pending_token") and not device:
        raise MissingFieldError(f"{path}.pending_token.buffer", "", "state views name a buffer")
    generating = graph.operation in GENERATING_OPERATIONS
    if device and host:
        raise PendingTokenError(
            f"{path}.bindings[{host[0]}].source", "VALUE_SOURCE_PENDING_TOKEN",
            "pending token is device-owned (pending_token) and host-bound at once",
        )
    if generating and not (device or host):
        raise PendingTokenError(
            f"{path}.pending_token", enum_name(pb.Operation, graph.operation),
            "generating graphs name a pending-token state view or bind VALUE_SOURCE_PENDING_TOKEN",
        )
    if not device:
        return
    views = [(a.access, a.view) for a in graph.state_accesses]
    readable = any(access in READS and _covers(v, graph.pending_token) for access, v in views)
    written = any(access in WRITES and _covers(v, graph.pending_token) for access, v in views)
    if generating and not (readable and written):
        raise PendingTokenError(
            f"{path}.pending_token", graph.pending_token.buffer,
            "generating graphs read the pending token and write the next: declare READ_WRITE "
            "state access covering the view",
        )
    if not (readable or written):
        raise PendingTokenError(
            f"{path}.pending_token", graph.pending_token.buffer,
            "no state access of this graph covers the pending-token view",
        )


def check_graphs(serving: pb.ServingContract) -> None:
    """Names, capacities, bindings, state accesses, speculative extents, pending tokens."""
    names: set[str] = set()
    for index, graph in enumerate(serving.model.graphs):
        path = f"model.graphs[{index}]"
        if not graph.name:
            raise MissingFieldError(f"{path}.name", "", "graphs name their captured program")
        if graph.name in names:
            raise DuplicateIdentifierError(f"{path}.name", graph.name, "graph declared twice")
        names.add(graph.name)
        if graph.operation in ROW_OPERATIONS:
            for field in ("batch_capacity", "token_capacity"):
                if getattr(graph, field) == 0:
                    raise ExtentError(f"{path}.{field}", 0, "captured capacities are positive")
            if graph.token_capacity < graph.batch_capacity:
                raise ExtentError(
                    f"{path}.token_capacity", graph.token_capacity,
                    f"every row carries a token: must be >= batch_capacity ({graph.batch_capacity})",
                )
        if graph.operation == pb.OPERATION_DECODE and graph.token_capacity != graph.batch_capacity:
            raise ExtentError(
                f"{path}.token_capacity", graph.token_capacity,
                f"DECODE packs one token per row: must equal batch_capacity "
                f"({graph.batch_capacity})",
            )
        for a, access in enumerate(graph.state_accesses):
            if not access.view.buffer:
                raise MissingFieldError(
                    f"{path}.state_accesses[{a}].view.buffer", "", "state views name a buffer"
                )
        for t, tuned in enumerate(graph.tuned_bindings):
            for field in ("buffer", "producer_graph"):
                if not getattr(tuned, field):
                    raise MissingFieldError(
                        f"{path}.tuned_bindings[{t}].{field}", "", "tuned bindings are explicit"
                    )
        cursor = graph.completion_cursor
        if not cursor.has_draft_cursor and cursor.lag_tokens:
            raise ExtentError(
                f"{path}.completion_cursor.lag_tokens", cursor.lag_tokens,
                "a graph without a draft cursor has no cursor lag",
            )
        _check_bindings(serving, graph, path)
        _check_speculative(serving, graph, path)
        _check_pending_token(graph, path)
