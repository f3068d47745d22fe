"""Suffix drafting: copied proposals scored by how often each continuation followed.

Suffix decoding (Oliaro et al. 2024, "SuffixDecoding", arXiv 2411.04975; Arctic
Inference), over one request's own sequence S = prompt + output so far (the pending token
last). The structure is a suffix trie of S cut at `depth` tokens: a node is a string x of
at most `depth` tokens that occurs in S, and its count is the number of positions where x
occurs. Appending a token t to S adds one occurrence to x + t for every suffix x of S
shorter than `depth` (the *active* nodes: the suffixes of S of lengths 1..depth).

Proposal (`propose(S, count)`), for each match length m = 1 .. min(depth, len(S)):

1. The match node is the suffix of S of length m (an active node: S itself is indexed).
2. Walk: from the node x, go to its most frequent child (ties: the child whose count
   reached the maximum most recently, i.e. the newest continuation), multiplying the
   path probability by count(child) / (occurrences of x that have a continuation:
   count(x) minus 1 when x is a suffix of S, whose last occurrence ends at the end of S).
   Append the child's token while the path probability stays >= `min_prob`, up to
   min(count, floor(m x factor + offset)) tokens: a longer match earns a longer draft
   (the draft length adapts per lane, per step, to the evidence behind it).
3. The draft's score is the sum of its tokens' path probabilities (the expected number
   of accepted tokens if the estimates were calibrated).

The proposal is the draft with the highest score; ties go to the longer match. Its
tokens' path probabilities are `last_probs`. Nothing is proposed (an empty tuple) when no
suffix of S has occurred with a continuation.

Against the latest-occurrence copy (speculation.HistoryIndex): where the matched context
occurred several times with different continuations, the frequency picks the usual one
and the probability shortens the draft; where it occurred once, the copy is the same.

Bounds, per request of a sequence of N tokens: at most `depth` trie nodes per token (four
ints each and one map entry), dropped with the request; O(depth) per newly indexed
token; a proposal walks at most depth x min(count, depth) trie edges, whatever N is
(`tests/serve/speculation/test_suffix.py::test_a_proposal_is_bounded_*`).
"""

from __future__ import annotations

from collections.abc import Sequence

# Longest indexed string (tokens): matches up to this long, drafts up to the depth left.
DEFAULT_DEPTH = 16
# A draft after a match of m tokens holds at most floor(m x FACTOR + OFFSET) tokens.
# Arctic Inference's defaults are 1 and 0; 2 and 1 accepted more copied tokens per step
# on SmolLM2's editing and extraction answers at W = 4 and 8
# (bench/results/suffix_drafting_cpu.json, `suffix` against `suffix_arctic`).
DEFAULT_FACTOR = 2.0
DEFAULT_OFFSET = 1.0
# A drafted token's path probability (the product of its continuation frequencies) must
# be at least this.
DEFAULT_MIN_PROB = 0.1

_KEY = 32  # child map key: node << _KEY | token (token ids are below 2^32)


class SuffixIndex:
    """A depth-limited suffix trie of one request's sequence with frequency-scored
    continuations (the module docstring). Same interface as speculation.HistoryIndex:
    `extend(tokens)`, `propose(tokens, count)`, `last_source`.

    Args:
        depth: longest indexed string in tokens (>= 2).
        factor, offset: a match of m tokens drafts at most floor(m x factor + offset)
            tokens (factor > 0, offset >= 0).
        min_prob: smallest path probability of a drafted token, in [0, 1].

    Raises:
        ValueError: an argument outside its range.
    """

    def __init__(self, depth: int = DEFAULT_DEPTH, *, factor: float = DEFAULT_FACTOR,
                 offset: float = DEFAULT_OFFSET, min_prob: float = DEFAULT_MIN_PROB) -> None:
        if depth < 2:
            raise ValueError(f"depth must be >= 2, got {depth}")
        if not factor > 0 or offset < 0:
            raise ValueError(f"factor must be > 0 and offset >= 0, got {factor}, {offset}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must lie in [0, 1], got {min_prob}")
        self.depth = depth
        self.factor = factor
        self.offset = offset
        self.min_prob = min_prob
        self._reset()

    def _reset(self) -> None:
        # Node 0 is the root (the empty string). Per node: its last token, its count
        # (occurrences in S), its most frequent child (-1: none).
        self._token: list[int] = [-1]
        self._count: list[int] = [0]
        self._best: list[int] = [-1]
        self._child: dict[int, int] = {}  # node << _KEY | token -> child node
        # _active[m - 1]: the node of S's suffix of length m, m = 1..min(depth, len(S))
        self._active: list[int] = []
        self._indexed = 0
        self.last_source = ""  # "suffix" or "" (nothing proposed): for traces
        self.last_probs: tuple[float, ...] = ()
        self.last_match = 0  # match length of the last proposal (0: none)

    @property
    def nodes(self) -> int:
        """Trie nodes held (the root included)."""
        return len(self._token)

    def extend(self, tokens: Sequence[int]) -> None:
        """Index `tokens` (the request's whole sequence so far; it only grows, except
        that a cut at a stop may shorten it, which re-indexes from the start)."""
        if len(tokens) < self._indexed:  # output cut after a stop: rebuild (rare)
            self._reset()
        for i in range(self._indexed, len(tokens)):
            self._append(int(tokens[i]))
        self._indexed = max(self._indexed, len(tokens))

    def _append(self, token: int) -> None:
        # Every suffix x of S shorter than `depth` (and the empty one) gains the
        # occurrence x + token; the new suffixes are those nodes.
        parents = [0, *self._active[:self.depth - 1]]
        active = []
        count, best, child_map = self._count, self._best, self._child
        for parent in parents:
            key = parent << _KEY | token
            child = child_map.get(key)
            if child is None:
                child = child_map[key] = len(self._token)
                self._token.append(token)
                count.append(0)
                best.append(-1)
            count[child] += 1
            top = best[parent]
            if top < 0 or count[child] >= count[top]:
                best[parent] = child  # ties: the newest continuation
            active.append(child)
        self._active = active

    def propose(self, tokens: Sequence[int], count: int) -> tuple[int, ...]:
        """Up to `count` tokens continuing `tokens` (the module docstring's algorithm);
        () when nothing is proposed or `count` < 1. Indexes `tokens` first. Calling it
        again at the same `tokens` returns the same ids.

        Returns:
            The proposal, at most `count` ids.
        """
        self.extend(tokens)
        self.last_source, self.last_probs, self.last_match = "", (), 0
        if count < 1:
            return ()
        ends = set(self._active)  # nodes with an occurrence ending at the end of S
        n_count, best, n_token = self._count, self._best, self._token
        top: tuple[float, tuple[int, ...], tuple[float, ...], int] = (0.0, (), (), 0)
        for m, node in enumerate(self._active, start=1):
            limit = min(count, int(m * self.factor + self.offset + 1e-6))
            ids: list[int] = []
            probs: list[float] = []
            prob = 1.0
            score = 0.0
            while len(ids) < limit:
                child = best[node]
                if child < 0:
                    break
                prob *= n_count[child] / (n_count[node] - (node in ends))
                if prob < self.min_prob:
                    break
                ids.append(n_token[child])
                probs.append(prob)
                score += prob
                node = child
            if ids and score >= top[0]:
                top = (score, tuple(ids), tuple(probs), m)
        _, ids, probs, match = top
        if ids:
            self.last_source, self.last_probs, self.last_match = "suffix", probs, match
        return ids
