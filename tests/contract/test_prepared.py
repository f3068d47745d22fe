"""PreparedContract validation: one passing and one failing case per rule, each failure
asserting the exact ContractError subclass and field path.

Indices used below: model.graphs[0] is prefill_b1_t64, [1] is decode_b4, [2] the added
speculative_b4_w4. decode_b4.bindings: [0] slot ... [4] page_table ... [11] grammar mask;
decode_b4.state_accesses: [0] pending token, [1] histogram, [2] kv.k, [3] kv.v.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from helios_contract import (
    BindingError,
    BufferRoleError,
    CapacityMismatchError,
    DuplicateIdentifierError,
    ExtentError,
    LengthSourceError,
    MissingFieldError,
    MissingGraphVariantError,
    OperationMismatchError,
    PendingTokenError,
    PreparedContract,
    SamplingDefaultsError,
    SpeculativeExtentError,
    TunedOverlapError,
    TunedProducerError,
    UnknownIdentifierError,
    UnspecifiedSelectorError,
    UnsupportedFeatureError,
    UnsupportedVersionError,
    ViewBoundsError,
    VocabularyRangeError,
)
from helios_contract.schema import contract_pb2 as c
from helios_contract.schema import manifest_pb2 as mpb

from tests.contract.checks import accepts, rejects
from tests.contract.example import (
    DECODE,
    PREFILL,
    TUNED_BUFFER,
    TUNING_PRODUCER,
    add_speculative,
    add_tuning,
)

Mutation = Callable[[c.ServingContract, mpb.ExecutionManifest], None]


def buffer(manifest, name):
    return next(b for b in manifest.buffers if b.name == name)


def program(manifest, name):
    return next(p for p in manifest.graphs if p.name == name)


def decode(serving):
    return serving.model.graphs[1]


def spec(serving):
    return serving.model.graphs[2].speculative


def with_speculative(mutate: Mutation | None = None, *, confidence=False) -> Mutation:
    def apply(serving, manifest):
        add_speculative(serving, manifest, confidence=confidence)
        if mutate:
            mutate(serving, manifest)
    return apply


def with_tuning(mutate: Mutation | None = None) -> Mutation:
    def apply(serving, manifest):
        add_tuning(serving, manifest)
        if mutate:
            mutate(serving, manifest)
    return apply


def set_attr(getter, name, value) -> Mutation:
    def apply(serving, manifest):
        setattr(getter(serving), name, value)
    return apply


def host_pending_token(serving, manifest):
    """Make decode_b4's pending token host-owned: a value binding instead of a view."""
    graph = decode(serving)
    graph.ClearField("pending_token")
    graph.bindings.add(destination="in.tokens", source=c.VALUE_SOURCE_PENDING_TOKEN,
                       indexing=c.INDEXING_SUBMISSION_ROW)
    program(manifest, DECODE).transports.add(destination="in.tokens", nbytes=16)


def downgrade_to_v1(serving, manifest):
    model = serving.model
    model.version = 1
    model.vocabulary.mask_words = 0
    model.cache.ClearField("page_table_views")
    for graph in model.graphs:
        graph.ClearField("completion_cursor")


def narrow_page_table(serving, manifest):
    """15 page-table columns for 16 context pages (transports shrunk with the buffer)."""
    buffer(manifest, "page_table").shape[1] = 15
    for prog in manifest.graphs:
        for transport in prog.transports:
            if transport.destination == "page_table":
                transport.nbytes = 4 * 15 * 4


def resize_speculative(b, d, w, p, lane) -> Mutation:
    """Give the speculative graph new extents, keeping graph and manifest capacities equal."""
    def apply(serving, manifest):
        graph = serving.model.graphs[2]
        graph.speculative.batch_capacity, graph.speculative.draft_tokens = b, d
        graph.speculative.token_capacity = w
        graph.speculative.packed_token_capacity = p
        graph.speculative.lane_limit = lane
        graph.batch_capacity, graph.token_capacity = b, p
        prog = program(manifest, graph.name)
        prog.batch_capacity, prog.token_capacity = b, p
        prog.completion.rows = b
        prog.completion.speculative.token_width = w  # one emitted-id column per position
        serving.speculative_widths[:] = [w]
    return apply


def second_speculative_batch(lane: int) -> Mutation:
    """A second W = 4 speculative graph (its program too), at batch 2 and lane limit
    `lane`: a width's programs at two batch capacities."""
    def apply(serving, manifest):
        first = serving.model.graphs[2]
        graph = serving.model.graphs.add()
        graph.CopyFrom(first)
        graph.name = "speculative_b2_w4"
        graph.batch_capacity = graph.speculative.batch_capacity = 2
        graph.token_capacity = graph.speculative.packed_token_capacity = 8
        graph.speculative.lane_limit = lane
        prog = manifest.graphs.add()
        prog.CopyFrom(program(manifest, first.name))
        prog.name = graph.name
        prog.batch_capacity, prog.token_capacity = 2, 8
        prog.completion.rows = 2
    return apply


