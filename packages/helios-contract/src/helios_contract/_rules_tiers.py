"""Rules of continuation storage, host-tier planes and RESTORE programs.

Specification: "Attention histories and cache policy" (continuation rows, snapshots,
restore into private writable pages) and "Host values and graph state" (restore source
and snapshot destination bindings; the RESTORE operation). The tiers and routes are
defined once in helios_contract.tiers; these rules say when a contract's declarations
make sense, contract-only (`tier_findings`) and against the manifest's buffers
(`tier_plane_findings`).
"""

from __future__ import annotations

from collections.abc import Iterator

from helios_contract._gen.helios.v1 import contract_pb2 as pb
from helios_contract._gen.helios.v1 import manifest_pb2 as mpb
from helios_contract._rules_contract import PAGED_KINDS, enum_name
from helios_contract.errors import (
    BindingError,
    BufferRoleError,
    DuplicateIdentifierError,
    ExtentError,
    MissingFieldError,
    UnknownIdentifierError,
)
from helios_contract.findings import Finding
from helios_contract.tiers import CONTINUATION, HOST, PAGES, storage_tiers, transfer_route

F = Finding.of
Findings = Iterator[Finding]

# What a RESTORE program binds: per submission row, the row it copies from and to.
TRANSFER_SOURCES = (pb.VALUE_SOURCE_RESTORE_SOURCE, pb.VALUE_SOURCE_SNAPSHOT_DESTINATION)


def tier_findings(serving: pb.ServingContract) -> Findings:
    """Continuation regions, host planes, prepared snapshots and RESTORE routes."""
    cache = serving.model.cache
    tiers = storage_tiers(cache)
    regions = list(cache.regions)
    continuation = [i for i, r in enumerate(regions) if r.kind == pb.HISTORY_KIND_CONTINUATION]
    for i in continuation[1:]:
        yield F("cache.continuation_duplicate", DuplicateIdentifierError,
                f"model.cache.regions[{i}].kind", "HISTORY_KIND_CONTINUATION",
                "a cache has one continuation region")
    if continuation:
        path = f"model.cache.regions[{continuation[0]}].planes"
        if len(tiers.continuation) != len(tiers.pages):
            yield F("cache.continuation_planes", ExtentError, path, len(tiers.continuation),
                    f"continuation planes pair 1:1 with the {len(tiers.pages)} planes of the "
                    "paged regions")
        if serving.prepared_snapshots == 0:
            yield F("capacity.prepared_snapshots", ExtentError, "prepared_snapshots", 0,
                    "continuation storage needs a prepared snapshot capacity")
    for index, region in enumerate(regions):
        if not region.host_planes:
            continue
        path = f"model.cache.regions[{index}].host_planes"
        if region.kind not in PAGED_KINDS:
            yield F("cache.host_planes_region", ExtentError, path, len(region.host_planes),
                    f"only paged regions have host-tier planes, not "
                    f"{enum_name(pb.HistoryKind, region.kind)}")
        elif len(region.host_planes) != len(region.planes):
            yield F("cache.host_planes", ExtentError, path, len(region.host_planes),
                    f"one host-tier plane per plane ({len(region.planes)})")
    paged = [r for r in regions if r.kind in PAGED_KINDS]
    if tiers.host and any(not r.host_planes for r in paged):
        yield F("cache.host_planes", MissingFieldError, "model.cache.regions",
                len(tiers.host), "a host tier holds every paged region's rows: declare "
                "host_planes on each paged region or on none")
    yield from _duplicate_planes(tiers)
    yield from _restore_graphs(serving, tiers)


def _duplicate_planes(tiers) -> Findings:
    seen = set(tiers.pages) | set(tiers.continuation)
    for index, plane in enumerate(tiers.host):
        if plane in seen:
            yield F("cache.host_plane_duplicate", DuplicateIdentifierError,
                    f"host_planes[{index}]", plane, "a host-tier plane is its own buffer")
        seen.add(plane)


def _restore_graphs(serving: pb.ServingContract, tiers) -> Findings:
    routes: dict[tuple[str, str, int], str] = {}
    for index, graph in enumerate(serving.model.graphs):
        if graph.operation != pb.OPERATION_RESTORE:
            continue
        path = f"model.graphs[{index}]"
        if graph.batch_capacity == 0:
            yield F("graph.capacity_zero", ExtentError, f"{path}.batch_capacity", 0,
                    "a RESTORE program copies at least one row")
        sources = [(b.source, b.indexing) for b in graph.bindings
                   if b.source in TRANSFER_SOURCES]
        wanted = {(s, pb.INDEXING_SUBMISSION_ROW) for s in TRANSFER_SOURCES}
        if sorted(sources) != sorted(wanted):
            yield F("restore.bindings", BindingError, f"{path}.bindings", len(sources),
                    "a RESTORE program binds RESTORE_SOURCE and SNAPSHOT_DESTINATION once "
                    "each, per submission row")
        route = transfer_route(graph, tiers)
        if route is None:
            yield F("restore.route", UnknownIdentifierError, f"{path}.state_accesses",
                    len(graph.state_accesses),
                    f"a RESTORE program READs every plane of one storage tier and WRITEs "
                    f"every plane of another (tiers: {PAGES}, {CONTINUATION}, {HOST})")
            continue
        key = (*route, graph.batch_capacity)
        if key in routes:
            yield F("restore.duplicate", DuplicateIdentifierError, f"{path}.name", graph.name,
                    f"route {route[0]} -> {route[1]} at capacity {graph.batch_capacity} is "
                    f"captured by {routes[key]!r} already")
        routes[key] = graph.name
    yield from _needed_routes(serving, tiers, {(src, dst) for src, dst, _ in routes})


