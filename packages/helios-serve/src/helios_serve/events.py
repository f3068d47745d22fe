"""Data-only messages between the HTTP layer and the model worker.

HTTP -> worker: a `GenerationRequest` (a frozen `PreparedRequest` plus each choice's
output state) or a `Cancel`. Worker -> HTTP: events appended to the request's
`EventSink`; each choice's events end with one `Finished`, and a response ends when
every choice finished or with one request-wide `Rejected` or `Failed`.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from helios_serve.engine.plan import SamplingParams, TokenLogprob
from helios_serve.frontend.deltas import Delta
from helios_serve.frontend.grammar import GrammarState
from helios_serve.frontend.pipeline import OutputPipeline
from helios_serve.frontend.prepare import PreparedRequest
from helios_serve.scheduler.request import AdmissionReason, FinishReason  # noqa: F401 (re-export)


@dataclass(frozen=True)
class Output:
    """Presentation deltas of one step of one choice (reasoning, content, tool-call
    start and argument fragments), in order, and the log probabilities of the tokens
    sampled in that step (requests with logprobs; a terminating EOS excluded)."""

    deltas: tuple[Delta, ...]
    choice: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()
    completion_tokens: int = 0  # the choice's output tokens so far

    # One per streamed token of every row of every step: the generated __init__ of a
    # frozen dataclass calls object.__setattr__ per field (~2 us here); this fills the
    # instance dict directly. Same signature (tests/serve/test_events.py checks).
    def __init__(self, deltas: tuple[Delta, ...], choice: int = 0,
                 logprobs: tuple[TokenLogprob, ...] = (), completion_tokens: int = 0) -> None:
        d = self.__dict__
        d["deltas"] = deltas
        d["choice"] = choice
        d["logprobs"] = logprobs
        d["completion_tokens"] = completion_tokens


@dataclass(frozen=True)
class PromptScores:
    """Log probabilities of prompt tokens (requests asking for prompt logprobs), in
    prompt order from the second token (the first has none), as a scored prefill chunk
    completes; each choice's first Output follows its last PromptScores. Every choice of
    a prompt shares them: they are published for the prompt's first choice.

    Attributes:
        logprobs: per scored prompt token, its log probability under the model's raw
            distribution after the tokens before it, and the requested alternatives.
        choice: the prompt's first choice.
    """

    logprobs: tuple[TokenLogprob, ...]
    choice: int = 0


@dataclass(frozen=True)
class TokenObserved:
    """One generated id (observed requests only), EOS and stop tokens included.

    timestamp_ns is relative to the observation clock origin, or None when the
    request did not ask for timestamps.
    """

    token_id: int
    timestamp_ns: int | None
    choice: int = 0


@dataclass(frozen=True)
class Finished:
    """Terminal for one choice: it ended normally.

    Attributes:
        reason: stop, length or tool_calls.
        choice: the choice's index.
        prompt_tokens: prompt length in tokens.
        completion_tokens: sampled tokens, including the token that crossed a stop.
        reused_prompt_tokens: prompt tokens served from the prefix cache.
    """

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reused_prompt_tokens: int
    choice: int = 0


@dataclass(frozen=True)
class Rejected:
    """Terminal: scheduler admission rejected the request (HTTP 503 before headers).

    Attributes:
        message: one line with the numbers.
        reason: the prepared capacity the request exceeds, or None when the admission
            queue was full (a transient state).
    """

    message: str
    reason: AdmissionReason | None = None


@dataclass(frozen=True)
class Failed:
    """Terminal: model execution, device or output failure (HTTP 500 before headers)."""

    message: str


Event = Output | PromptScores | TokenObserved | Finished | Rejected | Failed
TERMINAL_EVENTS = (Finished, Rejected, Failed)


class SinkBase:
    """What the worker needs of a response's sink: terminal bookkeeping and the mailbox
    `deliver` hands its events to (an event loop's, or the engine process's channel)."""

    _mailbox: Any  # post(batch): an event loop's _Mailbox or the engine's channel

    def __init__(self, choices: int) -> None:
        self._unfinished = choices  # worker-thread side
        self.terminal_sent = False  # worker-thread side: no event after a terminal one

    def publish(self, events: list[Event]) -> None:
        """Called on the worker thread: hand events to the reader."""
        deliver([(self, events)])

    def _accept(self, events: list[Event]) -> bool:
        """Worker thread: whether `events` may still be delivered (nothing after a
        terminal event); marks the terminal one."""
        if not events or self.terminal_sent:
            return False
        for event in events:
            kind = type(event)
            if kind is Output or kind is TokenObserved:  # the per-token events: not terminal
                continue
            if kind is Finished:
                self._unfinished -= 1
            if kind is Rejected or kind is Failed or self._unfinished == 0:
                self.terminal_sent = True
        return True


class EventSink(SinkBase):
    """A response's event queue, written by the worker thread and read on the HTTP loop.

    Storage grows as events arrive (a deque): the response's event budget is bounded by
    its prompt and output limits, never allocated up front. The worker hands a step's
    events for every response over at once (`deliver`): a wake-up of the loop costs a
    system call, so there is at most one outstanding, never one per response.
    The reader takes one event with `get` and whatever else is already queued with
    `drain`, so a reader that fell behind writes the backlog at once.

    Args:
        loop: the HTTP event loop.
        choices: `Finished` events that end the response (n of every prompt).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, choices: int = 1) -> None:
        super().__init__(choices)
        self._loop = loop
        self._mailbox = _mailbox(loop)
        self._events: deque[Event] = deque()  # loop-thread side
        self._waiter: asyncio.Future[None] | None = None

    def _put_all(self, events: list[Event]) -> None:
        self._events.extend(events)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Event:
        """Next event, on the HTTP loop."""
        while not self._events:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()

    @property
    def queued(self) -> int:
        """Events already queued (HTTP loop)."""
        return len(self._events)

    def drain(self) -> list[Event]:
        """Every event already queued (possibly none), without waiting; HTTP loop."""
        events = list(self._events)
        self._events.clear()
        return events


