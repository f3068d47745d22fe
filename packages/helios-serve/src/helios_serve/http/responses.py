"""OpenAI response shapes: chat.completion objects and chat.completion.chunk SSE events.

Pure functions over plain data. Observation fields follow model-contract.md, "Token and
timing observation": prompt_token_ids (top level; the first SSE chunk), choices[0]
.token_ids and .token_timestamps_ns, reused_prompt_tokens on observed terminal
responses, and the performance object on timed ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from helios_serve.events import Finished
from helios_serve.frontend.deltas import (
    ChatResult,
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)

DONE = b"data: [DONE]\n\n"


@dataclass
class ResponseContext:
    """Per-response constants and observation state."""

    id: str
    created: int
    model: str
    prompt_token_ids: tuple[int, ...]
    observe_ids: bool
    observe_timestamps: bool
    include_usage: bool
    ingress_ns: int = 0
    enqueue_ns: int = 0
    capacity_param: str | None = None  # the field a capacity rejection names
    token_ids: list[int] = field(default_factory=list)
    token_timestamps_ns: list[int] = field(default_factory=list)
    # The bytes around a presentation chunk's delta object (`delta_chunks`), made once.
    delta_envelope: tuple[bytes, bytes] | None = None


def usage(finished: Finished) -> dict[str, Any]:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.reused_prompt_tokens},
    }


def _observed_terminal(ctx: ResponseContext, finished: Finished, body: dict[str, Any]) -> None:
    if ctx.observe_ids:
        body["reused_prompt_tokens"] = finished.reused_prompt_tokens
    if ctx.observe_timestamps:
        body["performance"] = {
            "ingress_ns": ctx.ingress_ns,
            "enqueue_ns": ctx.enqueue_ns,
            "reused_prompt_tokens": finished.reused_prompt_tokens,
        }


def _tool_calls(result: ChatResult) -> list[dict[str, Any]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in result.tool_calls
    ]


def completion(ctx: ResponseContext, result: ChatResult, finished: Finished) -> dict[str, Any]:
    """The non-streaming chat.completion object."""
    calls = _tool_calls(result)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.content if result.content is not None else (None if calls else ""),
    }
    if result.reasoning_content is not None:
        message["reasoning_content"] = result.reasoning_content
    if calls:
        message["tool_calls"] = calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finished.reason.value,
    }
    if ctx.observe_ids:
        choice["token_ids"] = list(ctx.token_ids)
    if ctx.observe_timestamps:
        choice["token_timestamps_ns"] = list(ctx.token_timestamps_ns)
    body: dict[str, Any] = {
        "id": ctx.id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": [choice],
        "usage": usage(finished),
    }
    if ctx.observe_ids:
        body["prompt_token_ids"] = list(ctx.prompt_token_ids)
    _observed_terminal(ctx, finished, body)
    return body


def _event(body: dict[str, Any]) -> bytes:
    return (
        b"data: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
    )


def _chunk(ctx: ResponseContext, choices: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": ctx.id,
        "object": "chat.completion.chunk",
        "created": ctx.created,
        "model": ctx.model,
        "choices": choices,
    }
    if ctx.include_usage:
        body["usage"] = None
    return body


def _choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def role_chunk(ctx: ResponseContext) -> bytes:
    """The first SSE chunk: the assistant role (and the prompt ids when observed)."""
    body = _chunk(ctx, [_choice({"role": "assistant", "content": ""})])
    if ctx.observe_ids:
        body["prompt_token_ids"] = list(ctx.prompt_token_ids)
    return _event(body)


def observation_chunk(ctx: ResponseContext, token_id: int, timestamp_ns: int | None) -> bytes:
    """One metadata-only chunk per generated id: delta {} and choices[0].token_ids."""
    choice = _choice({})
    choice["token_ids"] = [token_id]
    if timestamp_ns is not None:
        choice["token_timestamps_ns"] = [timestamp_ns]
    return _event(_chunk(ctx, [choice]))


def delta_dict(delta: Any) -> dict[str, Any]:
    """A frontend presentation delta as an OpenAI chunk delta."""
    if isinstance(delta, ContentDelta):
        return {"content": delta.text}
    if isinstance(delta, ReasoningDelta):
        return {"reasoning_content": delta.text}
    if isinstance(delta, ToolCallStart):
        return {
            "tool_calls": [
                {
                    "index": delta.index,
                    "id": delta.id,
                    "type": "function",
                    "function": {"name": delta.name, "arguments": ""},
                }
            ]
        }
    if isinstance(delta, ToolCallArguments):
        return {"tool_calls": [{"index": delta.index, "function": {"arguments": delta.text}}]}
    raise TypeError(f"not a presentation delta: {delta!r}")


_SLOT = "\x00delta\x00"  # stands for the delta object while the envelope is encoded


def delta_chunks(ctx: ResponseContext, deltas: Sequence[Any]) -> bytes:
    """One chunk per presentation delta (the bytes `_event(_chunk(...))` gives).

    Every chunk of a response shares its envelope (id, created, model, usage: null), so it
    is encoded once per response and only the delta object is encoded per chunk: the
    streaming path runs this once per token.
    """
    if ctx.delta_envelope is None:
        encoded = _event(_chunk(ctx, [_choice(_SLOT)]))  # type: ignore[arg-type]
        head, _, tail = encoded.partition(json.dumps(_SLOT).encode())
        ctx.delta_envelope = (head, tail)
    head, tail = ctx.delta_envelope
    return b"".join(
        head + json.dumps(delta_dict(d), separators=(",", ":"), ensure_ascii=False).encode()
        + tail
        for d in deltas
    )


def terminal_chunks(ctx: ResponseContext, finished: Finished) -> bytes:
    """The finish chunk, the usage-only chunk when include_usage, and [DONE].

    With include_usage the usage arrives in a final chunk with choices=[]; otherwise an
    observed stream carries usage on its terminal choice chunk.
    """
    finish = _chunk(ctx, [_choice({}, finished.reason.value)])
    out = []
    if ctx.include_usage:
        out.append(_event(finish))
        last = _chunk(ctx, [])
        last["usage"] = usage(finished)
        _observed_terminal(ctx, finished, last)
        out.append(_event(last))
    else:
        if ctx.observe_ids:
            finish["usage"] = usage(finished)
            _observed_terminal(ctx, finished, finish)
        out.append(_event(finish))
    out.append(DONE)
    return b"".join(out)


def error_event(body: dict[str, Any]) -> bytes:
    """One terminal SSE error event (no [DONE] follows)."""
    return _event(body)
