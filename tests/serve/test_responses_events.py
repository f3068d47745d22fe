"""Property tests: streamed Responses events come in a valid order, validate against the
official openai event models, and add up to the non-streamed response.

At the presenter (helios_serve.responses.presenter) over generated delta sequences in
every grouping, and through real HTTP on the scripted backend over generated scripts.
"""

from __future__ import annotations

import copy
import json

import httpx
import pytest
from helios_serve.events import Finished, Output
from helios_serve.frontend.deltas import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)
from helios_serve.responses.presenter import ResponseBuilder
from helios_serve.scheduler.request import FinishReason
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from tests.serve.test_responses_api import PIECES, ToolsServer, _sse, _without_ids

EVENTS = TypeAdapter(ResponseStreamEvent)
SKELETON = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m",
            "instructions": None, "tools": [], "tool_choice": "auto",
            "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
            "metadata": {}}  # fmt: skip
DONE_OF = {"message": "response.output_text.done", "reasoning": "response.reasoning_text.done",
           "function_call": "response.function_call_arguments.done"}
DELTA_OF = {"message": "response.output_text.delta",
            "reasoning": "response.reasoning_text.delta",
            "function_call": "response.function_call_arguments.delta"}  # fmt: skip


def check_stream(events: list[dict]) -> list[dict]:
    """Assert the event order of module docstring of the presenter; returns the output
    items rebuilt from the added/delta events alone (checked against each done event)."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(event)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert sum(k.startswith("response.") and k.split(".")[1] in
               ("created", "in_progress", "completed", "incomplete", "failed")
               for k in kinds) == 3  # fmt: skip
    items: list[dict] = []
    stage = None  # open item: "added", "part", "text_done", "part_done"
    for event in events[2:-1]:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert stage is None and event["output_index"] == len(items)
            items.append(copy.deepcopy(event["item"]))
            item = items[-1]
            stage = "added"
            continue
        item = items[-1]
        assert event["output_index"] == len(items) - 1
        if kind != "response.output_item.done":
            assert event["item_id"] == item["id"]
        if kind == "response.content_part.added":
            assert stage == "added" and item["type"] in ("message", "reasoning")
            item["content"].append(copy.deepcopy(event["part"]))
            stage = "part"
        elif kind == DELTA_OF[item["type"]]:
            assert stage == ("added" if item["type"] == "function_call" else "part")
            assert event["delta"]
            if item["type"] == "function_call":
                item["arguments"] += event["delta"]
            else:
                item["content"][0]["text"] += event["delta"]
                if item["type"] == "message":
                    item["content"][0]["logprobs"] += event["logprobs"]
        elif kind == DONE_OF[item["type"]]:
            assert stage == ("added" if item["type"] == "function_call" else "part")
            if item["type"] == "function_call":
                assert event["arguments"] == item["arguments"]
                stage = "part_done"
            else:
                assert event["text"] == item["content"][0]["text"]
                stage = "text_done"
        elif kind == "response.content_part.done":
            assert stage == "text_done" and event["part"] == item["content"][0]
            stage = "part_done"
        elif kind == "response.output_item.done":
            assert stage == "part_done"
            assert {**item, "status": event["item"]["status"]} == event["item"]
            items[-1] = event["item"]
            stage = None
        else:
            raise AssertionError(f"{kind} while a {item['type']} item is open")
    assert stage is None
    assert items == events[-1]["response"]["output"]
    Response.model_validate(events[-1]["response"])
    return items


texts = st.text(alphabet="ab <>{}\"é\n", min_size=1, max_size=6)
segments = st.lists(st.one_of(
    st.tuples(st.just("reasoning"), texts),
    st.tuples(st.just("content"), texts),
    st.tuples(st.just("call"), st.sampled_from(["f", "get_weather"]),
              st.lists(texts, max_size=3)),
), max_size=6)  # fmt: skip


def _deltas(spec) -> list:
    out, calls = [], 0
    for segment in spec:
        if segment[0] == "reasoning":
            out.append(ReasoningDelta(segment[1]))
        elif segment[0] == "content":
            out.append(ContentDelta(segment[1]))
        else:
            out.append(ToolCallStart(calls, f"call_{calls}", segment[1]))
            out.extend(ToolCallArguments(calls, t) for t in segment[2])
            calls += 1
    return out


def _run(groups: list[list], reason: FinishReason) -> list[dict]:
    builder = ResponseBuilder(SKELETON, None)
    events = builder.start()
    for group in groups:
        events += builder.feed(Output(tuple(group)))
    events += builder.feed(Finished(reason, 7, 3, 0))
    assert builder.response() == events[-1]["response"]
    return events


@settings(max_examples=200, deadline=None)
@given(spec=segments, cuts=st.lists(st.integers(0, 40), max_size=8),
       reason=st.sampled_from([FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS]))
def test_presenter_streams_a_valid_order_equal_to_one_shot(spec, cuts, reason):
    deltas = _deltas(spec)
    bounds = sorted({min(c, len(deltas)) for c in cuts} | {0, len(deltas)})
    groups = [deltas[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    streamed = _run(groups, reason)
    items = check_stream(streamed)
    one_shot = _run([deltas], reason)[-1]["response"]
    assert _without_ids(streamed[-1]["response"]) == _without_ids(one_shot)
    assert [i["type"] for i in items] == [
        t for t, _ in _item_kinds(spec)]  # a new item at every change of kind
    status = "incomplete" if reason is FinishReason.LENGTH else "completed"
    assert streamed[-1]["response"]["status"] == status
    assert all(i["status"] == "completed" for i in items[:-1])
    if items:
        assert items[-1]["status"] == status


def _item_kinds(spec):
    out = []
    for segment in spec:
        kind = {"reasoning": "reasoning", "content": "message", "call": "function_call"}[segment[0]]
        if kind == "function_call" or not out or out[-1][0] != kind:
            out.append((kind, segment))
    return out


# -- through HTTP -------------------------------------------------------------------

SCRIPT_PIECES = [p for p in PIECES if p not in ("<think>", "</think>", "<tool_call>",
                                                "</tool_call>")]  # fmt: skip


@pytest.fixture(scope="module")
def http_server():
    with ToolsServer() as server:
        yield server


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=st.lists(st.sampled_from(SCRIPT_PIECES), min_size=1, max_size=6),
       thought=st.lists(st.sampled_from(["Let", " me", " check"]), max_size=3),
       limit=st.one_of(st.none(), st.integers(1, 8)))
def test_http_stream_equals_the_json_response(http_server, answer, thought, limit):
    trigger = f"q{len(http_server.book._scripts)}"
    script = (["<think>", *thought, "</think>", "\n\n"] if thought else []) + answer
    http_server.script(trigger, script)
    body = {"input": trigger, "temperature": 0}
    if limit is not None:
        body["max_output_tokens"] = limit
    r = httpx.post(http_server.url + "/v1/responses", timeout=30,
                   json={"model": http_server.model_name, **body})  # fmt: skip
    assert r.status_code == 200
    events = _sse(http_server, body)
    check_stream(events)
    assert _without_ids(events[-1]["response"]) == _without_ids(r.json())
    stored = httpx.get(f"{http_server.url}/v1/responses/{r.json()['id']}", timeout=30)
    assert stored.json() == r.json()
    assert json.loads(json.dumps(r.json())) == r.json()