def deliver(batches: list[tuple[SinkBase, list[Event]]]) -> None:
    """Worker thread: hand several responses' events to their HTTP loop (one loop in a
    server) with at most one wake-up outstanding per loop.

    Events after a response's terminal event are dropped; a closed loop (its readers are
    gone) drops its events.
    """
    accepted = [item for item in batches if item[0]._accept(item[1])]
    if not accepted:
        return
    mailbox = accepted[0][0]._mailbox
    if all(sink._mailbox is mailbox for sink, _ in accepted):  # one loop: the server's case
        mailbox.post(accepted)
        return
    by_loop: dict[Any, list[tuple[SinkBase, list[Event]]]] = {}
    for sink, events in accepted:
        by_loop.setdefault(sink._mailbox, []).append((sink, events))
    for box, items in by_loop.items():
        box.post(items)


class _Mailbox:
    """One event loop's delivery queue: the worker appends batches, the loop takes them
    all in one callback; a wake-up (`call_soon_threadsafe`, a write to the loop's
    self-pipe) is sent only when none is outstanding, so a loop that is behind is not
    woken once per step.

    No lock: the GIL orders `post` (append, then test the flag) against `_take` (clear the
    flag, then pop everything), so a batch appended after the loop's last pop always
    finds the flag clear and sends a wake-up.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._batches: deque[list[tuple[EventSink, list[Event]]]] = deque()
        self._scheduled = False

    def post(self, batch: list[tuple[EventSink, list[Event]]]) -> None:
        self._batches.append(batch)
        if self._scheduled:
            return
        self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._take)
        except RuntimeError:  # the loop is closed: the readers are gone
            self._batches.clear()

    def _take(self) -> None:
        self._scheduled = False
        while self._batches:
            for sink, events in self._batches.popleft():
                sink._put_all(events)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = (
    weakref.WeakKeyDictionary())


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    box = _MAILBOXES.get(loop)
    if box is None:
        box = _MAILBOXES[loop] = _Mailbox(loop)
    return box


@dataclass(frozen=True)
class ChoiceState:
    """One choice of a request, as the worker runs it.

    Attributes:
        index: the choice's index in the response.
        sampling: its sampling parameters (its own seed: `PreparedRequest.choice_sampling`).
        pipeline: its output pipeline (detokenizer, stops, parsers); worker thread only.
        grammar: its grammar state (structured output), or None.
        relayed: (engine process) its pipeline is a token relay: the frontend runs the
            real one, decides the finish reason and counts the finished request.
    """

    index: int
    sampling: SamplingParams
    pipeline: OutputPipeline
    grammar: GrammarState | None
    relayed: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """A prepared request, ready for the model worker.

    Attributes:
        request_id: process-internal id (never in labels or responses).
        prepared: the prepared request (prompt, sampling, limits, stops, n).
        choices: one output state per choice, built from `prepared.output`.
        sink: where the worker publishes events (shared by the prompts of one
            completions request).
        enqueue_ns: observation-clock time right before submission to the worker.
    """

    request_id: int
    prepared: PreparedRequest
    choices: tuple[ChoiceState, ...]
    sink: SinkBase
    enqueue_ns: int | None = None

    @classmethod
    def build(cls, request_id: int, prepared: PreparedRequest, sink: EventSink,
              enqueue_ns: int | None, first_index: int = 0) -> GenerationRequest:  # fmt: skip
        """Fresh output state for each of `prepared.n` choices, indexed from first_index."""
        choices = []
        for i in range(prepared.n):
            output = prepared.output.new_choice()
            choices.append(ChoiceState(first_index + i, prepared.choice_sampling(i),
                                       output.pipeline, output.grammar))  # fmt: skip
        return cls(request_id, prepared, tuple(choices), sink, enqueue_ns)


@dataclass(frozen=True)
class Cancel:
    """HTTP -> worker: the reader dropped the response."""

    request_id: int
