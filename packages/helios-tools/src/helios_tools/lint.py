"""lint-core: every structural reason a core would fail ``helios-serve`` startup, as values.

A finding names the rule, the field path and the offending value. ``lint_core`` runs what
``verify`` runs (authorization, every resource's digests and frame) plus full contract
validation (``PreparedContract.from_contract``) and the manifest consistency checks of
``lint_manifest``: graph variants, references to buffers, kernels and resources, views
inside buffers, kernel binaries per target, and capacities agreeing between the contract
and the manifest. Unlike the contract validator, which stops at the first broken rule,
lint reports every finding it can.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from helios_contract.schema import contract_pb2 as pb
from helios_contract.schema import core_pb2
from helios_contract.schema import manifest_pb2 as mpb

from helios_tools.core.errors import CoreError
from helios_tools.core.reader import Core, authorize

__all__ = ["DTYPE_NBYTES", "Finding", "lint_contract", "lint_core", "lint_manifest"]

DTYPE_NBYTES = {mpb.D_TYPE_F32: 4, mpb.D_TYPE_BF16: 2, mpb.D_TYPE_F16: 2, mpb.D_TYPE_I32: 4,
                mpb.D_TYPE_U32: 4, mpb.D_TYPE_I64: 8, mpb.D_TYPE_U8: 1}
_PARAM_ARG = {mpb.PARAM_KIND_BUFFER: "buffer", mpb.PARAM_KIND_I32: "int_value",
              mpb.PARAM_KIND_I64: "int_value", mpb.PARAM_KIND_F32: "float_value"}
_STATE_ROLES = (mpb.BUFFER_ROLE_PERSISTENT_STATE, mpb.BUFFER_ROLE_CACHE_PLANE,
                mpb.BUFFER_ROLE_TUNED)


@dataclass(frozen=True)
class Finding:
    """One lint finding.

    Attributes:
        rule: Stable rule id, e.g. ``"graph.missing"``.
        path: Where: a field path (``model.graphs[1].name``) or ``resources["id"]``.
        value: The offending value, as text.
        detail: Why it fails, in words.
    """

    rule: str
    path: str
    value: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.rule}: {self.path} = {self.value}: {self.detail}"


def lint_core(core: Core, *, acceptance: str | None = None,
              check_resources: bool = True,
              progress: Callable[[int], None] | None = None,
              require_targets: Iterable[str] = ()) -> list[Finding]:
    """Lint an open core.

    Args:
        core: The core (``open_core``, or ``open_core_unverified`` to lint structure only).
        acceptance: When given, the namespace must authorize (``authorize``).
        require_targets: GPU targets the core must carry binaries for (e.g. ``sm_90``, the
            architecture it will be served on). A core without targets is a valid
            CPU-only core; `helios-serve --backend cuda` rejects it at startup.
        check_resources: Verify every resource's chunks and frame (reads the whole file).
        progress: Called with the stored bytes of each resource once it is checked.

    Returns:
        Findings, empty for a core that passes.
    """
    findings: list[Finding] = []
    if acceptance is not None:
        try:
            authorize(core, acceptance)
        except CoreError as e:
            findings.append(Finding("core.authorize", "publisher_namespace", repr(acceptance),
                                    str(e)))
    if check_resources:
        for rid, res in core.resources.items():
            try:
                core.verify_resource(rid)
            except CoreError as e:
                findings.append(Finding("resource.integrity", f"resources[{rid!r}]",
                                        type(e).__name__, str(e)))
            if progress is not None:
                progress(res.stored_nbytes)
    findings += lint_contract(core.contract, core.manifest)
    findings += lint_manifest(core.contract, core.manifest, core.resources.values())
    declared = set(core.manifest.targets)
    for target in require_targets:
        if target not in declared:
            findings.append(Finding("kernel.target", "manifest.targets", target,
                                    f"no kernel binaries for required target {target!r}; "
                                    f"the core declares {sorted(declared) or 'none'}"))
    return findings


def lint_contract(contract: pb.ServingContract,
                  manifest: mpb.ExecutionManifest) -> list[Finding]:
    """Full contract validation by helios-contract's ``PreparedContract.from_contract``."""
    try:
        from helios_contract.prepared import PreparedContract
    except ImportError:  # helios-contract without its validator: nothing to add
        return []
    try:
        PreparedContract.from_contract(contract, manifest)
    except ValueError as e:  # helios_contract.errors.FieldError and subclasses
        path = getattr(e, "path", "") or "contract"
        value = getattr(e, "value", None)
        detail = getattr(e, "detail", "") or str(e)
        return [Finding(f"contract.{type(e).__name__}", path, _text(value), detail)]
    return []


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def buffer_nbytes(buffer: mpb.Buffer) -> int:
    """prod(shape) x element size; a scalar when the shape is empty."""
    return math.prod(buffer.shape) * DTYPE_NBYTES.get(buffer.dtype, 0)