# --- failing cases: (id, mutation, error class, path) ----------------------------------------

FAILING: list[tuple[str, Mutation, type, str]] = [
    # version and upgrade
    ("version-0", set_attr(lambda s: s.model, "version", 0), UnsupportedVersionError,
     "model.version"),
    ("version-4", set_attr(lambda s: s.model, "version", 4), UnsupportedVersionError,
     "model.version"),
    ("v2-with-mask-words", set_attr(lambda s: s.model, "version", 2), UnsupportedVersionError,
     "model.vocabulary.mask_words"),
    ("v1-with-page-table-views",
     lambda s, m: (downgrade_to_v1(s, m), s.model.cache.page_table_views.add(
         region="attention", buffer="page_table")),
     UnsupportedVersionError, "model.cache.page_table_views"),
    ("v1-with-completion-cursor",
     lambda s, m: (downgrade_to_v1(s, m), s.model.graphs[1].completion_cursor.SetInParent()),
     UnsupportedVersionError, "model.graphs[1].completion_cursor"),
    ("v2-with-lane-limit",
     with_speculative(lambda s, m: (setattr(s.model, "version", 2),
                                    s.model.vocabulary.ClearField("mask_words"))),
     UnsupportedVersionError, "model.graphs[2].speculative.lane_limit"),
    # required messages
    ("no-model", lambda s, m: s.ClearField("model"), MissingFieldError, "model"),
    ("no-frontend", lambda s, m: s.model.ClearField("frontend"), MissingFieldError,
     "model.frontend"),
    ("no-cache", lambda s, m: s.model.ClearField("cache"), MissingFieldError, "model.cache"),
    ("no-graphs", lambda s, m: s.model.ClearField("graphs"), MissingFieldError, "model.graphs"),
    ("no-served-id", set_attr(lambda s: s, "served_id", ""), MissingFieldError, "served_id"),
    ("no-sampling-defaults", lambda s, m: s.defaults.ClearField("sampling"), MissingFieldError,
     "defaults.sampling"),
    ("no-eos", lambda s, m: s.ClearField("eos_token_ids"), MissingFieldError, "eos_token_ids"),
    # selectors left UNSPECIFIED
    ("operation-unspecified", set_attr(decode, "operation", 0), UnspecifiedSelectorError,
     "model.graphs[1].operation"),
    ("source-unspecified", set_attr(lambda s: decode(s).bindings[3], "source", 0),
     UnspecifiedSelectorError, "model.graphs[1].bindings[3].source"),
    ("indexing-unspecified", set_attr(lambda s: decode(s).bindings[0], "indexing", 0),
     UnspecifiedSelectorError, "model.graphs[1].bindings[0].indexing"),
    ("access-unspecified", set_attr(lambda s: decode(s).state_accesses[1], "access", 0),
     UnspecifiedSelectorError, "model.graphs[1].state_accesses[1].access"),
    ("history-kind-unspecified", set_attr(lambda s: s.model.cache.regions[0], "kind", 0),
     UnspecifiedSelectorError, "model.cache.regions[0].kind"),
    ("length-source-unspecified", with_speculative(set_attr(spec, "length_source", 0)),
     UnspecifiedSelectorError, "model.graphs[2].speculative.length_source"),
    ("tool-parser-unspecified", set_attr(lambda s: s.model.frontend, "tool_parser", 0),
     UnspecifiedSelectorError, "model.frontend.tool_parser"),
    ("reasoning-parser-unspecified",
     set_attr(lambda s: s.model.frontend, "reasoning_parser", 0), UnspecifiedSelectorError,
     "model.frontend.reasoning_parser"),
    ("image-preparation-unspecified",
     set_attr(lambda s: s.model.frontend, "image_preparation", 0), UnspecifiedSelectorError,
     "model.frontend.image_preparation"),
    ("image-layout-unspecified", set_attr(lambda s: s.model.frontend, "image_layout", 0),
     UnspecifiedSelectorError, "model.frontend.image_layout"),
    ("prefix-role-unspecified",
     set_attr(lambda s: s.model.frontend.prefix_boundary_rules[2], "role", 0),
     UnspecifiedSelectorError, "model.frontend.prefix_boundary_rules[2].role"),
    ("manifest-dtype-unspecified", lambda s, m: setattr(buffer(m, "kv.v"), "dtype", 0),
     UnspecifiedSelectorError, "manifest.buffers[15].dtype"),
    # vocabulary ranges
    ("sampled-zero", set_attr(lambda s: s.model.vocabulary, "sampled_tokens", 0),
     VocabularyRangeError, "model.vocabulary.sampled_tokens"),
    ("histogram-narrow", set_attr(lambda s: s.model.vocabulary, "histogram_width", 319),
     VocabularyRangeError, "model.vocabulary.histogram_width"),
    ("mask-words-wrong", set_attr(lambda s: s.model.vocabulary, "mask_words", 11),
     VocabularyRangeError, "model.vocabulary.mask_words"),
    ("input-narrower-than-sampled",
     set_attr(lambda s: s.model.input_vocabulary, "input_tokens", 300), VocabularyRangeError,
     "model.input_vocabulary.input_tokens"),
    ("sentinel-sampled",
     lambda s, m: (setattr(s.model.input_vocabulary, "input_tokens", 330),
                   s.model.input_vocabulary.image_sentinel_ids.extend([325, 319])),
     VocabularyRangeError, "model.input_vocabulary.image_sentinel_ids[1]"),
    ("sentinel-past-input",
     lambda s, m: s.model.input_vocabulary.image_sentinel_ids.append(320),
     VocabularyRangeError, "model.input_vocabulary.image_sentinel_ids[0]"),
    ("eos-not-sampled", lambda s, m: s.eos_token_ids.append(320), VocabularyRangeError,
     "eos_token_ids[1]"),
    # serving extents and sampling defaults
    ("context-zero", set_attr(lambda s: s, "context_tokens", 0), ExtentError, "context_tokens"),
    ("prefill-chunk-mismatch", set_attr(lambda s: s, "prefill_chunk_tokens", 32),
     CapacityMismatchError, "prefill_chunk_tokens"),
    ("concurrency-above-decode", set_attr(lambda s: s, "selected_concurrency", 5),
     CapacityMismatchError, "selected_concurrency"),
    ("concurrency-zero", set_attr(lambda s: s, "selected_concurrency", 0),
     CapacityMismatchError, "selected_concurrency"),
    ("speculative-width-uncaptured", lambda s, m: s.speculative_widths.append(4),
     SpeculativeExtentError, "speculative_widths[0]"),
    ("prepared-pages-zero", set_attr(lambda s: s, "prepared_pages", 0), ExtentError,
     "prepared_pages"),
    ("top-p-zero", set_attr(lambda s: s.defaults.sampling, "top_p", 0.0),
     SamplingDefaultsError, "defaults.sampling.top_p"),
    ("temperature-negative", set_attr(lambda s: s.defaults.sampling, "temperature", -0.5),
     SamplingDefaultsError, "defaults.sampling.temperature"),
    ("max-output-past-context",
     set_attr(lambda s: s.defaults.sampling, "max_output_tokens", 257), SamplingDefaultsError,
     "defaults.sampling.max_output_tokens"),
    # cache
    ("page-tokens-zero", set_attr(lambda s: s.model.cache, "page_tokens", 0), ExtentError,
     "model.cache.page_tokens"),
    ("no-regions", lambda s, m: s.model.cache.ClearField("regions"), MissingFieldError,
     "model.cache.regions"),
    ("paged-without-planes", lambda s, m: s.model.cache.regions[0].ClearField("planes"),
     MissingFieldError, "model.cache.regions[0].planes"),
    ("paged-ratio-zero", set_attr(lambda s: s.model.cache.regions[0], "tokens_per_record", 0),
     ExtentError, "model.cache.regions[0].tokens_per_record"),
    ("sliding-without-window",
     lambda s, m: s.model.cache.regions.add(name="local", kind=c.HISTORY_KIND_SLIDING_WINDOW),
     ExtentError, "model.cache.regions[1].window_tokens"),
    ("window-on-paged", set_attr(lambda s: s.model.cache.regions[0], "window_tokens", 64),
     ExtentError, "model.cache.regions[0].window_tokens"),
    ("window-without-planes",
     lambda s, m: s.model.cache.regions.add(name="local", kind=c.HISTORY_KIND_SLIDING_WINDOW,
                                            window_tokens=64, tokens_per_record=1),
     MissingFieldError, "model.cache.regions[1].planes"),
    ("window-compressed",
     lambda s, m: (add_window_region(s, m),
                   setattr(s.model.cache.regions[1], "tokens_per_record", 2)),
     ExtentError, "model.cache.regions[1].tokens_per_record"),
    ("window-host-tier",
     lambda s, m: (add_window_region(s, m), s.model.cache.regions[1].host_planes.extend(
         ["local.k.host", "local.v.host"])),
     ExtentError, "model.cache.regions[1].host_planes"),
    ("window-without-view",
     lambda s, m: s.model.cache.regions.add(name="local", kind=c.HISTORY_KIND_SLIDING_WINDOW,
                                            window_tokens=64, planes=["local.k"],
                                            tokens_per_record=1),
     MissingFieldError, "model.cache.regions[1]"),
    ("window-view-shifted", lambda s, m: add_window_region(s, m, view_offset=1),
     ViewBoundsError, "model.cache.page_table_views[1].page_offset"),
    ("window-view-on-the-paged-table", lambda s, m: add_window_region(s, m, table="page_table"),
     DuplicateIdentifierError, "model.cache.page_table_views[1].buffer"),
    ("window-with-snapshots",
     lambda s, m: (add_window_region(s, m), s.model.cache.regions.add(
         name="continuation", kind=c.HISTORY_KIND_CONTINUATION, planes=["kv.k.c", "kv.v.c"],
         tokens_per_record=1)),
     UnsupportedFeatureError, "model.cache.regions[2].kind"),
    ("window-pool-too-small", lambda s, m: add_window_region(s, m, pool=4),
     ExtentError, "model.cache.regions[1].planes"),
    ("window-pools-differ",
     lambda s, m: (add_window_region(s, m), m.buffers[-2].shape.__setitem__(0, 6)),
     ExtentError, "model.cache.regions[1].planes"),
    ("duplicate-region",
     lambda s, m: s.model.cache.regions.add(name="attention",
                                            kind=c.HISTORY_KIND_RECURRENT),
     DuplicateIdentifierError, "model.cache.regions[1].name"),
    ("plane-in-two-regions",
     lambda s, m: s.model.cache.regions.add(name="recurrent", kind=c.HISTORY_KIND_RECURRENT,
                                            planes=["kv.v"]),
     DuplicateIdentifierError, "model.cache.regions[1].planes[0]"),
    ("paged-region-without-view", lambda s, m: s.model.cache.ClearField("page_table_views"),
     MissingFieldError, "model.cache.regions[0]"),
    ("view-of-unknown-region",
     set_attr(lambda s: s.model.cache.page_table_views[0], "region", "draft"),
     UnknownIdentifierError, "model.cache.page_table_views[0].region"),
    ("page-table-binding-elsewhere",
     set_attr(lambda s: decode(s).bindings[4], "destination", "in.slots2"),
     UnknownIdentifierError, "model.graphs[1].bindings[4].destination"),
    # graphs: names, capacities, bindings, cursor
    ("duplicate-graph", set_attr(decode, "name", PREFILL), DuplicateIdentifierError,
     "model.graphs[1].name"),
    ("duplicate-destination",
     set_attr(lambda s: decode(s).bindings[1], "destination", "in.slots"),
     DuplicateIdentifierError, "model.graphs[1].bindings[1].destination"),
    ("decode-capacity-zero", set_attr(decode, "batch_capacity", 0), ExtentError,
     "model.graphs[1].batch_capacity"),
    ("decode-tokens-differ", set_attr(decode, "token_capacity", 8), ExtentError,
     "model.graphs[1].token_capacity"),
    ("prefill-rows-above-tokens", set_attr(lambda s: s.model.graphs[0], "batch_capacity", 65),
     ExtentError, "model.graphs[0].token_capacity"),
    ("lag-without-cursor",
     set_attr(lambda s: decode(s).completion_cursor, "lag_tokens", 1), ExtentError,
     "model.graphs[1].completion_cursor.lag_tokens"),
    ("image-output-on-token-source",
     set_attr(lambda s: decode(s).bindings[0], "image_output", "features"), BindingError,
     "model.graphs[1].bindings[0].image_output"),
    ("constant-on-slot-source",
     set_attr(lambda s: decode(s).bindings[0], "constant_value", 7), BindingError,
     "model.graphs[1].bindings[0].constant_value"),
    ("image-tensor-without-output",
     lambda s, m: decode(s).bindings.add(destination="in.x", source=c.VALUE_SOURCE_IMAGE_TENSOR,
                                         indexing=c.INDEXING_PACKED_TOKEN),
     BindingError, "model.graphs[1].bindings[12].image_output"),
    # pending-token ownership
    ("pending-device-and-host",
     lambda s, m: decode(s).bindings.add(destination="in.tokens",
                                         source=c.VALUE_SOURCE_PENDING_TOKEN,
                                         indexing=c.INDEXING_SUBMISSION_ROW),
     PendingTokenError, "model.graphs[1].bindings[12].source"),
    ("pending-neither", lambda s, m: decode(s).ClearField("pending_token"), PendingTokenError,
     "model.graphs[1].pending_token"),
    ("pending-not-written",
     set_attr(lambda s: decode(s).state_accesses[0], "access", c.ACCESS_READ),
     PendingTokenError, "model.graphs[1].pending_token"),
    ("pending-not-accessed",
     lambda s, m: s.model.graphs[0].state_accesses[0].view.CopyFrom(
         c.StateView(buffer="state.histogram", row_stride=1280, byte_extent=1280)),
     PendingTokenError, "model.graphs[0].pending_token"),
    # speculative extents
    ("speculative-without-descriptor",
     with_speculative(lambda s, m: s.model.graphs[2].ClearField("speculative")),
     MissingFieldError, "model.graphs[2].speculative"),
    ("descriptor-on-decode",
     lambda s, m: setattr(decode(s).speculative, "length_source", c.LENGTH_SOURCE_QUERY_LENGTH),
     SpeculativeExtentError, "model.graphs[1].speculative"),
    ("lane-limit-above-w", with_speculative(set_attr(spec, "lane_limit", 5)),
     SpeculativeExtentError, "model.graphs[2].speculative.lane_limit"),
    ("lane-limit-above-d-plus-1", with_speculative(resize_speculative(4, 1, 4, 16, 3)),
     SpeculativeExtentError, "model.graphs[2].speculative.lane_limit"),
    ("lane-limit-zero", with_speculative(set_attr(spec, "lane_limit", 0)),
     SpeculativeExtentError, "model.graphs[2].speculative.lane_limit"),
    ("lane-limits-disagree-within-a-width", with_speculative(second_speculative_batch(2)),
     SpeculativeExtentError, "model.graphs[3].speculative.lane_limit"),
    ("confidence-width-not-d",
     with_speculative(set_attr(spec, "confidence_width", 2), confidence=True),
     SpeculativeExtentError, "model.graphs[2].speculative.confidence_width"),
    ("confidence-width-without-confidence",
     with_speculative(set_attr(spec, "confidence_width", 3)), SpeculativeExtentError,
     "model.graphs[2].speculative.confidence_width"),
    ("p-implicit", with_speculative(set_attr(spec, "packed_token_capacity", 0)),
     SpeculativeExtentError, "model.graphs[2].speculative.packed_token_capacity"),
    ("p-above-b-times-w", with_speculative(resize_speculative(4, 3, 4, 20, 4)),
     SpeculativeExtentError, "model.graphs[2].speculative.packed_token_capacity"),
    ("p-below-b", with_speculative(resize_speculative(4, 3, 4, 3, 4)), ExtentError,
     "model.graphs[2].token_capacity"),
    ("b-differs-from-graph", with_speculative(set_attr(spec, "batch_capacity", 2)),
     SpeculativeExtentError, "model.graphs[2].speculative.batch_capacity"),
    ("width-one-draws", with_speculative(resize_speculative(4, 1, 1, 4, 1)),
     SpeculativeExtentError, "model.graphs[2].speculative.draft_tokens"),
    ("two-length-sources",
     with_speculative(lambda s, m: s.model.graphs[2].bindings.add(
         destination="in.sample_rows", source=c.VALUE_SOURCE_SPECULATIVE_PREFIX_LIMIT,
         indexing=c.INDEXING_SUBMISSION_ROW)),
     LengthSourceError, "model.graphs[2].bindings"),
    ("no-length-source", with_speculative(lambda s, m: s.model.graphs[2].bindings.pop()),
     LengthSourceError, "model.graphs[2].bindings"),
    ("length-source-disagrees",
     with_speculative(set_attr(spec, "length_source",
                               c.LENGTH_SOURCE_SPECULATIVE_PREFIX_LIMIT)),
     LengthSourceError, "model.graphs[2].bindings[12].source"),
    # identifiers against the manifest
    ("graph-missing-from-manifest", set_attr(decode, "name", "decode_b8"),
     MissingGraphVariantError, "model.graphs[1].name"),
    ("graph-is-tuning-producer", with_tuning(set_attr(decode, "name", TUNING_PRODUCER)),
     MissingGraphVariantError, "model.graphs[1].name"),
    ("operation-disagrees",
     lambda s, m: setattr(program(m, DECODE), "operation", c.OPERATION_MIXED),
     OperationMismatchError, "model.graphs[1].operation"),
    ("capacity-disagrees", lambda s, m: setattr(program(m, DECODE), "batch_capacity", 8),
     CapacityMismatchError, "model.graphs[1].batch_capacity"),
    ("destination-not-transport",
     lambda s, m: program(m, DECODE).transports.pop(0), UnknownIdentifierError,
     "model.graphs[1].bindings[0].destination"),
    ("launch-view-off-its-elements",
     lambda s, m: setattr(program(m, DECODE).launches[0].args[0].buffer, "byte_offset", 2),
     ViewBoundsError, "manifest.graphs[1].launches[0].args[0].buffer.byte_offset"),
    ("transport-unknown-buffer",
     lambda s, m: setattr(program(m, DECODE).transports[0], "destination", "in.nowhere"),
     UnknownIdentifierError, "manifest.graphs[1].transports[0].destination"),
    ("transport-larger-than-buffer",
     lambda s, m: setattr(program(m, DECODE).transports[0], "nbytes", 17), ViewBoundsError,
     "manifest.graphs[1].transports[0].nbytes"),
    ("state-view-unknown-buffer",
     set_attr(lambda s: decode(s).state_accesses[1].view, "buffer", "state.hist"),
     UnknownIdentifierError, "model.graphs[1].state_accesses[1].view.buffer"),
    ("state-view-in-weight",
     set_attr(lambda s: decode(s).state_accesses[1].view, "buffer", "token_embd"),
     BufferRoleError, "model.graphs[1].state_accesses[1].view.buffer"),
    ("plane-unknown", lambda s, m: s.model.cache.regions[0].planes.__setitem__(1, "kv.w"),
     UnknownIdentifierError, "model.cache.regions[0].planes[1]"),
    ("plane-not-cache-role",
     lambda s, m: setattr(buffer(m, "kv.v"), "role", mpb.BUFFER_ROLE_PERSISTENT_STATE),
     BufferRoleError, "model.cache.regions[0].planes[1]"),
    ("duplicate-manifest-buffer", lambda s, m: m.buffers.add().CopyFrom(buffer(m, "kv.k")),
     DuplicateIdentifierError, "manifest.buffers[37].name"),
    # views inside their buffers
    ("state-view-past-buffer",
     set_attr(lambda s: decode(s).state_accesses[1].view, "byte_offset", 4), ViewBoundsError,
     "model.graphs[1].state_accesses[1].view"),
    ("state-view-rows-overlap",
     set_attr(lambda s: decode(s).state_accesses[1].view, "byte_extent", 1284),
     ViewBoundsError, "model.graphs[1].state_accesses[1].view.byte_extent"),
    ("state-view-empty",
     set_attr(lambda s: decode(s).state_accesses[1].view, "byte_extent", 0), ViewBoundsError,
     "model.graphs[1].state_accesses[1].view.byte_extent"),
    ("unrowed-view-past-buffer",
     set_attr(lambda s: decode(s).state_accesses[2].view, "byte_extent", 262_145),
     ViewBoundsError, "model.graphs[1].state_accesses[2].view"),
    ("page-offset-negative",
     set_attr(lambda s: s.model.cache.page_table_views[0], "page_offset", -1), ViewBoundsError,
     "model.cache.page_table_views[0].page_offset"),
    ("page-table-narrower-than-context", narrow_page_table, ViewBoundsError,
     "model.cache.page_table_views[0].buffer"),
    ("shifted-view-shares-buffer",
     lambda s, m: s.model.cache.page_table_views.add(region="attention", buffer="page_table",
                                                     page_offset=1),
     DuplicateIdentifierError, "model.cache.page_table_views[1].buffer"),
    ("page-table-not-int",
     lambda s, m: setattr(buffer(m, "page_table"), "dtype", mpb.D_TYPE_F32), ViewBoundsError,
     "model.cache.page_table_views[0].buffer"),
    ("page-table-unknown",
     lambda s, m: buffer(m, "page_table").__setattr__("name", "page_table0"),
     UnknownIdentifierError, "manifest.graphs[0].transports[6].destination"),
    # framed proposal confidence storage
    ("confidence-without-buffer",
     with_speculative(lambda s, m: buffer(m, "proposal_confidence").__setattr__("name", "conf"),
                      confidence=True),
     UnknownIdentifierError, "model.graphs[2].speculative.produces_confidence"),
    ("confidence-buffer-too-narrow",
     with_speculative(lambda s, m: buffer(m, "proposal_confidence").shape.__setitem__(2, 2),
                      confidence=True),
     ViewBoundsError, "model.graphs[2].speculative.produces_confidence"),
    ("confidence-buffer-unframed",
     with_speculative(lambda s, m: buffer(m, "proposal_confidence").shape.__setitem__(0, 1),
                      confidence=True),
     ViewBoundsError, "model.graphs[2].speculative.produces_confidence"),
    ("confidence-record-not-named",
     with_speculative(lambda s, m: m.graphs[2].completion.ClearField("confidence_buffer"),
                      confidence=True),
     BindingError, "manifest.graphs[2].completion.confidence_buffer"),
    ("confidence-record-without-confidence",
     with_speculative(lambda s, m: setattr(m.graphs[2].completion, "confidence_buffer",
                                           "proposal_confidence")),
     BindingError, "manifest.graphs[2].completion.confidence_buffer"),
    # tuned bindings
    ("producer-not-in-catalog",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "producer_graph", "tune_x")),
     TunedProducerError, "model.graphs[1].tuned_bindings[0].producer_graph"),
    ("producer-is-serving-graph",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "producer_graph", PREFILL)),
     TunedProducerError, "model.graphs[1].tuned_bindings[0].producer_graph"),
    ("producers-differ-from-manifest",
     with_tuning(lambda s, m: program(m, DECODE).ClearField("tuning_producers")),
     TunedProducerError, "model.graphs[1].tuned_bindings"),
    ("manifest-producer-undeclared",
     with_tuning(lambda s, m: decode(s).ClearField("tuned_bindings")),
     TunedProducerError, "model.graphs[1].tuned_bindings"),
    ("tuned-overlaps-request-input",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "buffer", "in.top_k")),
     TunedOverlapError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-overlaps-writable-state",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "buffer", "state.pending")),
     TunedOverlapError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-overlaps-cache",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "buffer", "kv.k")),
     TunedOverlapError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-in-request-input-role",
     with_tuning(lambda s, m: setattr(buffer(m, TUNED_BUFFER), "role",
                                      mpb.BUFFER_ROLE_REQUEST_INPUT)),
     TunedOverlapError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-in-weight-role",
     with_tuning(lambda s, m: setattr(buffer(m, TUNED_BUFFER), "role", mpb.BUFFER_ROLE_WEIGHT)),
     BufferRoleError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-unknown-buffer",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "buffer", "tuned.nothing")),
     UnknownIdentifierError, "model.graphs[1].tuned_bindings[0].buffer"),
    ("tuned-missing-producer",
     with_tuning(set_attr(lambda s: decode(s).tuned_bindings[0], "producer_graph", "")),
     MissingFieldError, "model.graphs[1].tuned_bindings[0].producer_graph"),
]


