"""The routing rule (helios_serve.ray.affinity): plain data, exact answers."""

from __future__ import annotations

import hashlib
import random

import pytest
from helios_serve.ray.affinity import AffinityIndex, ReplicaLoad, RouteHint, choose, page_keys


def test_page_keys_chain_full_pages_only():
    keys = page_keys(list(range(10)), page_tokens=4)
    assert len(keys) == 2  # 10 tokens: two full pages, the partial third has no key
    first = hashlib.blake2b(b"", digest_size=16)
    first.update(b"".join(i.to_bytes(4, "little") for i in range(4)))
    assert keys[0] == first.digest()
    second = hashlib.blake2b(keys[0], digest_size=16)
    second.update(b"".join(i.to_bytes(4, "little") for i in range(4, 8)))
    assert keys[1] == second.digest()
    # A later turn extends the prompt: it shares every earlier key.
    assert page_keys(list(range(10)) + [7, 7, 7], 4)[:2] == keys
    assert page_keys([9, *range(1, 10)], 4)[0] != keys[0]  # one changed id changes the chain
    assert len(page_keys(list(range(100)), 4, max_pages=3)) == 3
    with pytest.raises(ValueError, match="page_tokens must be positive, got 0"):
        page_keys([1], 0)


def test_the_index_finds_the_longest_recorded_prefix_and_evicts_the_oldest():
    a, b = page_keys(list(range(12)), 4), page_keys([5, *range(1, 12)], 4)
    index = AffinityIndex(capacity=4)
    index.record(a[:2], "r1")
    assert index.match(a) == ("r1", 2)
    assert index.match(a, live={"r2"}) == (None, 0)  # its replica is gone
    index.record(b[:1], "r2")
    assert index.match(b) == ("r2", 1)
    index.record(a[2:], "r2")  # now 4 keys: a0, a1, b0, a2
    assert index.match(a) == ("r2", 3)
    index.record(b[1:2], "r2")  # a fifth key: a0, used least recently, goes
    assert len(index) == 4
    assert index.match(a[:1]) == (None, 0)
    assert index.forget("r2") == 3 and len(index) == 1
    with pytest.raises(ValueError, match="capacity must be positive"):
        AffinityIndex(0)


def test_choose_pins_prefers_within_the_imbalance_and_else_takes_the_lighter_draw():
    loads = [ReplicaLoad("a", 0, 0.1), ReplicaLoad("b", 3, 0.5), ReplicaLoad("c", 9, 0.9)]
    rng = random.Random(0)
    # Pinned (previous_response_id) wins whatever its load; the rest follow lightest first.
    assert choose(loads, RouteHint(pinned="c"), rng=rng) == ["c", "a", "b"]
    # No hint: two random draws, the lighter first.
    for _ in range(20):
        order = choose(loads, None, rng=rng)
        assert len(order) == 2 and order == sorted(order, key="abc".index)
    # Preferred b (queue 3) against a draw whose best is a (queue 0): within imbalance 4.
    both = [ReplicaLoad("a", 0), ReplicaLoad("b", 3)]
    assert choose(both, RouteHint("b", 2), rng=rng) == ["b", "a"]
    assert choose(both, RouteHint("b", 2), imbalance=2, rng=rng) == ["a", "b"]
    # A preferred or pinned replica that is not live is no preference.
    assert choose(both, RouteHint("gone", 5, pinned="gone2"), rng=rng)[0] == "a"
    with pytest.raises(ValueError, match="no replica"):
        choose([], None)
