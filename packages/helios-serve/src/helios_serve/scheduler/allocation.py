"""Slots and pages of running requests: the one place a Sequence's cache fields change
hands (nano-vllm's BlockManager.allocate / deallocate).

`allocate(seq)` gives a waiting request a slot (a physical request row) and the pages of
its first chunk, reusing the longest cached prefix, and sets every field that depends on
them; `grow` and `extend` add pages as its plans advance; `release(seq)` returns slot and
pages and resets the same fields. The scheduler reads these fields and advances the
positions (`num_scheduled`, `num_computed`) as plans are issued and completed; it never
assigns slots or pages itself. Publication (scheduler/publication.py) advances
`page_hashes` and `num_published` from where `allocate` set them.

Fields set by `allocate` and reset by `release` (Sequence):

    slot, generation        the lowest free slot; its generation, bumped per allocation
    page_ids                reused pages (device, host copies, restore page), then fresh
    page_hashes             chain hashes of the prompt's complete pages the match hashed
    num_published           complete pages reused (published already, or by their copy)
    num_scheduled,          the reused prefix's tokens (the first position to compute)
    num_computed
    prefill_tokens          len(tokens) at allocation (allocate only)
    needs_histogram         True: the next row carries histogram_tokens (allocate only)
    reused_prompt_tokens    the first allocation's reused tokens (allocate only)

Page indexes are physical page ids; positions count tokens of the request's own sequence.
A shifted page-table view keeps `extra_pages_per_request` pages beyond those holding
positions (`token_pages`).

A sliding-window region (ModelGeometry.window_tokens > 0) has its own pool
(`WindowPages`) and page list (`Sequence.window_page_ids`, logical like `page_ids` and
always as long as its token pages): window pages are taken with the token pages they
mirror (all or none) and released once wholly behind the window (`trim_window`).
"""

from __future__ import annotations

import heapq
from collections import deque

from helios_serve.engine.plan import ModelGeometry
from helios_serve.scheduler.cache import CacheManager
from helios_serve.scheduler.capacity import ceil_div
from helios_serve.scheduler.sequence import Sequence, SlotState
from helios_serve.scheduler.transfers import Failed


class WindowPages:
    """The sliding-window region's page pool: private pages, no prefix cache.

    Invariant: ``free_pages + used_pages == num_pages``. Page k of a request (positions
    [k * page_tokens, (k + 1) * page_tokens)) is released once
    ``(k + 1) * page_tokens <= num_computed - window_tokens + 1``: a query at position p
    reads positions p - window_tokens + 1 .. p, and every query of the request still to
    run (in flight or not yet planned) has p >= num_computed, so no program reads the
    page again and another request may take it at once. A request thus holds at most
    ceil(window_tokens / page_tokens) + 1 pages while it decodes (capture's
    ``window_request_pages``; a prefill chunk adds its own pages).

    Args:
        num_pages: pages of the region's pool (its planes' leading extent).
        page_tokens: tokens per page.
        window_tokens: the region's window (>= 1).
    """

    def __init__(self, num_pages: int, page_tokens: int, window_tokens: int) -> None:
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self.window_tokens = window_tokens
        self._free = deque(range(num_pages))  # FIFO, ascending ids at start
        self.released = 0  # pages returned behind the window (monotonic)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.num_pages - len(self._free)

    def behind(self, computed: int) -> int:
        """Leading pages of a request wholly behind the window of every position >=
        `computed` (the class invariant)."""
        return max(0, computed - self.window_tokens + 1) // self.page_tokens

    def acquire(self, count: int) -> list[int] | None:
        """`count` free pages (ascending take order), or None (no change) if fewer."""
        if count > len(self._free):
            return None
        return [self._free.popleft() for _ in range(count)]

    def release(self, page_ids: list[int]) -> None:
        self._free.extend(page_ids)