@pytest.mark.parametrize(("mutate", "cls", "path"), [case[1:] for case in FAILING],
                         ids=[case[0] for case in FAILING])
def test_rule_rejects(serving, manifest, mutate, cls, path):
    mutate(serving, manifest)
    rejects(cls, path, serving, manifest)


# --- passing cases: the boundary of each rule, still valid -----------------------------------

def add_window_region(s, m, window=64, pool=5, view_offset=0, table="window_page_table"):
    """A complete sliding-window region: its planes (a pool of `pool` pages of 16
    tokens) and its own page-table view."""
    s.model.cache.regions.add(name="local", kind=c.HISTORY_KIND_SLIDING_WINDOW,
                              window_tokens=window, planes=["local.k", "local.v"],
                              tokens_per_record=1)
    s.model.cache.page_table_views.add(region="local", buffer=table, page_offset=view_offset)
    for plane in ("local.k", "local.v"):
        m.buffers.add().CopyFrom(mpb.Buffer(name=plane, dtype=mpb.D_TYPE_BF16,
                                            shape=[pool, 16, 2, 16],
                                            role=mpb.BUFFER_ROLE_CACHE_PLANE))
    if table == "window_page_table":
        m.buffers.add().CopyFrom(mpb.Buffer(name=table, dtype=mpb.D_TYPE_I32, shape=[4, 16],
                                            role=mpb.BUFFER_ROLE_PERSISTENT_STATE))


