"""Token pieces: the text and UTF-8 bytes one token id stands for (logprobs, tokenize).

A byte-level BPE token (GPT-2's alphabet, the ByteLevel decoder) maps back to its exact
bytes through the inverse of GPT-2's bytes-to-unicode table, so a token ending inside a
multi-byte character reports its real bytes (OpenAI's `bytes` field) and a text with
U+FFFD for the incomplete character. Added (special) tokens are their content. Other
decoders fall back to decoding the one id.

`ByteLevelPieces` states the bytes where the tokenizer's decoding is exactly their UTF-8
(the ByteLevel decoder alone), for the incremental detokenizer.
"""

from __future__ import annotations

import functools
import json


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode (printable bytes map to themselves, the rest
    to U+0100 onwards in byte order)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class _WholeCharacters:
    """`text_alone` over a subclass's `bytes_of` (cached per id in `self._texts`)."""

    _texts: dict[int, str | None]

    def bytes_of(self, token_id: int) -> bytes | None:
        raise NotImplementedError

    def text_alone(self, token_id: int) -> str | None:
        """The text of the id's bytes when they are valid UTF-8 on their own (whole
        characters), else None (part of a character, an invalid byte, no known bytes).

        Valid UTF-8 concatenates: when the bytes before it decode, the text with this id
        appended is that text followed by this one (the detokenizer's per-token path).
        """
        try:
            return self._texts[token_id]
        except KeyError:
            pass
        raw = self.bytes_of(token_id)
        try:
            text = raw.decode() if raw is not None else None
        except UnicodeDecodeError:
            text = None
        self._texts[token_id] = text
        return text


class TokenPieces(_WholeCharacters):
    """Per-id text and bytes of a `tokenizers.Tokenizer`; cached per id.

    Args:
        tokenizer: the frontend tokenizer.
    """

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer
        spec = json.loads(tokenizer.to_str())
        decoder = spec.get("decoder") or {}
        kinds = [decoder.get("type")] + [d.get("type") for d in decoder.get("decoders", [])]
        self._byte_level = "ByteLevel" in kinds
        self._added = {t["id"]: t["content"] for t in spec.get("added_tokens", [])}
        self._cache: dict[int, bytes] = {}
        self._texts: dict[int, str | None] = {}

    def bytes_of(self, token_id: int) -> bytes:
        """The UTF-8 bytes token `token_id` contributes to the text."""
        cached = self._cache.get(token_id)
        if cached is not None:
            return cached
        if token_id in self._added:
            out = self._added[token_id].encode()
        elif self._byte_level:
            piece = self._tok.id_to_token(token_id) or ""
            table = unicode_to_byte()
            out = bytes(table[c] for c in piece if c in table)
        else:
            out = self._tok.decode([token_id], skip_special_tokens=False).encode()
        self._cache[token_id] = out
        return out

    def text_of(self, token_id: int) -> str:
        """The token's text (U+FFFD where it holds part of a character)."""
        return self.bytes_of(token_id).decode("utf-8", errors="replace")


# Added-token characters whose byte is the character itself in GPT-2's table and in
# UTF-8 alike (printable ASCII without the space): such a token's bytes are its content
# whichever way the decoder treats added tokens.
_PLAIN_ASCII = frozenset(chr(c) for c in range(ord("!"), ord("~") + 1))


class ByteLevelPieces(_WholeCharacters):
    """The UTF-8 bytes of each id of a tokenizer whose decoder is ByteLevel alone; one
    per tokenizer, shared by every request's detokenizer (cached per id).

    `bytes_of(id)` is None for an id whose bytes it does not state: an added token with
    a character outside printable ASCII, a piece with a character outside GPT-2's table,
    an id outside the vocabulary.
    """

    def __init__(self, tokenizer, added: dict[int, str]) -> None:
        self._tok = tokenizer
        self._added = added
        self._table = unicode_to_byte()
        self._cache: dict[int, bytes | None] = {}
        self._texts: dict[int, str | None] = {}

    @classmethod
    def of(cls, tokenizer) -> ByteLevelPieces | None:
        """The pieces of `tokenizer`, or None when its decoder is not ByteLevel alone."""
        spec = json.loads(tokenizer.to_str())
        decoder = spec.get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            return None
        return cls(tokenizer, {t["id"]: t["content"] for t in spec.get("added_tokens", [])})

    def bytes_of(self, token_id: int) -> bytes | None:
        try:
            return self._cache[token_id]
        except KeyError:
            pass
        out: bytes | None
        content = self._added.get(token_id)
        if content is not None:
            out = content.encode() if content and set(content) <= _PLAIN_ASCII else None
        else:
            piece = self._tok.id_to_token(token_id)
            table = self._table
            out = (bytes(table[c] for c in piece)
                   if piece and all(c in table for c in piece) else None)  # fmt: skip
        self._cache[token_id] = out
        return out

