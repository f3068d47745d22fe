"""HTTP admission (the specification, admission paragraphs).

At most queue_capacity + max_active admitted requests, counting CPU preparation,
queued generation and responses still awaiting delivery; beyond that a request gets
429 at once (after the few event-loop turns that let disconnects already received
release their permits: a response its client closed never causes a 429, see
`Admission.acquire`). Admitted requests wait asynchronously for one of frontend_workers
preparation slots; preparation (template, tokenization, grammar compile) runs in a
thread pool so the event loop never blocks. A permit is released when the reader
releases the response, not when generation ends; a dropped response (A dropped
response cancels its request) releases it as soon as the server reads the drop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from helios_serve.http.errors import IngressFull
from helios_serve.metrics import REJECT_INGRESS_FULL, Metrics

T = TypeVar("T")

# Loop turns a request at capacity waits for disconnects already received to release
# their permits (uvicorn's connection_lost, Litestar's disconnect listener, the stream's
# cancellation and its `finally`). One turn sufficed in 9 of 50 rounds of
# tests/serve/test_admission.py::test_a_stream_dropped_and_reopened_at_once_is_never_refused
# (none in the rest); 16 leave room for a loaded loop and cost nothing when a permit is free.
SETTLE_TURNS = 16


class Permit:
    """One admitted request's hold on HTTP capacity; `release` is idempotent.

    A context manager: the block that prepares and submits the request holds it, and
    leaving the block releases it, unless the block handed it to the response
    (`hand_off`), which then releases it once the reader released the response:

        with await admission.acquire() as permit:
            ...prepare, submit (any exception releases the permit)...
            release = permit.hand_off()
    """

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self.released = False
        self._handed_off = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release()

    def hand_off(self) -> Callable[[], None]:
        """The response owns the permit now; returns its (idempotent) release."""
        self._handed_off = True
        return self.release

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handed_off:
            self.release()


class Admission:
    """Admission permits and preparation slots. Use on the HTTP event loop only.

    Args:
        capacity: queue_capacity + max_active.
        frontend_workers: preparation slots (and preparation threads).
        metrics: the server's metrics.
    """

    def __init__(self, capacity: int, frontend_workers: int, metrics: Metrics) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._metrics = metrics
        self._slots = asyncio.Semaphore(frontend_workers)
        self._pool = ThreadPoolExecutor(frontend_workers, thread_name_prefix="helios-prepare")
        metrics.http_permits_capacity.set(capacity)

    async def acquire(self) -> Permit:
        """Admit a request now or refuse it.

        At capacity, the event loop first runs up to SETTLE_TURNS turns (no timer) while
        no permit frees: a client that dropped a response and opened the next request at
        once has had its drop read by the kernel first, and reading it, cancelling the
        response and releasing its permit take a few turns; a request within the
        admitted bound is therefore never refused for a response its client already
        closed.

        Raises:
            IngressFull: `capacity` requests are admitted still (429).
        """
        for _ in range(SETTLE_TURNS):
            if self.in_use < self.capacity:
                break
            await asyncio.sleep(0)  # one loop turn: polls sockets, runs what is ready
        if self.in_use >= self.capacity:
            self._metrics.requests_rejected.labels(REJECT_INGRESS_FULL).inc()
            raise IngressFull(
                f"the server is at capacity ({self.capacity} requests admitted); retry later"
            )
        self.in_use += 1
        self._metrics.requests_admitted.inc()
        self._metrics.http_permits_in_use.set(self.in_use)
        return Permit(self)

    def _release(self) -> None:
        self.in_use -= 1
        self._metrics.http_permits_in_use.set(self.in_use)

    async def prepare(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` in a preparation slot (waits asynchronously for one)."""
        async with self._slots:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
