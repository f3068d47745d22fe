"""Incremental detokenization that never splits a UTF-8 character.

Algorithm (vLLM's and TGI's prefix-offset trick): decode a sliding window of ids twice,
once without and once with the newest tokens, and emit the difference. Decoding a window
that starts a few tokens back keeps tokenizer-specific spacing (e.g. SentencePiece's
leading-space handling) right, and a difference ending in U+FFFD means the newest token
ends inside a multi-byte character, so nothing is emitted until a later token completes it.
"""

from __future__ import annotations

from collections.abc import Sequence

_CONTEXT_TOKENS = 5  # prompt ids seeding the window


class IncrementalDetokenizer:
    """Turns generated token ids into text pieces, one `push` per token.

    Args:
        tokenizer: a `tokenizers.Tokenizer`.
        prompt_ids: the prompt; its last few ids seed the decode window.
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0  # window start (index into _ids)
        self._read = len(self._ids)  # ids before this have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False) if ids else ""

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            if self._prefix > 64:  # keep the id list short; offsets move with it
                del self._ids[: self._prefix]
                self._read -= self._prefix
                self._prefix = 0
            return new_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Text of trailing ids still held (an incomplete character decodes as U+FFFD)."""
        if self._read >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text) :]
