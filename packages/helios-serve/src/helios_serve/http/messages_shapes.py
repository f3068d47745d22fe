"""Anthropic Messages response shapes: the `message` object and its SSE events.

Pure functions over the chat path's presentation deltas (`frontend.deltas`). Consecutive
deltas of one kind make one content block: reasoning a `thinking` block, answer text a
`text` block, a tool call (start and argument fragments of one index) a `tool_use` block
whose `input` is its arguments parsed as JSON ({} when a call cut by max_tokens left them
incomplete). The JSON message is built by replaying the stream's own events
(`BlockEvents` then `reassemble`), so a streamed response reassembles to exactly the
non-streamed one.

    event: message_start        {"type": "message_start", "message": {... "content": []}}
    event: ping                 {"type": "ping"}
    event: content_block_start  {"type": ..., "index": i, "content_block": {...}}
    event: content_block_delta  {"index": i, "delta": text_delta | thinking_delta
                                                      | input_json_delta}
    event: content_block_stop   {"index": i}
    event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": ...}
    event: message_stop
    event: error                {"type": "error", "error": {"type", "message"}}

stop_reason: `max_tokens` (output limit), `stop_sequence` (a stop string matched; named in
`stop_sequence`), `tool_use` (the message calls tools), else `end_turn`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from helios_serve.events import Finished, FinishReason, Output
from helios_serve.frontend.deltas import (
    ContentDelta,
    Delta,
    ReasoningDelta,
    ToolCallStart,
)
from helios_serve.frontend.detokenizer import IncrementalDetokenizer
from helios_serve.frontend.stops import first_stop
from helios_serve.http.errors import ApiError
from helios_serve.http.messages_errors import anthropic_body
from helios_serve.http.responses import ChoiceRecord, ResponseContext, usage

_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def sse(name: str, body: dict[str, Any]) -> bytes:
    """One named SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + _ENCODE(body).encode() + b"\n\n"


def _block_kind(delta: Delta) -> tuple[str, int]:
    if isinstance(delta, ReasoningDelta):
        return "thinking", -1
    if isinstance(delta, ContentDelta):
        return "text", -1
    return "tool_use", delta.index  # type: ignore[union-attr]


