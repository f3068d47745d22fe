"""Runtime capabilities: what a serving backend executes, and the rules that hold a
contract to it.

A valid contract may declare more than a given runtime executes (a sliding-window
history, a SPECULATIVE program, startup tuning). Such a field must fail startup and lint
with a message naming it; it is never accepted and ignored. Each backend publishes a
``RuntimeCapabilities`` table (plain data; the tables of helios-serve's backends are in
``helios_tools.capabilities``, where both ``helios-serve`` and ``helios-tools lint-core``
read them), and ``capability_findings`` is the one rule set that compares a version 3
contract and its manifest with a table. ``NativeModel.load`` raises the first finding,
``lint-core --backend`` lists them all.

Every field defaults to "not executed", so a capability added to the schema is rejected
until a backend's table turns it on (docs/contract-rules.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import frontend_pb2 as fpb
from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract._rules_contract import enum_name
from helios_contract._rules_manifest import STORAGE_THIRD_SIDE, rank_count
from helios_contract.errors import LaunchError, UnsupportedFeatureError
from helios_contract.findings import Finding

__all__ = ["RuntimeCapabilities", "backend_phrase", "capability_findings"]

Findings = Iterator[Finding]


@dataclass(frozen=True)
class RuntimeCapabilities:
    """What one serving backend executes (every default: nothing).

    Attributes:
        backend: The backend's name (``"cpu"``, ``"cuda"``), used in messages.
        operations: ``Operation`` values whose graphs the scheduler runs.
        required_operations: Operations of which the contract must capture at least one
            graph (the scheduler cannot serve without them).
        bindings: ``(ValueSource, Indexing)`` pairs shared packing supplies.
        history_kinds: ``HistoryKind`` values whose storage the runtime backs (paged
            kinds share the request's one page list, whatever their number; one
            sliding-window region has its own pool and page list).
        tokens_per_record: ``HistoryRegion.tokens_per_record`` values the kernels read.
        host_tier: Whether paged regions' ``host_planes`` (host-memory tier planes) are
            backed: allocated in host memory the RESTORE programs read and write.
        state_accesses: ``Access`` kinds a graph may declare.
        state_rows_per_request: The most ``GraphContract.state_rows_per_request`` the
            runtime partitions (one slot row per request: 1).
        cursor_operations: Operations whose graphs may report a draft cursor (the
            runtime validates it against the consumed endpoint).
        speculative_confidence: Whether SPECULATIVE programs may produce confidence
            (device prefix allocation).
        tuning: Whether startup tuning producers run (``tuned_bindings`` and the
            manifest's tuning catalog).
        dtypes: ``DType`` values of buffers the backend allocates.
        image_preparations / image_layouts: Image implementations the frontend has.
        argument_alignment_bytes: Byte alignment every buffer argument of a launch must
            have (its buffer's base is aligned; the view's byte offset must be a multiple);
            0 for element alignment only (a manifest rule).
        reference_ops: Kernel ``reference_op`` names the backend executes, or ``None``
            when it runs compiled binaries instead (their presence per GPU target is a
            core-level check: ``lint-core --require-target``).
        max_ranks: The most tensor-parallel ranks (``ExecutionManifest.rank_count``) the
            backend runs a manifest's programs on, or ``None`` for any number.
        storage_types: ``StorageType`` values of quantized weights (``Buffer.storage``)
            the backend executes.
        storage_ops: Kernel ``reference_op`` names the backend executes with a quantized
            weight argument (each has a quantized form there; any other op reading one
            fails).
        storage_forms: Per storage type, the ops of ``storage_ops`` with a form for that
            type (a GGUF block reader is no FP8 reader); a type absent here takes every
            op of ``storage_ops``.
        storage_args: Ops that read a quantized weight's codes and scales as separate
            arguments (the FP8 and INT4 products): op -> (index of the codes argument,
            index of the scales argument[, index of the zero points or, for INT4_MIN,
            the minimums argument]). Such a
            launch must pass a weight of a storage type the op is a form of, and that
            weight's own scale (and zero point) buffers.
        cache_storage_forms: Per ``StorageType`` of cache planes (``Buffer.storage`` on a
            BUFFER_ROLE_CACHE_PLANE: the e4m3 KV cache), the ops that read or write such a
            plane; a type absent here is not executed. Every launch passing a stored plane
            runs one of them, and no such op is passed a plane of another storage.
        cache_storage_args: Ops of ``cache_storage_forms`` and, per plane argument, where
            its scales are among the arguments: op -> ((plane index, scale index), ...);
            each must be that plane's own scales.
        one_term_inputs: Ops whose compiled kernel skips the second term of a packed
            input when a variant constant is 0: op -> (constant, input argument index).
            The skipped terms are zero only where ``rounded_outputs`` wrote the input, so
            such a launch must read the view the last rounded producer before it in its
            program wrote (no other launch touching that buffer in between); elsewhere
            the backend's result would not be the op's reference.
        rounded_outputs: The producers of ``one_term_inputs``' inputs: op -> index of
            the argument they write (``hi | 0`` packed terms).
        cache_dtype_forms: Per ``DType`` of cache planes other than D_TYPE_F32 (a bf16 KV
            cache: the plane's elements themselves, no storage), the ops that read or
            write such a plane; a dtype absent here is not executed on a cache plane. The
            same rule as ``cache_storage_forms``: every launch passing such a plane runs
            one of them, and no such op is passed a plane of another kind.
    """

    backend: str
    operations: frozenset[int] = frozenset()
    required_operations: frozenset[int] = frozenset()
    bindings: frozenset[tuple[int, int]] = frozenset()
    history_kinds: frozenset[int] = frozenset()
    tokens_per_record: frozenset[int] = frozenset()
    host_tier: bool = False
    state_accesses: frozenset[int] = frozenset()
    state_rows_per_request: int = 0
    cursor_operations: frozenset[int] = frozenset()
    speculative_confidence: bool = False
    tuning: bool = False
    dtypes: frozenset[int] = frozenset()
    image_preparations: frozenset[int] = frozenset()
    image_layouts: frozenset[int] = frozenset()
    argument_alignment_bytes: int = 0
    reference_ops: frozenset[str] | None = None
    max_ranks: int | None = 1
    storage_types: frozenset[int] = frozenset()
    storage_ops: frozenset[str] = frozenset()
    storage_forms: Mapping[int, frozenset[str]] = field(default_factory=dict)
    storage_args: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    cache_storage_forms: Mapping[int, frozenset[str]] = field(default_factory=dict)
    cache_storage_args: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    one_term_inputs: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    rounded_outputs: Mapping[str, int] = field(default_factory=dict)
    cache_dtype_forms: Mapping[int, frozenset[str]] = field(default_factory=dict)

    def forms(self, storage_type: int) -> frozenset[str]:
        """The ops reading weights of `storage_type` the backend executes."""
        return self.storage_forms.get(storage_type, self.storage_ops)


def _names(enum: object, numbers) -> str:
    return ", ".join(sorted(enum_name(enum, n) for n in numbers)) or "none"


def backend_phrase(backend: str) -> str:
    """How a detail names its backend (lint merges the findings of several backends)."""
    return f"the {backend} backend"


def _unsupported(rule: str, path: str, value: object, caps: RuntimeCapabilities,
                 what: str) -> Finding:
    return Finding.of(rule, UnsupportedFeatureError, path, value,
                      f"not executed by {backend_phrase(caps.backend)}: {what}")


def _graphs(serving: pb.ServingContract, caps: RuntimeCapabilities) -> Findings:
    ops = {g.operation for g in serving.model.graphs}
    for needed in sorted(caps.required_operations - ops):
        yield Finding.of("runtime.required_operation", UnsupportedFeatureError, "model.graphs",
                         enum_name(pb.Operation, needed),
                         f"needed by {backend_phrase(caps.backend)}: at least one "
                         f"{enum_name(pb.Operation, needed)} graph (the contract has none)")
    for i, graph in enumerate(serving.model.graphs):
        path = f"model.graphs[{i}]"
        if graph.operation not in caps.operations:
            yield _unsupported("runtime.operation", f"{path}.operation",
                               enum_name(pb.Operation, graph.operation), caps,
                               f"{enum_name(pb.Operation, graph.operation)} graphs (it "
                               f"schedules {_names(pb.Operation, caps.operations)}), so "
                               f"{graph.name!r} would never run")
        for b, binding in enumerate(graph.bindings):
            if (binding.source, binding.indexing) not in caps.bindings:
                pair = (f"{enum_name(pb.ValueSource, binding.source)} with "
                        f"{enum_name(pb.Indexing, binding.indexing)}")
                yield _unsupported("runtime.binding", f"{path}.bindings[{b}]", pair, caps,
                                   f"{pair} (shared packing does not supply it)")
        for a, access in enumerate(graph.state_accesses):
            if access.access not in caps.state_accesses:
                yield _unsupported("runtime.state_access", f"{path}.state_accesses[{a}].access",
                                   enum_name(pb.Access, access.access), caps,
                                   f"{enum_name(pb.Access, access.access)} state accesses")
        if graph.state_rows_per_request > caps.state_rows_per_request:
            yield _unsupported("runtime.state_rows", f"{path}.state_rows_per_request",
                               graph.state_rows_per_request, caps,
                               f"more than {caps.state_rows_per_request} state row(s) per "
                               "request")
        if graph.completion_cursor.has_draft_cursor and \
                graph.operation not in caps.cursor_operations:
            yield _unsupported("runtime.completion_cursor",
                               f"{path}.completion_cursor.has_draft_cursor", True, caps,
                               f"draft cursors of {enum_name(pb.Operation, graph.operation)} "
                               f"graphs (it validates those of "
                               f"{_names(pb.Operation, caps.cursor_operations)})")
        if graph.speculative.produces_confidence and not caps.speculative_confidence:
            yield _unsupported("runtime.speculative_confidence",
                               f"{path}.speculative.produces_confidence", True, caps,
                               "programs producing proposal confidence")
        if graph.tuned_bindings and not caps.tuning:
            yield _unsupported("runtime.tuning", f"{path}.tuned_bindings",
                               [t.buffer for t in graph.tuned_bindings], caps,
                               "startup tuning producers (tuned bindings)")


def _speculative(serving: pb.ServingContract, caps: RuntimeCapabilities,
                 speculative_width: int | None) -> Findings:
    """What the scheduler needs of the SPECULATIVE programs it runs (those of width
    W <= `speculative_width`, the load option; None: every captured one): a width-one
    program (lanes that cannot speculate) and one draft cursor for every program."""
    spec = [(i, g) for i, g in enumerate(serving.model.graphs)
            if g.operation == pb.OPERATION_SPECULATIVE
            and (speculative_width is None or g.speculative.token_capacity <= speculative_width)]
    if not spec or pb.OPERATION_SPECULATIVE not in caps.operations:
        return
    widths = sorted({g.speculative.token_capacity for _, g in spec})
    if 1 not in widths:
        yield Finding.of("runtime.speculative_width_one", UnsupportedFeatureError,
                         "speculative_widths", widths,
                         f"needed by {backend_phrase(caps.backend)}: a width-one SPECULATIVE "
                         "program for lanes that cannot speculate")
    first = spec[0][1].completion_cursor
    for i, graph in spec[1:]:
        if graph.completion_cursor != first:
            yield _unsupported("runtime.draft_cursor", f"model.graphs[{i}].completion_cursor",
                               graph.completion_cursor.lag_tokens, caps,
                               "SPECULATIVE programs that disagree on the draft cursor")
            break


def _pending_token(serving: pb.ServingContract, caps: RuntimeCapabilities) -> Findings:
    """The runtime feeds (and restores) one pending-token view for every decode step, and
    a mixed step hands its sampled tokens to the next decode through that same view."""
    decode = [(i, g) for i, g in enumerate(serving.model.graphs)
              if g.operation == pb.OPERATION_DECODE]
    views = {g.pending_token.SerializeToString(deterministic=True) for _, g in decode}
    if len(views) > 1:
        i, graph = decode[-1]
        yield Finding.of("runtime.pending_token", UnsupportedFeatureError,
                         f"model.graphs[{i}].pending_token", graph.pending_token.buffer or "host",
                         f"not executed by {backend_phrase(caps.backend)}: decode graphs that "
                         "disagree on the pending token's owner or view (it feeds every decode "
                         "graph the same way)")
        return
    for i, graph in enumerate(serving.model.graphs):
        if graph.operation == pb.OPERATION_MIXED and views and \
                graph.pending_token.SerializeToString(deterministic=True) not in views:
            yield Finding.of("runtime.mixed_pending_token", UnsupportedFeatureError,
                             f"model.graphs[{i}].pending_token",
                             graph.pending_token.buffer or "host",
                             f"not executed by {backend_phrase(caps.backend)}: a MIXED graph "
                             "whose pending-token view differs from the decode graphs' (the "
                             "next decode reads the tokens a mixed step samples there)")


def _cache(serving: pb.ServingContract, manifest: mpb.ExecutionManifest,
           caps: RuntimeCapabilities) -> Findings:
    for i, region in enumerate(serving.model.cache.regions):
        path = f"model.cache.regions[{i}]"
        if region.kind not in caps.history_kinds:
            yield _unsupported("runtime.history_kind", f"{path}.kind",
                               enum_name(pb.HistoryKind, region.kind), caps,
                               f"{enum_name(pb.HistoryKind, region.kind)} histories (it backs "
                               f"{_names(pb.HistoryKind, caps.history_kinds)})")
        elif region.tokens_per_record not in caps.tokens_per_record:
            yield _unsupported("runtime.tokens_per_record", f"{path}.tokens_per_record",
                               region.tokens_per_record, caps,
                               f"compressed histories (tokens per record "
                               f"{sorted(caps.tokens_per_record)})")
        if region.kind == pb.HISTORY_KIND_SLIDING_WINDOW and any(
                r.kind == pb.HISTORY_KIND_SLIDING_WINDOW for r in serving.model.cache.regions[:i]):
            yield _unsupported("runtime.window_regions", f"{path}.kind",
                               enum_name(pb.HistoryKind, region.kind), caps,
                               "a second sliding-window region (it backs one window pool "
                               "per request)")
        if region.host_planes and not caps.host_tier:
            yield _unsupported("runtime.host_tier", f"{path}.host_planes",
                               len(region.host_planes), caps,
                               "host-memory tier planes (it backs no host tier)")
    buffers = {b.name: b for b in manifest.buffers}
    slots = {}
    for i, view in enumerate(serving.model.cache.page_table_views):
        table = buffers.get(view.buffer)
        if table is not None and table.shape:
            slots.setdefault(table.shape[0], i)
    if len(slots) > 1:
        yield _unsupported("runtime.page_table_slots", "model.cache.page_table_views",
                           sorted(slots), caps,
                           "page-table views of different request-slot counts")


def _manifest(manifest: mpb.ExecutionManifest, caps: RuntimeCapabilities) -> Findings:
    ranks = rank_count(manifest)
    if caps.max_ranks is not None and ranks > caps.max_ranks:
        yield _unsupported("runtime.rank_count", "manifest.rank_count", ranks, caps,
                           f"programs split between {ranks} tensor-parallel ranks (it runs "
                           f"at most {caps.max_ranks})")
    for i, buffer in enumerate(manifest.buffers):
        if buffer.dtype not in caps.dtypes:
            yield _unsupported("runtime.dtype", f"manifest.buffers[{i}].dtype",
                               enum_name(mpb.DType, buffer.dtype), caps,
                               f"{enum_name(mpb.DType, buffer.dtype)} buffers (it allocates "
                               f"{_names(mpb.DType, caps.dtypes)})")
    yield from _storage(manifest, caps)
    yield from _one_term_inputs(manifest, caps)
    if caps.reference_ops is not None:
        for i, kernel in enumerate(manifest.kernels):
            if kernel.reference_op not in caps.reference_ops:
                yield _unsupported("runtime.reference_op", f"manifest.kernels[{i}].reference_op",
                                   kernel.reference_op, caps,
                                   f"kernel {kernel.id!r} (its kernel library has no "
                                   f"reference op {kernel.reference_op!r})")
    if caps.argument_alignment_bytes:
        align = caps.argument_alignment_bytes
        for kind, programs in (("graphs", manifest.graphs),
                               ("tuning.producers", manifest.tuning.producers)):
            for g, program in enumerate(programs):
                for j, launch in enumerate(program.launches):
                    for a, arg in enumerate(launch.args):
                        if arg.WhichOneof("value") == "buffer" and arg.buffer.byte_offset % align:
                            yield _unsupported(
                                "runtime.alignment",
                                f"manifest.{kind}[{g}].launches[{j}].args[{a}].buffer.byte_offset",
                                arg.buffer.byte_offset, caps,
                                f"buffer arguments off its {align}-byte alignment (kernels are "
                                f"compiled for aligned pointers)")
    if manifest.tuning.producers and not caps.tuning:
        yield _unsupported("runtime.tuning", "manifest.tuning.producers",
                           [g.name for g in manifest.tuning.producers], caps,
                           "startup tuning producers (the manifest's tuning catalog)")


def _one_term_inputs(manifest: mpb.ExecutionManifest, caps: RuntimeCapabilities) -> Findings:
    """Launches running one term of a packed input (``one_term_inputs``' constant 0) read
    what a rounded producer (``rounded_outputs``) last wrote, at the same byte offset,
    with no other launch touching that buffer in between (any may write it)."""
    if not caps.one_term_inputs:
        return
    kernels = {k.id: k for k in manifest.kernels}
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for g, program in enumerate(programs):
            rounded: dict[str, int] = {}  # buffer -> byte offset of the rounded view
            for j, launch in enumerate(program.launches):
                kernel = kernels.get(launch.kernel)
                if kernel is None:
                    continue  # kernel.missing
                op, args = kernel.reference_op, launch.args
                if op in caps.one_term_inputs:
                    const, at = caps.one_term_inputs[op]
                    if (kernel.constants.get(const, 1) == 0 and at < len(args)
                            and args[at].WhichOneof("value") == "buffer"
                            and rounded.get(args[at].buffer.buffer)
                            != args[at].buffer.byte_offset):
                        yield Finding.of(
                            "runtime.one_term_input", LaunchError,
                            f"manifest.{kind}[{g}].launches[{j}].args[{at}].buffer.buffer",
                            args[at].buffer.buffer,
                            f"not executed by {backend_phrase(caps.backend)}: kernel "
                            f"{kernel.id!r} runs {const}=0 (one term) over a view no "
                            f"rounded producer ({', '.join(sorted(caps.rounded_outputs))}) "
                            "wrote just before: it would drop terms its reference adds")
                    continue  # reads its input, writes partial products elsewhere
                for arg in args:
                    if arg.WhichOneof("value") == "buffer":
                        rounded.pop(arg.buffer.buffer, None)
                out = caps.rounded_outputs.get(op)
                if out is not None and out < len(args) and \
                        args[out].WhichOneof("value") == "buffer":
                    rounded[args[out].buffer.buffer] = args[out].buffer.byte_offset


def _storage(manifest: mpb.ExecutionManifest, caps: RuntimeCapabilities) -> Findings:
    """Quantized weights: their storage type, and every kernel reading one, executed;
    every op reading codes and scales (``storage_args``) passes a quantized weight and its
    own scales."""
    yield from _storage_args(manifest, caps)
    yield from _cache_storage(manifest, caps)
    stored = {}
    for i, buffer in enumerate(manifest.buffers):
        if not buffer.HasField("storage") or buffer.role == mpb.BUFFER_ROLE_CACHE_PLANE:
            continue
        if buffer.storage.type not in caps.storage_types:
            # One finding per buffer: the launches reading it are not listed again.
            name = enum_name(mpb.StorageType, buffer.storage.type)
            yield _unsupported("runtime.storage", f"manifest.buffers[{i}].storage.type", name,
                               caps, f"buffer {buffer.name!r} stored as {name} (it "
                               f"executes {_names(mpb.StorageType, caps.storage_types)})")
            continue
        stored[buffer.name] = buffer.storage.type
    if not stored:
        return
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    seen: set[tuple[str, str]] = set()
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for g, program in enumerate(programs):
            for j, launch in enumerate(program.launches):
                op = kernels.get(launch.kernel, "")
                for a, arg in enumerate(launch.args):
                    if arg.WhichOneof("value") != "buffer" or arg.buffer.buffer not in stored:
                        continue
                    forms = caps.forms(stored[arg.buffer.buffer])
                    if op in forms or (op, arg.buffer.buffer) in seen:
                        continue
                    seen.add((op, arg.buffer.buffer))
                    name = enum_name(mpb.StorageType, stored[arg.buffer.buffer])
                    yield _unsupported(
                        "runtime.storage",
                        f"manifest.{kind}[{g}].launches[{j}].args[{a}].buffer.buffer",
                        arg.buffer.buffer, caps,
                        f"reference op {op!r} over quantized weights (it has a {name} form "
                        f"of {', '.join(sorted(forms)) or 'no op'})")


def _launches(manifest: mpb.ExecutionManifest):
    """(path of a launch's args, its reference op, the launch) of every program."""
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for g, program in enumerate(programs):
            for j, launch in enumerate(program.launches):
                yield (f"manifest.{kind}[{g}].launches[{j}].args",
                       kernels.get(launch.kernel, ""), launch)


def _plane_kind(buffer: mpb.Buffer) -> str:
    """How a cache plane holds its elements, as messages name it: its storage type
    (e4m3 codes), else its dtype (``D_TYPE_F32`` for the plain f32 plane)."""
    if buffer.HasField("storage"):
        return enum_name(mpb.StorageType, buffer.storage.type)
    return enum_name(mpb.DType, buffer.dtype)


# What each kind of plane holds, as the launch findings say it.
_HOLDS = {"STORAGE_TYPE_FP8_E4M3": "e4m3 codes", "D_TYPE_BF16": "bf16 elements",
          "D_TYPE_F32": "f32 elements"}


def _holds(kind: str) -> str:
    return _HOLDS.get(kind, kind)


def _cache_storage(manifest: mpb.ExecutionManifest, caps: RuntimeCapabilities) -> Findings:
    """Cache planes held otherwise than as f32 elements (an e4m3 cache: ``Buffer.storage``
    on the plane; a bf16 cache: D_TYPE_BF16 elements): that kind executed, every launch
    passing such a plane an op of that kind's forms (reading the plane's own scales where
    it has them), and no such op passed a plane of another kind (an f32 plane)."""
    planes = {b.name: b for b in manifest.buffers if b.role == mpb.BUFFER_ROLE_CACHE_PLANE}
    forms_of: dict[str, frozenset[str]] = {}  # kind -> the ops reading or writing it
    for kind, forms in caps.cache_storage_forms.items():
        forms_of[enum_name(mpb.StorageType, kind)] = forms
    for kind, forms in caps.cache_dtype_forms.items():
        forms_of[enum_name(mpb.DType, kind)] = forms
    kinds = {n: _plane_kind(b) for n, b in planes.items()
             if b.HasField("storage") or b.dtype != mpb.D_TYPE_F32}
    for i, buffer in enumerate(manifest.buffers):
        kind = kinds.get(buffer.name)
        if kind is not None and kind not in forms_of:
            field_ = "storage.type" if buffer.HasField("storage") else "dtype"
            yield _unsupported("runtime.storage", f"manifest.buffers[{i}].{field_}", kind,
                               caps, f"{kind} cache planes (it executes cache planes of "
                               f"D_TYPE_F32 elements and "
                               f"{', '.join(sorted(forms_of)) or 'nothing else'})")
            return  # one line: the kind, not each launch reading it
    op_kind = {op: kind for kind, forms in forms_of.items() for op in forms}
    for path, op, launch in _launches(manifest):
        args = launch.args
        for a, arg in enumerate(args):
            name = arg.buffer.buffer if arg.WhichOneof("value") == "buffer" else ""
            if name in kinds:
                forms = forms_of[kinds[name]]
                if op not in forms:
                    reads = _holds(op_kind.get(op, "D_TYPE_F32"))
                    yield Finding.of("runtime.storage", LaunchError, f"{path}[{a}].buffer.buffer",
                                     name, f"reference op {op!r} reads cache plane {name!r} "
                                     f"as {reads}; it is stored as {kinds[name]} (its forms: "
                                     f"{', '.join(sorted(forms)) or 'none'})")
            elif name in planes and op in op_kind:
                yield Finding.of("runtime.storage", LaunchError, f"{path}[{a}].buffer.buffer",
                                 name, f"reference op {op!r} reads {_holds(op_kind[op])}; "
                                 f"cache plane {name!r} holds f32 elements")
        for at, sat in caps.cache_storage_args.get(op, ()):
            if max(at, sat) >= len(args):
                continue  # the launch's arity: kernel.launch_args
            plane, scale = args[at].buffer.buffer, args[sat].buffer.buffer
            stored = planes.get(plane)
            if stored is not None and stored.HasField("storage") and \
                    scale != stored.storage.scales.buffer:
                yield Finding.of("runtime.storage", LaunchError, f"{path}[{sat}].buffer.buffer",
                                 scale, f"reference op {op!r} must read cache plane {plane!r}'s "
                                 f"own scales {stored.storage.scales.buffer!r}")


def _storage_args(manifest: mpb.ExecutionManifest, caps: RuntimeCapabilities) -> Findings:
    if not caps.storage_args:
        return
    storage = {b.name: b.storage for b in manifest.buffers if b.HasField("storage")}
    kernels = {k.id: k.reference_op for k in manifest.kernels}
    for kind, programs in (("graphs", manifest.graphs),
                           ("tuning.producers", manifest.tuning.producers)):
        for g, program in enumerate(programs):
            for j, launch in enumerate(program.launches):
                op = kernels.get(launch.kernel, "")
                if op not in caps.storage_args:
                    continue
                at = caps.storage_args[op]
                args = launch.args
                if max(at) >= len(args) or any(args[i].WhichOneof("value") != "buffer"
                                               for i in at):
                    continue  # the launch's arity and kinds: kernel.launch_args
                w, s = at[0], at[1]
                weight, scale = args[w].buffer.buffer, args[s].buffer.buffer
                path = f"manifest.{kind}[{g}].launches[{j}].args"
                st = storage.get(weight)
                if st is None or op not in caps.forms(st.type):
                    yield Finding.of("runtime.storage", LaunchError,
                                     f"{path}[{w}].buffer.buffer", weight,
                                     f"reference op {op!r} reads quantized codes; buffer "
                                     f"{weight!r} is not stored in a type it is a form of")
                elif scale != st.scales.buffer:
                    yield Finding.of("runtime.storage", LaunchError,
                                     f"{path}[{s}].buffer.buffer", scale,
                                     f"reference op {op!r} must read {weight!r}'s own scales "
                                     f"{st.scales.buffer!r}")
                elif len(at) > 2 and args[at[2]].buffer.buffer != _third(st).buffer:
                    side = args[at[2]].buffer.buffer
                    named = STORAGE_THIRD_SIDE.get(st.type, "zero_points")
                    words = named.replace("_", " ")
                    own = (f"{words} {_third(st).buffer!r}" if st.HasField(named)
                           else f"{words} (it declares none)")
                    yield Finding.of("runtime.storage", LaunchError,
                                     f"{path}[{at[2]}].buffer.buffer", side,
                                     f"reference op {op!r} must read {weight!r}'s own {own}")


def _third(st: mpb.TensorStorage) -> mpb.SideBuffer:
    """The side buffer after the scales a form reads (``STORAGE_THIRD_SIDE``: INT4's zero
    points, INT4_MIN's minimums)."""
    return getattr(st, STORAGE_THIRD_SIDE.get(st.type, "zero_points"))


def _frontend(serving: pb.ServingContract, caps: RuntimeCapabilities) -> Findings:
    front = serving.model.frontend
    if front.image_preparation not in caps.image_preparations:
        yield _unsupported("runtime.image", "model.frontend.image_preparation",
                           enum_name(fpb.ImagePreparation, front.image_preparation), caps,
                           "image preparation (it has no image implementation)")
    if front.image_layout not in caps.image_layouts:
        yield _unsupported("runtime.image", "model.frontend.image_layout",
                           enum_name(fpb.ImageLayout, front.image_layout), caps,
                           "image layouts (it has no image implementation)")


def capability_findings(serving: pb.ServingContract, manifest: mpb.ExecutionManifest,
                        caps: RuntimeCapabilities, *,
                        speculative_width: int | None = None) -> Findings:
    """Every field of a version 3 contract and its manifest that ``caps`` does not execute.

    Args:
        serving: A validated version 3 contract (``PreparedContract.serving``).
        manifest: Its execution manifest.
        caps: The backend's capability table.
        speculative_width: The load-time width limit (``helios-serve
            --speculative-width``): SPECULATIVE programs wider than it are not served, so
            their needs are not checked; None (lint's default) serves every captured one.

    Yields:
        ``runtime.*`` findings, raised at startup as ``UnsupportedFeatureError``.
    """
    yield from _graphs(serving, caps)
    yield from _speculative(serving, caps, speculative_width)
    yield from _pending_token(serving, caps)
    yield from _cache(serving, manifest, caps)
    yield from _manifest(manifest, caps)
    yield from _frontend(serving, caps)
