"""Syntax markers in generated output: the token-versus-text rule and incremental scanning.

Rule (the specification, "Frontend implementations"): a marker that the frontend tokenizer
encodes as one token delimits output only when generated as that token; any other spelling
of it is text. A marker that the tokenizer splits into several tokens can only be spelled
as text, so it is matched in the decoded text, across token boundaries. Tool tags (not
delimiters in the specification's sense) are token-bound only when their one token is an
added token, since an ordinary token such as ">" also occurs inside longer tokens.
See docs/frontend-syntax.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenMarks:
    """The syntax markers that are single tokens: token id <-> marker text."""

    by_id: Mapping[int, str]
    by_text: Mapping[str, int]

    def token_bound(self, marker: str) -> bool:
        """True when `marker` delimits only as its token (never as text)."""
        return marker in self.by_text

    @staticmethod
    def none() -> TokenMarks:
        return TokenMarks({}, {})


def resolve_marks(tokenizer, delimiters: Iterable[str], tags: Iterable[str] = ()) -> TokenMarks:
    """Find the markers that delimit only as their token (done once at startup).

    Args:
        tokenizer: the frontend `tokenizers.Tokenizer`.
        delimiters: reasoning delimiters and frame controls: token-bound when the
            tokenizer encodes them as exactly one token (the specification's rule).
        tags: other syntax strings: token-bound only when that one token is an added
            token. An ordinary vocabulary token such as ">" also occurs inside longer
            tokens (">\n", "\">"), so such tags are matched as text.
    """
    added = set(tokenizer.get_added_tokens_decoder())
    by_id: dict[int, str] = {}
    for marker, need_added in [*((d, False) for d in delimiters), *((t, True) for t in tags)]:
        if not marker or marker in by_id.values():
            continue
        ids = tokenizer.encode(marker, add_special_tokens=False).ids
        if len(ids) != 1 or tokenizer.decode(ids, skip_special_tokens=False) != marker:
            continue
        if need_added and ids[0] not in added:
            continue
        by_id[ids[0]] = marker
    return TokenMarks(by_id, {m: i for i, m in by_id.items()})


@dataclass(frozen=True, slots=True)
class Found:
    """One scanning step: `text` before the marker, then `marker` (or None), and the
    token id when the marker arrived as its token (-1 for a text match or plain text)."""

    text: str
    marker: str | None
    token_id: int = -1


class Scan:
    """Pending parser input: text runs and single-token markers, in generation order.

    The owning state machine asks `next(wanted, final)` repeatedly; each call consumes
    text up to the earliest wanted text marker, or a token marker at the front. Text that
    could still become a wanted text marker is held until resolved (or `final`).
    """

    def __init__(self, marks: TokenMarks) -> None:
        self._marks = marks
        self._items: list[str | tuple[int, str]] = []  # str: text run; tuple: token marker

    def push(self, token_id: int, text: str) -> None:
        """Append one token's text (a marker token becomes a marker item)."""
        marker = self._marks.by_id.get(token_id)
        if marker is not None:
            self._items.append((token_id, marker))
        elif text:
            if self._items and isinstance(self._items[-1], str):
                self._items[-1] += text
            else:
                self._items.append(text)

    def push_text(self, text: str) -> None:
        """Append text that can never be a token marker (e.g. a fragment of a token)."""
        if text:
            if self._items and isinstance(self._items[-1], str):
                self._items[-1] += text
            else:
                self._items.append(text)

    def empty(self) -> bool:
        return not self._items

    def next(self, wanted: Iterable[str], final: bool = False) -> Found | None:
        """Consume the next step, or return None when more input is needed."""
        if not self._items:
            return None
        head = self._items[0]
        if isinstance(head, tuple):
            self._items.pop(0)
            return Found("", head[1], head[0])
        text_markers = [w for w in wanted if w and not self._marks.token_bound(w)]
        best: tuple[int, int, str] | None = None  # (position, -length, marker)
        for w in text_markers:
            pos = head.find(w)
            if pos >= 0 and (best is None or (pos, -len(w)) < best[:2]):
                best = (pos, -len(w), w)
        if best is not None:
            pos, neg_len, w = best
            rest = head[pos - neg_len :]
            self._set_head(rest)
            return Found(head[:pos], w)
        closed = final or len(self._items) > 1
        hold = 0 if closed else _held_suffix(head, text_markers)
        if hold == len(head):
            return None
        self._set_head(head[len(head) - hold :])
        return Found(head[: len(head) - hold], None)

    def _set_head(self, rest: str) -> None:
        if rest:
            self._items[0] = rest
        else:
            self._items.pop(0)


def _held_suffix(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:k]):
                best = k
                break
    return best
