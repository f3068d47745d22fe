"""The per-token event path: Output's hand-written __init__ is the dataclass's, the
terminal rule of `SinkBase._accept`, and `deliver` posting one batch per mailbox."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from helios_serve.events import (
    Failed,
    Finished,
    FinishReason,
    Output,
    Rejected,
    SinkBase,
    TokenObserved,
    deliver,
)
from helios_serve.frontend.deltas import ContentDelta


def test_output_init_takes_exactly_the_dataclass_fields_and_stays_frozen():
    params = list(inspect.signature(Output.__init__).parameters.values())[1:]
    fields = dataclasses.fields(Output)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]
    built = Output((ContentDelta("a"),), 1, (), 7)
    assert (built.deltas, built.choice, built.logprobs, built.completion_tokens) == (
        (ContentDelta("a"),), 1, (), 7)
    assert built == Output((ContentDelta("a"),), choice=1, completion_tokens=7)
    assert Output(()) == Output((), 0, (), 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.choice = 2  # type: ignore[misc]


class _Box:
    def __init__(self) -> None:
        self.posts: list[list] = []

    def post(self, batch: list) -> None:
        self.posts.append(batch)


class _Sink(SinkBase):
    def __init__(self, choices: int, box: _Box) -> None:
        super().__init__(choices)
        self._mailbox = box


def _finished(choice: int) -> Finished:
    return Finished(FinishReason.LENGTH, 3, 2, 0, choice)


def test_accept_marks_the_terminal_event_and_refuses_what_follows():
    box = _Box()
    two = _Sink(2, box)
    out = Output((ContentDelta("x"),), 0, (), 1)
    assert two._accept([out, TokenObserved(5, None, 0)]) and not two.terminal_sent
    assert two._accept([_finished(0)]) and not two.terminal_sent  # one choice of two left
    assert two._accept([out, _finished(1)]) and two.terminal_sent
    assert not two._accept([out])
    for terminal in (Rejected("full"), Failed("boom")):
        sink = _Sink(1, box)
        assert sink._accept([terminal]) and sink.terminal_sent
        assert not sink._accept([out])
    assert not _Sink(1, box)._accept([])


def test_deliver_posts_one_batch_per_mailbox_in_order_without_refused_sinks():
    a, b = _Box(), _Box()
    s1, s2, s3, done = _Sink(1, a), _Sink(1, b), _Sink(1, a), _Sink(1, a)
    done._accept([Failed("gone")])
    e1, e2, e3 = ([Output((ContentDelta(t),), 0, (), 1)] for t in "xyz")
    deliver([(s1, e1), (done, e1), (s2, e2), (s3, e3)])
    assert a.posts == [[(s1, e1), (s3, e3)]] and b.posts == [[(s2, e2)]]
    deliver([(s1, e2), (s3, e1)])  # one mailbox: one post, in order
    assert a.posts[1] == [(s1, e2), (s3, e1)]
    deliver([(done, e1)])  # nothing accepted: nothing posted
    assert len(a.posts) == 2 and len(b.posts) == 1
