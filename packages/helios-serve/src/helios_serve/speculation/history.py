"""History drafting: copied proposals from a request's own prompt and output.

Algorithm (per request, over its sequence S = prompt + output so far, the pending token
last):

1. Copy cursor. A proposal copied from source position f (the ids S[f:f+k]) leaves a
   cursor (L, f), L = len(S) when it was made. At the next proposal, when the tokens the
   step committed, S[L:L'], equal the source's continuation S[f:f+L'-L] (every accepted
   copied token and the correction or bonus token after them), the source is still in
   step: the proposal is S[c:c+count] with c = f + L' - L, no lookup. This is what an
   editing or quoting request does -- it walks through one stretch of its prompt -- and
   what a lookup of the latest occurrence gets wrong whenever the last few tokens also
   occur later than the stretch being copied (in code: `self.items`, `order["`; in the
   answer's own earlier lines).
2. Lookup, when there is no cursor or it fell out of step: n-gram matching, longest
   suffix first (n in `sizes`, 4, 3, 2 by default; prompt lookup decoding, Saxena 2023;
   vLLM's n-gram proposer). For the longest n whose last n tokens occurred before, the
   `candidates` newest earlier occurrences are ranked by (a) resuming the broken cursor:
   an occurrence within `resume` tokens after the broken cursor's source position (the
   model substituted or inserted a few tokens, e.g. the renamed identifier, and goes
   on with the source), then (b) the longest agreement of the tokens before the match
   with the tokens before the end of S, up to `context` tokens (the longest-suffix
   match a suffix tree finds: suffix decoding, Oliaro et al. 2024, Arctic Inference),
   then (c) the nearest to the broken cursor, then (d) the newest. The proposal is what followed the chosen occurrence; it sets the cursor.

Why not a suffix tree (Arctic Inference's suffix decoding): the maps are updated in
O(len(sizes)) per new token with no rebuilding, and the bounded candidate ranking gives
the longest-context choice among the occurrences that matter.

Bounds, per request of a sequence of N tokens (N <= the context): memory is at most
len(sizes) map entries and len(sizes) chain links (one int each) per token, and the
index is dropped with the request. Time per proposal: O(len(sizes)) per newly indexed
token, then on the cursor path O(L' - L + count) comparisons and copies; on a lookup at
most len(sizes) map probes plus candidates x (n + context) token comparisons and count
copies (3 + 4 x 36 = 147 comparisons with the defaults), whatever N is
(`tests/serve/speculation/test_history.py::test_a_proposal_is_bounded_*`).
"""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SIZES = (4, 3, 2)
# Earlier occurrences of the matched n-gram ranked per lookup (newest first).
DEFAULT_CANDIDATES = 4
# Tokens before a match compared when ranking its occurrences.
DEFAULT_CONTEXT = 32
# An occurrence at most this many tokens after a broken cursor's source resumes it.
DEFAULT_RESUME = 16


