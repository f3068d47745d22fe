"""Reasoning parsers: split generated text into reasoning and answer pieces.

A reasoning parser is incremental: `feed(token_id, text)` per generated token and
`finish()` at the end, each returning `ReasoningDelta`s and `AnswerPiece`s (the answer goes
on to the tool parser). The non-streaming result is this path fed everything at once.

Think-tag rules (the specification, "Frontend implementations"):
- the open delimiter starts reasoning only before any answer text (or the prompt opened it);
- a close delimiter ends reasoning once; a later close (or open) is protocol markup and is
  dropped, never emitted as content; single-token delimiters delimit only as that token;
- a reasoning terminal marker (the tool syntax's call opener) ends reasoning and is passed
  on, with everything after it, to the tool parser; whitespace right before it separates
  reasoning from the call (syntax, as on the content side) and is dropped, so reasoning
  text is streamed without its trailing whitespace until more text follows;
- inside a structured (grammar-constrained) answer nothing is scanned: literal delimiters
  stay answer text.
"""

from __future__ import annotations

import enum

from .deltas import AnswerPiece, ReasoningDelta
from .markup import Scan, TokenMarks
from .syntax import AssistantBoundaries, ReasoningSyntax

ReasoningOutput = ReasoningDelta | AnswerPiece


class ReasoningStart(enum.Enum):
    """Where output starts, from the rendered prompt's open assistant envelope."""

    UNDECIDED = "undecided"  # the output may open reasoning with the open delimiter
    IN_REASONING = "in_reasoning"  # the template pre-opened reasoning
    ANSWER = "answer"  # the template pre-closed reasoning (or the model has none)


def prompt_tail(prompt_text: str, boundaries: AssistantBoundaries) -> str | None:
    """The open assistant envelope of a rendered prompt, or None if there is none.

    Only text after the last message end marker can open reasoning (completed user, tool
    and assistant messages are excluded); the envelope starts after the last assistant
    header in that text.
    """
    start = 0
    for marker in boundaries.message_end_markers:
        pos = prompt_text.rfind(marker)
        if pos >= 0:
            start = max(start, pos + len(marker))
    tail = prompt_text[start:]
    header = boundaries.assistant_header
    if header:
        pos = tail.rfind(header)
        if pos < 0:
            return None
        tail = tail[pos + len(header) :]
    return tail


def initial_reasoning_state(
    prompt_text: str, syntax: ReasoningSyntax, boundaries: AssistantBoundaries
) -> ReasoningStart:
    """Initial think-tag state from the rendered prompt (see `prompt_tail`)."""
    tail = prompt_tail(prompt_text, boundaries)
    if tail is None or not syntax.open:
        return ReasoningStart.UNDECIDED
    opened, closed = tail.rfind(syntax.open), tail.rfind(syntax.close) if syntax.close else -1
    if opened >= 0 and closed < opened:
        return ReasoningStart.IN_REASONING
    if closed >= 0:
        return ReasoningStart.ANSWER
    return ReasoningStart.UNDECIDED


class PassthroughReasoning:
    """REASONING_PARSER_NONE (and the recipient-frame pairing): everything is answer."""

    def __init__(self) -> None:
        pass

    def feed(self, token_id: int, text: str) -> list[ReasoningOutput]:
        return [AnswerPiece(token_id, text)]

    def finish(self) -> list[ReasoningOutput]:
        return []


class _State(enum.Enum):
    UNDECIDED = 0
    REASONING = 1
    SEPARATOR = 2  # just after the close: dropping the answer separator
    ANSWER = 3


