"""PageAllocator on 16 pages of 4 tokens: exact page ids, reuse and eviction order."""

from __future__ import annotations

import hashlib
import struct

import pytest
from helios_serve.scheduler.pages import (
    ROOT_HASH,
    PageAllocator,
    chain_at,
    chain_hashes,
    extend_chain,
    page_hash,
)

A = list(range(1, 13))  # 12 tokens: three complete pages
B = list(range(101, 109))  # 8 tokens: two complete pages


def publish_all(alloc: PageAllocator, pages: tuple[int, ...], tokens: list[int]) -> None:
    for page, h in zip(pages, chain_hashes(tokens, 4, len(pages)), strict=True):
        assert alloc.publish(page, h)


def counts(alloc: PageAllocator) -> tuple[int, int, int, int]:
    """(free, used, cached, evictable)"""
    return alloc.free_pages, alloc.used_pages, alloc.cached_pages, alloc.evictable_pages


def test_page_hash_is_stable_blake2b_chain():
    expected = hashlib.blake2b(
        bytes(16) + struct.pack("<4q", 1, 2, 3, 4), digest_size=16
    ).hexdigest()
    assert page_hash(ROOT_HASH, [1, 2, 3, 4]).hex() == expected
    assert expected == "7077f7c78cbaa9547bb8ede0e304f4f3"
    h0, h1 = chain_hashes(list(range(1, 9)), 4, 2)
    assert h1 == page_hash(h0, [5, 6, 7, 8])
    # The same page content after a different prefix is a different page.
    assert h1 != page_hash(ROOT_HASH, [5, 6, 7, 8])


def test_extend_chain_grows_in_place_from_any_length():
    tokens = list(range(1, 13))
    full = chain_hashes(tokens, 4, 3)
    hashes: list[bytes] = []
    assert extend_chain(hashes, tokens, 4, 1) is hashes and hashes == full[:1]
    extend_chain(hashes, tokens, 4, 3)
    assert hashes == full
    extend_chain(hashes, tokens, 4, 2)  # covers more already: unchanged
    assert hashes == full
    assert chain_at(full, 0) == ROOT_HASH and chain_at(full, 2) == full[1]


def test_fresh_allocation_is_ascending_and_release_returns_tail_first():
    alloc = PageAllocator(16, 4)
    assert counts(alloc) == (16, 0, 0, 0)
    grant = alloc.acquire(None, 3)
    assert grant is not None
    assert (grant.page_ids, grant.shared_pages, grant.reused_tokens) == ((0, 1, 2), 0, 0)
    assert counts(alloc) == (13, 3, 0, 0)
    rest = alloc.acquire(None, 13)
    assert rest is not None and rest.page_ids == tuple(range(3, 16))
    assert alloc.acquire(None, 1) is None
    alloc.release([0, 1, 2])  # tail first: 2, 1, 0 join the free list in that order
    assert alloc.acquire(None, 3).page_ids == (2, 1, 0)


def test_acquire_is_all_or_nothing():
    alloc = PageAllocator(16, 4)
    alloc.acquire(None, 14)
    assert not alloc.can_acquire(None, 3)
    assert alloc.acquire(None, 3) is None
    assert counts(alloc) == (2, 14, 0, 0)


def test_match_never_covers_the_page_of_the_last_token():
    alloc = PageAllocator(16, 4)
    grant = alloc.acquire(None, 3)
    publish_all(alloc, grant.page_ids, A)
    assert alloc.match_prefix(A).page_ids == (0, 1)  # page 2 holds token 12
    assert alloc.match_prefix(A + [99]).page_ids == (0, 1, 2)
    assert alloc.match_prefix(A[:9]).matched_tokens == 8
    assert alloc.match_prefix(A[:8]).matched_tokens == 4
    assert alloc.match_prefix(A[:4]).page_ids == ()
    assert alloc.match_prefix([]).page_ids == ()
    # A different first page breaks the chain even though page 1's tokens agree.
    assert alloc.match_prefix([0, 2, 3, 4] + A[4:]).page_ids == ()
    assert alloc.prefix_queries == 0  # match is a pure lookup


