"""String and token stops (the specification, "String stops" and "Token and timing
observation").

String stops match the incremental decoded text, reasoning and tool envelopes included,
before presentation. The first completed match wins: the one whose end comes earliest in
the text, ties broken by list order. It removes the stop and everything after it, text of
the same sampled token included. Text that could still begin a stop is held until
resolved; EOS or the output limit flushes it. Token stops match sampled ids before
detokenization; matched ids are omitted from presentation and a pending prefix of a stop
sequence is held until resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import StopValidationError

MAX_STOP_STRINGS = 4
MAX_STOP_BYTES = 4096
MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class StopSpec:
    """A request's validated stops."""

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    token_sequences: tuple[tuple[int, ...], ...] = ()

    @property
    def needs_host_stop_barrier(self) -> bool:
        """String stops need the host-stop scheduler barrier: width one and one outstanding
        round while the request is active, so the worker resolves a match before
        submitting another round."""
        return bool(self.strings)

    @property
    def has_host_stops(self) -> bool:
        """Any host stop (string or token): the request needs completion feedback."""
        return bool(self.strings or self.token_ids or self.token_sequences)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token(value: Any, field: str, vocab_size: int | None) -> int:
    if not _is_int(value):
        raise StopValidationError(field, f"token ids must be integers, got {value!r}")
    if value < 0 or (vocab_size is not None and value >= vocab_size):
        raise StopValidationError(field, f"token id {value} is outside the vocabulary")
    return value


def parse_stops(
    stop: Any = None,
    stop_token_ids: Any = None,
    stop_token_sequences: Any = None,
    *,
    vocab_size: int | None = None,
    structured_output: bool = False,
) -> StopSpec:
    """Validate a request's stop fields.

    Args:
        stop: null, one nonempty string, or an array of at most 4 nonempty strings
            totaling at most 4096 UTF-8 bytes; an empty array disables string stops.
        stop_token_ids: null or an array of vocabulary ids.
        stop_token_sequences: null or at most 16 arrays of 1 to 64 vocabulary ids.
        vocab_size: ids must be below it (None: unchecked).
        structured_output: the request has response_format or a forced tool choice.

    Returns:
        The validated stops.

    Raises:
        StopValidationError: naming the field and the violated limit.
    """
    if stop is None:
        strings: tuple[str, ...] = ()
    elif isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list):
        strings = tuple(stop)
        if len(strings) > MAX_STOP_STRINGS:
            raise StopValidationError(
                "stop", f"at most {MAX_STOP_STRINGS} strings are allowed, got {len(strings)}"
            )
    else:
        raise StopValidationError("stop", "must be null, a string or an array of strings")
    for s in strings:
        if not isinstance(s, str):
            raise StopValidationError("stop", f"stop strings must be strings, got {s!r}")
        if not s:
            raise StopValidationError("stop", "stop strings must be nonempty")
    total = sum(len(s.encode("utf-8")) for s in strings)
    if total > MAX_STOP_BYTES:
        raise StopValidationError(
            "stop", f"stop strings total {total} UTF-8 bytes; the limit is {MAX_STOP_BYTES}"
        )

    if stop_token_ids is None:
        ids: tuple[int, ...] = ()
    elif isinstance(stop_token_ids, list):
        ids = tuple(_token(t, "stop_token_ids", vocab_size) for t in stop_token_ids)
    else:
        raise StopValidationError("stop_token_ids", "must be null or an array of integers")

    if stop_token_sequences is None:
        seqs: tuple[tuple[int, ...], ...] = ()
    elif isinstance(stop_token_sequences, list):
        if len(stop_token_sequences) > MAX_STOP_SEQUENCES:
            raise StopValidationError(
                "stop_token_sequences",
                f"at most {MAX_STOP_SEQUENCES} sequences are allowed, "
                f"got {len(stop_token_sequences)}",
            )
        out = []
        for seq in stop_token_sequences:
            if not isinstance(seq, list) or not seq:
                raise StopValidationError(
                    "stop_token_sequences", "each sequence must be a nonempty array of ids"
                )
            if len(seq) > MAX_STOP_SEQUENCE_TOKENS:
                raise StopValidationError(
                    "stop_token_sequences",
                    f"a sequence holds at most {MAX_STOP_SEQUENCE_TOKENS} tokens, got {len(seq)}",
                )
            out.append(tuple(_token(t, "stop_token_sequences", vocab_size) for t in seq))
        seqs = tuple(out)
    else:
        raise StopValidationError("stop_token_sequences", "must be null or an array of arrays")

    if strings and (ids or seqs):
        raise StopValidationError(
            "stop", "string stops cannot be combined with stop_token_ids or stop_token_sequences"
        )
    if strings and structured_output:
        raise StopValidationError("stop", "string stops cannot be combined with structured output")
    return StopSpec(strings, ids, seqs)


