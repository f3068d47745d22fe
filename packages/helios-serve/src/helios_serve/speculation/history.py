"""History drafting: copied proposals from a request's own prompt and output.

Algorithm: n-gram lookup over the request's sequence, longest match first (prompt lookup
decoding, Saxena 2023; vLLM's n-gram proposer), with the most recent occurrence of each
n-gram. For every n in `sizes` (4, 3, 2 by default) a hash map sends an n-gram to the
position right after its latest occurrence; the proposal for a sequence ending in the
n-gram g is the tokens that followed g there. Why this and not a suffix tree (Arctic
Inference's suffix decoding): the maps are updated in O(len(sizes)) per new token and a
proposal costs O(len(sizes) + k), with no rebuilding; the latest occurrence is what
editing and quoting tasks repeat (a renamed identifier's surroundings, the quoted
sentence); and longer matches are tried first, so a long verbatim stretch keeps
proposing its continuation.

Bounds: memory is at most len(sizes) entries per token of the sequence (the sequence is
bounded by the context), and the index of one request is dropped with the request.
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SIZES = (4, 3, 2)


class HistoryIndex:
    """Latest-occurrence n-gram maps over one request's sequence.

    Args:
        sizes: n-gram lengths tried, longest first (each >= 1).

    Raises:
        ValueError: empty or non-positive sizes.
    """

    def __init__(self, sizes: Sequence[int] = DEFAULT_SIZES) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"n-gram sizes must be positive, got {tuple(sizes)}")
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._indexed = 0  # tokens whose preceding n-grams are in the maps

    def extend(self, tokens: Sequence[int]) -> None:
        """Index `tokens` (the request's whole sequence so far; it only grows, except
        that a cut at a stop may shorten it, which re-indexes from the cut)."""
        if len(tokens) < self._indexed:  # output cut after a stop: rebuild (rare)
            self._maps = {n: {} for n in self.sizes}
            self._indexed = 0
        for end in range(max(self._indexed, 1), len(tokens)):
            # token `end` exists: every n-gram ending just before it now has a follower
            for n in self.sizes:
                if end >= n:
                    self._maps[n][tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, len(tokens))

    def propose(self, tokens: Sequence[int], count: int) -> tuple[int, ...]:
        """Up to `count` tokens that followed the latest earlier occurrence of the
        longest indexed suffix of `tokens` (its last n tokens, n in `sizes`); () when no
        suffix occurred before or `count` < 1. Indexes `tokens` first.

        Returns:
            The copied proposal, at most `count` ids.
        """
        self.extend(tokens)
        if count < 1:
            return ()
        for n in self.sizes:
            if len(tokens) <= n:
                continue
            follow = self._maps[n].get(tuple(tokens[-n:]))
            if follow is not None and follow < len(tokens):
                return tuple(tokens[follow:follow + count])
        return ()
