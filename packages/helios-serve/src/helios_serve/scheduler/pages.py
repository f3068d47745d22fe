"""Paged KV allocation with prefix reuse of complete immutable pages.

A page holds `page_tokens` consecutive positions of one request's history. Every
physical page is in exactly one of four states:

    free            on the free list; refcount 0; no hash
    private         refcount >= 1; no hash (being written, or a duplicate)
    cached, in use  refcount >= 1; published under a hash
    cached, idle    refcount 0; published; on the LRU list (evictable)

so `free + evictable + used == num_pages` always holds (`used` counts the two
referenced states). A page is published once it is complete and the step that
wrote its KV has completed; its hash chains over every token before it, so a
hit on page i implies pages 0..i-1 match too. Published pages are immutable.

Allocation takes the free list first (FIFO, ascending ids at start) and only
when it is empty evicts the least recently released idle cached page. Releasing
a request's pages walks its page list tail first, so a chain's tail is evicted
before its head (the head is what other prompts are most likely to share; this
is vLLM's order too). An eviction is reported to `on_evict(page, hash)` before the
page is handed out again, so its payload can move to the host tier first.

References are not only requests': a transfer in flight holds one on each page it
reads or writes (`retain`), so a page is reused only after that transfer's fence.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Hash of the empty prefix: the parent of page 0.
ROOT_HASH = bytes(16)


def page_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Chain hash of one complete page.

    Args:
        parent: hash of the previous page of the same sequence (ROOT_HASH for page 0).
        tokens: the page's token ids, exactly `page_tokens` of them.

    Returns:
        16-byte BLAKE2b digest of parent || tokens as little-endian int64;
        stable across processes and runs.
    """
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


def extend_chain(hashes: list[bytes], tokens: Sequence[int], page_tokens: int,
                 count: int) -> list[bytes]:
    """Extend a sequence's page-hash chain to its first `count` complete pages: the one
    place a chain grows (every user calls it; ROOT_HASH is the parent of page 0).

    Args:
        hashes: chain hashes of the leading complete pages of `tokens`, in position order;
            appended to in place.
        tokens: the sequence's token ids (at least count * page_tokens of them).
        page_tokens: tokens per page.
        count: complete pages the chain should cover; no change when it covers as many.

    Returns:
        `hashes` itself.
    """
    parent = hashes[-1] if hashes else ROOT_HASH
    for i in range(len(hashes), count):
        parent = page_hash(parent, tokens[i * page_tokens : (i + 1) * page_tokens])
        hashes.append(parent)
    return hashes


def chain_hashes(tokens: Sequence[int], page_tokens: int, count: int) -> list[bytes]:
    """Hashes of the first `count` complete pages of `tokens`."""
    return extend_chain([], tokens, page_tokens, count)


def chain_at(hashes: Sequence[bytes], pages: int) -> bytes:
    """The chain hash after the first `pages` complete pages (ROOT_HASH for none): what a
    snapshot's continuation row is keyed under."""
    return hashes[pages - 1] if pages else ROOT_HASH


@dataclass(frozen=True)
class PrefixMatch:
    """Cached pages covering a prompt's leading complete pages.

    Attributes:
        page_ids: matched physical pages, in position order.
        hashes: chain hash of each page of the query's complete pages that were
            hashed (at least the matched ones; reused to publish later pages).
        matched_tokens: len(page_ids) * page_tokens.
    """

    page_ids: tuple[int, ...]
    hashes: tuple[bytes, ...]
    matched_tokens: int


@dataclass(frozen=True)
class PageGrant:
    """Pages handed to one request by `PageAllocator.acquire`.

    Attributes:
        page_ids: shared (matched) pages first, then fresh private pages.
        shared_pages: how many leading entries of page_ids are shared cached pages.
        reused_tokens: prompt tokens covered by the shared pages.
    """

    page_ids: tuple[int, ...]
    shared_pages: int
    reused_tokens: int


