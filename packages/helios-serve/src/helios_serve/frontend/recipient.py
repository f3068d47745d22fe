"""Recipient-header frames: REASONING_PARSER_RECIPIENT_HEADER paired with
TOOL_PARSER_ATEM_RECIPIENT_HEADERS (docs/frontend-syntax.md, "ATEM").

Output is a sequence of frames `<|start|>assistant to=RECIPIENT<|message|>BODY` ended by
`<|eom|>` (an internal message; another header may follow) or by the end of generation
(the core's EOS ids). The self recipient carries reasoning; commentary and user carry
visible content; the generic tool recipient (`functions`) accepts one invocation of any
registered name, a named tool recipient (`functions.NAME`) only that name. Header controls
delimit frames only when observed as their tokenizer tokens (the token-versus-text rule).
The two selectors are paired because this one parser consumes complete frames.

Whitespace at the end of a reasoning body right before the next frame's start control
separates the frames (syntax, as whitespace before a call is on the content side) and is
dropped; reasoning text is therefore streamed without trailing whitespace until more text
or the body's end marker follows.
"""

from __future__ import annotations

from .deltas import ContentDelta, Delta, ReasoningDelta
from .markup import Scan, TokenMarks
from .syntax import AssistantBoundaries, RecipientSyntax, ToolSyntax
from .tools import CallSink, TaggedToolParser


class RecipientFrameParser:
    """Incremental frame parser producing reasoning, content and tool-call deltas.

    Args:
        tools: the ATEM call-block syntax used inside tool frames.
        recipients: recipient frame syntax.
        boundaries: message end markers and the assistant header.
        marks: single-token markers.
        sink: call numbering and the registered tools.
        prompt_text: the rendered prompt; an open header or body at its end is where the
            output continues (the generated recipient suffix, or inside that body).
    """

    def __init__(
        self,
        tools: ToolSyntax,
        recipients: RecipientSyntax,
        boundaries: AssistantBoundaries,
        marks: TokenMarks,
        sink: CallSink,
        prompt_text: str = "",
    ) -> None:
        self._tools = tools
        self._r = recipients
        self._marks = marks
        self._sink = sink
        self._scan = Scan(marks)
        self._ends = tuple(
            m for m in (recipients.internal_message_end, *boundaries.message_end_markers) if m
        )
        self._role = boundaries.assistant_header.removeprefix(recipients.frame_start)
        self._state = "outside"  # outside | header | reasoning | content | tool | drop
        self._header = ""
        self._reasoning_ws = ""  # a reasoning body's trailing whitespace, held
        self._tool: TaggedToolParser | None = None
        self._resume(prompt_text, boundaries)

    def _resume(self, prompt_text: str, boundaries: AssistantBoundaries) -> None:
        start = 0
        for marker in self._ends:
            pos = prompt_text.rfind(marker)
            if pos >= 0:
                start = max(start, pos + len(marker))
        tail = prompt_text[start:]
        pos = tail.rfind(boundaries.assistant_header) if boundaries.assistant_header else -1
        if pos < 0:
            return
        header = self._role + tail[pos + len(boundaries.assistant_header) :]
        opened = header.find(self._r.message_open)
        if opened < 0:
            self._state, self._header = "header", header
        else:
            self._open_body(header[:opened])

    def feed(self, token_id: int, text: str) -> list[Delta]:
        self._scan.push(token_id, text)
        return self._drain(False)

    def finish(self) -> list[Delta]:
        out = self._drain(True)
        self._end_body(out)
        return out

    def _wanted(self) -> tuple[str, ...]:
        if self._state == "header":
            return (self._r.message_open, self._r.frame_start)
        return (self._r.frame_start, *self._ends)

    def _drain(self, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while (step := self._scan.next(self._wanted(), final)) is not None:
            if step.text:
                self._text(step.text, step.token_id, out)
            if step.marker is not None:
                self._marker(step.marker, step.token_id, out)
        return out

    def _text(self, text: str, token_id: int, out: list[Delta]) -> None:
        st = self._state
        if st == "header":
            self._header += text
        elif st == "reasoning":
            body = text.rstrip()
            if not body:
                self._reasoning_ws += text
                return
            out.append(ReasoningDelta(self._reasoning_ws + body))
            self._reasoning_ws = text[len(body):]
        elif st in ("content", "outside"):
            out.append(ContentDelta(text))
        elif st == "tool":
            assert self._tool is not None
            out.extend(self._tool.feed(token_id, text))

    def _marker(self, marker: str, token_id: int, out: list[Delta]) -> None:
        r = self._r
        if marker == r.frame_start:
            self._reasoning_ws = ""  # separation before the next frame: syntax
            self._end_body(out)
            self._state, self._header = "header", ""
        elif self._state == "header" and marker == r.message_open:
            self._open_body(self._header)
        elif marker in self._ends and self._state != "header":
            self._end_body(out)
            self._state = "outside"
        elif self._state == "tool":
            # A call-block marker token: the tool parser applies the rule itself.
            assert self._tool is not None
            out.extend(self._tool.feed(token_id, marker))
        elif self._state in ("reasoning", "content") and marker not in (r.message_open,):
            self._flush_reasoning_ws(out)
            if self._state == "reasoning":
                out.append(ReasoningDelta(marker))
            else:
                self._text(marker, token_id, out)
        # Any other control token is protocol markup: dropped.

    def _open_body(self, header: str) -> None:
        r = self._r
        header = header.strip()
        if not header.startswith(self._role):
            self._state = "drop"
            return
        rest = header[len(self._role) :]
        recipient = rest.strip()
        if rest.startswith(r.recipient_prefix) or rest.startswith(r.recipient_prefix.strip()):
            recipient = rest.strip().removeprefix(r.recipient_prefix.strip()).strip()
        if not recipient:
            recipient = r.answer_recipient
        named_prefix = r.tool_recipient + r.named_tool_separator
        if recipient == r.reasoning_recipient:
            self._state = "reasoning"
        elif recipient in r.content_recipients:
            self._state = "content"
        elif recipient == r.tool_recipient or recipient.startswith(named_prefix):
            required = recipient[len(named_prefix) :] if recipient != r.tool_recipient else None
            self._tool = TaggedToolParser(
                self._tools,
                self._marks,
                self._sink,
                emit_content=False,
                required_name=required,
                max_calls=1,
            )
            self._state = "tool"
        else:
            self._state = "drop"

    def _flush_reasoning_ws(self, out: list[Delta]) -> None:
        if self._reasoning_ws:
            out.append(ReasoningDelta(self._reasoning_ws))
            self._reasoning_ws = ""

    def _end_body(self, out: list[Delta]) -> None:
        self._flush_reasoning_ws(out)
        if self._tool is not None:
            out.extend(self._tool.finish())
            self._tool = None
        self._state = "outside"
