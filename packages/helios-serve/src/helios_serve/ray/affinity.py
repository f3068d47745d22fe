"""Conversation-affine replica choice: plain logic over plain data (no Ray, no HTTP).

A turn of a conversation reuses cached state only on the replica that served the turns
before it. Two hints name that replica:

- the prompt's leading pages: `page_keys` hashes each full page of the rendered prompt's
  token ids as a chain (key i covers pages 0..i), so a later turn, whose prompt extends
  an earlier one, shares the earlier prompt's keys; `AffinityIndex` remembers which replica
  each key was sent to (least recently used first out) and finds the longest match, as
  llm-d's prefix-cache scorer keeps block hashes per endpoint;
- `previous_response_id` (the Responses API): the stored response lives in the SQLite
  store of the replica that answered it, so the request is pinned there.

`choose` balances the hint against load with the power of two choices (Mitzenmacher),
as SGLang's cache-aware router does: two random replicas, the less loaded wins; the
preferred replica wins unless it is more loaded than that one by `imbalance` requests.
"""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_PAGES = 64  # leading pages hashed per prompt (64 x 16 tokens = 1024 tokens)
DEFAULT_INDEX_ENTRIES = 100_000  # page keys remembered by one ingress (~10 MB)
DEFAULT_IMBALANCE = 4  # requests of extra queue a preferred replica may carry


def page_keys(token_ids: Sequence[int], page_tokens: int,
              max_pages: int = DEFAULT_MAX_PAGES) -> tuple[bytes, ...]:  # fmt: skip
    """Chained digests of the prompt's full leading pages.

    Args:
        token_ids: the rendered prompt's token ids (int, vocabulary range).
        page_tokens: tokens per cache page (CacheContract.page_tokens), > 0.
        max_pages: at most this many leading pages are hashed.

    Returns:
        One 16-byte key per full page, at most `max_pages`: key i = blake2b(key i-1 ||
        ids of page i), so key i names the whole prefix of i + 1 pages. A partial last
        page has no key (the cache publishes full pages only).

    Raises:
        ValueError: page_tokens < 1.
    """
    if page_tokens < 1:
        raise ValueError(f"page_tokens must be positive, got {page_tokens}")
    keys = []
    previous = b""
    for page in range(min(len(token_ids) // page_tokens, max_pages)):
        ids = token_ids[page * page_tokens:(page + 1) * page_tokens]
        digest = hashlib.blake2b(previous, digest_size=16)
        digest.update(b"".join(int(i).to_bytes(4, "little") for i in ids))
        previous = digest.digest()
        keys.append(previous)
    return tuple(keys)


@dataclass(frozen=True)
class RouteHint:
    """What the ingress knows about where a request should go (a keyword argument of the
    replica call, read by the Ray request router).

    Attributes:
        preferred: the replica id (Ray's unique replica id) holding the longest prefix of
            the prompt, or None.
        matched_pages: how many leading pages that replica was sent (0 with no preference).
        pinned: the replica id that stored `previous_response_id`, or None; a pinned
            request goes nowhere else while that replica lives.
    """

    preferred: str | None = None
    matched_pages: int = 0
    pinned: str | None = None


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's load as the router sees it.

    Attributes:
        replica: the replica id.
        queue: requests waiting or running there (count).
        kv_usage: fraction 0..1 of its cache pages referenced by requests.
    """

    replica: str
    queue: int
    kv_usage: float = 0.0

    def order(self) -> tuple[int, float]:
        return self.queue, self.kv_usage


class AffinityIndex:
    """Page key -> replica id, least recently used evicted first.

    Args:
        capacity: keys kept (> 0).
    """

    def __init__(self, capacity: int = DEFAULT_INDEX_ENTRIES) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._keys: OrderedDict[bytes, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, keys: Sequence[bytes], live: set[str] | None = None) -> tuple[str | None, int]:
        """(replica, pages) of the longest recorded prefix of `keys` whose replica is in
        `live` (any replica when None); (None, 0) when none is."""
        for i in range(len(keys) - 1, -1, -1):
            replica = self._keys.get(keys[i])
            if replica is not None and (live is None or replica in live):
                self._keys.move_to_end(keys[i])
                return replica, i + 1
        return None, 0

    def record(self, keys: Sequence[bytes], replica: str) -> None:
        """Remember that `replica` was sent every prefix in `keys` (it now caches them)."""
        for key in keys:
            self._keys[key] = replica
            self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def forget(self, replica: str) -> int:
        """Drop a replica's keys (it died: a replacement starts with an empty cache);
        returns how many were dropped."""
        gone = [k for k, r in self._keys.items() if r == replica]
        for key in gone:
            del self._keys[key]
        return len(gone)


def choose(loads: Sequence[ReplicaLoad], hint: RouteHint | None, *,
           imbalance: int = DEFAULT_IMBALANCE, rng: random.Random | None = None
           ) -> list[str]:  # fmt: skip
    """Replica ids in order of preference (the first is the choice; the rest are tried
    if it refuses the request).

    Rule: a pinned replica that is live comes first whatever its load. Otherwise two
    random live replicas are drawn and ordered by (queue, kv_usage); a live preferred
    replica goes first unless its queue exceeds the better draw's by more than
    `imbalance`.

    Args:
        loads: the live replicas' loads (at least one).
        hint: the ingress's hint, or None (affinity off).
        imbalance: extra queued requests a preferred replica may carry (>= 0).
        rng: the random source (tests pass a seeded one).

    Raises:
        ValueError: no replica.
    """
    if not loads:
        raise ValueError("no replica to choose from")
    rng = rng or random
    by_id = {load.replica: load for load in loads}
    if hint is not None and hint.pinned in by_id:
        rest = sorted((x for x in loads if x.replica != hint.pinned), key=ReplicaLoad.order)
        return [hint.pinned, *(x.replica for x in rest)]
    drawn = sorted(rng.sample(list(loads), min(2, len(loads))), key=ReplicaLoad.order)
    order = [x.replica for x in drawn]
    preferred = by_id.get(hint.preferred) if hint is not None and hint.preferred else None
    if preferred is not None and preferred.queue <= drawn[0].queue + imbalance:
        order = [preferred.replica, *(r for r in order if r != preferred.replica)]
    return order