class PageAllocator:
    """Free list, reference counts, hash-chained prefix cache and LRU eviction.

    Args:
        num_pages: physical pages backed at load (page ids 0..num_pages-1).
        page_tokens: tokens per page.
        on_evict: called with (page, hash) for each idle cached page evicted, before
            the page is handed out again.
    """

    def __init__(self, num_pages: int, page_tokens: int,
                 on_evict: Callable[[int, bytes], None] | None = None) -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError("num_pages and page_tokens must be positive")
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self._free: deque[int] = deque(range(num_pages))
        self._refs = [0] * num_pages
        self._hash_of: dict[int, bytes] = {}  # published page -> hash
        self._page_of: dict[bytes, int] = {}  # hash -> published page
        self._lru: OrderedDict[int, None] = OrderedDict()  # idle cached, oldest first
        self.prefix_queries = 0
        self.prefix_hit_pages = 0
        self.prefix_hit_tokens = 0
        self.evictions = 0
        self.published = 0
        self.on_evict = on_evict

    # -- gauges ---------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        """Pages on the free list (never published, or evicted)."""
        return len(self._free)

    @property
    def evictable_pages(self) -> int:
        """Published pages no request references (reclaimable, LRU order)."""
        return len(self._lru)

    @property
    def cached_pages(self) -> int:
        """Published pages, referenced or not."""
        return len(self._hash_of)

    @property
    def used_pages(self) -> int:
        """Pages referenced by at least one request."""
        return self.num_pages - len(self._free) - len(self._lru)

    @property
    def available_pages(self) -> int:
        """Pages an allocation could take now: free plus evictable."""
        return len(self._free) + len(self._lru)

    def refcount(self, page: int) -> int:
        """Requests referencing `page`."""
        return self._refs[page]

    def lru_order(self) -> tuple[int, ...]:
        """Idle cached pages, next eviction first."""
        return tuple(self._lru)

    # -- prefix cache ---------------------------------------------------------

    def match_prefix(self, tokens: Sequence[int]) -> PrefixMatch:
        """Longest run of cached complete pages covering a prefix of `tokens`.

        Only complete pages strictly before the page holding the last token are
        eligible, so at least one token is always computed (it yields the logits
        to sample from). Pure lookup: no reference or counter changes.
        """
        pt = self.page_tokens
        hashes = chain_hashes(tokens, pt, max(len(tokens) - 1, 0) // pt)
        pages: list[int] = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None:
                break
            pages.append(page)
        return PrefixMatch(tuple(pages), tuple(hashes), len(pages) * pt)

    def publish(self, page: int, page_hash_: bytes) -> bool:
        """Make a complete page whose KV write has completed shareable.

        Returns:
            True if published; False if another page already holds this hash
            (the page stays private and is freed on release).

        Raises:
            ValueError: the page is unreferenced or already published.
        """
        if self._refs[page] < 1:
            raise ValueError(f"publish of unreferenced page {page}")
        if page in self._hash_of:
            raise ValueError(f"page {page} is already published")
        if page_hash_ in self._page_of:
            return False
        self._hash_of[page] = page_hash_
        self._page_of[page_hash_] = page
        self.published += 1
        return True

    def is_published(self, page: int) -> bool:
        """Whether `page` is in the prefix cache."""
        return page in self._hash_of

    # -- references -----------------------------------------------------------

    def available_for(self, match: PrefixMatch | None) -> int:
        """Fresh pages `acquire(match, n)` could still take: available pages
        minus the matched ones it would pull off the LRU list."""
        idle_matched = 0 if match is None else sum(p in self._lru for p in match.page_ids)
        return self.available_pages - idle_matched

    def can_acquire(self, match: PrefixMatch | None, new_pages: int) -> bool:
        """Whether `acquire(match, new_pages)` would succeed."""
        return new_pages <= self.available_for(match)

    def acquire(self, match: PrefixMatch | None, new_pages: int) -> PageGrant | None:
        """Reference the matched pages and take `new_pages` fresh ones, or nothing.

        A non-None match counts as one prefix query (hits: its pages and tokens).

        Returns:
            The grant, or None when too few pages are free or evictable (no
            state changes then).
        """
        if not self.can_acquire(match, new_pages):
            return None
        shared: tuple[int, ...] = ()
        if match is not None:
            for page, h in zip(match.page_ids, match.hashes, strict=False):
                if self._hash_of.get(page) != h:
                    raise ValueError(f"stale prefix match: page {page}")
            shared = match.page_ids
            for page in shared:
                self._lru.pop(page, None)
                self._refs[page] += 1
            self.prefix_queries += 1
            self.prefix_hit_pages += len(shared)
            self.prefix_hit_tokens += match.matched_tokens
        fresh = tuple(self._take() for _ in range(new_pages))
        return PageGrant(shared + fresh, len(shared), len(shared) * self.page_tokens)

    def retain(self, page: int) -> None:
        """Add a reference to a page someone already references (a transfer reading or
        writing it holds one until its fence).

        Raises:
            ValueError: the page is unreferenced.
        """
        if self._refs[page] < 1:
            raise ValueError(f"retain of unreferenced page {page}")
        self._refs[page] += 1

    def page_of(self, page_hash_: bytes) -> int | None:
        """The published page holding `page_hash_`, or None."""
        return self._page_of.get(page_hash_)

    def release(self, pages: Sequence[int]) -> None:
        """Drop one reference from each page, walking `pages` tail first.

        A page reaching zero goes to the LRU tail if published, else to the free
        list tail.
        """
        for page in reversed(pages):
            if self._refs[page] < 1:
                raise ValueError(f"release of unreferenced page {page}")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                if page in self._hash_of:
                    self._lru[page] = None
                else:
                    self._free.append(page)

    def _take(self) -> int:
        if self._free:
            page = self._free.popleft()
        else:
            page, _ = self._lru.popitem(last=False)
            evicted = self._hash_of.pop(page)
            del self._page_of[evicted]
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(page, evicted)
        self._refs[page] = 1
        return page
