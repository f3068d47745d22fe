"""The finish rule (scheduler/finish.py): exact decisions and their order."""

from __future__ import annotations

from helios_serve.scheduler import FinishReason
from helios_serve.scheduler.finish import (
    EOS,
    LENGTH,
    MATCHED_STOP,
    Stop,
    StopRule,
    check_stop,
    ending_eos_ids,
)

RULE = StopRule(4, frozenset({2}), frozenset({7}), prompt_tokens=10, context_tokens=20)


def test_generation_goes_on_below_every_end():
    assert check_stop(RULE, 5, 1) is None
    assert check_stop(RULE, 5, 3) is None


def test_eos_ends_publishable_before_any_other_end():
    assert check_stop(RULE, 2, 1) == Stop(FinishReason.STOP, publish=True) == EOS
    assert check_stop(RULE, 2, 4) is EOS  # EOS at the output limit is still EOS


def test_stop_id_ends_unpublishable_before_the_limit():
    assert check_stop(RULE, 7, 2) == Stop(FinishReason.STOP, publish=False) == MATCHED_STOP
    assert check_stop(RULE, 7, 4) is MATCHED_STOP


def test_output_limit_ends_with_length():
    assert check_stop(RULE, 5, 4) == Stop(FinishReason.LENGTH, publish=True) == LENGTH
    assert check_stop(RULE, 5, 5) is LENGTH


def test_context_end_ends_with_length_before_the_output_limit():
    rule = StopRule(100, prompt_tokens=10, context_tokens=12)
    assert check_stop(rule, 5, 1) is None
    assert check_stop(rule, 5, 2) is LENGTH
    assert check_stop(StopRule(100, prompt_tokens=10), 5, 50) is None  # no context end


def test_ignore_eos_is_an_empty_eos_set():
    assert check_stop(StopRule(4), 2, 1) is None


def test_ending_eos_ids_are_none_with_ignore_eos():
    assert ending_eos_ids((2, 3), ignore_eos=False) == frozenset({2, 3})
    assert ending_eos_ids((2, 3), ignore_eos=True) == frozenset()