PASSING: list[tuple[str, Mutation]] = [
    ("example", lambda s, m: None),
    ("version-1-upgraded", downgrade_to_v1),
    ("version-2-upgraded",
     lambda s, m: (setattr(s.model, "version", 2), s.model.vocabulary.ClearField("mask_words"))),
    ("histogram-wider", lambda s, m: (setattr(s.model.vocabulary, "histogram_width", 321),
                                      setattr(s.model.vocabulary, "mask_words", 11))),
    ("eos-last-sampled-id", lambda s, m: s.eos_token_ids.append(319)),
    ("concurrency-reduced", set_attr(lambda s: s, "selected_concurrency", 1)),
    ("sampling-greedy-bounds",
     lambda s, m: s.defaults.sampling.MergeFrom(c.SamplingDefaults(
         temperature=0.0, top_p=1.0, min_p=1.0, max_output_tokens=256))),
    ("sliding-window-region", add_window_region),
    ("recurrent-region",
     lambda s, m: s.model.cache.regions.add(name="ssm", kind=c.HISTORY_KIND_RECURRENT)),
    # Entry i of a shifted view references page i + 1: same columns, one extra page.
    ("shifted-draft-view",
     lambda s, m: (s.model.cache.page_table_views.add(region="attention",
                                                      buffer="draft_page_table", page_offset=1),
                   m.buffers.add().CopyFrom(mpb.Buffer(
                       name="draft_page_table", dtype=mpb.D_TYPE_I32, shape=[4, 16],
                       role=mpb.BUFFER_ROLE_PERSISTENT_STATE)))),
    ("state-subview-exact-end",
     lambda s, m: decode(s).state_accesses[1].view.MergeFrom(
         c.StateView(byte_offset=1276, row_stride=1280, byte_extent=4))),
    ("constant-binding",
     lambda s, m: (decode(s).bindings.add(destination="in.sample_rows", indexing=c.INDEXING_SCALAR,
                                          source=c.VALUE_SOURCE_CONSTANT, constant_value=1),
                   program(m, DECODE).transports.add(destination="in.sample_rows", nbytes=4))),
    ("host-pending-token", host_pending_token),
    ("speculative-query-length", with_speculative()),
    ("speculative-confidence-prefix-limit", with_speculative(confidence=True)),
    ("speculative-confidence-block-longer-than-verify",
     with_speculative(lambda s, m: (resize_speculative(4, 5, 4, 12, 4)(s, m),
                                    setattr(spec(s), "confidence_width", 5)),
                      confidence=True)),
    ("speculative-width-one", with_speculative(resize_speculative(4, 0, 1, 4, 1))),
    ("speculative-lane-limit-below-ceiling", with_speculative(set_attr(spec, "lane_limit", 2))),
    ("speculative-lane-limit-below-ceiling-at-every-batch",
     with_speculative(lambda s, m: (set_attr(spec, "lane_limit", 2)(s, m),
                                    second_speculative_batch(2)(s, m)))),
    ("tuned-binding", with_tuning()),
]