# The copies each tier cannot work without: filled from pages and read back into pages.
NEEDED_ROUTES = {CONTINUATION: ((PAGES, CONTINUATION), (CONTINUATION, PAGES)),
                 HOST: ((PAGES, HOST), (HOST, PAGES))}


def _needed_routes(serving: pb.ServingContract, tiers, routes: set[tuple[str, str]]
                   ) -> Findings:
    """Continuation storage and a host tier need RESTORE programs that fill them from
    pages and copy them back: storage that can be neither written nor read is a
    declaration no runtime could execute."""
    regions = list(serving.model.cache.regions)
    for tier, needed in NEEDED_ROUTES.items():
        if not tiers.planes(tier):
            continue
        missing = [f"{a} -> {b}" for a, b in needed if (a, b) not in routes]
        if not missing:
            continue
        index = next(i for i, r in enumerate(regions)
                     if (r.kind == pb.HISTORY_KIND_CONTINUATION) == (tier == CONTINUATION)
                     and (tier == CONTINUATION or r.host_planes))
        field = "planes" if tier == CONTINUATION else "host_planes"
        yield F(f"restore.{tier}_routes", MissingFieldError,
                f"model.cache.regions[{index}].{field}", ", ".join(missing),
                f"{tier} storage needs a RESTORE program for each of "
                f"{', '.join(f'{a} -> {b}' for a, b in needed)}")


def tier_plane_findings(serving: pb.ServingContract,
                        buffers: dict[str, mpb.Buffer]) -> Findings:
    """Continuation and host planes are cache planes shaped like the planes they pair with
    (dtype and row shape); continuation planes lead with prepared_snapshots rows."""
    cache = serving.model.cache
    pages = storage_tiers(cache).pages
    for index, region in enumerate(cache.regions):
        base = f"model.cache.regions[{index}]"
        if region.kind == pb.HISTORY_KIND_CONTINUATION:
            pairs = [(f"{base}.planes[{i}]", plane, paired, CONTINUATION)
                     for i, (plane, paired) in enumerate(zip(region.planes, pages, strict=False))]
        elif region.kind in PAGED_KINDS:
            pairs = [(f"{base}.host_planes[{i}]", plane, paired, HOST) for i, (plane, paired)
                     in enumerate(zip(region.host_planes, region.planes, strict=False))]
        else:
            continue
        for path, plane, paired, tier in pairs:
            yield from _tier_plane(serving, buffers, path, plane, paired, tier)


def _tier_plane(serving: pb.ServingContract, buffers: dict[str, mpb.Buffer], path: str,
                plane: str, paired: str, tier: str) -> Findings:
    buffer, base = buffers.get(plane), buffers.get(paired)
    if buffer is None:
        yield F("manifest.buffer_missing", UnknownIdentifierError, path, plane,
                "not a buffer of the execution manifest")
    elif base is None:
        return  # the paired plane's own rule reports it
    elif buffer.role != mpb.BUFFER_ROLE_CACHE_PLANE:
        if tier == HOST:  # region planes are checked by the cache rule
            yield F("cache.plane", BufferRoleError, path, plane,
                    f"host-tier planes are BUFFER_ROLE_CACHE_PLANE, not "
                    f"{enum_name(mpb.BufferRole, buffer.role)}")
    elif buffer.dtype != base.dtype or list(buffer.shape[1:]) != list(base.shape[1:]):
        yield F("cache.tier_row_shape", ExtentError, path,
                f"{enum_name(mpb.DType, buffer.dtype)}{list(buffer.shape)}",
                f"{tier} rows must match {paired!r} "
                f"({enum_name(mpb.DType, base.dtype)}{list(base.shape[1:])})")
    elif buffer.storage != base.storage:  # e4m3 rows move as bytes with the plane's scales
        yield F("cache.tier_row_shape", ExtentError, f"{path}.storage",
                enum_name(mpb.StorageType, buffer.storage.type),
                f"{tier} rows must be stored as {paired!r} is "
                f"({enum_name(mpb.StorageType, base.storage.type)}, the same scales)")
    elif tier == CONTINUATION and (not buffer.shape or
                                   buffer.shape[0] != serving.prepared_snapshots):
        yield F("capacity.snapshots", ExtentError, path, list(buffer.shape),
                f"continuation planes lead with the prepared snapshot count "
                f"{serving.prepared_snapshots}")
