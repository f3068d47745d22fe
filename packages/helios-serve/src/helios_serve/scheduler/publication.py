"""Publication: what running requests computed becomes reusable by others.

Two kinds, both only from committed state (positions [0, num_computed) whose plans have
completed) and never for a retiring request (the scheduler does not call then):

- complete pages enter the prefix cache under their chain hash (`pages`), in position
  order, once the plan that completed them has completed; pages of a speculative run are
  published at the lane's next completion, so tokens the worker discards inside the run
  are never cached;
- exact-endpoint snapshots (`capture`): the chain of the endpoint's complete pages plus
  the partial page copied into a continuation row (CacheManager.capture). Endpoints are
  each prompt-turn end the request marks (`SchedRequest.publish_endpoints`), the
  prompt-minus-one endpoint a choice of n > 1 forks from (`Sequence.fork_endpoint`), the
  request's end when the worker finishes it with publish=True (`end`), and the partial
  page of a preempted request when the swap pays (the scheduler's `_preempt_newest`).

Sequence fields advanced here: page_hashes (extended with `extend_chain`, the one place a
chain grows), num_published, endpoints_done, fork_endpoint, fork_snapshot.
"""

from __future__ import annotations

from helios_serve.scheduler.cache import CacheManager, SnapshotKey
from helios_serve.scheduler.pages import chain_at, extend_chain
from helios_serve.scheduler.sequence import Sequence


class Publisher:
    """Publishes pages and snapshots of running requests into the cache tiers.

    Args:
        cache: the tiers published into.
        page_tokens: tokens per page.
        shared: pages may be shared at all (False for shifted page-table views: pages are
            then private and nothing is published).
    """

    def __init__(self, cache: CacheManager, page_tokens: int, shared: bool) -> None:
        self.cache = cache
        self.page_tokens = page_tokens
        self.shared = shared

    def pages(self, seq: Sequence, endpoint: int | None = None) -> None:
        """Publish `seq`'s pages completed by finished plans (up to `endpoint`, default
        the computed endpoint), in position order."""
        if not self.shared:
            return  # shifted views: pages are private
        pt = self.page_tokens
        end = seq.num_computed if endpoint is None else min(endpoint, seq.num_computed)
        if seq.num_published >= end // pt:
            return
        extend_chain(seq.page_hashes, seq.cache_tokens, pt, end // pt)
        for i in range(seq.num_published, end // pt):
            self.cache.publish(seq.page_ids[i], seq.page_hashes[i])
            seq.num_published = i + 1

    def endpoints(self, seq: Sequence) -> None:
        """Capture a snapshot at each prompt-turn end (and the fork endpoint) the
        committed state has reached."""
        marks = seq.request.publish_endpoints
        while seq.endpoints_done < len(marks) and marks[seq.endpoints_done] <= seq.num_computed:
            self.capture(seq, marks[seq.endpoints_done])
            seq.endpoints_done += 1
        fork = seq.fork_endpoint
        if fork is not None and fork > 0 and fork <= seq.num_computed:
            seq.fork_snapshot = self.capture(seq, fork)
            seq.fork_endpoint = 0  # done (0: never again)

    def end(self, seq: Sequence) -> None:
        """The request ends at a publishable endpoint (EOS, output limit): publish its
        committed state, every token but the last sampled one (whose KV no plan wrote)."""
        end = min(seq.num_computed, len(seq.tokens) - 1)
        self.pages(seq, end)  # a speculative run's pages publish late
        self.capture(seq, end)

    def capture(self, seq: Sequence, endpoint: int) -> SnapshotKey | None:
        """Publish a snapshot of `seq` at exactly `endpoint` committed tokens: its
        complete pages are (or become) published pages; its partial page is copied to a
        continuation row. An endpoint on a page boundary needs no copy.

        Returns:
            The snapshot's key when its capture was queued, else None.
        """
        pt = self.page_tokens
        pages = endpoint // pt
        if not self.cache.snapshots or endpoint % pt == 0 or endpoint > seq.num_computed:
            return None
        keys = seq.cache_tokens
        chain = chain_at(extend_chain(seq.page_hashes, keys, pt, pages), pages)
        tail = tuple(keys[pages * pt:endpoint])
        if not self.cache.capture(chain, tail, seq.page_ids[pages]):
            return None
        return (chain, tail)