@pytest.mark.parametrize("mutate", [case[1] for case in PASSING], ids=[c[0] for c in PASSING])
def test_rule_accepts(serving, manifest, mutate):
    mutate(serving, manifest)
    assert accepts(serving, manifest).model.version == 3


@pytest.mark.parametrize("mutate", [case[1] for case in PASSING], ids=[c[0] for c in PASSING])
def test_rule_accepts_without_manifest(serving, manifest, mutate):
    mutate(serving, manifest)
    assert accepts(serving).manifest is None


# --- upgrade and views -----------------------------------------------------------------------


def test_version_1_upgrade_makes_implicit_fields_explicit(serving, manifest):
    downgrade_to_v1(serving, manifest)
    before = serving.SerializeToString()
    prepared = PreparedContract.from_contract(serving, manifest)
    assert serving.SerializeToString() == before  # the input is not modified
    assert prepared.source_version == 1
    assert prepared.model.version == 3
    assert prepared.mask_words == 10
    assert [(v.region, v.buffer, v.page_offset) for v in prepared.page_table_views] == [
        ("attention", "page_table", 0)
    ]
    assert not prepared.graphs[DECODE].completion_cursor.has_draft_cursor


def test_version_2_upgrade_derives_lane_limit(serving, manifest):
    add_speculative(serving, manifest)
    serving.model.version = 2
    serving.model.vocabulary.ClearField("mask_words")
    spec(serving).ClearField("lane_limit")
    prepared = PreparedContract.from_contract(serving, manifest)
    assert prepared.source_version == 2
    assert prepared.graphs["speculative_b4_w4"].speculative.lane_limit == 4  # min(D + 1, W)


