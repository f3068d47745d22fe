"""Delivery: a submitted `Generation`'s events become one JSON body or an SSE stream.

Before headers, a scheduler rejection is 503 and an execution failure 500 (the error
table); after SSE headers either is one terminal error event without [DONE]
(the specification, admission paragraphs). A dropped connection cancels every request
of the generation; the admission permit is released when the reader releases the
response (`Generation.release`), however the response ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from helios_serve.events import (
    EventSink,
    Failed,
    Finished,
    Output,
    PromptScores,
    Rejected,
    TokenObserved,
)
from helios_serve.frontend.deltas import coalesce
from helios_serve.http.errors import (
    AdmissionRejected,
    ApiError,
    CapacityExceeded,
    ExecutionFailed,
)
from helios_serve.http.responses import ChoiceRecord, Shapes
from helios_serve.http.service import Generation


class ClientDisconnected(Exception):
    """The client closed the connection while a non-streaming request ran."""


def rejection(event: Rejected) -> AdmissionRejected:
    """The API error of a worker-side admission rejection."""
    if event.reason is not None:
        return CapacityExceeded(event.message)
    return AdmissionRejected(event.message)


def _apply(records: list[ChoiceRecord], event: Any) -> None:
    """Record a per-choice event (observation, output, finish)."""
    if isinstance(event, TokenObserved):
        record = records[event.choice]
        record.token_ids.append(event.token_id)
        if event.timestamp_ns is not None:
            record.token_timestamps_ns.append(event.timestamp_ns)
    elif isinstance(event, Output):
        record = records[event.choice]
        record.deltas.extend(event.deltas)
        record.logprobs.extend(event.logprobs)
        record.completion_tokens = event.completion_tokens
    elif isinstance(event, Finished):
        records[event.choice].finished = event
    elif isinstance(event, PromptScores):
        records[event.choice].prompt_logprobs.extend(event.logprobs)


async def collect(generation: Generation, shapes: Shapes,
                  disconnected: asyncio.Future | None) -> dict[str, Any]:  # fmt: skip
    """Wait for every choice and return the JSON body.

    The caller releases the permit after sending the body (`generation.release`); on
    an error or a dropped client it is released here.

    Raises:
        ApiError: a rejection (503) or execution failure (500).
        ClientDisconnected: the client left (the requests are cancelled).
    """
    records = [ChoiceRecord() for _ in range(generation.choices)]
    unfinished = generation.choices
    try:
        while True:
            event = await next_event(generation.sink, disconnected)
            _apply(records, event)
            if isinstance(event, Finished):
                unfinished -= 1
                if unfinished == 0:
                    return shapes.completion(records)
            elif isinstance(event, Rejected):
                generation.cancel()
                raise rejection(event)
            elif isinstance(event, Failed):
                generation.cancel()
                raise ExecutionFailed(event.message)
    except ApiError:
        generation.release()
        raise
    except BaseException:  # disconnected, or a cancelled handler: the reader is gone
        generation.cancel()
        generation.release()
        raise


async def next_event(sink: EventSink, disconnected: asyncio.Future | None):
    """The sink's next event; ClientDisconnected first if `disconnected` completes."""
    if disconnected is None:
        return await sink.get()
    getter = asyncio.ensure_future(sink.get())
    done, _ = await asyncio.wait({getter, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    raise ClientDisconnected()


class SseStream:
    """One SSE response: `events()` yields the bytes; `close()` (idempotent) cancels an
    unfinished generation (the reader dropped it) and releases the admission permit.

    The HTTP layer calls `close` after the response ends however it ends (completed,
    disconnected, or never started); the generator calls it too when it finishes.
    """

    def __init__(self, generation: Generation, shapes: Shapes) -> None:
        self.generation = generation
        self.records = [ChoiceRecord() for _ in range(generation.choices)]
        self._shapes = shapes
        self._terminal = False  # every choice finished
        self._failed = False  # a terminal error event was written
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._terminal:
            self.generation.cancel()
        self.generation.release()

    async def events(self) -> AsyncIterator[bytes]:
        """The SSE bytes: one write per batch of events that arrived together.

        After one awaited event, every event already queued joins it (a reader that fell
        behind writes its backlog at once). A choice's consecutive outputs become one
        chunk (deltas merged by frontend.deltas.coalesce, logprobs concatenated) until
        another event of that choice (an observation, its finish) or the batch's end.
        """
        shapes, records, sink = self._shapes, self.records, self.generation.sink
        unfinished = self.generation.choices
        pending: dict[int, list[Output]] = {}  # choice -> outputs not yet encoded

        def flush(choice: int, out: list[bytes]) -> None:
            outputs = pending.pop(choice, None)
            if outputs:
                out.append(shapes.output(merge(outputs), records))

        try:
            first = shapes.first()
            if first:
                yield first
            while True:
                got = await sink.get()
                if not sink.queued and type(got) is Output and len(got.deltas) <= 1:
                    # One token of one choice (the steady stream: a reader that keeps
                    # up gets one Output per step): its chunk as the general path
                    # below writes it (merge returns a lone one-delta Output as it is).
                    _apply(records, got)
                    yield shapes.output(got, records)
                    continue
                out: list[bytes] = []
                for event in [got, *sink.drain()]:
                    if isinstance(event, TokenObserved | Finished):
                        flush(event.choice, out)  # (usage so far: before this event)
                    _apply(records, event)
                    if isinstance(event, Output):
                        pending.setdefault(event.choice, []).append(event)
                    elif isinstance(event, TokenObserved):
                        out.append(shapes.observation(event.choice, event.token_id,
                                                      event.timestamp_ns))  # fmt: skip
                    elif isinstance(event, Finished):
                        unfinished -= 1
                        out.append(shapes.finish(event, records))
                        if unfinished == 0:
                            self._terminal = True
                            out.append(shapes.end(records))
                            break
                    elif isinstance(event, Rejected | Failed):
                        for choice in list(pending):
                            flush(choice, out)
                        error: ApiError = (
                            rejection(event) if isinstance(event, Rejected)
                            else ExecutionFailed(event.message)
                        )  # fmt: skip
                        out.append(shapes.error(error))
                        self._failed = True
                        break
                for choice in list(pending):
                    flush(choice, out)
                data = b"".join(out)
                if data:  # (an empty chunk would end a chunked HTTP body)
                    yield data
                if self._terminal or self._failed:
                    return  # after an error, close() cancels the generation's requests
        finally:
            self.close()


def merge(outputs: list[Output]) -> Output:
    """One choice's consecutive outputs as one: deltas coalesced, logprobs in order."""
    if len(outputs) == 1 and len(outputs[0].deltas) <= 1:  # one token's delta: as it is
        return outputs[0]
    deltas = [d for o in outputs for d in o.deltas]
    logprobs = tuple(lp for o in outputs for lp in o.logprobs)
    last = outputs[-1]
    return Output(tuple(coalesce(deltas)), last.choice, logprobs, last.completion_tokens)
