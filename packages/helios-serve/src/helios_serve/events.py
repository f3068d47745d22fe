"""Data-only messages between the HTTP layer and the model worker (STYLE.md item 2).

HTTP -> worker: a `GenerationRequest` (fully prepared: prompt ids, sampling, limits,
stops, its output pipeline) or a `Cancel`. Worker -> HTTP: events appended to the
request's `EventSink`; a response is a sequence of `Output`/`TokenObserved` events
ended by exactly one terminal event (`Finished`, `Rejected` or `Failed`).
"""

from __future__ import annotations

import asyncio
import enum
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from helios_serve.engine.plan import SamplingParams, TokenLogprob


class FinishReason(enum.Enum):
    """Why a request ended normally; distinct from rejection and failure."""

    STOP = "stop"  # EOS id, token stop or string stop
    LENGTH = "length"  # output limit or context extent
    TOOL_CALLS = "tool_calls"  # the pipeline finished with completed tool calls
    CANCELLED = "cancelled"  # the reader dropped the response (never presented)


@dataclass(frozen=True)
class Output:
    """Presentation deltas of one step (frontend delta objects: reasoning, content,
    tool-call start and argument fragments), in order, and the logprobs of the step's
    sampled token (requests that asked; the EOS id that ends a request has none)."""

    deltas: tuple[Any, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class TokenObserved:
    """One generated id (observed requests only), EOS and stop tokens included.

    timestamp_ns is relative to the observation clock origin, or None when the
    request did not ask for timestamps.
    """

    token_id: int
    timestamp_ns: int | None


@dataclass(frozen=True)
class Finished:
    """Terminal: the request ended normally.

    Attributes:
        reason: stop, length or tool_calls.
        prompt_tokens: prompt length in tokens.
        completion_tokens: sampled tokens, including the token that crossed a stop.
        reused_prompt_tokens: prompt tokens served from the prefix cache.
    """

    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reused_prompt_tokens: int


@dataclass(frozen=True)
class Rejected:
    """Terminal: scheduler admission rejected the request (HTTP 503 before headers).

    Attributes:
        message: one line with the numbers.
        capacity: the request exceeds the prepared capacities (context, page table,
            cache); False when the admission queue was full.
    """

    message: str
    capacity: bool = False


@dataclass(frozen=True)
class Failed:
    """Terminal: model execution, device or output failure (HTTP 500 before headers)."""

    message: str


Event = Output | TokenObserved | Finished | Rejected | Failed
TERMINAL_EVENTS = (Finished, Rejected, Failed)


class EventSink:
    """A response's event queue, written by the worker thread and read on the HTTP loop.

    Storage grows as events arrive (a deque): the response's event budget is bounded by
    its prompt and output limits, never allocated up front. The worker hands a step's
    events for every response over at once (`deliver`): a wake-up of the loop costs a
    system call, so there is at most one outstanding, never one per response.
    The reader takes one event with `get` and whatever else is already queued with
    `drain`, so a reader that fell behind writes the backlog at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._mailbox = _mailbox(loop)
        self._events: deque[Event] = deque()  # loop-thread side
        self._waiter: asyncio.Future[None] | None = None
        self.terminal_sent = False  # worker-thread side: no event after a terminal one

    def publish(self, events: list[Event]) -> None:
        """Called on the worker thread: hand events to the HTTP loop."""
        deliver([(self, events)])

    def _accept(self, events: list[Event]) -> bool:
        """Worker thread: whether `events` may still be delivered (nothing after a
        terminal event); marks the terminal one."""
        if not events or self.terminal_sent:
            return False
        if isinstance(events[-1], TERMINAL_EVENTS):
            self.terminal_sent = True
        return True

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

    def drain(self) -> list[Event]:
        """Every event already queued (possibly none), without waiting; HTTP loop."""
        events = list(self._events)
        self._events.clear()
        return events


def deliver(batches: list[tuple[EventSink, list[Event]]]) -> None:
    """Worker thread: hand several responses' events to their HTTP loop (one loop in a
    server) with at most one wake-up outstanding per loop.

    Events after a response's terminal event are dropped; a closed loop (its readers are
    gone) drops its events.
    """
    by_loop: dict[_Mailbox, list[tuple[EventSink, list[Event]]]] = {}
    for sink, events in batches:
        if sink._accept(events):
            by_loop.setdefault(sink._mailbox, []).append((sink, events))
    for mailbox, accepted in by_loop.items():
        mailbox.post(accepted)


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


@dataclass
class GenerationRequest:
    """A prepared request, ready for the model worker.

    Attributes:
        request_id: process-internal id (never in labels or responses).
        prompt_token_ids: the rendered, tokenized prompt.
        sampling: sampling parameters after prepared defaults are applied.
        max_output_tokens: output limit in tokens.
        has_string_stops: the pipeline matches string stops (host-stop barrier).
        has_host_stops: the pipeline matches string or token stops (completion feedback).
        grammar: the request's GrammarState (structured output), or None.
        observe_ids: emit TokenObserved per generated id.
        observe_timestamps: stamp each observation (requires observe_ids).
        pipeline: the request's OutputPipeline (detokenizer, string and token stops,
            parsers, grammar); used only on the worker thread after submission.
        sink: where the worker publishes events.
        enqueue_ns: observation-clock time right before submission to the worker.
    """

    request_id: int
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_output_tokens: int
    sink: EventSink
    pipeline: Any = None
    has_string_stops: bool = False
    has_host_stops: bool = False
    grammar: Any = None
    observe_ids: bool = False
    observe_timestamps: bool = False
    enqueue_ns: int | None = None

    @property
    def constrained(self) -> bool:
        """A grammar constrains sampling (the worker fills its masks)."""
        return self.grammar is not None

    @property
    def needs_feedback(self) -> bool:
        """Each sampled token must reach the worker before another round is submitted
        (grammar, string or token stops): no step is submitted ahead while it is live."""
        return self.constrained or self.has_string_stops or self.has_host_stops


@dataclass(frozen=True)
class Cancel:
    """HTTP -> worker: the reader dropped the response."""

    request_id: int