def test_views(serving, manifest):
    add_speculative(serving, manifest)
    prepared = PreparedContract.from_contract(serving, manifest)
    assert prepared.served_id == "tiny-llama"
    assert prepared.aliases == ("tiny", "tiny-llama-instruct")
    assert list(prepared.graphs) == [PREFILL, DECODE, "speculative_b4_w4"]
    assert [g.name for g in prepared.graphs_for(c.OPERATION_DECODE)] == [DECODE]
    assert prepared.decode_capacities == (4,)
    assert prepared.prefill_capacities == ((1, 64),)
    assert prepared.speculative_widths == (4,)
    assert prepared.page_tokens == 16
    assert prepared.cache_planes == ("kv.k", "kv.v")
    assert prepared.eos_token_ids == (2,)
    assert prepared.sampled_tokens == 320 and prepared.input_tokens == 320
    assert prepared.histogram_width == 320 and prepared.mask_words == 10
    assert prepared.sampling_defaults.top_p == pytest.approx(0.9)
    assert prepared.sampling_defaults.max_output_tokens == 128
    assert prepared.state_rows_per_request == 1
    assert prepared.context_tokens == 256 and prepared.prefill_chunk_tokens == 64
    assert prepared.tool_syntax.call_open == "<tool_call>"
    assert prepared.reasoning_syntax.close == "</think>"
    assert prepared.manifest == manifest
    assert prepared.manifest is not manifest


