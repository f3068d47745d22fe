"""The per-token delivery path (issue 17): worker -> event sink -> SSE bytes.

A reader that fell behind gets its backlog in one write, presentation deltas merged
into one chunk unless the response is observed (then one metadata chunk per id stays);
the chunk envelope is encoded once per response and gives the same bytes as the
generic encoder; the worker ends a request at EOS in the scheduler before it plans the
next step, even though that token's text work runs after the next submission.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from helios_serve.events import Output
from helios_serve.frontend.deltas import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallStart,
)
from helios_serve.http import responses
from helios_serve.testing.harness import ScriptedServer, content_of

PIECES = ["Hello", ",", " world", "!", " Hello"]


def _chat(server, prompt: str, **extra):
    return {"model": server.model_name, "messages": [{"role": "user", "content": prompt}],
            "stream": True, **extra}


def _events(lines: list[str]) -> list:
    return [("[DONE]" if line[6:] == "[DONE]" else json.loads(line[6:]))
            for line in lines if line.startswith("data: ")]


def _stream_with_the_loop_blocked(server: ScriptedServer, body: dict) -> tuple[list, int]:
    """Stream `body`; right after the role chunk, block the server's event loop until the
    worker has finished the request, so that every later event reaches the SSE writer as
    one backlog. Returns (events, HTTP body chunks read after the role chunk)."""
    worker = server.server.worker
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=30) as r:
        assert r.status_code == 200
        raw = r.iter_raw()
        first = next(raw).decode()
        assert first.startswith("data: ") and '"role":"assistant"' in first
        deadline = time.monotonic() + 5
        while not worker._live:  # the worker drains its ingress between steps
            assert time.monotonic() < deadline, "the request did not become live"
            time.sleep(0.001)
        assert not any(live.first_token_s for live in worker._live.values())
        loop = next(iter(worker._live.values())).request.sink._loop
        done = threading.Event()

        def block() -> None:  # runs ON the server's event loop
            deadline = time.monotonic() + 20
            while worker._live and time.monotonic() < deadline:
                time.sleep(0.005)
            done.set()

        loop.call_soon_threadsafe(block)
        assert done.wait(25), "the worker did not finish while the loop was blocked"
        rest = [chunk.decode() for chunk in raw]
    return _events(first.splitlines() + "".join(rest).splitlines()), len(rest)


def test_a_reader_behind_gets_its_backlog_as_one_merged_chunk(tok):
    # Slow steps: the role chunk reaches the client long before the first token exists.
    with ScriptedServer(tok, step_delay_s=0.1) as server:
        server.script("behind", PIECES)
        events, writes = _stream_with_the_loop_blocked(server, _chat(server, "behind"))
        server.wait_idle()
    assert events[-1] == "[DONE]"
    content = [e for e in events[1:-1] if e["choices"] and e["choices"][0]["delta"]]
    assert [e["choices"][0]["delta"] for e in content] == [{"content": "Hello, world! Hello"}]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert content_of(events) == "Hello, world! Hello"
    assert writes == 1  # content, finish chunk and [DONE] in one HTTP chunk


def test_an_observed_reader_behind_keeps_one_metadata_chunk_per_id(tok):
    with ScriptedServer(tok, step_delay_s=0.1) as server:
        server.script("observed", PIECES)
        events, writes = _stream_with_the_loop_blocked(
            server, _chat(server, "observed", return_token_ids=True))
        server.wait_idle()
    chunks = events[1:-1]
    observed = [c["choices"][0]["token_ids"] for c in chunks
                if c["choices"] and "token_ids" in c["choices"][0]]
    assert observed == [[i] for i in tok.ids(PIECES) + [2]]  # every id, EOS included
    # Text follows its own token's observation: deltas are not merged across ids.
    kinds = ["id" if "token_ids" in c["choices"][0] else c["choices"][0]["delta"].get("content")
             for c in chunks if c["choices"] and not c["choices"][0]["finish_reason"]]
    assert kinds == ["id", "Hello", "id", ",", "id", " world", "id", "!", "id", " Hello", "id"]
    assert writes == 1


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("delta", [
    ContentDelta("plain"), ContentDelta('quote " back\\slash \n é ✓ \u2028'),
    ContentDelta("\x00\x1f\x7f\t \U0001f600 </script>"), ReasoningDelta("thinking"),
    ReasoningDelta('"\\ \u00e9\r'), ToolCallStart(0, "call_1", "get_weather"),
    ToolCallArguments(1, '{"city": "Z\u00fcrich"}'),
])
def test_delta_chunks_encode_the_envelope_once_with_the_generic_bytes(delta, include_usage):
    ctx = responses.ResponseContext(
        id="chatcmpl-abc", created=1700000000, model='m "quoted" ü', prompts=((1, 2),),
        first_choice=(0, 1), choices=2, include_usage=include_usage)
    shapes = responses.ChatShapes(ctx, pieces=None)  # no logprobs: no token pieces read

    def generic(index: int, delta_object: dict) -> bytes:  # the stdlib's encoding, spelled out
        body = shapes._chunk([shapes._choice(index, delta_object)], [])
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        return b"data: " + text.encode() + b"\n\n"

    for index in (0, 1):
        expected = generic(index, responses.delta_dict(delta))
        out = Output((delta,), choice=index)
        assert shapes.output(out, []) == expected
        assert shapes.output(Output((delta, delta), choice=index), []) == expected * 2
        assert shapes.output(Output((), choice=index), []) == generic(index, {})
    assert set(shapes._envelopes) == {0, 1}  # encoded once per choice, then reused


def test_eos_ends_the_request_before_the_next_step_is_planned(tok):
    """Two frames, decode submitted ahead: the request's EOS row of step N is followed by
    at most the one row already in flight (step N + 1), never a row planned after N's
    completion, although N's text work runs after the next submission."""
    with ScriptedServer(tok) as server:
        server.script("short", PIECES[:3])
        planned: list[int] = []
        submit = server.model.submit

        def recording_submit(plan):
            planned.extend(r.request_id for r in plan.rows if r.sample)
            return submit(plan)

        server.model.submit = recording_submit
        r = server.openai().chat.completions.create(
            model=server.model_name, messages=[{"role": "user", "content": "short"}])
        server.wait_idle()
    assert r.choices[0].message.content == "Hello, world"
    assert r.usage.completion_tokens == 4  # three pieces and EOS
    # prefill + 3 decodes produce the 4 sampled ids; one ahead row may follow the EOS row.
    assert len(planned) in (4, 5)