def test_shared_pages_are_reference_counted():
    alloc = PageAllocator(16, 4)
    first = alloc.acquire(None, 3)
    publish_all(alloc, first.page_ids, A)
    match = alloc.match_prefix(A + [50, 51])
    second = alloc.acquire(match, 1)
    assert (second.page_ids, second.shared_pages, second.reused_tokens) == ((0, 1, 2, 3), 3, 12)
    assert [alloc.refcount(p) for p in range(4)] == [2, 2, 2, 1]
    assert (alloc.prefix_queries, alloc.prefix_hit_pages, alloc.prefix_hit_tokens) == (1, 3, 12)
    alloc.release(first.page_ids)
    assert [alloc.refcount(p) for p in range(4)] == [1, 1, 1, 1]
    assert counts(alloc) == (12, 4, 3, 0)
    alloc.release(second.page_ids)  # page 3 is private: back to the free list
    assert counts(alloc) == (13, 0, 3, 3)
    assert alloc.lru_order() == (2, 1, 0)


def test_lru_eviction_order_is_exact():
    alloc = PageAllocator(16, 4)
    a = alloc.acquire(None, 3)  # pages 0, 1, 2
    b = alloc.acquire(None, 2)  # pages 3, 4
    publish_all(alloc, a.page_ids, A)
    publish_all(alloc, b.page_ids, B)
    alloc.release(a.page_ids)
    alloc.release(b.page_ids)
    assert alloc.lru_order() == (2, 1, 0, 4, 3)
    assert counts(alloc) == (11, 0, 5, 5)
    filler = alloc.acquire(None, 11)  # the free list first: no eviction yet
    assert filler.page_ids == tuple(range(5, 16))
    assert alloc.evictions == 0
    grant = alloc.acquire(None, 3)  # now the least recently released idle pages
    assert grant.page_ids == (2, 1, 0)
    assert alloc.evictions == 3
    assert alloc.lru_order() == (4, 3)
    assert counts(alloc) == (0, 14, 2, 2)
    assert alloc.match_prefix(A + [0]).page_ids == ()
    assert alloc.match_prefix(B + [0]).page_ids == (3, 4)


def test_tail_first_release_evicts_a_chain_tail_before_its_head():
    alloc = PageAllocator(4, 4)
    a = alloc.acquire(None, 3)
    publish_all(alloc, a.page_ids, A)
    alloc.release(a.page_ids)
    alloc.acquire(None, 2)  # page 3 from the free list, then evicts page 2
    assert alloc.match_prefix(A + [0]).page_ids == (0, 1)


def test_a_hit_refreshes_lru_position():
    alloc = PageAllocator(16, 4)
    a = alloc.acquire(None, 3)
    b = alloc.acquire(None, 2)
    publish_all(alloc, a.page_ids, A)
    publish_all(alloc, b.page_ids, B)
    alloc.release(a.page_ids)
    alloc.release(b.page_ids)
    assert alloc.lru_order() == (2, 1, 0, 4, 3)
    hit = alloc.acquire(alloc.match_prefix(A[:5]), 1)  # shares page 0, takes page 5
    assert hit.page_ids == (0, 5)
    assert alloc.lru_order() == (2, 1, 4, 3)
    alloc.release(hit.page_ids)
    assert alloc.lru_order() == (2, 1, 4, 3, 0)


def test_matched_idle_pages_do_not_count_as_available_for_the_same_grant():
    alloc = PageAllocator(4, 4)
    a = alloc.acquire(None, 3)
    publish_all(alloc, a.page_ids, A)
    alloc.release(a.page_ids)
    match = alloc.match_prefix(A + [0])
    assert match.page_ids == (0, 1, 2)
    assert alloc.available_pages == 4
    assert alloc.available_for(match) == 1
    assert alloc.acquire(match, 2) is None
    assert alloc.lru_order() == (2, 1, 0)
    assert alloc.acquire(match, 1).page_ids == (0, 1, 2, 3)


def test_publish_rules():
    alloc = PageAllocator(16, 4)
    h = page_hash(ROOT_HASH, A[:4])
    with pytest.raises(ValueError, match="unreferenced"):
        alloc.publish(0, h)
    g = alloc.acquire(None, 2)
    assert alloc.publish(0, h)
    with pytest.raises(ValueError, match="already published"):
        alloc.publish(0, h)
    assert not alloc.publish(1, h)  # duplicate content stays private
    assert not alloc.is_published(1)
    alloc.release(g.page_ids)
    assert counts(alloc) == (15, 0, 1, 1)
    with pytest.raises(ValueError, match="unreferenced"):
        alloc.release([1])


def test_stale_match_is_refused():
    alloc = PageAllocator(2, 4)
    a = alloc.acquire(None, 1)
    publish_all(alloc, a.page_ids, A[:4])
    alloc.release(a.page_ids)
    match = alloc.match_prefix(A[:5])
    alloc.acquire(None, 2)  # evicts page 0
    with pytest.raises(ValueError, match="stale"):
        alloc.acquire(match, 0)
