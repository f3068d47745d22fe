"""Incremental detokenization that never splits a UTF-8 character.

Algorithm (vLLM's and TGI's prefix-offset trick): decode a sliding window of ids twice,
once without and once with the newest tokens, and emit the difference. Decoding a window
that starts a few tokens back keeps tokenizer-specific spacing (e.g. SentencePiece's
leading-space handling) right, and a difference ending in U+FFFD means the newest token
ends inside a multi-byte character, so nothing is emitted until a later token completes it.

Byte-level BPE (`ByteLevelPieces`): when the tokenizer's decoder is GPT-2's ByteLevel
alone, decoding ids is decoding the UTF-8 of their bytes concatenated, so the same two
window decodes are done on bytes kept beside the ids (no tokenizer call per token). A
window whose bytes are not valid UTF-8 (a character still incomplete, an invalid byte)
is decoded by the tokenizer, as is everything after an id without known bytes: the text
is the tokenizer's in every case.

Per token, in steady streaming: when nothing is held back (the previous token completed
its characters) and the new id's bytes are whole characters, the two window decodes
differ by exactly that id's text (valid UTF-8 concatenates), so `push` returns the id's
cached text (`ByteLevelPieces.text_alone`) without decoding the window.
"""

from __future__ import annotations

from collections.abc import Sequence

from .vocab import ByteLevelPieces

_CONTEXT_TOKENS = 5  # prompt ids seeding the window
class IncrementalDetokenizer:
    """Turns generated token ids into text pieces, one `push` per token.

    Args:
        tokenizer: a `tokenizers.Tokenizer`.
        prompt_ids: the prompt; its last few ids seed the decode window.
        pieces: the tokenizer's `ByteLevelPieces` (None: every window is decoded by the
            tokenizer).
    """

    def __init__(self, tokenizer, prompt_ids: Sequence[int] = (),
                 pieces: ByteLevelPieces | None = None) -> None:  # fmt: skip
        self._tok = tokenizer
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0  # window start (index into _ids)
        self._read = len(self._ids)  # ids before this have been emitted
        self._pieces = pieces
        # With pieces: the bytes of _ids[_prefix:_read] and of _ids[_read:].
        self._head = self._tail = b""
        # _head is valid UTF-8 (its text is what the window starts with): the per-token
        # path (`push`) may then append a whole-character id's text without decoding.
        self._head_valid = False
        if pieces is not None:
            known = [pieces.bytes_of(i) for i in self._ids]
            if all(b is not None for b in known):
                self._head = b"".join(known)  # type: ignore[arg-type]
                try:
                    self._head.decode()
                    self._head_valid = True
                except UnicodeDecodeError:
                    pass
            else:
                self._pieces = None

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False) if ids else ""

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a character is incomplete)."""
        self._ids.append(token_id)
        texts = None
        if self._pieces is not None:
            if self._head_valid and not self._tail:
                text = self._pieces.text_alone(token_id)
                if text and not text.endswith("\ufffd"):  # what the window path emits
                    self._prefix, self._read = self._read, len(self._ids)
                    self._head = self._pieces.bytes_of(token_id)  # type: ignore[assignment]
                    if self._prefix > 64:  # as below
                        del self._ids[: self._prefix]
                        self._read -= self._prefix
                        self._prefix = 0
                    return text
            piece = self._pieces.bytes_of(token_id)
            if piece is None:
                self._pieces = None  # the tokenizer decodes from now on
            else:
                self._tail += piece
                try:
                    texts = self._head.decode(), (self._head + self._tail).decode()
                except UnicodeDecodeError:  # the tokenizer says what it decodes to
                    pass
        from_bytes = texts is not None
        if texts is None:
            texts = (self._decode(self._ids[self._prefix : self._read]),
                     self._decode(self._ids[self._prefix :]))  # fmt: skip
        prefix_text, new_text = texts
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            # The new head's bytes decoded here only when the bytes path decoded them.
            self._head_valid = self._pieces is not None and from_bytes
            self._prefix, self._read = self._read, len(self._ids)
            self._head, self._tail = self._tail, b""
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
        self._head = self._tail = b""
        self._head_valid = self._pieces is not None
        return new_text[len(prefix_text) :]