SEVEN = ["Hello", ",", " world", "!", " Hello", ",", " world"]


def _content_chunks(server: ScriptedServer, body: dict) -> tuple[list[str], list[int]]:
    """Stream `body`: each content chunk's text, and the model's executed steps when it
    arrived."""
    texts, steps = [], []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0]["delta"].get("content"):
                steps.append(server.model.steps)
                texts.append(choices[0]["delta"]["content"])
    return texts, steps


@pytest.mark.parametrize("interval", [1, 3])
def test_the_first_content_delta_is_sent_at_the_first_token(tok, interval):
    """Whatever the stream interval, the first token's text leaves with the step that
    sampled it (the prefill): the client reads it while the next step still runs."""
    with ScriptedServer(tok, step_delay_s=0.4, stream_interval=interval) as server:
        server.script("first", SEVEN[:3])
        texts, steps = _content_chunks(server, _chat(server, "first"))
        server.wait_idle()
    assert texts[0] == "Hello"
    assert steps[0] == 1  # only the prefill has completed


def test_stream_interval_delivers_every_n_tokens_with_the_text_unchanged(tok):
    """--stream-interval 3: the first token at once, then one chunk per 3 tokens; the end
    (EOS) flushes what is held. The text equals interval 1's."""
    with ScriptedServer(tok, step_delay_s=0.15, stream_interval=3) as server:
        server.script("grouped", SEVEN)
        texts, _ = _content_chunks(server, _chat(server, "grouped"))
        server.wait_idle()
    assert texts == ["Hello", ", world!", " Hello, world"]


def test_stream_interval_flushes_a_partial_group_at_the_end(tok):
    with ScriptedServer(tok, step_delay_s=0.15, stream_interval=3) as server:
        server.script("partial", SEVEN[:5])
        texts, _ = _content_chunks(server, _chat(server, "partial"))
        server.wait_idle()
    assert texts == ["Hello", ", world!", " Hello"]
