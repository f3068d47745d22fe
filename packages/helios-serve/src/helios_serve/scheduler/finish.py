"""The finish rule: whether a sampled token ends its request, and why.

Every path that retires a request on a sampled token calls `check_stop` (the worker for
each validated token, `testing.serial.Serial`); nothing else decides "length". The rule,
in order (the first that holds decides):

    EOS         the token is one of the request's EOS ids (none with ignore_eos)
                -> STOP, a publishable end
    stop id     the token is one of the request's single-id stops -> STOP, not
                publishable (its private candidate is discarded: "String stops")
    output end  output_tokens >= max_output_tokens -> LENGTH, publishable
    context end prompt_tokens + output_tokens >= context_tokens -> LENGTH, publishable

`output_tokens` counts the output up to and including the token. A request that needs
host feedback (grammar, string stops, stop sequences) has its stop ids, sequences and
strings matched by its output pipeline (frontend/stops.py: text before a stop must be
flushed first), so its rule carries no stop ids; the worker asks the rule only for the
end the pipeline did not reach itself. Admission (`check_capacity`) guarantees
prompt + max_output_tokens <= context_tokens, so the context end never comes before the
output end of an admitted request; it is stated here so the rule is complete on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from helios_serve.scheduler.request import FinishReason


def ending_eos_ids(eos_token_ids: Iterable[int], ignore_eos: bool) -> frozenset[int]:
    """The ids that end a request as EOS: the core's EOS ids, none with ignore_eos (then
    they are sampled as ordinary tokens and omitted from the text)."""
    return frozenset() if ignore_eos else frozenset(eos_token_ids)


@dataclass(frozen=True)
class StopRule:
    """What ends one request (one choice).

    Attributes:
        max_output_tokens: the output limit (tokens, >= 1).
        eos_token_ids: ids that end generation as EOS (`ending_eos_ids`).
        stop_token_ids: single ids that end generation as a matched stop.
        prompt_tokens: the prompt's length (tokens), for the context end.
        context_tokens: the context the request runs in (tokens); None: no context end.
    """

    max_output_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    stop_token_ids: frozenset[int] = frozenset()
    prompt_tokens: int = 0
    context_tokens: int | None = None


@dataclass(frozen=True)
class Stop:
    """A decided end.

    Attributes:
        reason: STOP or LENGTH.
        publish: the request's end is a publishable snapshot endpoint (EOS, output or
            context end); False for a matched stop.
    """

    reason: FinishReason
    publish: bool


EOS = Stop(FinishReason.STOP, publish=True)
MATCHED_STOP = Stop(FinishReason.STOP, publish=False)
LENGTH = Stop(FinishReason.LENGTH, publish=True)


def check_stop(rule: StopRule, token_id: int, output_tokens: int) -> Stop | None:
    """Whether sampled `token_id`, the request's `output_tokens`-th output token, ends it.

    Args:
        rule: the request's StopRule.
        token_id: the sampled id.
        output_tokens: output tokens including this one (>= 1).

    Returns:
        The end (EOS, MATCHED_STOP or LENGTH), or None while generation goes on.
    """
    if token_id in rule.eos_token_ids:
        return EOS
    if token_id in rule.stop_token_ids:
        return MATCHED_STOP
    if output_tokens >= rule.max_output_tokens:
        return LENGTH
    if rule.context_tokens is not None and \
            rule.prompt_tokens + output_tokens >= rule.context_tokens:
        return LENGTH
    return None
