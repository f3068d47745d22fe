"""min_tokens: EOS and stop tokens cannot be sampled before a request's minimum output.

vLLM's ``min_tokens``: while fewer than ``min_tokens`` output tokens exist, the ids in
``SamplingParams.min_tokens_banned`` (EOS ids unless EOS is ignored, plus the request's
stop-token ids) are masked out of sampling. The ban travels through the sampler's grammar
mask input (GRAMMAR_MASK / GRAMMAR_MASK_ENABLED): it depends only on the row's position,
known when the row is planned, so it needs no completion feedback and rows may still be
submitted ahead. A constrained row gets its grammar's mask with the banned ids cleared;
when that leaves nothing (the grammar allows only banned ids, e.g. only EOS once its
document is complete) the grammar's mask is kept: the grammar wins.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from .plan import RowPlan


def ban_words(mask_words: int, banned: Iterable[int]) -> np.ndarray:
    """int32 ``[mask_words]`` bitmask allowing every id except ``banned``.

    Raises:
        ValueError: a banned id outside ``[0, 32 * mask_words)``.
    """
    words = np.full(mask_words, -1, dtype=np.int32).view(np.uint32)
    for token in banned:
        if not 0 <= token < 32 * mask_words:
            raise ValueError(f"banned id {token} outside [0, {32 * mask_words})")
        words[token // 32] &= np.uint32(~(1 << (token % 32)) & 0xFFFFFFFF)
    return words.view(np.int32)


class MinTokensBan:
    """One request's ban: applies to rows whose sampled token has output index below
    ``min_tokens``.

    Args:
        prompt_tokens: the request's prompt length (positions < it are the prompt).
        min_tokens: output tokens before the banned ids may be sampled (>= 1).
        banned: the banned ids.
        mask_words: int32 words of a mask row.
    """

    def __init__(self, prompt_tokens: int, min_tokens: int, banned: Iterable[int],
                 mask_words: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.min_tokens = min_tokens
        self._words = ban_words(mask_words, banned)  # shared, never written after this

    def applies(self, row: RowPlan) -> bool:
        """Whether `row` samples an output token with index < min_tokens. The token
        sampled after the row's last fed token lands at position start + len(tokens);
        its output index is that position minus the prompt length."""
        end = row.start_position + len(row.tokens)
        return row.sample and end - self.prompt_tokens < self.min_tokens

    def mask(self, grammar_mask: np.ndarray | None) -> np.ndarray:
        """The row's sampling mask: the ban alone (shared, read-only: do not write it), or
        `grammar_mask` with the banned ids cleared unless that allows nothing."""
        if grammar_mask is None:
            return self._words
        both = grammar_mask & self._words
        return both if both.any() else grammar_mask