Piece = tuple[int, str]  # (token id or -1 for part of a token, its decoded text)


def first_stop(text: str, stops: Sequence[str]) -> tuple[int, int, int] | None:
    """The stop string that text completes first: (end, index in `stops`, start) of the
    match ending earliest (ties: the earlier listed stop), or None. The one matching rule
    of `StringStopMatcher` and of a response naming the stop that ended it."""
    best: tuple[int, int, int] | None = None
    for order, stop in enumerate(stops):
        start = text.find(stop)
        if start >= 0 and (best is None or (start + len(stop), order) < best[:2]):
            best = (start + len(stop), order, start)
    return best


class StringStopMatcher:
    """Finds the first completed stop string in incrementally decoded text.

    Pieces are held whole while any of their text could begin a stop; a piece cut by a
    match keeps only its text before the stop and loses its token identity (-1).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._held: list[Piece] = []

    def feed(self, token_id: int, text: str) -> tuple[list[Piece], bool]:
        """Add one token's text.

        Returns:
            (pieces now safe to present, whether a stop matched). After a match the
            pieces are the text before the stop and the matcher must not be fed again.
        """
        self._held.append((token_id, text))
        buf = "".join(t for _, t in self._held)
        best = first_stop(buf, self._stops)
        if best is not None:
            released = self._release_before(best[2], cut=True)
            self._held = []
            return released, True
        return self._release_before(len(buf) - self._held_suffix(buf), cut=False), False

    def flush(self) -> list[Piece]:
        """EOS or the output limit: the held text is not a stop."""
        held, self._held = self._held, []
        return held

    def _held_suffix(self, buf: str) -> int:
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:k]):
                    best = k
                    break
        return best

    def _release_before(self, limit: int, cut: bool) -> list[Piece]:
        """Release whole held pieces ending at or before char `limit`; with `cut`, also
        the part of the piece that straddles it."""
        out: list[Piece] = []
        pos = 0
        keep = 0
        for i, (tid, text) in enumerate(self._held):
            end = pos + len(text)
            if end <= limit:
                out.append((tid, text))
                keep = i + 1
            else:
                if cut and limit > pos:
                    out.append((-1, text[: limit - pos]))
                break
            pos = end
        self._held = self._held[keep:]
        return out


class TokenStopMatcher:
    """Matches stop token ids and stop token sequences on sampled ids."""

    def __init__(self, token_ids: Sequence[int], sequences: Sequence[Sequence[int]]) -> None:
        self._seqs = [(t,) for t in token_ids] + [tuple(s) for s in sequences]
        self._held: list[int] = []

    def feed(self, token_id: int) -> tuple[list[int], bool]:
        """Add one sampled id.

        Returns:
            (ids now safe to present, whether a stop matched). A match omits its ids; the
            longest stop completed by this id is the one removed.
        """
        self._held.append(token_id)
        held = self._held
        done = [s for s in self._seqs if len(s) <= len(held) and tuple(held[-len(s) :]) == s]
        if done:
            longest = max(len(s) for s in done)
            released = held[: len(held) - longest]
            self._held = []
            return released, True
        keep = 0
        for s in self._seqs:
            for k in range(min(len(s) - 1, len(held)), keep, -1):
                if tuple(held[-k:]) == s[:k]:
                    keep = k
                    break
        released = held[: len(held) - keep]
        self._held = held[len(held) - keep :]
        return released, False

    def flush(self) -> list[int]:
        """EOS or the output limit: the held ids are not a stop."""
        held, self._held = self._held, []
        return held
