"""SequencePages and Publisher on their own: the Sequence's cache fields set by
allocate and reset by release, pages and snapshots published from committed state
(8 pages of 4 tokens, 2 slots, CPU; exact page ids, hashes and rows)."""

from __future__ import annotations

from dataclasses import replace

from helios_serve.engine.plan import Route, RowCopy, StepKind, Tier
from helios_serve.scheduler import SchedRequest
from helios_serve.scheduler.allocation import SequencePages
from helios_serve.scheduler.cache import CacheManager
from helios_serve.scheduler.pages import chain_hashes
from helios_serve.scheduler.publication import Publisher
from helios_serve.scheduler.sequence import Sequence
from helios_serve.scheduler.transfers import ROUTE_ORDER, TransferQueue
from helios_serve.testing.scripted import tiny_geometry

GEO = tiny_geometry(64, num_pages=8, slots=2, max_pages_per_request=8)
A = (1, 2, 3, 4, 5, 6)  # one complete page and a partial one


def _parts(snapshot_rows: int = 0, geometry=GEO):
    queue = TransferQueue(4)
    cache = CacheManager(geometry.num_pages, geometry.page_tokens, snapshot_rows=snapshot_rows,
                         routes=ROUTE_ORDER, queue=queue,
                         sharing=not geometry.extra_pages_per_request)
    return (SequencePages(geometry, cache),
            Publisher(cache, geometry.page_tokens, not geometry.extra_pages_per_request),
            queue)


def _seq(rid: int, prompt=A, **kw) -> Sequence:
    return Sequence(SchedRequest(rid, prompt, 4, **kw), order=-1)


def _fields(seq: Sequence) -> tuple:
    return (seq.slot, seq.generation, seq.page_ids, seq.page_hashes, seq.num_published,
            seq.num_scheduled, seq.num_computed)


def test_allocate_sets_and_release_resets_the_cache_fields():
    alloc, _, _ = _parts()
    seq = _seq(1)
    assert alloc.allocate(seq, 8, lambda: None)
    assert _fields(seq) == (0, 1, [0, 1], chain_hashes(A, 4, 1), 0, 0, 0)
    assert (seq.prefill_tokens, seq.needs_histogram, seq.reused_prompt_tokens) == (6, True, 0)
    assert alloc.free_slots == 1 and alloc.token_pages(seq) == 2
    alloc.release(seq)
    assert _fields(seq) == (None, 1, [], [], 0, 0, 0) and alloc.free_slots == 2
    assert alloc.cache.pages.free_pages == 8
    assert alloc.allocate(seq, 8, lambda: None)
    assert (seq.slot, seq.generation) == (0, 2)  # the slot's generation moves on


def test_allocate_reuses_published_pages_and_counts_reused_tokens():
    alloc, publisher, _ = _parts()
    first = _seq(1)
    alloc.allocate(first, 8, lambda: None)
    first.num_scheduled = first.num_computed = 6
    publisher.pages(first)
    assert first.num_published == 1 and alloc.cache.pages.is_published(0)
    second = _seq(2, prompt=(1, 2, 3, 4, 9))
    assert alloc.allocate(second, 8, lambda: None)
    assert _fields(second) == (1, 1, [0, 2], chain_hashes((1, 2, 3, 4, 9), 4, 1), 1, 4, 4)
    assert second.reused_prompt_tokens == 4 and alloc.reused_tokens == 4


def test_allocate_refuses_without_a_page_for_the_first_computed_token():
    alloc, _, _ = _parts()
    hog = _seq(1, prompt=tuple(range(1, 33)))
    assert alloc.allocate(hog, 32, lambda: None) and hog.page_ids == list(range(8))
    seq = _seq(2)
    assert not alloc.allocate(seq, 8, lambda: None)
    assert _fields(seq) == (None, 0, [], [], 0, 0, 0) and alloc.free_slots == 1


def test_grow_shortens_to_the_pages_left_and_extend_is_all_or_none():
    alloc, _, _ = _parts()
    seq = _seq(1, prompt=tuple(range(1, 30)))  # 29 tokens: 8 pages
    assert alloc.allocate(seq, 8, lambda: None) and seq.page_ids == [0, 1]
    seq.num_scheduled = 8
    other = _seq(2)
    alloc.allocate(other, 8, lambda: None)  # pages 2, 3
    assert alloc.grow(seq, 32) == 16 and seq.page_ids == [0, 1, 4, 5, 6, 7]
    seq.num_scheduled = 24
    assert alloc.grow(seq, 32) == 0 and not alloc.extend(seq, 25)
    assert seq.page_ids == [0, 1, 4, 5, 6, 7]
    assert alloc.extend(seq, 24)  # covered already


def test_shifted_views_hold_extra_pages_and_publish_nothing():
    geometry = replace(GEO, extra_pages_per_request=1)
    alloc, publisher, _ = _parts(geometry=geometry)
    seq = _seq(1)
    assert alloc.allocate(seq, 8, lambda: None)
    assert seq.page_ids == [0, 1, 2] and alloc.token_pages(seq) == 2
    seq.num_computed = 6
    publisher.pages(seq)
    assert seq.num_published == 0 and alloc.cache.pages.cached_pages == 0


def test_capture_queues_the_partial_page_under_its_chain():
    alloc, publisher, queue = _parts(snapshot_rows=2)
    seq = _seq(1, publish_endpoints=(5,))
    alloc.allocate(seq, 8, lambda: None)
    seq.num_scheduled = seq.num_computed = 4
    publisher.endpoints(seq)
    assert seq.endpoints_done == 0 and len(queue) == 0  # endpoint 5 not committed yet
    seq.num_scheduled = seq.num_computed = 6
    publisher.endpoints(seq)
    assert seq.endpoints_done == 1
    assert publisher.capture(seq, 6) == (chain_hashes(A, 4, 1)[0], (5, 6))
    assert publisher.capture(seq, 4) is None  # a page boundary: no copy
    assert publisher.capture(seq, 7) is None  # beyond the committed state
    (plan,) = queue.drain()
    assert (plan.kind, plan.route, plan.copies) == (
        StepKind.TRANSFER, Route(Tier.PAGES, Tier.CONTINUATION),
        (RowCopy(1, 0), RowCopy(1, 1)))


def test_end_publishes_every_token_but_the_last_sampled_one():
    alloc, publisher, queue = _parts(snapshot_rows=1)
    seq = _seq(1, prompt=(1, 2, 3))
    alloc.allocate(seq, 8, lambda: None)
    seq.tokens += [4, 5, 6]  # three outputs; positions 0..4 computed, 6 sampled last
    seq.num_scheduled = seq.num_computed = 5
    assert alloc.extend(seq, 6) and seq.page_ids == [0, 1]
    publisher.end(seq)
    assert seq.num_published == 1 and seq.page_hashes == chain_hashes((1, 2, 3, 4), 4, 1)
    (plan,) = queue.drain()
    assert plan.copies == (RowCopy(1, 0),)  # the tail (5,) of endpoint 5
