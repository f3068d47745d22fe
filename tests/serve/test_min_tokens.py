"""min_tokens: the ban mask, when it applies, and how it meets a grammar's mask."""

import numpy as np
import pytest
from helios_serve.engine.min_tokens import MinTokensBan, ban_words
from helios_serve.engine.plan import RowPlan, SamplingParams


def _allowed(words) -> set[int]:
    bits = np.unpackbits(np.asarray(words).view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def _row(start, n_tokens, sample=True) -> RowPlan:
    return RowPlan(request_id=1, slot=0, generation=1, tokens=(5,) * n_tokens,
                   start_position=start, page_ids=(0,), sample=sample,
                   sampling=SamplingParams())


def test_ban_words_clear_exactly_the_banned_bits():
    words = ban_words(3, [0, 2, 31, 32, 95])
    assert words.dtype == np.int32 and words.shape == (3,)
    assert _allowed(words) == set(range(96)) - {0, 2, 31, 32, 95}
    with pytest.raises(ValueError, match=r"banned id 96 outside \[0, 96\)"):
        ban_words(3, [96])


def test_ban_applies_while_the_sampled_output_index_is_below_min_tokens():
    ban = MinTokensBan(prompt_tokens=10, min_tokens=3, banned=[2], mask_words=2)
    assert ban.applies(_row(0, 10))  # prefill samples output 0
    assert not ban.applies(_row(0, 8, sample=False))  # a chunk that samples nothing
    assert ban.applies(_row(10, 1))  # decode feeding output 0 samples output 1
    assert ban.applies(_row(11, 1))  # samples output 2 (the third)
    assert not ban.applies(_row(12, 1))  # output 3: three exist before it
    # readmission after preemption re-prefills prompt + output: still by position
    assert not ban.applies(_row(0, 13))
    assert ban.applies(_row(4, 8))


def test_ban_alone_is_shared_and_with_a_grammar_it_intersects_unless_empty():
    ban = MinTokensBan(prompt_tokens=4, min_tokens=2, banned=[2, 40], mask_words=2)
    alone = ban.mask(None)
    assert _allowed(alone) == set(range(64)) - {2, 40}
    assert ban.mask(None) is alone  # no allocation per step
    grammar = np.zeros(2, np.int32)
    grammar.view(np.uint32)[0] = (1 << 2) | (1 << 7)  # the grammar allows ids 2 and 7
    assert _allowed(ban.mask(grammar)) == {7}
    only_eos = np.zeros(2, np.int32)
    only_eos.view(np.uint32)[0] = 1 << 2  # only the banned EOS: the grammar wins
    assert _allowed(ban.mask(only_eos)) == {2}
