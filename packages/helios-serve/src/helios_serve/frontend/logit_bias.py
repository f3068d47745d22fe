"""OpenAI ``logit_bias``: validation of the request field into sampler pairs.

OpenAI's rules: a JSON object mapping token ids (string keys, as JSON requires; integer
keys are accepted from Python callers) to a bias from -100 to 100, at most 300 entries.
The bias is added to the model's logits before sampling: -100 in practice bans a token,
+100 makes it the only choice. Ids must lie in the sampled vocabulary. The sampler adds
the bias before penalties, the grammar mask and temperature (vLLM's order); logprobs still
describe the raw model distribution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import FrontendRequestError

FIELD = "logit_bias"
MAX_LOGIT_BIAS = 300
MAX_BIAS = 100.0
_ID = re.compile(r"0|[1-9][0-9]*")


class LogitBiasError(FrontendRequestError):
    """`logit_bias` violates a limit (names the offending id)."""

    def __init__(self, message: str) -> None:
        super().__init__(FIELD, message)


def _token_id(key: Any, vocab_size: int) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        token = key
    elif isinstance(key, str) and _ID.fullmatch(key):
        token = int(key)
    else:
        raise LogitBiasError(f"keys must be token ids (decimal integers), got {key!r}")
    if not 0 <= token < vocab_size:
        raise LogitBiasError(f"token id {token} is outside the vocabulary [0, {vocab_size})")
    return token


def parse_logit_bias(value: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """Validate a request's ``logit_bias``.

    Args:
        value: the field as decoded from JSON (None, or an object of id -> number).
        vocab_size: ids must be below this (the sampled vocabulary).

    Returns:
        (token id, bias) pairs, ids ascending; () for None or an empty object.

    Raises:
        LogitBiasError: not an object, more than 300 entries, a key that is not a token
            id in the vocabulary, a value that is not a finite number in [-100, 100], or
            two keys naming the same id (e.g. "7" and 7).
    """
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise LogitBiasError("must be an object mapping token ids to a bias in [-100, 100]")
    if len(value) > MAX_LOGIT_BIAS:
        raise LogitBiasError(f"has {len(value)} entries; at most {MAX_LOGIT_BIAS} are allowed")
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        token = _token_id(key, vocab_size)
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise LogitBiasError(f"the bias of token id {token} must be a number, got {bias!r}")
        if not (math.isfinite(bias) and -MAX_BIAS <= bias <= MAX_BIAS):
            raise LogitBiasError(f"the bias of token id {token} is {bias}; it must lie in "
                                 f"[-100, 100]")
        if token in pairs:
            raise LogitBiasError(f"token id {token} is given twice")
        pairs[token] = float(bias)
    return tuple(sorted(pairs.items()))