class _Lint:
    def __init__(self, contract: pb.ServingContract, manifest: mpb.ExecutionManifest,
                 resources: Iterable[core_pb2.ExecutableResource]) -> None:
        self.contract = contract
        self.manifest = manifest
        self.resources = {r.resource_id: r for r in resources}
        self.findings: list[Finding] = []
        self.buffers = {b.name: b for b in manifest.buffers}
        self.kernels = {k.id: k for k in manifest.kernels}
        self.graphs = {g.name: g for g in manifest.graphs}
        self.producers = {g.name: g for g in manifest.tuning.producers}

    def add(self, rule: str, path: str, value: Any, detail: str) -> None:
        self.findings.append(Finding(rule, path, _text(value), detail))

    def buffer(self, name: str, path: str) -> mpb.Buffer | None:
        buf = self.buffers.get(name)
        if buf is None:
            self.add("buffer.missing", path, name, "no such buffer in the execution manifest")
        return buf

    def resource(self, rid: str, path: str, kind: int) -> core_pb2.ExecutableResource | None:
        res = self.resources.get(rid)
        if res is None:
            self.add("resource.missing", path, rid, "no such resource in the core")
        elif kind and res.kind != kind:
            self.add("resource.kind", path, rid, f"resource is "
                     f"{core_pb2.ResourceKind.Name(res.kind)}, expected "
                     f"{core_pb2.ResourceKind.Name(kind)}")
        return res

    # -- manifest internals ------------------------------------------------------------------

    def duplicates(self) -> None:
        m = self.manifest
        for field, names in (("buffers", [b.name for b in m.buffers]),
                             ("kernels", [k.id for k in m.kernels]),
                             ("graphs", [g.name for g in m.graphs]),
                             ("tuning.producers", [g.name for g in m.tuning.producers])):
            for name, n in Counter(names).items():
                if n > 1:
                    self.add("manifest.duplicate", f"manifest.{field}", name,
                             f"declared {n} times")
        for name in set(self.graphs) & set(self.producers):
            self.add("manifest.duplicate", "manifest.tuning.producers", name,
                     "a tuning producer shares a serving graph's name")

    def buffers_and_weights(self) -> None:
        for i, b in enumerate(self.manifest.buffers):
            path = f"manifest.buffers[{i}]"
            if b.dtype not in DTYPE_NBYTES:
                self.add("buffer.dtype", f"{path}.dtype", b.dtype, "unknown dtype")
            if b.role == mpb.BUFFER_ROLE_WEIGHT:
                if not b.weight_resource_id:
                    self.add("resource.missing", f"{path}.weight_resource_id", "",
                             f"weight buffer {b.name!r} names no resource")
                    continue
                res = self.resource(b.weight_resource_id, f"{path}.weight_resource_id",
                                    core_pb2.RESOURCE_KIND_WEIGHTS)
                if res is not None and res.decoded_nbytes != buffer_nbytes(b):
                    self.add("weight.nbytes", f"{path}.weight_resource_id",
                             b.weight_resource_id, f"resource decodes to {res.decoded_nbytes} "
                             f"bytes; buffer {b.name!r} holds {buffer_nbytes(b)}")
            elif b.weight_resource_id:
                self.add("buffer.role", f"{path}.weight_resource_id", b.weight_resource_id,
                         f"buffer {b.name!r} is not a weight but names a resource")

    def kernels_and_targets(self) -> None:
        targets = list(self.manifest.targets)
        for i, k in enumerate(self.manifest.kernels):
            path = f"manifest.kernels[{i}]"
            have = Counter(b.target for b in k.binaries)
            for t in targets:
                if not have[t]:
                    self.add("kernel.target", f"{path}.binaries", f"{k.id}@{t}",
                             f"kernel {k.id!r} has no binary for declared target {t!r}")
                elif have[t] > 1:
                    self.add("kernel.target", f"{path}.binaries", f"{k.id}@{t}",
                             f"kernel {k.id!r} has {have[t]} binaries for target {t!r}")
            for j, b in enumerate(k.binaries):
                self.resource(b.resource_id, f"{path}.binaries[{j}].resource_id",
                              core_pb2.RESOURCE_KIND_KERNEL_BINARY)
                if not b.entry_name:
                    self.add("kernel.binary", f"{path}.binaries[{j}].entry_name", "",
                             "binaries name their entry point")

    def program(self, g: mpb.GraphProgram, path: str) -> None:
        for j, launch in enumerate(g.launches):
            lpath = f"{path}.launches[{j}]"
            kernel = self.kernels.get(launch.kernel)
            if kernel is None:
                self.add("kernel.missing", f"{lpath}.kernel", launch.kernel,
                         "no such kernel in the manifest")
            elif len(launch.args) != len(kernel.params):
                self.add("launch.args", f"{lpath}.args", len(launch.args),
                         f"kernel {kernel.id!r} takes {len(kernel.params)} parameters")
            else:
                for a, (arg, param) in enumerate(zip(launch.args, kernel.params, strict=True)):
                    want, got = _PARAM_ARG.get(param.kind), arg.WhichOneof("value")
                    if want != got:
                        self.add("launch.args", f"{lpath}.args[{a}]", got,
                                 f"parameter {param.name!r} takes {want}")
            for a, arg in enumerate(launch.args):
                if arg.WhichOneof("value") == "buffer":
                    buf = self.buffer(arg.buffer.buffer, f"{lpath}.args[{a}].buffer.buffer")
                    if buf is not None and arg.buffer.byte_offset >= max(1, buffer_nbytes(buf)):
                        self.add("view.bounds", f"{lpath}.args[{a}].buffer.byte_offset",
                                 arg.buffer.byte_offset,
                                 f"outside buffer {buf.name!r} of {buffer_nbytes(buf)} bytes")
            for name, dims in (("grid", launch.grid), ("block", launch.block)):
                if not 1 <= len(dims) <= 3 or any(d == 0 for d in dims):
                    self.add("launch.geometry", f"{lpath}.{name}", list(dims),
                             "1 to 3 positive extents")
        for t, tr in enumerate(g.transports):
            buf = self.buffer(tr.destination, f"{path}.transports[{t}].destination")
            if buf is not None and tr.nbytes > buffer_nbytes(buf):
                self.add("view.bounds", f"{path}.transports[{t}].nbytes", tr.nbytes,
                         f"exceeds buffer {buf.name!r} of {buffer_nbytes(buf)} bytes")
        if g.HasField("completion"):
            buf = self.buffer(g.completion.buffer, f"{path}.completion.buffer")
            if buf is not None and g.completion.rows * 4 > buffer_nbytes(buf):
                self.add("view.bounds", f"{path}.completion.rows", g.completion.rows,
                         f"int32 rows exceed buffer {buf.name!r} of {buffer_nbytes(buf)} bytes")
        for p, producer in enumerate(g.tuning_producers):
            if producer not in self.producers:
                self.add("tuned.producer", f"{path}.tuning_producers[{p}]", producer,
                         "not a producer of the tuning catalog")

    # -- contract against manifest -----------------------------------------------------------

    def view(self, view: pb.StateView, path: str) -> None:
        """Row r of a view spans [byte_offset + r * row_stride, + byte_extent)."""
        buf = self.buffer(view.buffer, f"{path}.buffer")
        if buf is None:
            return
        if buf.role not in _STATE_ROLES:
            self.add("view.role", f"{path}.buffer", view.buffer,
                     f"state views lie in persistent buffers, not "
                     f"{mpb.BufferRole.Name(buf.role)}")
        total, rows = buffer_nbytes(buf), (buf.shape[0] if buf.shape else 1)
        stride = view.row_stride
        end = view.byte_offset + (rows - 1) * stride + view.byte_extent if stride else \
            view.byte_offset + view.byte_extent
        if view.byte_extent == 0 or (stride and view.byte_extent > stride) or end > total:
            self.add("view.bounds", path, f"bytes up to {end}",
                     f"outside buffer {buf.name!r} of {total} bytes ({rows} rows) or empty")

    def graph(self, i: int, gc: pb.GraphContract) -> None:
        path = f"model.graphs[{i}]"
        g = self.graphs.get(gc.name)
        if g is None:
            self.add("graph.missing", f"{path}.name", gc.name,
                     "the contract selects a graph variant the manifest lacks")
        else:
            if g.operation != gc.operation:
                self.add("graph.operation", f"{path}.operation",
                         pb.Operation.Name(gc.operation) if gc.operation in
                         pb.Operation.values() else gc.operation,
                         f"manifest graph is {pb.Operation.Name(g.operation)}")
            for field in ("batch_capacity", "token_capacity"):
                if getattr(g, field) != getattr(gc, field):
                    self.add("graph.capacity", f"{path}.{field}", getattr(gc, field),
                             f"manifest graph captures {getattr(g, field)}")
            transports = {t.destination for t in g.transports}
            for b, binding in enumerate(gc.bindings):
                if binding.destination not in transports:
                    self.add("binding.destination", f"{path}.bindings[{b}].destination",
                             binding.destination,
                             f"not a transport destination of manifest graph {gc.name!r}")
            declared = sorted({t.producer_graph for t in gc.tuned_bindings})
            if declared != sorted(set(g.tuning_producers)):
                self.add("tuned.producer", f"{path}.tuned_bindings", declared,
                         f"manifest graph depends on producers {sorted(set(g.tuning_producers))}")
        if gc.operation == pb.OPERATION_SPECULATIVE and gc.HasField("speculative"):
            spec = gc.speculative
            if spec.batch_capacity != gc.batch_capacity:
                self.add("graph.capacity", f"{path}.speculative.batch_capacity",
                         spec.batch_capacity, f"graph captures {gc.batch_capacity} rows")
            if spec.packed_token_capacity != gc.token_capacity:
                self.add("graph.capacity", f"{path}.speculative.packed_token_capacity",
                         spec.packed_token_capacity, f"graph captures {gc.token_capacity} tokens")
        for b, binding in enumerate(gc.bindings):
            self.buffer(binding.destination, f"{path}.bindings[{b}].destination")
        for a, access in enumerate(gc.state_accesses):
            self.view(access.view, f"{path}.state_accesses[{a}].view")
        if gc.HasField("pending_token"):
            self.view(gc.pending_token, f"{path}.pending_token")
        for t, tuned in enumerate(gc.tuned_bindings):
            buf = self.buffer(tuned.buffer, f"{path}.tuned_bindings[{t}].buffer")
            if buf is not None and buf.role != mpb.BUFFER_ROLE_TUNED:
                self.add("tuned.buffer", f"{path}.tuned_bindings[{t}].buffer", tuned.buffer,
                         f"tuned buffers are BUFFER_ROLE_TUNED, not "
                         f"{mpb.BufferRole.Name(buf.role)}")
            if tuned.producer_graph not in self.producers:
                self.add("tuned.producer", f"{path}.tuned_bindings[{t}].producer_graph",
                         tuned.producer_graph, "not a producer of the tuning catalog")
        for r, rid in enumerate(gc.resource_dependencies):
            self.resource(rid, f"{path}.resource_dependencies[{r}]", 0)

    def cache(self) -> None:
        c = self.contract
        cache = c.model.cache
        for i, region in enumerate(cache.regions):
            for p, plane in enumerate(region.planes):
                path = f"model.cache.regions[{i}].planes[{p}]"
                buf = self.buffer(plane, path)
                if buf is None:
                    continue
                if buf.role != mpb.BUFFER_ROLE_CACHE_PLANE:
                    self.add("cache.plane", path, plane, f"history planes are "
                             f"BUFFER_ROLE_CACHE_PLANE, not {mpb.BufferRole.Name(buf.role)}")
                elif region.kind in (pb.HISTORY_KIND_PAGED_KV, pb.HISTORY_KIND_PAGED_LATENT) \
                        and (not buf.shape or buf.shape[0] != c.prepared_pages):
                    self.add("capacity.pages", path, list(buf.shape),
                             f"paged planes lead with the prepared page count "
                             f"{c.prepared_pages}")
        pages = math.ceil(c.context_tokens / cache.page_tokens) if cache.page_tokens else 0
        for i, view in enumerate(cache.page_table_views):
            path = f"model.cache.page_table_views[{i}]"
            buf = self.buffer(view.buffer, f"{path}.buffer")
            if buf is None:
                continue
            if buf.dtype != mpb.D_TYPE_I32 or len(buf.shape) != 2:
                self.add("view.bounds", f"{path}.buffer", view.buffer,
                         "page tables are [slots, pages_per_request] int32 buffers")
            elif pages + abs(view.page_offset) > buf.shape[1]:
                self.add("view.bounds", f"{path}.page_offset", view.page_offset,
                         f"{pages} context pages shifted by {view.page_offset} exceed the "
                         f"{buf.shape[1]} columns of {view.buffer!r}")

    def capacities(self) -> None:
        c = self.contract
        graphs = list(c.model.graphs)
        decode = [g.batch_capacity for g in graphs if g.operation == pb.OPERATION_DECODE]
        if c.selected_concurrency and (not decode or max(decode) < c.selected_concurrency):
            self.add("capacity.concurrency", "selected_concurrency", c.selected_concurrency,
                     f"largest captured decode batch is {max(decode, default=0)}")
        prefill = [g.token_capacity for g in graphs if g.operation == pb.OPERATION_PREFILL]
        if c.prefill_chunk_tokens and (not prefill or max(prefill) < c.prefill_chunk_tokens):
            self.add("capacity.prefill", "prefill_chunk_tokens", c.prefill_chunk_tokens,
                     f"largest captured prefill chunk is {max(prefill, default=0)} tokens")
        widths = {g.speculative.token_capacity for g in graphs
                  if g.operation == pb.OPERATION_SPECULATIVE and g.HasField("speculative")}
        for i, w in enumerate(c.speculative_widths):
            if w not in widths:
                self.add("capacity.speculative_width", f"speculative_widths[{i}]", w,
                         "no speculative graph captures this verify width")

    def frontend_assets(self) -> None:
        kinds = Counter(r.kind for r in self.resources.values())
        for kind in (core_pb2.RESOURCE_KIND_TOKENIZER, core_pb2.RESOURCE_KIND_CHAT_TEMPLATE):
            if kinds[kind] != 1:
                self.add("resource.frontend_assets", "resources",
                         core_pb2.ResourceKind.Name(kind),
                         f"bootstrap loads exactly one; the core has {kinds[kind]}")

    def run(self) -> list[Finding]:
        self.duplicates()
        self.buffers_and_weights()
        self.kernels_and_targets()
        for i, g in enumerate(self.manifest.graphs):
            self.program(g, f"manifest.graphs[{i}]")
        for i, g in enumerate(self.manifest.tuning.producers):
            self.program(g, f"manifest.tuning.producers[{i}]")
        for i, gc in enumerate(self.contract.model.graphs):
            self.graph(i, gc)
        self.cache()
        self.capacities()
        self.frontend_assets()
        return self.findings


def lint_manifest(contract: pb.ServingContract, manifest: mpb.ExecutionManifest,
                  resources: Iterable[core_pb2.ExecutableResource]) -> list[Finding]:
    """Manifest consistency against the contract and the core's resources.

    Args:
        contract: The ServingContract.
        manifest: The ExecutionManifest.
        resources: The core's signed resources.

    Returns:
        Every finding, in check order.
    """
    return _Lint(contract, manifest, resources).run()
