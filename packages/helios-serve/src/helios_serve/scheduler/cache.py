"""Cache policy over three storage tiers: device pages, continuation rows, host rows.

Specification: "Attention histories and cache policy". What each tier holds:

    device pages       request histories; complete pages whose KV write completed are
                       published under their chain hash (immutable, shared, refcounted
                       checkpoints: scheduler/pages.py)
    continuation rows  exact-endpoint snapshots: the partial last page of a committed
                       state, keyed by (chain hash of its complete pages, tail tokens)
    host rows          the host-memory tier: pages evicted from the device (keyed by
                       their chain hash) and snapshots evicted from continuation rows

A snapshot at endpoint E is therefore the chain of E // page_tokens complete pages
(wherever they are: device or host) plus one continuation row holding positions
[E - E % page_tokens, E). A later prompt that starts with exactly those E tokens reuses
the chain and restores the row into a private writable page; only tokens from E on are
computed. A snapshot does not pin its pages: it is usable while its chain is resident
on the device or in the host tier.

Every payload moves by copy in TRANSFER steps (scheduler/transfers.py) and becomes
visible only at that step's final fence; a failed step publishes nothing (its fence
actions discard the rows). A copy holds a reference on the page it reads or writes and
pins the row it reads, so nothing it touches is reused before its fence. Capacities are
bounded by the rows backed at load; eviction is LRU over unreferenced rows in each tier:
a device page evicted from the prefix cache moves to the host tier (when it has a row
that is free or idle), a snapshot evicted from its continuation row moves there too,
and a host row evicted in turn is discarded.

Write-back ahead of eviction (SGLang HiCache's write-through, done in idle time): pages
published and snapshots captured are noted in a backlog; while the scheduler has nothing
else to run (no live request, no step in flight: `queue_write_backs`), they are copied
into FREE host rows, never evicting one. A page or snapshot with a host copy leaves the
device later without a copy on anyone's critical path, and a revisit then finds its
pages and its snapshot in one tier: one host -> pages TRANSFER step brings back both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from helios_serve.engine.plan import Route, Tier
from helios_serve.scheduler.pages import PageAllocator, PageGrant, PrefixMatch, chain_at
from helios_serve.scheduler.rows import RowPool
from helios_serve.scheduler.transfers import Done, Failed, TransferQueue

SnapshotKey = tuple[bytes, tuple[int, ...]]  # (chain hash of complete pages, tail tokens)

_PAGES_OUT = Route(Tier.PAGES, Tier.HOST)
_SNAPSHOT_OUT = Route(Tier.CONTINUATION, Tier.HOST)
_CAPTURE = Route(Tier.PAGES, Tier.CONTINUATION)
_HOST_IN = Route(Tier.HOST, Tier.PAGES)
_RESTORE = Route(Tier.CONTINUATION, Tier.PAGES)


def _page_key(page_hash: bytes) -> tuple[str, bytes]:
    return ("page", page_hash)


def _snapshot_key(key: SnapshotKey) -> tuple[str, SnapshotKey]:
    return ("snapshot", key)


@dataclass(frozen=True)
class SnapshotMatch:
    """A snapshot a prompt can restore.

    Attributes:
        key: (chain hash of its complete pages, tail tokens).
        endpoint: tokens it restores: complete pages x page_tokens + len(tail).
        tier: where its continuation payload lies (CONTINUATION or HOST).
    """

    key: SnapshotKey
    endpoint: int
    tier: Tier


@dataclass(frozen=True)
class CacheMatch:
    """What a prompt can reuse, tier by tier.

    Attributes:
        device: device-resident cached pages covering its leading complete pages.
        host_hashes: chain hashes of the complete pages after those that lie in the host
            tier, in position order (each needs a fresh device page and a copy).
        snapshot: the snapshot restoring the next partial page, or None.
        reused_tokens: prompt tokens not computed again: the snapshot's endpoint, else
            (device + host pages) x page_tokens. Always < len(prompt).
    """

    device: PrefixMatch
    host_hashes: tuple[bytes, ...]
    snapshot: SnapshotMatch | None
    reused_tokens: int

    @property
    def complete_pages(self) -> int:
        return len(self.device.page_ids) + len(self.host_hashes)

    @property
    def fresh_pages(self) -> int:
        """Fresh device pages the reused part itself needs (swap-ins, restore page)."""
        return len(self.host_hashes) + (self.snapshot is not None)


class CacheManager:
    """The tiers, their indexes and the copies between them.

    Args:
        num_pages: device pages backed at load.
        page_tokens: tokens per page.
        snapshot_rows: continuation rows backed at load (0: no snapshots).
        host_rows: host-tier rows backed at load (0: no host tier).
        routes: TRANSFER routes the model serves; a tier is used only when its routes
            are served (snapshots: pages <-> continuation; host pages: pages <-> host;
            host snapshots also continuation -> host).
        queue: where copies are queued.
        sharing: whether pages may be shared between requests at all (False for shifted
            page-table views: nothing is cached then).
        write_back: note published pages and captured snapshots for idle-time copies to
            the host tier (`queue_write_backs`); False: copies out only at eviction.
    """

    def __init__(self, num_pages: int, page_tokens: int, *, snapshot_rows: int = 0,
                 host_rows: int = 0, routes: Iterable[Route] = (),
                 queue: TransferQueue, sharing: bool = True, write_back: bool = True) -> None:
        served = set(routes)
        self.page_tokens = page_tokens
        self.sharing = sharing
        self.pages = PageAllocator(num_pages, page_tokens, on_evict=self._page_evicted)
        self.queue = queue
        self.snapshots = (sharing and snapshot_rows > 0 and queue.capacity > 0
                          and {_CAPTURE, _RESTORE} <= served)
        self.host_pages = (sharing and host_rows > 0 and queue.capacity > 0
                           and {_PAGES_OUT, _HOST_IN} <= served)
        self.host_snapshots = self.snapshots and self.host_pages and _SNAPSHOT_OUT in served
        self.write_back = write_back and self.host_pages
        self.continuation = RowPool(snapshot_rows if self.snapshots else 0)
        self.host = RowPool(host_rows if self.host_pages else 0)
        self._tails: dict[bytes, set[tuple[int, ...]]] = {}  # chain hash -> snapshot tails
        # Host keys of published pages / captured snapshots without a host copy -> their
        # device page / continuation row, oldest first (write-back candidates). Entries
        # leave when the page or row is evicted, so every entry is valid (and there are at
        # most num_pages + snapshot_rows of them).
        self._backlog: OrderedDict[Hashable, int] = OrderedDict()
        # Counters (monotonic): snapshots published / evicted from continuation rows;
        # host rows found and copied back, copied in (swap-ins) and out (swap-outs).
        self.publications = 0
        self.snapshot_evictions = 0
        self.snapshot_hits = 0
        self.host_hits = 0
        self.swap_ins = 0
        self.swap_outs = 0
        self.host_evictions = 0
        self.write_backs = 0  # swap-outs made ahead of eviction (queue_write_backs)

    # -- lookups ----------------------------------------------------------------------------

    def match(self, tokens: Sequence[int]) -> CacheMatch:
        """The longest reusable prefix of `tokens` (pure lookup: nothing changes).

        At least the last token is always left to compute (it yields the logits).
        """
        if not self.sharing:
            return CacheMatch(PrefixMatch((), (), 0), (), None, 0)
        device = self.pages.match_prefix(tokens)
        hashes = device.hashes
        pages = len(device.page_ids)
        host: list[bytes] = []
        if self.host_pages:
            while pages < len(hashes) and self.host.lookup(_page_key(hashes[pages])) is not None:
                host.append(hashes[pages])
                pages += 1
        snapshot = (self._find_snapshot(tokens, hashes, pages, prefer_host=bool(host))
                    if self.snapshots else None)
        reused = snapshot.endpoint if snapshot else pages * self.page_tokens
        return CacheMatch(device, tuple(host), snapshot, reused)

    def _find_snapshot(self, tokens: Sequence[int], hashes: Sequence[bytes], pages: int,
                       prefer_host: bool = False) -> SnapshotMatch | None:
        """The longest snapshot after `pages` complete pages. Held in both tiers, it is
        restored from continuation storage (a device copy), or from the host tier when
        `prefer_host` (pages come from there anyway: the restore joins their step)."""
        chain = chain_at(hashes, pages)
        tails = self._tails.get(chain)
        if not tails:
            return None
        base = pages * self.page_tokens
        for n in range(min(self.page_tokens - 1, len(tokens) - 1 - base), 0, -1):
            tail = tuple(tokens[base:base + n])
            if tail not in tails:
                continue
            key = (chain, tail)
            device = self.continuation.lookup(key) is not None
            host = self.host_snapshots and self.host.lookup(_snapshot_key(key)) is not None
            if host and (prefer_host or not device):
                return SnapshotMatch(key, base + n, Tier.HOST)
            if device:
                return SnapshotMatch(key, base + n, Tier.CONTINUATION)
        return None

    def capturing(self, key: SnapshotKey) -> bool:
        """Whether snapshot `key`'s capture is queued or in flight (not yet visible)."""
        return self.continuation.holds(key) and self.continuation.lookup(key) is None

    def available_for(self, match: CacheMatch) -> int:
        """Fresh device pages `grant(match, n)` could take beyond `match.fresh_pages`."""
        return self.pages.available_for(match.device) - match.fresh_pages

    # -- grants -----------------------------------------------------------------------------

    def grant(self, match: CacheMatch, new_pages: int, failed: Failed) -> PageGrant | None:
        """Reference the device pages of `match`, take fresh pages for its host pages and
        snapshot and `new_pages` more, and queue the copies that fill the reused ones.

        Returns:
            The grant (page_ids: device pages, then the host pages' fresh copies, then the
            restore page, then the new pages; shared_pages counts the device pages), or
            None when too few pages are free or evictable (no change then).

        `failed()` runs if a copy into the request's pages fails (its history is then
        invalid) and returns the request's summary.
        """
        host_keys = [_page_key(h) for h in match.host_hashes]
        reads: list[tuple[RowPool, Hashable]] = [(self.host, k) for k in host_keys]
        snapshot = match.snapshot
        if snapshot is not None:
            reads.append(self._snapshot_row(snapshot))
        # Pin what the copies read first: the evictions acquire makes (device pages moving
        # to the host tier) must not reclaim those rows.
        for pool, key in reads:
            pool.pin(key)
        grant = self.pages.acquire(match.device, match.fresh_pages + new_pages)
        if grant is None:
            for pool, key in reads:
                pool.unpin(key)
            return None
        fresh = grant.page_ids[grant.shared_pages:]
        for page, key, page_hash in zip(fresh, host_keys, match.host_hashes, strict=False):
            self.host_hits += 1
            self._copy_in(_HOST_IN, self.host, key, page, page_hash, failed)
        if snapshot is not None:
            self.snapshot_hits += 1
            pool, key = reads[-1]
            if snapshot.tier is Tier.HOST:
                self.host_hits += 1
            route = _HOST_IN if snapshot.tier is Tier.HOST else _RESTORE
            self._copy_in(route, pool, key, fresh[len(host_keys)], None, failed)
        return PageGrant(grant.page_ids, grant.shared_pages, match.reused_tokens)

    def _snapshot_row(self, snapshot: SnapshotMatch) -> tuple[RowPool, Hashable]:
        """The pool and key holding a snapshot's continuation payload."""
        if snapshot.tier is Tier.HOST:
            return self.host, _snapshot_key(snapshot.key)
        return self.continuation, snapshot.key

    def _copy_in(self, route: Route, pool: RowPool, key: Hashable, page: int,
                 page_hash: bytes | None, failed: Failed) -> None:
        """Queue the copy of pinned row `key` of `pool` into fresh device `page`
        (published under `page_hash` at the fence when it is a complete page)."""
        row = pool.lookup(key)
        assert row is not None
        self.pages.retain(page)

        def done() -> None:
            if route == _HOST_IN:
                self.swap_ins += 1
            if page_hash is not None and not self.pages.is_published(page):
                self.pages.publish(page, page_hash)
            self.pages.release([page])
            pool.unpin(key)

        def fail():
            self.pages.release([page])
            pool.unpin(key)
            return failed()

        self.queue.add(route, row, page, done, fail)

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference from each page (tail first; see PageAllocator.release)."""
        self.pages.release(pages)

    # -- publication ------------------------------------------------------------------------

    def capture(self, chain: bytes, tail: tuple[int, ...], page: int) -> bool:
        """Publish the snapshot (chain, tail) whose partial page is device `page`.

        The page's leading len(tail) positions must hold the committed history of the
        snapshot's tokens (the step that wrote them has completed). The snapshot becomes
        visible at the fence of the copy into its continuation row; nothing happens when
        snapshots are off, the tail is empty, the snapshot already exists or is being
        written, or every continuation row is in use.

        Returns:
            Whether a capture was queued.
        """
        key = (chain, tail)
        if not self.snapshots or not tail or len(tail) >= self.page_tokens:
            return False
        if self.continuation.holds(key) or self.host.holds(_snapshot_key(key)):
            return False
        reservation = self.continuation.reserve(key)
        if reservation is None:
            return False
        self._tails.setdefault(chain, set()).add(tail)
        if reservation.evicted is not None:
            self._snapshot_evicted(reservation.evicted, reservation.row)  # type: ignore[arg-type]
        self.pages.retain(page)

        def done() -> None:
            self.continuation.commit(key)
            self.publications += 1
            self.pages.release([page])
            if self.write_back and self.host_snapshots and \
                    not self.host.holds(_snapshot_key(key)):
                self._backlog[_snapshot_key(key)] = reservation.row

        def fail() -> None:
            self.continuation.abort(key)
            self._forget(key)
            self.pages.release([page])
            return None

        self.queue.add(_CAPTURE, page, reservation.row, done, fail)
        return True

    def publish(self, page: int, page_hash: bytes) -> bool:
        """Publish a complete page (PageAllocator.publish); with a host tier it becomes a
        write-back candidate unless the host tier holds it already."""
        published = self.pages.publish(page, page_hash)
        if published and self.write_back and not self.host.holds(_page_key(page_hash)):
            self._backlog[_page_key(page_hash)] = page
        return published

    # -- write-back -------------------------------------------------------------------------

    def write_back_due(self) -> bool:
        """Whether `queue_write_backs` would queue a copy now."""
        return bool(self._backlog) and self.host.free_rows > 0

    def queue_write_backs(self, limit: int) -> int:
        """Queue copies of up to `limit` backlog entries (oldest first) into free host rows.

        Call only while nothing else runs (no live request, no step in flight): the copies
        then delay no request, and each is issued before any later step that could reuse
        the page it reads (a page evicted meanwhile keeps its order: copy, then reuse).
        A snapshot's continuation row is pinned until its copy's fence.

        Returns:
            Copies queued.
        """
        queued = 0
        while self._backlog and queued < limit and self.host.free_rows > 0:
            key, source = self._backlog.popitem(last=False)
            reservation = self.host.reserve(key)  # a free row: evicts nothing
            assert reservation is not None and reservation.evicted is None
            snapshot = key[0] == "snapshot"  # type: ignore[index]
            if snapshot:
                self.continuation.pin(key[1])  # type: ignore[index]
            done, fail = self._write_back_actions(key, snapshot)
            self.queue.add(_SNAPSHOT_OUT if snapshot else _PAGES_OUT, source, reservation.row,
                           done, fail)
            queued += 1
        return queued

    def _write_back_actions(self, key: Hashable, snapshot: bool) -> tuple[Done, Failed]:
        """Fence actions of one write-back: commit the host row (and unpin the snapshot's
        continuation row), or free it on failure (the eviction copies it then)."""

        def done() -> None:
            self.host.commit(key)
            self.swap_outs += 1
            self.write_backs += 1
            if snapshot:
                self.continuation.unpin(key[1])  # type: ignore[index]

        def fail() -> None:
            self.host.abort(key)
            if snapshot:
                self.continuation.unpin(key[1])  # type: ignore[index]
            return None

        return done, fail

    # -- evictions --------------------------------------------------------------------------

    def _snapshot_evicted(self, key: SnapshotKey, row: int) -> None:
        """Snapshot `key` lost its continuation row `row` (LRU): move it to the host tier
        when a host row is free or idle, else discard it."""
        self.snapshot_evictions += 1
        host_key = _snapshot_key(key)
        self._backlog.pop(host_key, None)
        if self.host.holds(host_key):
            return  # written back already (or being written): the host copy stays
        if self.host_snapshots:
            reservation = self.host.reserve(host_key)
            if reservation is not None:
                if reservation.evicted is not None:
                    self._host_evicted(reservation.evicted)

                def done() -> None:
                    self.host.commit(host_key)
                    self.swap_outs += 1

                def fail() -> None:
                    self.host.abort(host_key)
                    self._forget(key)
                    return None

                self.queue.add(_SNAPSHOT_OUT, row, reservation.row, done, fail)
                return
        self._forget(key)

    def _page_evicted(self, page: int, page_hash: bytes) -> None:
        """Device `page` left the prefix cache (LRU) and is about to be reused: copy it to
        the host tier first when a host row is free or idle and none holds it yet."""
        if not self.host_pages:
            return
        key = _page_key(page_hash)
        self._backlog.pop(key, None)
        if self.host.holds(key):
            return  # a clean copy is already there (it was swapped in from it)
        reservation = self.host.reserve(key)
        if reservation is None:
            return
        if reservation.evicted is not None:
            self._host_evicted(reservation.evicted)

        def done() -> None:
            self.host.commit(key)
            self.swap_outs += 1

        def fail() -> None:
            self.host.abort(key)
            return None

        self.queue.add(_PAGES_OUT, page, reservation.row, done, fail)

    def _host_evicted(self, key: Hashable) -> None:
        self.host_evictions += 1
        if key[0] == "snapshot":  # type: ignore[index]
            self._forget(key[1])  # type: ignore[index]

    def _forget(self, key: SnapshotKey) -> None:
        """Drop a snapshot's tail from the index once no tier holds it."""
        if self.continuation.holds(key) or self.host.holds(_snapshot_key(key)):
            return
        chain, tail = key
        tails = self._tails.get(chain)
        if tails is not None:
            tails.discard(tail)
            if not tails:
                del self._tails[chain]

    # -- observation ------------------------------------------------------------------------

    @property
    def snapshots_resident(self) -> int:
        """Snapshots a prompt can restore now (in continuation rows or host rows)."""
        host = {k[1] for k in self.host.resident_keys() if k[0] == "snapshot"}  # type: ignore[index]
        return len(host | set(self.continuation.resident_keys()))

    def quiescent(self) -> bool:
        """No copy queued or in flight: every row is free or resident with no reader."""
        return (len(self.queue) == 0 and self.continuation.writing_rows == 0
                and self.host.writing_rows == 0
                and self.continuation.resident_rows == self.continuation.idle_rows
                and self.host.resident_rows == self.host.idle_rows)

    def stats(self) -> dict[str, int]:
        """The SchedulerStats fields of the tiers: page gauges and prefix-cache counters,
        snapshot and host-tier counters and row gauges."""
        p = self.pages
        return dict(
            pages_total=p.num_pages,
            pages_free=p.free_pages,
            pages_used=p.used_pages,
            pages_cached=p.cached_pages,
            pages_evictable=p.evictable_pages,
            prefix_queries=p.prefix_queries,
            prefix_hit_pages=p.prefix_hit_pages,
            page_evictions=p.evictions,
            pages_published=p.published,
            snapshot_publications=self.publications,
            snapshot_evictions=self.snapshot_evictions,
            snapshot_hits=self.snapshot_hits,
            snapshots_resident=self.snapshots_resident,
            continuation_rows_used=self.continuation.used_rows,
            host_rows_total=self.host.rows,
            host_rows_used=self.host.used_rows,
            host_hits=self.host_hits,
            host_swap_ins=self.swap_ins,
            host_swap_outs=self.swap_outs,
            host_evictions=self.host_evictions,
        )