class ThinkTagReasoning:
    """Open/close delimited reasoning (REASONING_PARSER_THINK_TAGS and XTML_THINK)."""

    def __init__(
        self,
        syntax: ReasoningSyntax,
        marks: TokenMarks,
        start: ReasoningStart = ReasoningStart.UNDECIDED,
        structured_answer: bool = False,
    ) -> None:
        self._syntax = syntax
        self._marks = marks
        self._scan = Scan(marks)
        self._structured = structured_answer
        self._state = {
            ReasoningStart.UNDECIDED: _State.UNDECIDED,
            ReasoningStart.IN_REASONING: _State.REASONING,
            ReasoningStart.ANSWER: _State.ANSWER,
        }[start]
        self._leading_ws = ""  # whitespace held while undecided
        self._trailing_ws = ""  # reasoning's trailing whitespace, held until more text
        self._sep_pos = 0
        self._own = {m for m in (syntax.open, syntax.close) if m}
        self._terminal = tuple(m for m in syntax.terminal_markers if m)

    def feed(self, token_id: int, text: str) -> list[ReasoningOutput]:
        self._scan.push(token_id, text)
        return self._drain(final=False)

    def finish(self) -> list[ReasoningOutput]:
        out = self._drain(final=True)
        self._flush_reasoning_ws(out)
        if self._leading_ws:
            out.append(AnswerPiece(-1, self._leading_ws))
            self._leading_ws = ""
        return out

    def _wanted(self) -> tuple[str, ...]:
        s = self._syntax
        if self._state is _State.UNDECIDED:
            return (s.open, *self._terminal)
        if self._state is _State.REASONING:
            return (s.close, *self._terminal)
        if self._structured:
            return ()
        return (s.close,)

    def _drain(self, final: bool) -> list[ReasoningOutput]:
        out: list[ReasoningOutput] = []
        while (step := self._scan.next(self._wanted(), final)) is not None:
            if step.text:
                self._text(step.text, out)
            if step.marker is not None:
                self._marker(step.marker, step.token_id, out)
        return out

    def _text(self, text: str, out: list[ReasoningOutput]) -> None:
        if self._state is _State.UNDECIDED:
            if not text.strip():
                self._leading_ws += text
                return
            text, self._leading_ws = self._leading_ws + text, ""
            self._state = _State.ANSWER
        if self._state is _State.REASONING:
            body = text.rstrip()
            if not body:
                self._trailing_ws += text
                return
            out.append(ReasoningDelta(self._trailing_ws + body))
            self._trailing_ws = text[len(body):]
            return
        if self._state is _State.SEPARATOR:
            sep = self._syntax.answer_separator
            i = 0
            while i < len(text) and self._sep_pos < len(sep) and text[i] == sep[self._sep_pos]:
                i += 1
                self._sep_pos += 1
            text = text[i:]
            if not text and self._sep_pos < len(sep):
                return
            self._state = _State.ANSWER
        if text:
            out.append(AnswerPiece(-1, text))

    def _marker(self, marker: str, token_id: int, out: list[ReasoningOutput]) -> None:
        state = self._state
        if marker in self._terminal and state in (_State.UNDECIDED, _State.REASONING):
            self._leading_ws = self._trailing_ws = ""  # separation before the call: syntax
            self._state = _State.ANSWER
            out.append(AnswerPiece(token_id, marker))
            return
        if marker not in self._own:
            # Another syntax's single-token marker: plain text to this parser.
            if state is _State.REASONING:
                self._flush_reasoning_ws(out)
                out.append(ReasoningDelta(marker))
            else:
                if state is _State.UNDECIDED:
                    self._text_flush_ws(out)
                self._state = _State.ANSWER
                out.append(AnswerPiece(token_id, marker))
            return
        if marker == self._syntax.open and state is _State.UNDECIDED:
            self._leading_ws = ""
            self._state = _State.REASONING
        elif marker == self._syntax.close and state in (_State.UNDECIDED, _State.REASONING):
            self._flush_reasoning_ws(out)  # before a close delimiter it stays reasoning
            self._leading_ws = ""
            self._state = _State.SEPARATOR if self._syntax.answer_separator else _State.ANSWER
            self._sep_pos = 0
        # Any other delimiter occurrence is protocol markup: dropped.

    def _flush_reasoning_ws(self, out: list[ReasoningOutput]) -> None:
        if self._trailing_ws:
            out.append(ReasoningDelta(self._trailing_ws))
            self._trailing_ws = ""

    def _text_flush_ws(self, out: list[ReasoningOutput]) -> None:
        if self._leading_ws:
            out.append(AnswerPiece(-1, self._leading_ws))
            self._leading_ws = ""
