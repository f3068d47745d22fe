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


# -- the copy cursor, occurrence ranking and the bounds ------------------------------

# A stretch "7 1 2 3 4 20 21" that a request copies, and a later "8 1 2 3 4 30 31":
# after copying "7 1 2 3 4" the latest occurrence of "1 2 3 4" is the later one.
CURSOR_PROMPT = [7, 1, 2, 3, 4, 20, 21, 8, 1, 2, 3, 4, 30, 31, 9]


def test_the_cursor_keeps_copying_the_source_the_accepted_tokens_came_from():
    index = HistoryIndex()
    assert index.propose(CURSOR_PROMPT + [7, 1], 2) == (2, 3)  # lookup of "7 1"
    assert index.last_source == "lookup"
    # both copies accepted and the bonus token 4 is the source's next: still in step
    assert index.propose(CURSOR_PROMPT + [7, 1, 2, 3, 4], 2) == (20, 21)
    assert index.last_source == "cursor"
    assert index.propose(CURSOR_PROMPT + [7, 1, 2, 3, 4], 2) == (20, 21)  # same endpoint
    # the latest occurrence of "1 2 3 4" (the proposer before the cursor) copies 30 31
    latest = HistoryIndex(cursor=False, candidates=1, resume=0)
    assert latest.propose(CURSOR_PROMPT + [7, 1, 2, 3, 4], 2) == (30, 31)


def test_a_cursor_out_of_step_falls_back_to_lookup():
    index = HistoryIndex()
    assert index.propose(CURSOR_PROMPT + [7, 1], 3) == (2, 3, 4)
    # 2 accepted, the correction 9 is not the source's 4: lookup of "2 9" finds nothing
    assert index.propose(CURSOR_PROMPT + [7, 1, 2, 9], 3) == ()
    assert index.last_source == ""
    # "9 7" occurred (positions 14, 15): its follower is 1
    assert index.propose(CURSOR_PROMPT + [7, 1, 2, 9, 7], 3) == (1, 2, 9)
    assert index.last_source == "lookup"


def test_occurrences_are_ranked_by_the_agreement_of_the_tokens_before_them():
    # Without a cursor: "1 2 3 4" occurs after a 7 and after an 8; the sequence has a 7
    # before it, so the earlier occurrence (agreement 1) beats the latest (0).
    ranked = HistoryIndex(cursor=False)
    assert ranked.propose(CURSOR_PROMPT + [7, 1, 2, 3, 4], 2) == (20, 21)
    assert HistoryIndex(cursor=False, candidates=1).propose(
        CURSOR_PROMPT + [7, 1, 2, 3, 4], 2) == (30, 31)
    # equal agreement: the latest wins
    assert HistoryIndex(cursor=False).propose([1, 2, 5, 0, 1, 2, 6, 3, 1, 2], 1) == (6,)


# "7 1 2 3 4 5 6" is copied, with 3 replaced by 50 (a renamed identifier); "4 5 6 99"
# occurs later as well.
RESUME_PROMPT = [7, 1, 2, 3, 4, 5, 6, 40, 41, 0, 4, 5, 6, 99, 0]


def test_an_occurrence_just_after_a_broken_cursor_resumes_its_source():
    index = HistoryIndex()
    assert index.propose(RESUME_PROMPT + [7, 1], 2) == (2, 3)
    assert index.propose(RESUME_PROMPT + [7, 1, 2, 50], 2) == ()  # broke at source 4
    assert index.propose(RESUME_PROMPT + [7, 1, 2, 50, 4], 2) == ()
    # "4 5" follows at 6 (just after the broken source) and at 12 (latest): resumed
    assert index.propose(RESUME_PROMPT + [7, 1, 2, 50, 4, 5], 2) == (6, 40)
    no_resume = HistoryIndex(resume=0)
    for end in (2, 4, 5):
        no_resume.propose((RESUME_PROMPT + [7, 1, 2, 50, 4, 5])[:len(RESUME_PROMPT) + end], 2)
    assert no_resume.propose(RESUME_PROMPT + [7, 1, 2, 50, 4, 5], 2) == (6, 99)


def test_a_cut_sequence_drops_the_cursor():
    index = HistoryIndex()
    assert index.propose(CURSOR_PROMPT + [7, 1], 2) == (2, 3)
    assert index.propose(CURSOR_PROMPT[:10], 2) == (3, 4)  # shorter: rebuilt, "1 2" lookup
    assert index.last_source == "lookup"


def test_options_are_checked():
    with pytest.raises(ValueError, match="candidates must be >= 1, got 0"):
        HistoryIndex(candidates=0)
    with pytest.raises(ValueError, match="context and resume must be >= 0, got -1, 16"):
        HistoryIndex(context=-1)


class _Counting(list):
    """A token list that counts the elements read through indexing and slicing."""

    reads = 0

    def __getitem__(self, key):
        value = super().__getitem__(key)
        _Counting.reads += len(value) if isinstance(key, slice) else 1
        return value


def _reads_of_one_step(tokens: list[int], index: HistoryIndex, count: int) -> int:
    """Elements read by propose after one more token (the index is built before)."""
    seq = _Counting(tokens[:-1])
    index.propose(seq, count)
    seq.append(tokens[-1])
    _Counting.reads = 0
    index.propose(seq, count)
    return _Counting.reads


@pytest.mark.parametrize("length", [200, 4000])
def test_a_proposal_is_bounded_whatever_the_sequence_length(length):
    sizes, count = (4, 3, 2), 3
    # the worst case of a lookup: every n-gram occurred everywhere, long agreements
    same = [5] * length
    index = HistoryIndex(cursor=False)
    bound = 2 * sum(sizes) + 2 * index.candidates * index.context + count
    assert _reads_of_one_step(same, index, count) <= bound
    # the cursor path: the step committed one token in step with the source
    index = HistoryIndex()
    assert _reads_of_one_step(same, index, count) <= sum(sizes) + 2 * 1 + count
    # memory: one map entry and one chain link per n and token at most
    assert sum(len(m) for m in index._maps.values()) <= len(sizes) * length
    assert all(len(c) == length for c in index._chains.values())