def test_decode_capacities_sorted(serving, manifest):
    for rows in (8, 1, 2):
        graph = serving.model.graphs.add()
        graph.CopyFrom(serving.model.graphs[1])
        graph.name = f"decode_b{rows}"
        graph.batch_capacity = graph.token_capacity = rows
    prepared = PreparedContract.from_contract(serving)
    assert prepared.decode_capacities == (1, 2, 4, 8)
    assert [g.batch_capacity for g in prepared.graphs_for(c.OPERATION_DECODE)] == [1, 2, 4, 8]


def test_error_message_names_path_and_value(serving):
    decode(serving).bindings[3].source = 0
    with pytest.raises(UnspecifiedSelectorError) as info:
        PreparedContract.from_contract(serving)
    assert str(info.value).startswith(
        "model.graphs[1].bindings[3].source = 'VALUE_SOURCE_UNSPECIFIED':"
    )
    assert info.value.value == "VALUE_SOURCE_UNSPECIFIED"


def test_history_drafting_needs_copied_token_inputs(serving, manifest):
    add_speculative(serving, manifest)
    prepared = PreparedContract.from_contract(serving, manifest)
    prepared.check_history_drafting(widths=[])  # no wider graph selected: nothing needed
    with pytest.raises(BindingError) as info:
        prepared.check_history_drafting()
    assert type(info.value) is BindingError
    assert info.value.path == "model.graphs[2].bindings"
    assert info.value.value == ["VALUE_SOURCE_CANDIDATE_IDS", "VALUE_SOURCE_CANDIDATE_COUNT"]


def test_history_drafting_accepts_copied_token_inputs(serving, manifest):
    graph = add_speculative(serving, manifest)
    for destination, source in (("in.tokens", c.VALUE_SOURCE_CANDIDATE_IDS),
                                ("in.sample_rows", c.VALUE_SOURCE_CANDIDATE_COUNT)):
        graph.bindings.add(destination=destination, source=source,
                           indexing=c.INDEXING_SUBMISSION_ROW)
        program(manifest, graph.name).transports.add(destination=destination, nbytes=16)
    PreparedContract.from_contract(serving, manifest).check_history_drafting()
