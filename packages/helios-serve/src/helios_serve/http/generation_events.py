"""A submitted generation's events for presenters other than the chat shapes.

`http.delivery` turns events into chat/completions JSON and SSE; the Responses API (and
any other API presented over the chat path: Anthropic Messages) reads the same events
through `GenerationEvents` and presents them itself. The rules are delivery's: a dropped
reader cancels every request of the generation; the admission permit is released when
the reader releases the response (`close`), however it ended; a terminal event (every
choice finished, a rejection, a failure) ends the iteration.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from litestar import Request

from helios_serve.events import Event, Failed, Finished, Rejected
from helios_serve.http.delivery import ClientDisconnected, next_event, rejection
from helios_serve.http.errors import ApiError, ExecutionFailed
from helios_serve.http.service import Generation


async def watch_disconnect(request: Request) -> None:
    """Completes when the client closes the connection (read after the body)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def terminal_error(event: Rejected | Failed) -> ApiError:
    """The API error of a rejection (503) or an execution failure (500)."""
    if isinstance(event, Rejected):
        return rejection(event)
    return ExecutionFailed(event.message)


class GenerationEvents:
    """Iterates one generation's events; `close()` (idempotent) cancels it unless it
    ended and releases the admission permit.

    Args:
        generation: the admitted, submitted generation (`ApiService.generate`).
    """

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.terminal = False  # every choice finished, or a rejection or failure arrived
        self._closed = False

    async def batches(self, disconnected: asyncio.Future | None = None
                      ) -> AsyncIterator[list[Event]]:  # fmt: skip
        """Batches of events: one awaited event and every event already queued behind
        it, in order, until the terminal event (the last of the last batch).

        Raises:
            ClientDisconnected: `disconnected` completed first (nothing is cancelled
                here: `close` does that).
        """
        sink = self.generation.sink
        unfinished = self.generation.choices
        while not self.terminal:
            batch: list[Event] = []
            for event in [await next_event(sink, disconnected), *sink.drain()]:
                batch.append(event)
                if isinstance(event, Finished):
                    unfinished -= 1
                if unfinished == 0 or isinstance(event, Rejected | Failed):
                    self.terminal = True
                    break
            yield batch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.terminal:
            self.generation.cancel()
        self.generation.release()


__all__ = ["ClientDisconnected", "GenerationEvents", "terminal_error", "watch_disconnect"]