class BlockEvents:
    """Turns presentation deltas into content-block events (dicts), one block open at a
    time; indexes count the blocks of the message from 0."""

    def __init__(self) -> None:
        self.open: tuple[str, int] | None = None  # (kind, tool call index)
        self.index = -1

    def feed(self, deltas: Sequence[Delta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for delta in deltas:
            kind = _block_kind(delta)
            if isinstance(delta, ToolCallStart):
                self._close(out)
                self._start(out, kind, {"type": "tool_use", "id": delta.id, "name": delta.name,
                                        "input": {}})  # fmt: skip
                continue
            if not delta.text:  # type: ignore[union-attr]
                continue
            if kind != self.open:
                if kind[0] == "tool_use":  # (never: a call's start precedes its arguments)
                    continue
                self._close(out)
                self._start(out, kind, {"type": "thinking", "thinking": "", "signature": ""}
                            if kind[0] == "thinking" else {"type": "text", "text": ""})
            if isinstance(delta, ReasoningDelta):
                piece = {"type": "thinking_delta", "thinking": delta.text}
            elif isinstance(delta, ContentDelta):
                piece = {"type": "text_delta", "text": delta.text}
            else:
                piece = {"type": "input_json_delta", "partial_json": delta.text}  # type: ignore[union-attr]
            out.append({"type": "content_block_delta", "index": self.index, "delta": piece})
        return out

    def close(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        self._close(out)
        return out

    def _start(self, out: list[dict[str, Any]], kind: tuple[str, int],
               block: dict[str, Any]) -> None:  # fmt: skip
        self.index += 1
        self.open = kind
        out.append({"type": "content_block_start", "index": self.index, "content_block": block})

    def _close(self, out: list[dict[str, Any]]) -> None:
        if self.open is not None:
            out.append({"type": "content_block_stop", "index": self.index})
            self.open = None


def tool_input(arguments: str) -> dict[str, Any]:
    """A tool_use block's input: its JSON arguments, or {} when they are not a complete
    JSON object (a call cut by the output limit)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def reassemble(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a client accumulates from content-block events (tool_use input
    from its concatenated input_json_delta fragments, parsed by `tool_input`)."""
    blocks: list[dict[str, Any]] = []
    arguments: dict[int, str] = {}
    for e in events:
        if e["type"] == "content_block_start":
            blocks.append(dict(e["content_block"]))
        elif e["type"] == "content_block_delta":
            block, delta = blocks[e["index"]], e["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                arguments[e["index"]] = arguments.get(e["index"], "") + delta["partial_json"]
        elif e["type"] == "content_block_stop" and blocks[e["index"]]["type"] == "tool_use":
            blocks[e["index"]]["input"] = tool_input(arguments.get(e["index"], ""))
    return blocks


def stop_sequence(record: ChoiceRecord, stops: Sequence[str], tokenizer,
                  prompt_ids: Sequence[int], eos_ids: Sequence[int],
                  hidden_ids: frozenset[int] = frozenset()) -> str | None:  # fmt: skip
    """The stop string that ended a choice finished with `stop`, from its observed raw
    ids decoded as the output pipeline decodes them (the matcher's rule,
    `frontend.stops.first_stop`; `hidden_ids`, the frontend's special tokens without
    text, are skipped); None when EOS ended it."""
    if not stops or record.finished is None or record.finished.reason is not FinishReason.STOP:
        return None
    ids = record.token_ids
    if ids and ids[-1] in eos_ids:  # EOS ended it: no stop string matched
        return None
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    text = "".join(detok.push(i) for i in ids if i not in hidden_ids) + detok.flush()
    best = first_stop(text, stops)
    return stops[best[1]] if best is not None else None


class MessagesShapes:
    """The Anthropic bodies of one Messages response (one choice), JSON and SSE; the
    delivery layer (`http.delivery`) drives it as it drives the chat shapes.

    Args:
        ctx: the response constants (id, model, prompt ids).
        stops: the request's stop strings.
        tokenizer / eos_ids / hidden_ids: to name the stop string that ended the response
            (hidden_ids: `Frontend.hidden_ids`).
    """

    def __init__(self, ctx: ResponseContext, stops: Sequence[str], tokenizer,
                 eos_ids: Sequence[int], hidden_ids: frozenset[int] = frozenset()
                 ) -> None:  # fmt: skip
        self.ctx = ctx
        self.stops = tuple(stops)
        self.tokenizer = tokenizer
        self.eos_ids = tuple(eos_ids)
        self.hidden_ids = hidden_ids
        self.blocks = BlockEvents()

    def usage(self, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
        """Anthropic's usage: prompt tokens served from the prefix cache are
        `cache_read_input_tokens`, the others `input_tokens` (their sum is the prompt,
        what count_tokens says)."""
        u = usage(self.ctx, records)
        cached = u["prompt_tokens_details"]["cached_tokens"]
        return {"input_tokens": u["prompt_tokens"] - cached,
                "output_tokens": u["completion_tokens"], "cache_read_input_tokens": cached}

    def stop(self, records: Sequence[ChoiceRecord]) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of the finished response."""
        record = records[0]
        calls = any(isinstance(d, ToolCallStart) for d in record.deltas)
        assert record.finished is not None
        if record.finished.reason is FinishReason.LENGTH:
            return "max_tokens", None
        matched = stop_sequence(record, self.stops, self.tokenizer, self.ctx.prompts[0],
                                self.eos_ids, self.hidden_ids)  # fmt: skip
        if matched is not None:
            return "stop_sequence", matched
        if calls or record.finished.reason is FinishReason.TOOL_CALLS:
            return "tool_use", None
        return "end_turn", None

    def _message(self, content: list[dict[str, Any]], stop_reason: str | None,
                 stop_seq: str | None, use: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
        return {"id": self.ctx.id, "type": "message", "role": "assistant",
                "model": self.ctx.model, "content": content, "stop_reason": stop_reason,
                "stop_sequence": stop_seq, "usage": use}  # fmt: skip

    # -- JSON -------------------------------------------------------------------------

    def completion(self, records: Sequence[ChoiceRecord]) -> dict[str, Any]:
        """The non-streaming `message` object."""
        blocks = BlockEvents()
        events = blocks.feed(records[0].deltas) + blocks.close()
        content = reassemble(events)
        reason, seq = self.stop(records)
        return self._message(content, reason, seq, self.usage(records))

    # -- SSE --------------------------------------------------------------------------

    def first(self) -> bytes:
        start = self._message([], None, None, {"input_tokens": len(self.ctx.prompts[0]),
                                               "output_tokens": 0})  # fmt: skip
        return (sse("message_start", {"type": "message_start", "message": start})
                + sse("ping", {"type": "ping"}))  # fmt: skip

    def observation(self, index: int, token_id: int, timestamp_ns: int | None) -> bytes:
        return b""  # observed ids only name the matched stop sequence

    def output(self, out: Output, records: Sequence[ChoiceRecord]) -> bytes:
        return b"".join(sse(e["type"], e) for e in self.blocks.feed(out.deltas))

    def finish(self, finished: Finished, records: Sequence[ChoiceRecord]) -> bytes:
        out = [sse(e["type"], e) for e in self.blocks.close()]
        reason, seq = self.stop(records)
        out.append(sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": seq},
                                         "usage": self.usage(records)}))  # fmt: skip
        return b"".join(out)

    def end(self, records: Sequence[ChoiceRecord]) -> bytes:
        return sse("message_stop", {"type": "message_stop"})

    def error(self, error: ApiError) -> bytes:
        """The terminal `error` event (after SSE headers; no message_stop follows)."""
        return sse("error", anthropic_body(error))
