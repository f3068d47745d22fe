"""Suffix drafting's proposer (helios_serve.speculation.suffix): a depth-limited suffix
trie of the request's own sequence, frequency-scored continuations, the draft length
adapted to the match, incremental and bounded. Exact drafts on constructed sequences."""

from __future__ import annotations

import numpy as np
import pytest
from helios_serve.speculation import HistoryIndex, SuffixIndex


def arctic(**options) -> SuffixIndex:
    """Arctic Inference's draft-length rule: at most m tokens after a match of m."""
    return SuffixIndex(**{"factor": 1.0, "offset": 0.0, **options})


def test_the_highest_scoring_match_proposes_what_followed_it():
    # "1 2 3" occurred followed by 4 9 1; the sequence ends in "1 2 3" again.
    # m = 1 ("3"): one token (factor 1), score 1; m = 2: "4 9", score 2; m = 3: "4 9 1",
    # score 3; m = 4 ("9 1 2 3") occurs only at the end.
    index = arctic()
    seq = [1, 2, 3, 4, 9, 1, 2, 3]
    assert index.propose(seq, 3) == (4, 9, 1)
    assert index.last_probs == (1.0, 1.0, 1.0) and index.last_match == 3
    assert index.last_source == "suffix"
    assert index.propose(seq, 2) == (4, 9)
    assert index.propose(seq, 0) == () and index.last_source == ""


def test_the_most_frequent_continuation_beats_the_latest_one():
    # "4 5" was followed by 7, 7, then 8; its last occurrence (the end) has no follower,
    # so 7 follows with probability 2 / 3 (then 4, certainly). The latest-occurrence copy
    # proposes what followed "4 5" last: 8 4.
    seq = [4, 5, 7, 4, 5, 7, 4, 5, 8, 4, 5]
    index = arctic()
    assert index.propose(seq, 2) == (7, 4)
    assert index.last_probs == pytest.approx((2 / 3, 2 / 3)) and index.last_match == 2
    assert HistoryIndex(cursor=False, candidates=1, resume=0).propose(seq, 2) == (8, 4)


def test_equal_counts_go_to_the_newest_continuation():
    index = arctic()
    assert index.propose([5, 7, 5, 8, 5], 2) == (8,)
    assert index.last_probs == (0.5,)


def test_the_draft_length_adapts_to_the_match_length():
    # A one-token match drafts one token (floor(1 x factor + offset) = 1) ...
    seq = [1, 2, 3, 4, 5, 6, 0, 1]
    assert arctic().propose(seq, 3) == (2,)
    # ... an offset of 2 allows three after it, as the defaults do (2 x 1 + 1).
    assert arctic(offset=2.0).propose(seq, 3) == (2, 3, 4)
    assert SuffixIndex().propose(seq, 4) == (2, 3, 4)
    # a two-token match: "0 1" occurred once before, followed by 2 3 4 5.
    seq = [0, 1, 2, 3, 4, 5, 9, 0, 1]
    assert arctic().propose(seq, 4) == (2, 3)


def test_a_draft_stops_where_its_path_probability_falls_below_the_minimum():
    # "1" was followed by 11 different tokens: each continuation has probability 1 / 11.
    seq = [t for k in range(2, 13) for t in (1, k)] + [1]
    assert arctic().propose(seq, 3) == ()
    assert arctic(min_prob=0.09).propose(seq, 3) == (12,)  # ties: the newest
    # a path whose second step halves the probability below a 0.6 minimum: 9 followed
    # "3 4" twice, then 9 was followed by 1 once and by 2 once.
    seq = [3, 4, 9, 1, 3, 4, 9, 2, 3, 4]
    assert arctic(min_prob=0.6).propose(seq, 3) == (9,)
    index = arctic(min_prob=0.5)
    assert index.propose(seq, 3) == (9, 2)
    assert index.last_probs == (1.0, 0.5)


def test_a_periodic_sequence_discounts_every_occurrence_at_its_end():
    # "7 7 7 7": every suffix is also followed by 7 earlier; the path's nodes that are
    # suffixes of the sequence count their end occurrence out of the denominator.
    index = arctic()
    assert index.propose([7, 7, 7, 7], 3) == (7, 7)
    # m = 1: 1 token (p = 3/3); m = 2: "7 7" occurs 3 times, 2 with a follower: p = 2/2,
    # then "7 7 7" (2 times, 1 with a follower): p = 1: score 2 -- m = 3 is also 2 but
    # drafts from "7 7 7" whose single continuation leads to "7 7 7 7" (a suffix, no
    # follower): one token; the longer match wins only on a higher or equal score.
    assert index.last_probs == (1.0, 1.0)


def test_nothing_occurred_before_proposes_nothing():
    assert arctic().propose([1, 2, 3, 4, 5], 3) == ()
    assert arctic().propose([1], 3) == ()
    assert arctic().propose([], 3) == ()


def test_incremental_indexing_equals_indexing_at_once_and_a_cut_reindexes():
    rng = np.random.default_rng(3)
    seq = rng.integers(0, 6, 300).tolist()
    grown = arctic()
    for end in range(1, len(seq) + 1):
        got = grown.propose(seq[:end], 4)
        assert got == arctic().propose(seq[:end], 4), end
    whole = arctic()
    whole.extend(seq)
    assert grown.nodes == whole.nodes
    # a stop cut the sequence: the index forgets what was cut
    cut = seq[:120] + [99, 98]
    assert grown.propose(cut, 4) == arctic().propose(cut, 4)


def test_arguments_outside_their_range_are_refused():
    with pytest.raises(ValueError, match="depth must be >= 2"):
        SuffixIndex(1)
    with pytest.raises(ValueError, match="factor must be > 0"):
        SuffixIndex(factor=0.0)
    with pytest.raises(ValueError, match="offset >= 0"):
        SuffixIndex(offset=-1.0)
    with pytest.raises(ValueError, match=r"min_prob must lie in \[0, 1\]"):
        arctic(min_prob=1.5)


class _Counting(list):
    """A node table that counts the entries read (trie edges walked)."""

    reads = 0

    def __getitem__(self, key):
        _Counting.reads += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("length", [200, 4000])
def test_a_proposal_is_bounded_whatever_the_sequence_length(length):
    depth, count = 16, 3
    rng = np.random.default_rng(length)
    for seq in ([5] * length, rng.integers(0, 4, length).tolist()):
        index = SuffixIndex(depth)
        index.extend(seq)
        # memory: at most `depth` nodes per token (and the root)
        assert index.nodes <= depth * length + 1
        index._best = _Counting(index._best)
        _Counting.reads = 0
        index.propose(seq, count)
        # one best-child read per drafted token and one where each walk stops
        assert _Counting.reads <= depth * (count + 1)
