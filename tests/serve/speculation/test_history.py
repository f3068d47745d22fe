"""History drafting's proposer (helios_serve.speculation.history): n-gram lookup, longest
suffix first, latest occurrence, incremental and bounded."""

from __future__ import annotations

import pytest
from helios_serve.speculation import HistoryIndex


def test_the_longest_matching_suffix_proposes_what_followed_it():
    index = HistoryIndex()
    # "5 6 7 8" occurred followed by 9 10 11; the sequence now ends in "6 7 8" after a 1.
    seq = [1, 2, 5, 6, 7, 8, 9, 10, 11, 3, 1, 6, 7, 8]
    assert index.propose(seq, 3) == (9, 10, 11)
    assert index.propose(seq, 1) == (9,)
    assert index.propose(seq, 0) == ()


def test_the_latest_occurrence_wins_and_longer_matches_beat_shorter_ones():
    index = HistoryIndex()
    # "7 8" is followed by 1 early and by 2 later; "6 7 8" only by 3 (the longest match).
    seq = [7, 8, 1, 4, 7, 8, 2, 5, 6, 7, 8, 3, 9, 6, 7, 8]
    assert index.propose(seq, 1) == (3,)
    seq2 = [7, 8, 1, 4, 7, 8, 2, 5, 9, 7, 8]
    assert HistoryIndex().propose(seq2, 2) == (2, 5)


def test_no_earlier_occurrence_proposes_nothing():
    assert HistoryIndex().propose([1, 2, 3, 4, 5], 3) == ()
    assert HistoryIndex().propose([1], 3) == ()


def test_indexing_is_incremental_and_a_cut_reindexes():
    index = HistoryIndex(sizes=(2,))
    seq = [1, 2, 3]
    assert index.propose(seq, 2) == ()
    seq += [4, 1, 2]
    assert index.propose(seq, 2) == (3, 4)
    assert sum(len(m) for m in index._maps.values()) <= len(seq)  # one entry per token
    assert index.propose([1, 2, 9, 1, 2], 1) == (9,)  # shorter sequence: rebuilt


def test_sizes_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        HistoryIndex(sizes=(0,))
