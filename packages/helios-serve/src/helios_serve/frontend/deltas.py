"""Presentation deltas and the final message: the data the output pipeline hands out."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text (OpenAI `reasoning_content`)."""

    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Visible answer text (OpenAI `content`)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """First delta of a tool call: its index in the response, unique id and name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A fragment of a tool call's JSON arguments string."""

    index: int
    text: str


Delta = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArguments


@dataclass(frozen=True, slots=True)
class AnswerPiece:
    """Reasoning-parser output that is not reasoning: text for the tool parser.

    `token_id` is the generating token when the piece is that token's whole text, else -1,
    so the tool parser can apply the token-versus-text rule to its own markers.
    """

    token_id: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A completed tool call of the final message (`type` is always "function")."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The non-streaming message: exactly the accumulation of the streamed deltas.

    finish_reason is "stop", "length" or "tool_calls".
    """

    reasoning_content: str | None
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str


def coalesce(deltas: list[Delta]) -> list[Delta]:
    """Merge adjacent deltas of one kind (and one call index); drop empty text."""
    out: list[Delta] = []
    for d in deltas:
        if isinstance(d, ToolCallStart):
            out.append(d)
            continue
        if not d.text:
            continue
        last = out[-1] if out else None
        if type(last) is type(d) and (
            not isinstance(d, ToolCallArguments) or last.index == d.index  # type: ignore[union-attr]
        ):
            out[-1] = (
                ToolCallArguments(d.index, last.text + d.text)  # type: ignore[union-attr]
                if isinstance(d, ToolCallArguments)
                else type(d)(last.text + d.text)  # type: ignore[union-attr]
            )
        else:
            out.append(d)
    return out


def accumulate(deltas: list[Delta], finish_reason: str) -> ChatResult:
    """Accumulate deltas the way an OpenAI client does (tool calls by index)."""
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for d in deltas:
        if isinstance(d, ReasoningDelta):
            reasoning.append(d.text)
        elif isinstance(d, ContentDelta):
            content.append(d.text)
        elif isinstance(d, ToolCallStart):
            calls[d.index] = [d.id, d.name, ""]
        else:
            calls[d.index][2] += d.text
    return ChatResult(
        reasoning_content="".join(reasoning) or None,
        content="".join(content) or None,
        tool_calls=tuple(ToolCall(*calls[i]) for i in sorted(calls)),
        finish_reason=finish_reason,
    )
