"""Leading extents of the cache planes outside the paged tier, chosen at load.

Specification: "Serving metadata" (physical cache capacities are chosen at load and
replace preparation's counts). The paged planes lead with the page count the cache
sizing chooses (runtime.cache_sizing); continuation planes lead with the physical
snapshot capacity and host-tier planes with the host tier's rows
(helios_contract.tiers names which planes are which). Host-tier planes live in host
memory: pinned and mapped into the device's address space on cuda, so the captured
RESTORE programs' kernels read and write them directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from helios_contract import stored_nbytes
from helios_contract.schema import contract_pb2 as cpb
from helios_contract.schema import manifest_pb2 as mpb
from helios_contract.tiers import storage_tiers, transfer_route

from ..config import format_bytes
from ..engine.plan import Route, Tier
from .cache_sizing import MemoryAsk
from .errors import RuntimeLoadError


@dataclass(frozen=True)
class TierRows:
    """Rows of each cache plane whose leading extent is not the paged cache's chosen page
    count: continuation and host-tier planes, and the sliding-window region's planes
    (its own page pool, kept at the manifest's extent). The other cache planes are paged.

    Attributes:
        rows: plane name -> leading extent (0 allowed: the tier is off).
        host: the names among `rows` that are host-tier planes (host memory).
        window: the names among `rows` that are sliding-window planes (device memory).
    """

    rows: Mapping[str, int] = field(default_factory=dict)
    host: frozenset[str] = frozenset()
    window: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        bad = {n: r for n, r in self.rows.items() if r < 0}
        if bad:
            raise ValueError(f"tier plane rows must be >= 0: {bad}")
        if not self.host <= set(self.rows):
            raise ValueError(f"host-tier planes without rows: {sorted(self.host - set(self.rows))}")


@dataclass(frozen=True)
class TierChoice:
    """What the tiers hold once loaded.

    Attributes:
        rows: the planes' row counts (what the backend allocates).
        snapshot_rows: continuation rows (0: no exact-endpoint snapshots).
        host_rows: host-tier rows (0: no host tier).
        host_row_bytes: bytes of one host-tier row across its planes (stored dtypes).
        snapshot_row_bytes: bytes of one continuation row across its planes (stored dtypes).
        snapshot_option, host_option: the options that sized them, as given ("--snapshots
            100" or "the core's prepared_snapshots 64"; "--host-cache-bytes N"), named
            when they do not fit.
        page_bytes: bytes of one page across the paged planes (stored dtypes).
        routes: TRANSFER routes served -> RESTORE programs (capacity, graph name),
            ascending capacity.
    """

    rows: TierRows
    snapshot_rows: int
    host_rows: int
    host_row_bytes: int
    page_bytes: int
    routes: Mapping[Route, tuple[tuple[int, str], ...]]
    snapshot_row_bytes: int = 0
    snapshot_option: str = "--snapshots"
    host_option: str = "--host-cache-bytes"

    @property
    def snapshot_ask(self) -> MemoryAsk:
        """The continuation rows (host memory on cpu; the cuda backend counts them with
        its device buffers)."""
        return MemoryAsk(self.snapshot_option, "snapshot storage",
                         self.snapshot_rows * self.snapshot_row_bytes,
                         f"{self.snapshot_rows} rows")

    def host_asks(self, backend: str) -> list[MemoryAsk]:
        """The tier rows in host memory, for cache_sizing.check_fits before anything is
        allocated: the continuation rows on cpu (device memory on cuda) and the host tier
        (pinned on cuda)."""
        host = MemoryAsk(self.host_option, "the host tier", self.host_rows * self.host_row_bytes,
                         f"{self.host_rows} rows")
        return [host] if backend == "cuda" else [self.snapshot_ask, host]

    @property
    def transfer_rows(self) -> int:
        """Copies one TRANSFER step may hold: every served route has a program that big."""
        return min((caps[-1][0] for caps in self.routes.values()), default=0)

    def describe(self, backend: str = "cpu") -> str:
        """One line for the startup log (`backend`: the host tier is pinned only on cuda)."""
        memory = "pinned" if backend == "cuda" else "host memory"
        host = (f"host tier {self.host_rows} rows "
                f"({format_bytes(self.host_rows * self.host_row_bytes)} {memory})"
                if self.host_rows else "no host tier")
        return (f"{self.snapshot_rows} snapshot rows, {host}, "
                f"{len(self.routes)} transfer routes of {self.transfer_rows} rows")


def choose_tiers(cache: cpb.CacheContract, graphs: Sequence[cpb.GraphContract],
                 buffers: Mapping[str, mpb.Buffer], *, prepared_snapshots: int,
                 snapshots: int | None, host_cache_bytes: int) -> TierChoice:
    """Row counts of the continuation and host-tier planes and the served routes.

    Args:
        cache: the validated contract's cache (helios_contract.tiers reads its tiers).
        graphs: its graph contracts (the RESTORE programs and their routes).
        buffers: manifest buffers by name (plane dtypes and row shapes).
        prepared_snapshots: ServingContract.prepared_snapshots (the default).
        snapshots: physical snapshot capacity (None: the prepared count; 0: off).
        host_cache_bytes: host tier capacity in bytes (0: off).

    Raises:
        RuntimeLoadError: a capacity is negative, asked for but not declared by the core
            (no continuation region / no host-tier planes), or too small to hold one row.
            Everything structural (planes, their programs) is a contract rule
            (helios_contract._rules_tiers), checked before this runs.
    """
    tiers = storage_tiers(cache)
    if snapshots is not None and snapshots < 0:
        raise RuntimeLoadError(f"--snapshots must be >= 0, got {snapshots}")
    if host_cache_bytes < 0:
        raise RuntimeLoadError(f"--host-cache-bytes must be >= 0, got {host_cache_bytes}")
    by_route: dict[Route, list[tuple[int, str]]] = {}
    for g in graphs:
        if g.operation == cpb.OPERATION_RESTORE:
            route = transfer_route(g, tiers)
            assert route is not None, "checked by the contract rules"
            key = Route(Tier(route[0]), Tier(route[1]))
            by_route.setdefault(key, []).append((g.batch_capacity, g.name))
    snapshot_rows = prepared_snapshots if snapshots is None else snapshots
    if not tiers.continuation:
        if snapshots:
            raise RuntimeLoadError(f"--snapshots {snapshots}: this core declares no continuation "
                                   "storage (no HISTORY_KIND_CONTINUATION region)")
        snapshot_rows = 0
    # Continuation storage and host planes come with their RESTORE programs (contract
    # rules restore.continuation_routes / restore.host_routes).
    assert not tiers.continuation or {_CAPTURE, _RESTORE} <= set(by_route)
    assert not tiers.host or {_PAGES_OUT, _HOST_IN} <= set(by_route)
    host_row_bytes = sum(_row_bytes(buffers[p]) for p in tiers.host)
    host_rows = 0
    if host_cache_bytes:
        if not tiers.host:
            raise RuntimeLoadError(f"--host-cache-bytes {host_cache_bytes}: this core declares "
                                   "no host tier (HistoryRegion.host_planes)")
        host_rows = host_cache_bytes // host_row_bytes
        if host_rows < 1:
            raise RuntimeLoadError(f"--host-cache-bytes {host_cache_bytes} holds no host-tier row "
                                   "(one row of every host plane is "
                                   f"{format_bytes(host_row_bytes)})")
    used = {Tier.PAGES} | ({Tier.CONTINUATION} if snapshot_rows else set()) | (
        {Tier.HOST} if host_rows else set())
    routes = {r: tuple(sorted(c)) for r, c in by_route.items()
              if r.source in used and r.destination in used}
    rows = {p: snapshot_rows for p in tiers.continuation}
    rows.update({p: host_rows for p in tiers.host})
    window = {p: int(buffers[p].shape[0]) for r in cache.regions
              if r.kind == cpb.HISTORY_KIND_SLIDING_WINDOW for p in r.planes}
    rows.update(window)
    snapshot_option = (f"--snapshots {snapshots}" if snapshots is not None
                       else f"the core's prepared_snapshots {prepared_snapshots}")
    return TierChoice(TierRows(rows, frozenset(tiers.host), frozenset(window)),
                      snapshot_rows, host_rows,
                      host_row_bytes, sum(_row_bytes(buffers[p]) for p in tiers.pages), routes,
                      sum(_row_bytes(buffers[p]) for p in tiers.continuation),
                      snapshot_option, f"--host-cache-bytes {host_cache_bytes}")


_CAPTURE = Route(Tier.PAGES, Tier.CONTINUATION)
_RESTORE = Route(Tier.CONTINUATION, Tier.PAGES)
_PAGES_OUT = Route(Tier.PAGES, Tier.HOST)
_HOST_IN = Route(Tier.HOST, Tier.PAGES)
_ITEMSIZE = {mpb.D_TYPE_F32: 4, mpb.D_TYPE_BF16: 2, mpb.D_TYPE_I32: 4, mpb.D_TYPE_U32: 4}


def _row_bytes(buffer: mpb.Buffer) -> int:
    if buffer.HasField("storage"):  # an e4m3 plane's row: a byte an element
        return stored_nbytes(buffer, leading=1)
    return math.prod(int(s) for s in buffer.shape[1:]) * _ITEMSIZE.get(buffer.dtype, 4)