class SequencePages:
    """Free slots, slot generations, and each running Sequence's pages.

    Args:
        geometry: slots, page_tokens and extra_pages_per_request are read.
        cache: the cache tiers pages are matched, granted and released through.
    """

    def __init__(self, geometry: ModelGeometry, cache: CacheManager) -> None:
        self.page_tokens = geometry.page_tokens
        self.extra = geometry.extra_pages_per_request
        self.cache = cache
        self._free_slots = list(range(geometry.slots))  # min-heap: lowest slot first
        self._generations = [0] * geometry.slots  # per physical request row
        self.state = SlotState(geometry.slots)  # the slot holders' state rows
        self.changes = 0  # allocations and releases so far (a slot changed holder)
        self.reused_tokens = 0  # prompt tokens reused over every allocation
        self.window = (WindowPages(geometry.window_pages, geometry.page_tokens,
                                   geometry.window_tokens)
                       if geometry.window_tokens else None)

    @property
    def free_slots(self) -> int:
        """Slots no running request holds."""
        return len(self._free_slots)

    def generation(self, slot: int) -> int:
        """Current generation of a physical request row."""
        return self._generations[slot]

    @property
    def generations(self) -> list[int]:
        """Current generation of every physical request row, by slot (read only: the
        completion check reads one per row without a call)."""
        return self._generations

    def token_pages(self, seq: Sequence) -> int:
        """Pages of `seq` that hold its token positions (the rest are the extra pages of
        shifted page-table views)."""
        return len(seq.page_ids) - self.extra

    def allocate(self, seq: Sequence, budget: int, failed: Failed) -> bool:
        """Give waiting `seq` the lowest free slot and pages for its first chunk of at
        most `budget` tokens, reusing the longest cached prefix (device pages, host-tier
        pages, a snapshot), and set its cache fields (the module's table).

        Args:
            seq: a waiting request (no slot); a free slot must exist.
            budget: prefill tokens the step has left (>= 1).
            failed: run if a copy into its reused pages fails (CacheManager.grant).

        Returns:
            False (no change) if the pages for the reused part and one computed token are
            not there.
        """
        pt = self.page_tokens
        extra = self.extra
        # A shifted page-table view keeps block i's history in page i + offset: pages are
        # then private to their request (the cache shares nothing: CacheManager.sharing).
        # A request scoring its prompt needs the logits of every position: no reuse.
        match = self.cache.match(() if seq.scoring else seq.cache_tokens)
        start = match.reused_tokens
        n = min(len(seq.tokens) - start, budget)
        held = len(match.device.page_ids) + match.fresh_pages  # pages of the reused part
        need = min(ceil_div(start + n, pt) + extra - held, self.cache.available_for(match))
        if self.window is not None:  # as many window pages as token pages (no reuse)
            need = min(need, self.window.free_pages + extra - held)
        if need < 0 or (held + need - extra) * pt <= start:
            return False  # no page for the first token to compute
        grant = self.cache.grant(match, need, failed)
        assert grant is not None
        if self.window is not None:
            window = self.window.acquire(held + need - extra)
            assert window is not None
            seq.window_page_ids = window
            seq.window_released = 0
        slot = heapq.heappop(self._free_slots)
        self._generations[slot] += 1
        self.state.adopt(seq, slot)
        self.changes += 1
        seq.slot = slot
        seq.generation = self._generations[slot]
        seq.prefill_tokens = len(seq.tokens)
        seq.page_ids = list(grant.page_ids)
        seq.page_hashes = list(match.device.hashes)
        seq.num_published = match.complete_pages  # host pages are published by their copy
        seq.num_scheduled = seq.num_computed = start
        seq.needs_histogram = True
        self.reused_tokens += start
        if seq.reused_prompt_tokens is None:
            seq.reused_prompt_tokens = grant.reused_tokens
        return True

    def grow(self, seq: Sequence, budget: int) -> int:
        """Take pages for the next prefill chunk of running `seq`.

        Returns:
            The chunk length (tokens): min(remaining, budget), shortened to what the
            available pages cover; 0 when no page is available.
        """
        pt = self.page_tokens
        start = seq.num_scheduled
        n = min(seq.prefill_tokens - start, budget)
        need = ceil_div(start + n, pt) - self.token_pages(seq)
        self.trim_window(seq)
        if need > 0:
            pages = self.cache.pages
            need = min(need, pages.available_pages)
            if self.window is not None:
                need = min(need, self.window.free_pages)
            n = min(n, (self.token_pages(seq) + need) * pt - start)
            if n <= 0:
                return 0
            if need:
                grant = pages.acquire(None, need)
                assert grant is not None
                seq.page_ids.extend(grant.page_ids)
                self._take_window(seq, need)
        return n

    def extend(self, seq: Sequence, end: int) -> bool:
        """Pages covering positions [0, end) of running `seq` (a decode row or the full
        ceiling of a speculative lane), all or none.

        Returns:
            False (no change) when the pages are not available.
        """
        need = ceil_div(end, self.page_tokens) - self.token_pages(seq)
        self.trim_window(seq)
        if need > 0:
            if self.window is not None and self.window.free_pages < need:
                return False
            grant = self.cache.pages.acquire(None, need)
            if grant is None:
                return False
            seq.page_ids.extend(grant.page_ids)
            self._take_window(seq, need)
        return True

    def _take_window(self, seq: Sequence, count: int) -> None:
        """`count` more window pages for `seq` (the callers checked they are free)."""
        if self.window is not None:
            window = self.window.acquire(count)
            assert window is not None
            seq.window_page_ids.extend(window)

    def trim_window(self, seq: Sequence) -> None:
        """Return `seq`'s window pages wholly behind the window of every position it still
        computes (WindowPages) to the pool; their entries become -1."""
        w = self.window
        if w is None:
            return
        behind = min(w.behind(seq.num_computed), len(seq.window_page_ids))
        done = seq.window_released
        if behind > done:
            ids = seq.window_page_ids
            w.release(ids[done:behind])
            w.released += behind - done
            ids[done:behind] = [-1] * (behind - done)
            seq.window_released = behind

    def window_prefix(self, seq: Sequence, count: int) -> tuple[int, ...]:
        """The first `count` entries of `seq`'s window page list (a RowPlan's
        window_page_ids; () without a window region)."""
        return tuple(seq.window_page_ids[:count]) if self.window is not None else ()

    def release(self, seq: Sequence) -> None:
        """Return `seq`'s pages (tail first) and slot, and reset its cache fields: a
        preempted request is allocated again from its tokens alone."""
        assert seq.slot is not None and seq.inflight_rows == 0
        self.cache.release(seq.page_ids)
        if self.window is not None:
            self.window.release(seq.window_page_ids[seq.window_released:])
            seq.window_page_ids = []
            seq.window_released = 0
        heapq.heappush(self._free_slots, seq.slot)
        seq.slot = None
        seq.page_ids = []
        seq.page_hashes = []
        seq.num_published = seq.num_scheduled = seq.num_computed = 0
        self.state.detach(seq)
        self.changes += 1
