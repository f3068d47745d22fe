"""Log-probability response shapes (OpenAI's) over token pieces with exact bytes."""

from __future__ import annotations

import math

from helios_serve.engine.plan import TokenLogprob
from helios_serve.events import Finished, FinishReason, Output
from helios_serve.frontend.deltas import ContentDelta
from helios_serve.frontend.vocab import TokenPieces
from helios_serve.http.responses import (
    ChatShapes,
    ChoiceRecord,
    CompletionShapes,
    ResponseContext,
)


def _ctx(**extra) -> ResponseContext:
    return ResponseContext(id="x", created=1, model="m", prompts=((1, 2),), first_choice=(0,),
                           choices=1, logprobs=True, **extra)  # fmt: skip


def test_pieces_give_exact_bytes_of_a_split_character(tok):
    pieces = TokenPieces(tok.tokenizer)
    first, second = tok.byte_ids("é".encode())
    assert pieces.bytes_of(first) == b"\xc3" and pieces.bytes_of(second) == b"\xa9"
    assert pieces.text_of(first) == "\ufffd"
    (hello,) = tok.ids(["Hello"])
    assert pieces.bytes_of(hello) == b"Hello"
    assert pieces.bytes_of(2) == b"<|im_end|>"  # an added (special) token: its content
    # Whole characters alone: a half of "é" has no text of its own, "Hello" does.
    assert pieces.text_alone(first) is None and pieces.text_alone(second) is None
    assert pieces.text_alone(hello) == "Hello"


def test_chat_logprobs_shape(tok):
    pieces = TokenPieces(tok.tokenizer)
    (hello,) = tok.ids(["Hello"])
    (comma,) = tok.ids([","])
    lp = TokenLogprob(hello, -0.25, ((hello, -0.25), (comma, -1.5)))
    shapes = ChatShapes(_ctx(), pieces)
    assert shapes.logprobs([lp]) == {"refusal": None, "content": [{
        "token": "Hello", "logprob": -0.25, "bytes": list(b"Hello"),
        "top_logprobs": [{"token": "Hello", "logprob": -0.25, "bytes": list(b"Hello")},
                         {"token": ",", "logprob": -1.5, "bytes": [44]}]}]}
    record = ChoiceRecord(deltas=[ContentDelta("Hello")], logprobs=[lp],
                          finished=Finished(FinishReason.STOP, 2, 1, 0))
    body = shapes.completion([record])
    assert body["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.25
    chunk = shapes.output(Output((ContentDelta("Hello"),), 0, (lp,), 1), [record])
    assert b'"logprobs":{"content":[{"token":"Hello"' in chunk


def test_completion_logprobs_shape_and_offsets(tok):
    pieces = TokenPieces(tok.tokenizer)
    hello, comma = tok.ids(["Hello", ","])
    shapes = CompletionShapes(_ctx(), pieces)
    lps = [TokenLogprob(hello, math.log(0.5), ((hello, math.log(0.5)),)),
           TokenLogprob(comma, -2.0, ((comma, -2.0),))]
    record = ChoiceRecord(deltas=[ContentDelta("Hello,")], logprobs=lps,
                          finished=Finished(FinishReason.LENGTH, 2, 2, 0))
    choice = shapes.completion([record])["choices"][0]
    assert choice["text"] == "Hello," and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"tokens": ["Hello", ","],
                                  "token_logprobs": [math.log(0.5), -2.0],
                                  "top_logprobs": [{"Hello": math.log(0.5)}, {",": -2.0}],
                                  "text_offset": [0, 5]}