class HistoryIndex:
    """N-gram maps with occurrence chains and a copy cursor over one request's sequence.

    Args:
        sizes: n-gram lengths tried, longest first (each >= 1).
        cursor: keep copying from the previous proposal's source while it stays in step
            (step 1 of the module docstring); False = every proposal is a lookup.
        candidates: earlier occurrences ranked per lookup (>= 1; 1 = the latest only).
        context: tokens before a match compared when ranking occurrences (>= 0).
        resume: window after a broken cursor's source in which an occurrence resumes it
            (0 = never).

    Raises:
        ValueError: empty or non-positive sizes, candidates < 1, negative context or
            resume.
    """

    def __init__(self, sizes: Sequence[int] = DEFAULT_SIZES, *, cursor: bool = True,
                 candidates: int = DEFAULT_CANDIDATES, context: int = DEFAULT_CONTEXT,
                 resume: int = DEFAULT_RESUME) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f"n-gram sizes must be positive, got {tuple(sizes)}")
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        if context < 0 or resume < 0:
            raise ValueError(f"context and resume must be >= 0, got {context}, {resume}")
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self.use_cursor = cursor
        self.candidates = candidates
        self.context = context
        self.resume = resume
        self._reset()

    def _reset(self) -> None:
        # n -> n-gram -> the follower position of its latest occurrence
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        # n -> follower position -> the follower position of the previous occurrence of
        # the same n-gram (-1: none); index = follower position
        self._chains: dict[int, list[int]] = {n: [] for n in self.sizes}
        self._indexed = 0  # tokens whose preceding n-grams are in the maps
        self._cursor: tuple[int, int] | None = None  # (len(S) at the proposal, source)
        self._broken: int | None = None  # source position of the last broken cursor
        self.last_source = ""  # "cursor", "lookup" or "" (nothing proposed): for traces

    def extend(self, tokens: Sequence[int]) -> None:
        """Index `tokens` (the request's whole sequence so far; it only grows, except
        that a cut at a stop may shorten it, which re-indexes from the cut)."""
        if len(tokens) < self._indexed:  # output cut after a stop: rebuild (rare)
            self._reset()
        for end in range(max(self._indexed, 1), len(tokens)):
            # token `end` exists: every n-gram ending just before it now has a follower
            for n in self.sizes:
                chain = self._chains[n]
                while len(chain) < end:
                    chain.append(-1)
                if end >= n:
                    key = tuple(tokens[end - n:end])
                    chain.append(self._maps[n].get(key, -1))
                    self._maps[n][key] = end
                else:
                    chain.append(-1)
        self._indexed = max(self._indexed, len(tokens))

    def propose(self, tokens: Sequence[int], count: int) -> tuple[int, ...]:
        """Up to `count` tokens copied from an earlier stretch of `tokens` (the module
        docstring's algorithm); () when nothing matches or `count` < 1. Indexes
        `tokens` first. Calling it again at the same `tokens` returns the same ids.

        Returns:
            The copied proposal, at most `count` ids.
        """
        self.extend(tokens)
        self.last_source = ""
        if count < 1:
            return ()
        end = len(tokens)
        source = self._follow(tokens)
        if source is not None:
            self.last_source = "cursor"
        else:
            source = self._lookup(tokens)
            if source is not None:
                self.last_source = "lookup"
        if source is None or source >= end:
            self._cursor = None
            self.last_source = ""
            return ()
        self._cursor = (end, source)
        return tuple(tokens[source:source + count])

    def _follow(self, tokens: Sequence[int]) -> int | None:
        """The cursor's source position now, if the committed tokens kept it in step."""
        if not self.use_cursor or self._cursor is None:
            return None
        then, source = self._cursor
        end = len(tokens)
        grown = end - then
        if grown < 0:
            self._cursor = None
            return None
        if all(tokens[source + i] == tokens[then + i] for i in range(grown)):
            return source + grown
        self._broken = source + grown  # where the source would have been now
        self._cursor = None
        return None

    def _lookup(self, tokens: Sequence[int]) -> int | None:
        end = len(tokens)
        for n in self.sizes:
            if end <= n:
                continue
            follow = self._maps[n].get(tuple(tokens[-n:]), -1)
            if follow < 0 or follow >= end:
                continue
            chain = self._chains[n]
            best, best_key = follow, None
            for _ in range(self.candidates):
                if follow < 0:
                    break
                gap = self._resume_gap(follow)
                key = (gap is not None, self._agreement(tokens, follow - n, end - n),
                       -(gap or 0), follow)
                if best_key is None or key > best_key:
                    best, best_key = follow, key
                follow = chain[follow]
            return best
        return None

    def _resume_gap(self, follow: int) -> int | None:
        """Tokens from the broken cursor's source to `follow`, if within `resume`."""
        broken = self._broken
        if broken is None or not broken <= follow <= broken + self.resume:
            return None
        return follow - broken

    def _agreement(self, tokens: Sequence[int], a: int, b: int) -> int:
        """How many tokens before positions a < b agree (tokens[a-1] vs tokens[b-1],
        ...), at most `context`."""
        k = 0
        limit = min(self.context, a)
        while k < limit and tokens[a - 1 - k] == tokens[b - 1 - k]:
            k += 1
        return k
