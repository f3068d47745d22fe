"""Storage tiers of a contract's cache and the route of each RESTORE program.

Specification: "Attention histories and cache policy". A cache stores page-shaped rows in
up to three tiers:

    pages         the planes of every paged region (region order): row = page id
    continuation  the HISTORY_KIND_CONTINUATION region's planes, paired 1:1 in order with
                  the paged planes: row = a snapshot's partial last page
    host          the paged regions' host_planes (HistoryRegion.host_planes), paired the
                  same way: row = a page or a snapshot's continuation row moved to host
                  memory

Each OPERATION_RESTORE graph copies whole rows from one tier to another; its route is not
a flag but what its state accesses say: it READs every plane of one tier and WRITEs every
plane of another, nothing else. `transfer_route` reads it, once, for the rules
(helios_contract._rules_tiers) and for the runtime that schedules the copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from helios_contract._gen.helios.v1 import contract_pb2 as pb

__all__ = ["CONTINUATION", "HOST", "PAGES", "TIERS", "StorageTiers", "storage_tiers",
           "transfer_route"]

PAGES, CONTINUATION, HOST = "pages", "continuation", "host"
TIERS = (PAGES, CONTINUATION, HOST)
_PAGED = (pb.HISTORY_KIND_PAGED_KV, pb.HISTORY_KIND_PAGED_LATENT)
_READS = (pb.ACCESS_READ,)
_WRITES = (pb.ACCESS_WRITE,)


@dataclass(frozen=True)
class StorageTiers:
    """The planes of each tier, paired by position (entry i of every tier is one plane's
    storage in that tier; empty tiers are absent)."""

    pages: tuple[str, ...]
    continuation: tuple[str, ...]
    host: tuple[str, ...]

    def planes(self, tier: str) -> tuple[str, ...]:
        return {PAGES: self.pages, CONTINUATION: self.continuation, HOST: self.host}[tier]

    def tier_of(self, buffer: str) -> str | None:
        for tier in TIERS:
            if buffer in self.planes(tier):
                return tier
        return None


def storage_tiers(cache: pb.CacheContract) -> StorageTiers:
    """The tiers a cache contract declares (no validation: see _rules_tiers)."""
    pages = tuple(p for r in cache.regions if r.kind in _PAGED for p in r.planes)
    host = tuple(p for r in cache.regions if r.kind in _PAGED for p in r.host_planes)
    continuation = tuple(p for r in cache.regions if r.kind == pb.HISTORY_KIND_CONTINUATION
                         for p in r.planes)
    return StorageTiers(pages, continuation, host)


def transfer_route(graph: pb.GraphContract, tiers: StorageTiers) -> tuple[str, str] | None:
    """(source tier, destination tier) of a RESTORE graph: it reads exactly every plane of
    the source tier and writes exactly every plane of another tier. None when its state
    accesses describe no such route (a finding of _rules_tiers)."""
    reads = {a.view.buffer for a in graph.state_accesses if a.access in _READS}
    writes = {a.view.buffer for a in graph.state_accesses if a.access in _WRITES}
    if len(reads) + len(writes) != len(graph.state_accesses):
        return None  # READ_WRITE or repeated accesses
    source = _whole_tier(reads, tiers)
    destination = _whole_tier(writes, tiers)
    if source is None or destination is None or source == destination:
        return None
    return source, destination


def _whole_tier(buffers: set[str], tiers: StorageTiers) -> str | None:
    for tier in TIERS:
        planes = tiers.planes(tier)
        if planes and buffers == set(planes):
            return tier
    return None
