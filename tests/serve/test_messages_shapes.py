"""Property: for any sequence of presentation deltas, however split into outputs, the
Messages SSE events come in Anthropic's order and reassemble to the JSON message."""

from __future__ import annotations

import json

from helios_serve.events import Finished, FinishReason, Output
from helios_serve.frontend.deltas import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)
from helios_serve.http.errors import AdmissionRejected, CapacityExceeded
from helios_serve.http.messages_shapes import MessagesShapes, reassemble, tool_input
from helios_serve.http.responses import ChoiceRecord, ResponseContext
from hypothesis import given, settings
from hypothesis import strategies as st

TEXT = st.text(min_size=0, max_size=6)
JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=6,
)  # fmt: skip


@st.composite
def call_arguments(draw) -> list[str]:
    """A call's argument fragments: a JSON object cut anywhere, or text that is none."""
    if draw(st.booleans()):
        text = json.dumps(draw(st.dictionaries(st.text(max_size=3), JSON_VALUE, max_size=3)))
    else:
        text = draw(st.text(max_size=8))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=3)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@st.composite
def deltas(draw) -> list:
    out: list = []
    calls = 0
    for kind in draw(st.lists(st.sampled_from(["reasoning", "content", "call"]), max_size=8)):
        if kind == "reasoning":
            out.append(ReasoningDelta(draw(TEXT)))
        elif kind == "content":
            out.append(ContentDelta(draw(TEXT)))
        else:
            out.append(ToolCallStart(calls, f"call_{calls}", draw(st.sampled_from(["f", "g"]))))
            out.extend(ToolCallArguments(calls, a) for a in draw(call_arguments()))
            calls += 1
    return out


def parse_sse(data: bytes) -> list[tuple[str, dict]]:
    events = []
    for raw in data.decode().split("\n\n"):
        if not raw:
            continue
        name_line, data_line = raw.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        events.append((name_line[7:], json.loads(data_line[6:])))
    return events


def check_order(events: list[tuple[str, dict]]) -> None:
    """message_start ping (content_block_start content_block_delta* content_block_stop)*
    message_delta message_stop, block indexes 0, 1, ..., each event named by its type."""
    names = [n for n, _ in events]
    assert all(n == d["type"] for n, d in events)
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta",
                                                                      "message_stop"]
    open_index, next_index, block = None, 0, None
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index
            open_index, next_index = next_index, next_index + 1
            block = data["content_block"]["type"]
        elif name == "content_block_delta":
            assert data["index"] == open_index
            assert block == {"text_delta": "text", "thinking_delta": "thinking",
                             "input_json_delta": "tool_use"}[data["delta"]["type"]]
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            open_index = None
    assert open_index is None


def _ctx() -> ResponseContext:
    return ResponseContext(id="msg_x", created=0, model="m", prompts=((1, 2, 3),),
                           first_choice=(0,), choices=1)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(deltas(), st.data(), st.sampled_from(list(FinishReason)[:3]))
def test_events_are_ordered_and_reassemble_to_the_message(ds, data, reason):
    # however the deltas are split into outputs (one batch per SSE write)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ds)), max_size=4)))
    bounds = [0, *cuts, len(ds)]
    outputs = [Output(tuple(ds[a:b]), 0, (), b) for a, b in zip(bounds, bounds[1:], strict=False)]
    streamed = MessagesShapes(_ctx(), (), None, ())
    record = ChoiceRecord()
    raw = [streamed.first()]
    for out in outputs:
        record.deltas.extend(out.deltas)
        raw.append(streamed.output(out, [record]))
    record.finished = Finished(reason, 3, len(ds), 1)
    raw += [streamed.finish(record.finished, [record]), streamed.end([record])]
    events = parse_sse(b"".join(raw))
    check_order(events)
    message = MessagesShapes(_ctx(), (), None, ()).completion([record])
    assert reassemble([d for _, d in events]) == message["content"]
    assert events[-2][1]["delta"] == {"stop_reason": message["stop_reason"],
                                      "stop_sequence": None}  # fmt: skip
    assert events[-2][1]["usage"] == message["usage"] == {
        "input_tokens": 2, "output_tokens": len(ds), "cache_read_input_tokens": 1}
    # the content is the deltas': text and thinking joined per run, calls by index
    assert "".join(b.get("text", "") for b in message["content"]) == "".join(
        d.text for d in ds if isinstance(d, ContentDelta))
    calls = [b for b in message["content"] if b["type"] == "tool_use"]
    assert [c["id"] for c in calls] == [d.id for d in ds if isinstance(d, ToolCallStart)]
    for c in calls:
        index = int(c["id"].split("_")[1])
        args = "".join(d.text for d in ds if isinstance(d, ToolCallArguments) and d.index == index)
        assert c["input"] == tool_input(args)
    expected = {FinishReason.LENGTH: "max_tokens"}.get(
        reason, "tool_use" if calls or reason is FinishReason.TOOL_CALLS else "end_turn")
    assert message["stop_reason"] == expected


def test_tool_input_is_the_object_or_empty():
    assert tool_input('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    assert tool_input("") == {} and tool_input('{"a": ') == {} and tool_input("[1]") == {}


def test_error_events_are_anthropic_errors():
    shapes = MessagesShapes(_ctx(), (), None, ())
    assert parse_sse(shapes.error(AdmissionRejected("the queue is full"))) == [
        ("error", {"type": "error", "error": {"type": "overloaded_error",
                                              "message": "the queue is full"}})]  # fmt: skip
    assert parse_sse(shapes.error(CapacityExceeded("prompt 9 exceeds", param="messages"))) == [
        ("error", {"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "prompt is too long: prompt 9 exceeds"}})]
