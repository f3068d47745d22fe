"""Rules tying a version 3 ServingContract to its execution manifest.

Identifiers resolve (graphs, transports, buffers, planes, tuning producers), operations and
capacities agree, every view lies inside its buffer, and tuned buffers stay apart from
request inputs, writable state and cache storage. Contract paths start at the
``ServingContract`` root; manifest paths start with ``manifest.``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract._rules_contract import WRITES, check_selectors, enum_name
from helios_contract.errors import (
    BufferRoleError,
    CapacityMismatchError,
    DuplicateIdentifierError,
    OperationMismatchError,
    TunedOverlapError,
    TunedProducerError,
    UnknownIdentifierError,
    ViewBoundsError,
)

DTYPE_BYTES = {
    mpb.D_TYPE_F32: 4,
    mpb.D_TYPE_BF16: 2,
    mpb.D_TYPE_F16: 2,
    mpb.D_TYPE_I32: 4,
    mpb.D_TYPE_U32: 4,
    mpb.D_TYPE_I64: 8,
    mpb.D_TYPE_U8: 1,
}
STATE_ROLES = (mpb.BUFFER_ROLE_PERSISTENT_STATE, mpb.BUFFER_ROLE_CACHE_PLANE)
PAGE_TABLE_DTYPES = (mpb.D_TYPE_I32, mpb.D_TYPE_U32)


def buffer_nbytes(buffer: mpb.Buffer) -> int:
    """Bytes of a manifest buffer: prod(shape) x element size (a scalar when shape is empty)."""
    return math.prod(buffer.shape) * DTYPE_BYTES[buffer.dtype]


@dataclass(frozen=True)
class ManifestIndex:
    """Manifest names resolved once: buffers, serving programs, tuning producers."""

    buffers: dict[str, mpb.Buffer]
    programs: dict[str, mpb.GraphProgram]
    producers: dict[str, mpb.GraphProgram]
    program_index: dict[str, int]

    @classmethod
    def build(cls, manifest: mpb.ExecutionManifest) -> ManifestIndex:
        def unique(items, path: str) -> dict:
            out: dict = {}
            for index, item in enumerate(items):
                if item.name in out:
                    raise DuplicateIdentifierError(f"{path}[{index}].name", item.name,
                                                   "declared twice in the manifest")
                out[item.name] = item
            return out

        return cls(
            buffers=unique(manifest.buffers, "manifest.buffers"),
            programs=unique(manifest.graphs, "manifest.graphs"),
            producers=unique(manifest.tuning.producers, "manifest.tuning.producers"),
            program_index={g.name: i for i, g in enumerate(manifest.graphs)},
        )

    def buffer(self, name: str, path: str) -> mpb.Buffer:
        try:
            return self.buffers[name]
        except KeyError:
            raise UnknownIdentifierError(path, name, "no such buffer in the execution manifest") \
                from None


def _check_view(view: pb.StateView, buffer: mpb.Buffer, path: str) -> None:
    """Row r of a view spans [byte_offset + r * row_stride, + byte_extent) (contract.proto)."""
    total = buffer_nbytes(buffer)
    rows = buffer.shape[0] if buffer.shape else 1
    if view.byte_extent == 0:
        raise ViewBoundsError(f"{path}.byte_extent", 0, "a state view covers at least one byte")
    if view.row_stride:
        if view.byte_extent > view.row_stride:
            raise ViewBoundsError(
                f"{path}.byte_extent", view.byte_extent,
                f"rows of the view overlap: extent exceeds row_stride ({view.row_stride})",
            )
        end = view.byte_offset + (rows - 1) * view.row_stride + view.byte_extent
    else:
        end = view.byte_offset + view.byte_extent
    if end > total:
        raise ViewBoundsError(
            path, f"bytes up to {end}",
            f"outside buffer {buffer.name!r} of {total} bytes ({rows} rows)",
        )


def _check_graph(serving: pb.ServingContract, index: int, graph: pb.GraphContract,
                 names: ManifestIndex) -> None:
    path = f"model.graphs[{index}]"
    program = names.programs.get(graph.name)
    if program is None:
        hint = " (it is a tuning producer)" if graph.name in names.producers else ""
        raise UnknownIdentifierError(
            f"{path}.name", graph.name, f"no such serving graph in the execution manifest{hint}"
        )
    if program.operation != graph.operation:
        raise OperationMismatchError(
            f"{path}.operation", enum_name(pb.Operation, graph.operation),
            f"the manifest graph is {enum_name(pb.Operation, program.operation)}",
        )
    for field in ("batch_capacity", "token_capacity"):
        if getattr(program, field) != getattr(graph, field):
            raise CapacityMismatchError(
                f"{path}.{field}", getattr(graph, field),
                f"the manifest graph captures {getattr(program, field)}",
            )
    transports = {}
    for t, transport in enumerate(program.transports):
        tpath = f"manifest.graphs[{names.program_index[graph.name]}].transports[{t}]"
        buffer = names.buffer(transport.destination, f"{tpath}.destination")
        if transport.nbytes > buffer_nbytes(buffer):
            raise ViewBoundsError(
                f"{tpath}.nbytes", transport.nbytes,
                f"exceeds buffer {buffer.name!r} of {buffer_nbytes(buffer)} bytes",
            )
        transports[transport.destination] = transport
    for b, binding in enumerate(graph.bindings):
        if binding.destination not in transports:
            raise UnknownIdentifierError(
                f"{path}.bindings[{b}].destination", binding.destination,
                f"not a registered transport destination of manifest graph {graph.name!r}",
            )
    views = [(f"{path}.state_accesses[{a}].view", access.view)
             for a, access in enumerate(graph.state_accesses)]
    if graph.HasField("pending_token"):
        views.append((f"{path}.pending_token", graph.pending_token))
    for vpath, view in views:
        buffer = names.buffer(view.buffer, f"{vpath}.buffer")
        if buffer.role not in STATE_ROLES:
            raise BufferRoleError(
                f"{vpath}.buffer", view.buffer,
                f"state views lie in persistent buffers, not "
                f"{enum_name(mpb.BufferRole, buffer.role)}",
            )
        _check_view(view, buffer, vpath)


def _check_cache(serving: pb.ServingContract, names: ManifestIndex) -> None:
    cache = serving.model.cache
    for index, region in enumerate(cache.regions):
        for p, plane in enumerate(region.planes):
            path = f"model.cache.regions[{index}].planes[{p}]"
            buffer = names.buffer(plane, path)
            if buffer.role != mpb.BUFFER_ROLE_CACHE_PLANE:
                raise BufferRoleError(
                    path, plane,
                    f"history planes are BUFFER_ROLE_CACHE_PLANE, not "
                    f"{enum_name(mpb.BufferRole, buffer.role)}",
                )
    # A request may reference every page of its context, plus the shift of its view.
    pages = math.ceil(serving.context_tokens / cache.page_tokens)
    for index, view in enumerate(cache.page_table_views):
        path = f"model.cache.page_table_views[{index}]"
        buffer = names.buffer(view.buffer, f"{path}.buffer")
        if buffer.dtype not in PAGE_TABLE_DTYPES or len(buffer.shape) != 2:
            raise ViewBoundsError(
                f"{path}.buffer", view.buffer,
                f"page tables are [slots, pages_per_request] int32 buffers, not "
                f"{enum_name(mpb.DType, buffer.dtype)}{list(buffer.shape)}",
            )
        columns = buffer.shape[1]
        if pages + abs(view.page_offset) > columns:
            raise ViewBoundsError(
                f"{path}.page_offset", view.page_offset,
                f"{pages} context pages shifted by {view.page_offset} exceed the "
                f"{columns} columns of {view.buffer!r}",
            )


def _check_tuned(serving: pb.ServingContract, names: ManifestIndex) -> None:
    graphs = serving.model.graphs
    request_inputs = {b.destination for g in graphs for b in g.bindings}
    writable = {a.view.buffer for g in graphs for a in g.state_accesses if a.access in WRITES}
    cache = {p for r in serving.model.cache.regions for p in r.planes}
    cache |= {v.buffer for v in serving.model.cache.page_table_views}
    for index, graph in enumerate(graphs):
        path = f"model.graphs[{index}].tuned_bindings"
        for t, tuned in enumerate(graph.tuned_bindings):
            here = f"{path}[{t}]"
            if tuned.producer_graph not in names.producers:
                where = " (a serving graph)" if tuned.producer_graph in names.programs else ""
                raise TunedProducerError(
                    f"{here}.producer_graph", tuned.producer_graph,
                    f"not a producer of the manifest's tuning catalog{where}",
                )
            buffer = names.buffer(tuned.buffer, f"{here}.buffer")
            for kind, members in (("a request input", request_inputs),
                                  ("writable graph state", writable), ("cache storage", cache)):
                if tuned.buffer in members:
                    raise TunedOverlapError(f"{here}.buffer", tuned.buffer,
                                            f"tuned output overlaps {kind}")
            if buffer.role in (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_CACHE_PLANE):
                raise TunedOverlapError(
                    f"{here}.buffer", tuned.buffer,
                    f"tuned output overlaps {enum_name(mpb.BufferRole, buffer.role)} storage",
                )
            if buffer.role != mpb.BUFFER_ROLE_TUNED:
                raise BufferRoleError(
                    f"{here}.buffer", tuned.buffer,
                    f"tuned buffers are BUFFER_ROLE_TUNED, not "
                    f"{enum_name(mpb.BufferRole, buffer.role)}",
                )
        # The binding list matches the physical execution descriptor exactly.
        declared = sorted({t.producer_graph for t in graph.tuned_bindings})
        physical = sorted(set(names.programs[graph.name].tuning_producers))
        if declared != physical:
            raise TunedProducerError(
                path, declared, f"manifest graph {graph.name!r} depends on producers {physical}"
            )


# Spec name of the framed confidence storage: contiguous FP32 [2, request_slots, draft_capacity].
PROPOSAL_CONFIDENCE = "proposal_confidence"


def _check_confidence(serving: pb.ServingContract, names: ManifestIndex) -> None:
    producers = [(i, g) for i, g in enumerate(serving.model.graphs)
                 if g.HasField("speculative") and g.speculative.produces_confidence]
    if not producers:
        return
    index, first = producers[0]
    path = f"model.graphs[{index}].speculative.produces_confidence"
    buffer = names.buffers.get(PROPOSAL_CONFIDENCE)
    if buffer is None:
        raise UnknownIdentifierError(
            path, PROPOSAL_CONFIDENCE, "confidence programs need the proposal_confidence buffer"
        )
    widths = max(g.speculative.confidence_width for _, g in producers)
    rows = max(g.speculative.batch_capacity for _, g in producers)
    shape = list(buffer.shape)
    if buffer.dtype != mpb.D_TYPE_F32 or len(shape) != 3 or shape[0] != 2 or \
            shape[1] < rows or shape[2] < widths:
        raise ViewBoundsError(
            path, f"{enum_name(mpb.DType, buffer.dtype)}{shape}",
            f"proposal_confidence is F32 [2, request_slots >= {rows}, draft_capacity >= {widths}]",
        )


def check_manifest(serving: pb.ServingContract, manifest: mpb.ExecutionManifest) -> None:
    """Cross-check a validated version 3 contract against its execution manifest."""
    # Tuning producers are not serving operations: their operation selects nothing.
    for field in ("buffers", "kernels", "graphs"):
        for index, item in enumerate(getattr(manifest, field)):
            check_selectors(item, f"manifest.{field}[{index}]")
    names = ManifestIndex.build(manifest)
    for index, graph in enumerate(serving.model.graphs):
        _check_graph(serving, index, graph, names)
    _check_cache(serving, names)
    _check_tuned(serving, names)
    _check_confidence(serving, names)
