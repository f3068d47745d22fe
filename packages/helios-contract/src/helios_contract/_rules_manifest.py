"""Rules of the execution manifest, on its own and tied to a version 3 ServingContract.

Manifest internals: unique names, kernels and buffers that launches name, arguments that
match their kernel's parameters, views inside their buffers, transports and completion
records that fit, producers that exist. Against the contract: identifiers resolve
(graphs, transports, buffers, planes, tuning producers), operations and capacities agree,
every state view lies inside its buffer, and tuned buffers stay apart from request
inputs, writable state and cache storage. Contract paths start at the ``ServingContract``
root; manifest paths start with ``manifest.``.

What the manifest alone cannot say (whether a named resource exists in the core, has the
right kind and size, or whether a binary exists for a GPU target) is checked by
``helios-tools lint-core`` against the core's resources.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract._rules_contract import PAGED_KINDS, WRITES, context_pages, enum_name, selectors
from helios_contract._rules_experts import expert_findings
from helios_contract._rules_tiers import tier_plane_findings
from helios_contract.errors import (
    BindingError,
    BufferRoleError,
    CapacityMismatchError,
    DuplicateIdentifierError,
    ExtentError,
    LaunchError,
    MissingFieldError,
    MissingGraphVariantError,
    OperationMismatchError,
    RankLayoutError,
    TunedOverlapError,
    TunedProducerError,
    UnknownIdentifierError,
    ViewBoundsError,
)
from helios_contract.findings import Finding

F = Finding.of
Findings = Iterator[Finding]

# The one dtype table: bytes per element of every DType (UNSPECIFIED is rejected as a
# selector before any size is computed).
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
# PageTableView.buffer is "a persistent [slots, pages_per_request] int32 table"
# (contract.proto), and every attention kernel of the library reads it as int32.
PAGE_TABLE_DTYPE = mpb.D_TYPE_I32
# Argument oneof case each kernel parameter kind takes.
PARAM_ARGUMENT = {mpb.PARAM_KIND_BUFFER: "buffer", mpb.PARAM_KIND_I32: "int_value",
                  mpb.PARAM_KIND_I64: "int_value", mpb.PARAM_KIND_F32: "float_value"}
# Spec name of the framed confidence storage: contiguous FP32 [2, request_slots, draft_capacity].
PROPOSAL_CONFIDENCE = "proposal_confidence"
COMPLETION_ID_BYTES = 4  # CompletionLayout: int32 sampled ids, one per submission row
# SpeculativeCompletion lane record: generation, offers, accepted, emitted, draft cursor,
# reserved, then token_width emitted ids (int32 each).
SPECULATIVE_RECORD_FIELDS = 6


# The one table of block storage: (elements, bytes) per block of each self-describing
# block type (GGUF: ggml's block_q4_0 ... structs; scales inside the block).
STORAGE_BLOCKS = {
    mpb.STORAGE_TYPE_GGUF_Q4_0: (32, 18),
    mpb.STORAGE_TYPE_GGUF_Q4_1: (32, 20),
    mpb.STORAGE_TYPE_GGUF_Q5_0: (32, 22),
    mpb.STORAGE_TYPE_GGUF_Q8_0: (32, 34),
    mpb.STORAGE_TYPE_GGUF_Q4_K: (256, 144),
    mpb.STORAGE_TYPE_GGUF_Q6_K: (256, 210),
}
# Element-wise codes whose scales lie in another buffer: bits per element.
STORAGE_CODE_BITS = {mpb.STORAGE_TYPE_FP8_E4M3: 8, mpb.STORAGE_TYPE_INT4: 4,
                     mpb.STORAGE_TYPE_INT4_MIN: 4, mpb.STORAGE_TYPE_INT8: 8}
# The optional third side buffer each element-wise code type may (INT4) or must
# (INT4_MIN) declare: TensorStorage field name; a type absent here declares none.
STORAGE_THIRD_SIDE = {mpb.STORAGE_TYPE_INT4: "zero_points", mpb.STORAGE_TYPE_INT4_MIN: "mins"}


def stored_nbytes(buffer: mpb.Buffer, leading: int | None = None) -> int:
    """Bytes `buffer` occupies as stored: ``buffer_nbytes`` for plain storage; for
    quantized storage (a weight's resource, an e4m3 cache plane), rows x (K /
    block_elements) x block_bytes (K = the last axis, rows = the product of the others).

    Args:
        leading: count this leading extent instead of the declared one (a cache plane's
            physical page count; 1: the bytes of one page or row).

    Raises:
        KeyError: ``buffer.dtype`` is UNSPECIFIED (plain storage).
        ZeroDivisionError: quantized storage with block_elements 0 (a ``buffers`` finding).
    """
    shape = [int(s) for s in buffer.shape]
    if leading is not None and shape:
        shape[0] = leading
    if not buffer.HasField("storage"):
        return math.prod(shape) * DTYPE_BYTES[buffer.dtype]
    rows = math.prod(shape[:-1])
    k = shape[-1] if shape else 1
    return rows * (k // buffer.storage.block_elements) * buffer.storage.block_bytes


def buffer_nbytes(buffer: mpb.Buffer) -> int:
    """Bytes of a manifest buffer: prod(shape) x element size (a scalar when shape is empty).
    For a quantized weight, the bytes of its logical elements (what views address);
    ``stored_nbytes`` is what its resource holds.

    Raises:
        KeyError: ``buffer.dtype`` is UNSPECIFIED (a rejected selector).
    """
    return math.prod(buffer.shape) * DTYPE_BYTES[buffer.dtype]


def _nbytes(buffer: mpb.Buffer) -> int:
    """``buffer_nbytes``, 0 for an UNSPECIFIED dtype (reported by the selector rule)."""
    return math.prod(buffer.shape) * DTYPE_BYTES.get(buffer.dtype, 0)


@dataclass(frozen=True)
class ManifestIndex:
    """Manifest names resolved once (first declaration wins; duplicates are findings)."""

    buffers: dict[str, mpb.Buffer]
    kernels: dict[str, mpb.Kernel]
    programs: dict[str, mpb.GraphProgram]
    producers: dict[str, mpb.GraphProgram]
    program_index: dict[str, int]

    @classmethod
    def build(cls, manifest: mpb.ExecutionManifest) -> ManifestIndex:
        def first(items, key=lambda item: item.name) -> dict:
            out: dict = {}
            for item in items:
                out.setdefault(key(item), item)
            return out

        index: dict[str, int] = {}
        for i, g in enumerate(manifest.graphs):
            index.setdefault(g.name, i)
        return cls(first(manifest.buffers), first(manifest.kernels, lambda k: k.id),
                   first(manifest.graphs), first(manifest.tuning.producers), index)


def _unknown_buffer(path: str, name: str) -> Finding:
    return F("manifest.buffer_missing", UnknownIdentifierError, path, name,
             "no such buffer in the execution manifest")


# --- the manifest on its own -----------------------------------------------------------------


def duplicates(manifest: mpb.ExecutionManifest) -> Findings:
    """Buffer, kernel, graph and tuning-producer names are unique."""
    lists = (("buffers", manifest.buffers, lambda b: b.name),
             ("kernels", manifest.kernels, lambda k: k.id),
             ("graphs", manifest.graphs, lambda g: g.name),
             ("tuning.producers", manifest.tuning.producers, lambda g: g.name))
    for name, items, key in lists:
        seen: set[str] = set()
        for index, item in enumerate(items):
            field = "id" if name == "kernels" else "name"
            if key(item) in seen:
                yield F("manifest.duplicate", DuplicateIdentifierError,
                        f"manifest.{name}[{index}].{field}", key(item),
                        "declared twice in the manifest")
            seen.add(key(item))
    serving = {g.name for g in manifest.graphs}
    for index, producer in enumerate(manifest.tuning.producers):
        if producer.name in serving:
            yield F("manifest.duplicate", DuplicateIdentifierError,
                    f"manifest.tuning.producers[{index}].name", producer.name,
                    "a tuning producer shares a serving graph's name")


def rank_count(manifest: mpb.ExecutionManifest) -> int:
    """Tensor-parallel ranks of `manifest` (``rank_count`` 0, cores exported before
    tensor parallelism, reads 1)."""
    return manifest.rank_count or 1


def buffers(manifest: mpb.ExecutionManifest) -> Findings:
    """Weights name their resource, shared by every rank or one per rank (exactly
    ``rank_count``); nothing else does."""
    ranks = rank_count(manifest)
    by_name = {b.name: b for b in manifest.buffers}
    for index, b in enumerate(manifest.buffers):
        path = f"manifest.buffers[{index}].weight_resource_id"
        per_rank = list(b.rank_weight_resource_ids)
        ranks_path = f"manifest.buffers[{index}].rank_weight_resource_ids"
        if b.role == mpb.BUFFER_ROLE_WEIGHT and not b.weight_resource_id and not per_rank:
            yield F("buffer.weight_resource", MissingFieldError, path, "",
                    f"weight buffer {b.name!r} names no resource")
        elif b.role != mpb.BUFFER_ROLE_WEIGHT and (b.weight_resource_id or per_rank):
            yield F("buffer.role", BufferRoleError,
                    path if b.weight_resource_id else ranks_path,
                    b.weight_resource_id or per_rank,
                    f"buffer {b.name!r} is not a weight but names a resource")
        elif per_rank and b.weight_resource_id:
            yield F("buffer.rank_weights", RankLayoutError, ranks_path, per_rank,
                    f"weight buffer {b.name!r} names both a resource every rank reads "
                    f"({b.weight_resource_id!r}) and per-rank resources")
        elif per_rank and len(per_rank) != ranks:
            yield F("buffer.rank_weights", RankLayoutError, ranks_path, len(per_rank),
                    f"weight buffer {b.name!r} names {len(per_rank)} per-rank resources; "
                    f"the manifest has rank_count {ranks}")
        if b.HasField("storage"):
            yield from _storage(b, f"manifest.buffers[{index}]", by_name)


def _storage(b: mpb.Buffer, path: str, by_name: dict[str, mpb.Buffer]) -> Findings:
    """A quantized weight: a weight of F32 elements, at least one axis, its last axis whole
    blocks, the geometry its block type fixes, its scale buffer named where it has one
    (``_side_buffers``)."""
    st = b.storage
    kind = enum_name(mpb.StorageType, st.type)
    if b.role == mpb.BUFFER_ROLE_CACHE_PLANE and b.dtype == mpb.D_TYPE_F32:
        yield from _plane_storage(b, path, by_name)
        return
    if b.role != mpb.BUFFER_ROLE_WEIGHT or b.dtype != mpb.D_TYPE_F32 or not b.shape:
        yield F("buffer.storage", BufferRoleError, f"{path}.storage", kind,
                f"buffer {b.name!r}: quantized storage is for weights and cache planes of "
                f"D_TYPE_F32 elements "
                f"with a shape (it is {enum_name(mpb.BufferRole, b.role)}, "
                f"{enum_name(mpb.DType, b.dtype)}, shape {list(b.shape)})")
        return
    if st.type in STORAGE_BLOCKS:
        want = STORAGE_BLOCKS[st.type]
        if (st.block_elements, st.block_bytes) != want:
            yield F("buffer.storage", ExtentError, f"{path}.storage.block_bytes",
                    [st.block_elements, st.block_bytes],
                    f"buffer {b.name!r}: {kind} blocks are {want[0]} elements in {want[1]} "
                    "bytes")
            return
    elif st.type in STORAGE_CODE_BITS:
        bits = STORAGE_CODE_BITS[st.type]
        if not st.block_elements or st.block_bytes * 8 != st.block_elements * bits:
            yield F("buffer.storage", ExtentError, f"{path}.storage.block_bytes",
                    [st.block_elements, st.block_bytes],
                    f"buffer {b.name!r}: {kind} codes are {bits} bits an element "
                    "(block_bytes = block_elements x bits / 8, block_elements > 0)")
            return
        if not st.scales.buffer:
            yield F("buffer.storage", MissingFieldError, f"{path}.storage.scales.buffer", "",
                    f"buffer {b.name!r}: {kind} storage names no scale buffer")
    else:
        yield F("buffer.storage", MissingFieldError, f"{path}.storage.type", kind,
                f"buffer {b.name!r}: a quantized storage needs a known storage type")
        return
    if b.shape[-1] % st.block_elements:
        yield F("buffer.storage", ExtentError, f"{path}.shape", list(b.shape),
                f"buffer {b.name!r}: last axis {b.shape[-1]} is not whole {kind} blocks of "
                f"{st.block_elements}")
        return
    if st.type in STORAGE_CODE_BITS:
        yield from _side_buffers(b, path, by_name)


def _plane_storage(b: mpb.Buffer, path: str, by_name: dict[str, mpb.Buffer]) -> Findings:
    """An e4m3 KV cache plane (``[pages, page_tokens, kv_heads, head_dim]`` and the like):
    FP8_E4M3 codes, one block per head row (block_elements = block_bytes = the last
    axis), no zero points, and one F32 scale per head: ``scales`` a plain F32 weight of
    shape ``[kv_heads]`` (the plane's second-to-last axis)."""
    st = b.storage
    kind = enum_name(mpb.StorageType, st.type)
    if st.type != mpb.STORAGE_TYPE_FP8_E4M3 or len(b.shape) < 3:
        yield F("buffer.storage", BufferRoleError, f"{path}.storage.type", kind,
                f"cache plane {b.name!r}: a cache plane is stored as STORAGE_TYPE_FP8_E4M3 "
                f"codes over at least [rows, heads, head_dim] (it is {kind}, shape "
                f"{list(b.shape)})")
        return
    if st.block_elements != b.shape[-1] or st.block_bytes != b.shape[-1]:
        yield F("buffer.storage", ExtentError, f"{path}.storage.block_bytes",
                [st.block_elements, st.block_bytes],
                f"cache plane {b.name!r}: e4m3 blocks are one head row, {b.shape[-1]} "
                f"elements in {b.shape[-1]} bytes")
        return
    if st.HasField("zero_points"):
        yield F("buffer.storage", BufferRoleError, f"{path}.storage.zero_points",
                st.zero_points.buffer, f"cache plane {b.name!r}: {kind} codes have no zero "
                "points")
    other = by_name.get(st.scales.buffer)
    want = [b.shape[-2]]
    where = f"{path}.storage.scales.buffer"
    if not st.scales.buffer:
        yield F("buffer.storage", MissingFieldError, where, "",
                f"cache plane {b.name!r}: {kind} storage names no scale buffer")
    elif other is None:
        yield F("buffer.storage", UnknownIdentifierError, where, st.scales.buffer,
                f"cache plane {b.name!r}: its scales buffer {st.scales.buffer!r} is not "
                "declared")
    elif (other.role != mpb.BUFFER_ROLE_WEIGHT or other.dtype != mpb.D_TYPE_F32
          or st.scales.dtype != mpb.D_TYPE_F32 or other.HasField("storage")):
        yield F("buffer.storage", BufferRoleError, where, st.scales.buffer,
                f"cache plane {b.name!r}: its scales {st.scales.buffer!r} must be a D_TYPE_F32 "
                "weight stored as plain elements (SideBuffer.dtype D_TYPE_F32)")
    elif list(other.shape) != want:
        yield F("buffer.storage", ExtentError, where, list(other.shape),
                f"cache plane {b.name!r}: its scales {st.scales.buffer!r} must have shape "
                f"{want} (one per kv head), not {list(other.shape)}")


def _side_buffers(b: mpb.Buffer, path: str, by_name: dict[str, mpb.Buffer]) -> Findings:
    """The scales (and the third side buffer of ``STORAGE_THIRD_SIDE``: INT4's optional
    zero points, INT4_MIN's required minimums) of element-wise codes: F32 weights of their
    own (plain storage) of shape [rows, K / block_elements]; other types declare neither."""
    st = b.storage
    kind = enum_name(mpb.StorageType, st.type)
    third = STORAGE_THIRD_SIDE.get(st.type)
    for field in ("zero_points", "mins"):
        if field != third and st.HasField(field):
            yield F("buffer.storage", BufferRoleError, f"{path}.storage.{field}",
                    getattr(st, field).buffer, f"buffer {b.name!r}: {kind} codes have no "
                    f"{field.replace('_', ' ')}")
    if third == "mins" and not st.mins.buffer:
        yield F("buffer.storage", MissingFieldError, f"{path}.storage.mins.buffer", "",
                f"buffer {b.name!r}: {kind} storage names no mins buffer")
        return
    want = [*b.shape[:-1], b.shape[-1] // st.block_elements]
    sides = [("scales", st.scales)] + ([(third, getattr(st, third))]
                                       if third and st.HasField(third) else [])
    for field, side in sides:
        other = by_name.get(side.buffer)
        where = f"{path}.storage.{field}"
        if other is None:
            yield F("buffer.storage", UnknownIdentifierError, f"{where}.buffer", side.buffer,
                    f"buffer {b.name!r}: its {field} buffer {side.buffer!r} is not declared")
        elif (other.role != mpb.BUFFER_ROLE_WEIGHT or other.dtype != mpb.D_TYPE_F32
              or side.dtype != mpb.D_TYPE_F32 or other.HasField("storage")):
            yield F("buffer.storage", BufferRoleError, f"{where}.buffer", side.buffer,
                    f"buffer {b.name!r}: its {field} {side.buffer!r} must be a D_TYPE_F32 "
                    "weight stored as plain elements (SideBuffer.dtype D_TYPE_F32)")
        elif list(other.shape) != want:
            yield F("buffer.storage", ExtentError, f"{where}.buffer", list(other.shape),
                    f"buffer {b.name!r}: its {field} {side.buffer!r} must have shape {want} "
                    f"(rows x blocks of {st.block_elements}), not {list(other.shape)}")


# Kernel reference ops that join tensor-parallel ranks (helios_tools.kernels.collective).
COLLECTIVE_OPS = frozenset({"all_reduce_sum", "all_gather_columns", "broadcast_rank0"})


def collectives(manifest: mpb.ExecutionManifest) -> Findings:
    """Collective ops join ranks: a single-rank manifest has none (no backend would run
    them as kernels)."""
    if rank_count(manifest) > 1:
        return
    for i, kernel in enumerate(manifest.kernels):
        if kernel.reference_op in COLLECTIVE_OPS:
            yield F("kernel.collective", LaunchError, f"manifest.kernels[{i}].reference_op",
                    kernel.reference_op, f"kernel {kernel.id!r} is a collective, but the "
                    "manifest has one rank (rank_count 0 or 1)")


def transports(manifest: mpb.ExecutionManifest, names: ManifestIndex) -> Findings:
    """Every transport of every program names a buffer it fits in."""
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for i, program in enumerate(programs):
            for t, transport in enumerate(program.transports):
                path = f"manifest.{kind}[{i}].transports[{t}]"
                buffer = names.buffers.get(transport.destination)
                if buffer is None:
                    yield _unknown_buffer(f"{path}.destination", transport.destination)
                elif transport.nbytes > _nbytes(buffer):
                    yield F("view.bounds", ViewBoundsError, f"{path}.nbytes", transport.nbytes,
                            f"exceeds buffer {buffer.name!r} of {_nbytes(buffer)} bytes")


def _launch(launch: mpb.Launch, path: str, names: ManifestIndex) -> Findings:
    kernel = names.kernels.get(launch.kernel)
    if kernel is None:
        yield F("kernel.missing", UnknownIdentifierError, f"{path}.kernel", launch.kernel,
                "no such kernel in the manifest")
    elif len(launch.args) != len(kernel.params):
        yield F("launch.args", LaunchError, f"{path}.args", len(launch.args),
                f"kernel {kernel.id!r} takes {len(kernel.params)} parameters")
    else:
        for a, (arg, param) in enumerate(zip(launch.args, kernel.params, strict=True)):
            want, got = PARAM_ARGUMENT.get(param.kind), arg.WhichOneof("value")
            if want != got:
                yield F("launch.args", LaunchError, f"{path}.args[{a}]", got,
                        f"parameter {param.name!r} takes {want}")
    for a, arg in enumerate(launch.args):
        if arg.WhichOneof("value") != "buffer":
            continue
        view = arg.buffer
        buffer = names.buffers.get(view.buffer)
        if buffer is None:
            yield _unknown_buffer(f"{path}.args[{a}].buffer.buffer", view.buffer)
            continue
        item = DTYPE_BYTES.get(buffer.dtype, 0)
        if item and view.byte_offset % item:
            yield F("view.alignment", ViewBoundsError, f"{path}.args[{a}].buffer.byte_offset",
                    view.byte_offset,
                    f"not a multiple of {buffer.name!r}'s {item}-byte elements")
        end = view.byte_offset + math.prod(view.shape) * item
        if end > _nbytes(buffer) or (view.byte_offset and view.byte_offset >= _nbytes(buffer)):
            yield F("view.bounds", ViewBoundsError, f"{path}.args[{a}].buffer",
                    f"bytes up to {end}",
                    f"outside buffer {buffer.name!r} of {_nbytes(buffer)} bytes")
    for name, dims in (("grid", launch.grid), ("block", launch.block)):
        if not 1 <= len(dims) <= 3 or any(d == 0 for d in dims):
            yield F("launch.geometry", LaunchError, f"{path}.{name}", list(dims),
                    "1 to 3 positive extents")


def programs(manifest: mpb.ExecutionManifest, names: ManifestIndex) -> Findings:
    """Launches, completion records and producer references of every program."""
    for kind, items in (("graphs", manifest.graphs), ("tuning.producers",
                                                      manifest.tuning.producers)):
        for i, program in enumerate(items):
            path = f"manifest.{kind}[{i}]"
            for j, launch in enumerate(program.launches):
                yield from _launch(launch, f"{path}.launches[{j}]", names)
            if program.HasField("completion"):
                done = program.completion
                buffer = names.buffers.get(done.buffer)
                columns = (SPECULATIVE_RECORD_FIELDS + done.speculative.token_width
                           if done.HasField("speculative") else 1)
                if buffer is None:
                    yield _unknown_buffer(f"{path}.completion.buffer", done.buffer)
                elif done.rows * columns * COMPLETION_ID_BYTES > _nbytes(buffer):
                    yield F("view.bounds", ViewBoundsError, f"{path}.completion.rows", done.rows,
                            f"{done.rows} x {columns} int32 record entries exceed buffer "
                            f"{buffer.name!r} of {_nbytes(buffer)} bytes")
                yield from _speculative_record(program, path)
            for p, producer in enumerate(program.tuning_producers):
                if producer not in names.producers:
                    yield F("tuned.producer", TunedProducerError,
                            f"{path}.tuning_producers[{p}]", producer,
                            "not a producer of the tuning catalog")


def _speculative_record(program: mpb.GraphProgram, path: str) -> Findings:
    """A SPECULATIVE program's single terminal completion is a lane record of its width
    W (one emitted-id column per target position); other programs report sampled ids."""
    done = program.completion
    speculative = program.operation == pb.OPERATION_SPECULATIVE
    if speculative and not done.HasField("speculative"):
        yield F("speculative.record", MissingFieldError, f"{path}.completion.speculative", "",
                "SPECULATIVE programs report lane records (offers, accepted, emitted, ...)")
    elif not speculative and done.HasField("speculative"):
        yield F("speculative.record", ExtentError, f"{path}.completion.speculative", "set",
                f"only SPECULATIVE programs report lane records, not "
                f"{enum_name(pb.Operation, program.operation)}")
    elif speculative and done.speculative.token_width == 0:
        yield F("speculative.record", ExtentError,
                f"{path}.completion.speculative.token_width", 0,
                "a lane emits at least one token: token_width >= 1")


def speculative_programs(serving: pb.ServingContract, names: ManifestIndex) -> Findings:
    """Each SPECULATIVE graph's program records W emitted-id columns (W = its
    token_capacity)."""
    for graph in serving.model.graphs:
        program = names.programs.get(graph.name)
        if graph.operation != pb.OPERATION_SPECULATIVE or program is None:
            continue
        width = program.completion.speculative.token_width
        if program.completion.HasField("speculative") and width != graph.speculative.token_capacity:
            yield F("speculative.record", ExtentError,
                    f"manifest.graphs[{names.program_index[graph.name]}].completion.speculative"
                    ".token_width", width,
                    f"graph {graph.name!r} verifies W = {graph.speculative.token_capacity} "
                    "positions per lane")


# --- the manifest against the contract -------------------------------------------------------


def _state_view(view: pb.StateView, path: str, names: ManifestIndex) -> Findings:
    """Row r of a view spans [byte_offset + r * row_stride, + byte_extent) (contract.proto)."""
    buffer = names.buffers.get(view.buffer)
    if buffer is None:
        yield _unknown_buffer(f"{path}.buffer", view.buffer)
        return
    if buffer.role not in STATE_ROLES:
        yield F("view.role", BufferRoleError, f"{path}.buffer", view.buffer,
                f"state views lie in persistent buffers, not "
                f"{enum_name(mpb.BufferRole, buffer.role)}")
    total = _nbytes(buffer)
    rows = buffer.shape[0] if buffer.shape else 1
    if view.byte_extent == 0:
        yield F("view.bounds", ViewBoundsError, f"{path}.byte_extent", 0,
                "a state view covers at least one byte")
        return
    if view.row_stride:
        if view.byte_extent > view.row_stride:
            yield F("view.bounds", ViewBoundsError, f"{path}.byte_extent", view.byte_extent,
                    f"rows of the view overlap: extent exceeds row_stride ({view.row_stride})")
            return
        end = view.byte_offset + (rows - 1) * view.row_stride + view.byte_extent
    else:
        end = view.byte_offset + view.byte_extent
    if end > total:
        yield F("view.bounds", ViewBoundsError, path, f"bytes up to {end}",
                f"outside buffer {buffer.name!r} of {total} bytes ({rows} rows)")


def _graph(index: int, graph: pb.GraphContract, names: ManifestIndex) -> Findings:
    path = f"model.graphs[{index}]"
    program = names.programs.get(graph.name)
    if program is None:
        hint = " (it is a tuning producer)" if graph.name in names.producers else ""
        yield F("graph.missing", MissingGraphVariantError, f"{path}.name", graph.name,
                f"the contract selects a graph variant the execution manifest lacks{hint}")
    else:
        if program.operation != graph.operation:
            yield F("graph.operation", OperationMismatchError, f"{path}.operation",
                    enum_name(pb.Operation, graph.operation),
                    f"the manifest graph is {enum_name(pb.Operation, program.operation)}")
        for fd in ("batch_capacity", "token_capacity"):
            if getattr(program, fd) != getattr(graph, fd):
                yield F("graph.capacity", CapacityMismatchError, f"{path}.{fd}",
                        getattr(graph, fd), f"the manifest graph captures {getattr(program, fd)}")
        registered = {t.destination for t in program.transports}
        for b, binding in enumerate(graph.bindings):
            if binding.destination and binding.destination not in registered:
                yield F("binding.destination", UnknownIdentifierError,
                        f"{path}.bindings[{b}].destination", binding.destination,
                        f"not a registered transport destination of manifest graph "
                        f"{graph.name!r}")
    views = [(f"{path}.state_accesses[{a}].view", access.view)
             for a, access in enumerate(graph.state_accesses) if access.view.buffer]
    if graph.pending_token.buffer:
        views.append((f"{path}.pending_token", graph.pending_token))
    for vpath, view in views:
        yield from _state_view(view, vpath, names)


def cache(serving: pb.ServingContract, names: ManifestIndex) -> Findings:
    """History planes are cache planes sized by the prepared pages; page tables fit."""
    c = serving.model.cache
    for index, region in enumerate(c.regions):
        if region.kind == pb.HISTORY_KIND_SLIDING_WINDOW:
            yield from _window_pool(serving, region, index, names)
        for p, plane in enumerate(region.planes):
            path = f"model.cache.regions[{index}].planes[{p}]"
            buffer = names.buffers.get(plane)
            if buffer is None:
                yield _unknown_buffer(path, plane)
            elif buffer.role != mpb.BUFFER_ROLE_CACHE_PLANE:
                yield F("cache.plane", BufferRoleError, path, plane,
                        f"history planes are BUFFER_ROLE_CACHE_PLANE, not "
                        f"{enum_name(mpb.BufferRole, buffer.role)}")
            elif region.kind in PAGED_KINDS and serving.prepared_pages and \
                    (not buffer.shape or buffer.shape[0] != serving.prepared_pages):
                # Load replaces the leading extent by the physical page count.
                yield F("capacity.pages", ExtentError, path, list(buffer.shape),
                        f"paged planes lead with the prepared page count "
                        f"{serving.prepared_pages}")
    # Entry i of a view references page i + page_offset, so a view of a request whose
    # context spans P pages holds P entries; the offset asks for extra pages, not columns.
    pages = context_pages(serving)
    for index, view in enumerate(c.page_table_views):
        path = f"model.cache.page_table_views[{index}]"
        if not view.buffer:
            continue
        buffer = names.buffers.get(view.buffer)
        if buffer is None:
            yield _unknown_buffer(f"{path}.buffer", view.buffer)
        elif buffer.dtype != PAGE_TABLE_DTYPE or len(buffer.shape) != 2 or \
                buffer.role != mpb.BUFFER_ROLE_PERSISTENT_STATE:
            yield F("cache.view_table", ViewBoundsError, f"{path}.buffer", view.buffer,
                    f"page tables are persistent [slots, pages_per_request] int32 buffers, not "
                    f"{enum_name(mpb.BufferRole, buffer.role)} "
                    f"{enum_name(mpb.DType, buffer.dtype)}{list(buffer.shape)}")
        elif pages > buffer.shape[1]:
            yield F("cache.view_columns", ViewBoundsError, f"{path}.buffer", view.buffer,
                    f"{pages} context pages exceed the {buffer.shape[1]} columns of "
                    f"{view.buffer!r}")


def window_request_pages(window_tokens: int, page_tokens: int, chunk_tokens: int) -> int:
    """Pages one request holds in a sliding-window region while a step computes
    `chunk_tokens` positions from position p: the window of its first query
    ([p - window + 1, p]) and the chunk ([p, p + chunk)) span window + chunk - 1
    positions, on at most ceil((window + chunk - 1) / page_tokens) + 1 pages (one more
    when the span starts mid-page). A decode step (chunk 1): ceil(window / page) + 1."""
    return -(-(window_tokens + chunk_tokens - 1) // page_tokens) + 1


def _window_pool(serving: pb.ServingContract, region: pb.HistoryRegion, index: int,
                 names: ManifestIndex) -> Findings:
    """A sliding-window region's planes lead with its own page pool (kept at load, not
    sized by the cache budget), one extent for all, holding at least one request's
    decode window."""
    extents = {int(b.shape[0]) for p in region.planes
               if (b := names.buffers.get(p)) is not None and b.shape}
    path = f"model.cache.regions[{index}].planes"
    if len(extents) > 1:
        yield F("capacity.window_pages", ExtentError, path, sorted(extents),
                "the planes of a sliding-window region share one page pool (one leading "
                "extent)")
    elif extents and region.window_tokens and serving.model.cache.page_tokens:
        need = window_request_pages(region.window_tokens, serving.model.cache.page_tokens, 1)
        pool = extents.pop()
        if pool < need:
            yield F("capacity.window_pages", ExtentError, path, pool,
                    f"a {region.window_tokens}-token window of "
                    f"{serving.model.cache.page_tokens}-token pages needs a pool of at least "
                    f"{need} pages (one request's decode window)")


def tuned(serving: pb.ServingContract, names: ManifestIndex) -> Findings:
    """Tuned buffers have their producer and stay apart from inputs, state and cache."""
    graphs = serving.model.graphs
    request_inputs = {b.destination for g in graphs for b in g.bindings}
    writable = {a.view.buffer for g in graphs for a in g.state_accesses if a.access in WRITES}
    storage = {p for r in serving.model.cache.regions for p in r.planes}
    storage |= {v.buffer for v in serving.model.cache.page_table_views}
    for index, graph in enumerate(graphs):
        path = f"model.graphs[{index}].tuned_bindings"
        for t, binding in enumerate(graph.tuned_bindings):
            here = f"{path}[{t}]"
            if binding.producer_graph and binding.producer_graph not in names.producers:
                where = " (a serving graph)" if binding.producer_graph in names.programs else ""
                yield F("tuned.producer", TunedProducerError, f"{here}.producer_graph",
                        binding.producer_graph,
                        f"not a producer of the manifest's tuning catalog{where}")
            if not binding.buffer:
                continue
            buffer = names.buffers.get(binding.buffer)
            if buffer is None:
                yield _unknown_buffer(f"{here}.buffer", binding.buffer)
                continue
            overlaps = [kind for kind, members in (("a request input", request_inputs),
                                                   ("writable graph state", writable),
                                                   ("cache storage", storage))
                        if binding.buffer in members]
            if overlaps:
                yield F("tuned.overlap", TunedOverlapError, f"{here}.buffer", binding.buffer,
                        f"tuned output overlaps {overlaps[0]}")
            elif buffer.role in (mpb.BUFFER_ROLE_REQUEST_INPUT, mpb.BUFFER_ROLE_CACHE_PLANE):
                yield F("tuned.overlap", TunedOverlapError, f"{here}.buffer", binding.buffer,
                        f"tuned output overlaps {enum_name(mpb.BufferRole, buffer.role)} storage")
            elif buffer.role != mpb.BUFFER_ROLE_TUNED:
                yield F("tuned.buffer", BufferRoleError, f"{here}.buffer", binding.buffer,
                        f"tuned buffers are BUFFER_ROLE_TUNED, not "
                        f"{enum_name(mpb.BufferRole, buffer.role)}")
        program = names.programs.get(graph.name)
        if program is None:
            continue
        # The binding list matches the physical execution descriptor exactly.
        declared = sorted({t.producer_graph for t in graph.tuned_bindings})
        physical = sorted(set(program.tuning_producers))
        if declared != physical:
            yield F("tuned.producers", TunedProducerError, path, declared,
                    f"manifest graph {graph.name!r} depends on producers {physical}")


def scores(serving: pb.ServingContract, names: ManifestIndex) -> Findings:
    """SCORED_PREFILL programs, and only they, name their per-token scores record:
    scores_buffer F32 [>= token_capacity, 1 + top_logprobs] and score_ids_buffer I32
    [>= token_capacity, top_logprobs] (manifest.proto CompletionLayout)."""
    for g in serving.model.graphs:
        program = names.programs.get(g.name)
        if program is None:
            continue
        done = program.completion
        path = f"manifest.graphs[{names.program_index[g.name]}].completion"
        if g.operation != pb.OPERATION_SCORED_PREFILL:
            for fd in ("scores_buffer", "score_ids_buffer"):
                if getattr(done, fd):
                    yield F("scored.record", BindingError, f"{path}.{fd}", getattr(done, fd),
                            f"only SCORED_PREFILL programs record prompt scores, not "
                            f"{enum_name(pb.Operation, g.operation)}")
            continue
        k = done.top_logprobs
        for fd, dtype, width in (("scores_buffer", mpb.D_TYPE_F32, 1 + k),
                                 ("score_ids_buffer", mpb.D_TYPE_I32, k)):
            name = getattr(done, fd)
            buffer = names.buffers.get(name) if name else None
            if not name:
                yield F("scored.record", MissingFieldError, f"{path}.{fd}", "",
                        "SCORED_PREFILL programs name their per-token scores record")
            elif buffer is None:
                yield _unknown_buffer(f"{path}.{fd}", name)
            elif buffer.dtype != dtype or len(buffer.shape) != 2 or \
                    buffer.shape[0] < g.token_capacity or buffer.shape[1] != width:
                yield F("scored.record", ViewBoundsError, f"{path}.{fd}",
                        f"{enum_name(mpb.DType, buffer.dtype)}{list(buffer.shape)}",
                        f"{name!r} is {enum_name(mpb.DType, dtype)} [>= {g.token_capacity} "
                        f"packed tokens, {width}]")


def confidence(serving: pb.ServingContract, names: ManifestIndex) -> Findings:
    """Confidence programs have the framed F32 proposal_confidence storage, and exactly
    they name it as their completion's confidence_buffer (the record the host reads)."""
    producers = [(i, g) for i, g in enumerate(serving.model.graphs)
                 if g.HasField("speculative") and g.speculative.produces_confidence]
    yield from _confidence_storage(producers, names)
    for g in serving.model.graphs:
        program = names.programs.get(g.name)
        if program is None:
            continue
        named = program.completion.confidence_buffer
        produces = g.HasField("speculative") and g.speculative.produces_confidence
        if named != (PROPOSAL_CONFIDENCE if produces else ""):
            yield F("speculative.confidence_record", BindingError,
                    f"manifest.graphs[{names.program_index[g.name]}].completion"
                    ".confidence_buffer", named or "(none)",
                    f"{g.name!r} " + ("produces proposal confidence: its completion names "
                                      f"{PROPOSAL_CONFIDENCE!r}" if produces else
                                      "produces no proposal confidence"))


def _confidence_storage(producers: list[tuple[int, pb.GraphContract]],
                        names: ManifestIndex) -> Findings:
    if not producers:
        return
    index, _ = producers[0]
    path = f"model.graphs[{index}].speculative.produces_confidence"
    buffer = names.buffers.get(PROPOSAL_CONFIDENCE)
    if buffer is None:
        yield F("speculative.confidence_buffer", UnknownIdentifierError, path,
                PROPOSAL_CONFIDENCE, "confidence programs need the proposal_confidence buffer")
        return
    widths = max(g.speculative.confidence_width for _, g in producers)
    rows = max(g.speculative.batch_capacity for _, g in producers)
    shape = list(buffer.shape)
    if buffer.dtype != mpb.D_TYPE_F32 or len(shape) != 3 or shape[0] != 2 or \
            shape[1] < rows or shape[2] < widths:
        yield F("speculative.confidence_buffer", ViewBoundsError, path,
                f"{enum_name(mpb.DType, buffer.dtype)}{shape}",
                f"proposal_confidence is F32 [2, request_slots >= {rows}, draft_capacity >= "
                f"{widths}]")


def manifest_findings(serving: pb.ServingContract, manifest: mpb.ExecutionManifest) -> Findings:
    """Every manifest rule, for a version 3 contract, in the order startup reports them."""
    # Tuning producers are not serving operations: their operation selects nothing.
    for fd in ("buffers", "kernels", "graphs"):
        for index, item in enumerate(getattr(manifest, fd)):
            yield from selectors(item, f"manifest.{fd}[{index}]")
    names = ManifestIndex.build(manifest)
    yield from duplicates(manifest)
    yield from transports(manifest, names)
    for index, graph in enumerate(serving.model.graphs):
        yield from _graph(index, graph, names)
    yield from cache(serving, names)
    yield from tier_plane_findings(serving, names.buffers)
    yield from tuned(serving, names)
    yield from confidence(serving, names)
    yield from scores(serving, names)
    yield from speculative_programs(serving, names)
    yield from buffers(manifest)
    yield from collectives(manifest)
    yield from programs(manifest, names)
    yield from expert_findings(manifest, names.kernels)
