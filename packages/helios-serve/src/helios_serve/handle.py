"""The engine handle: what the HTTP layer and the Server hold of the model worker.

Two implementations, one interface (vLLM's `EngineCoreClient` pattern): the worker in
this process (`worker_host.WorkerHost`, a thread) and the worker in the engine process
(`engine_client.EngineClient`, behind a socket). The holder never asks which one it has.

    Server:   start() -> [serving] -> stop()
    HTTP loop (ApiService): attach(loop, metrics) -> submit / cancel / healthy / liveness
                            / scrape

Liveness (docs/api.md, "Engine liveness"): each handle feeds a `liveness.StallWatch`
with its worker's step counter and whether it has work; a stalled engine is unhealthy.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from helios_serve.engine.plan import ModelGeometry
from helios_serve.events import GenerationRequest
from helios_serve.liveness import StallWatch
from helios_serve.metrics import Metrics


class EngineHandle(Protocol):
    """The model worker as the HTTP layer and the Server see it.

    Attributes:
        geometry: the serving geometry the scheduler plans against (preparation checks
            requests against it: slots, vocabulary, context, top logprobs).
    """

    @property
    def geometry(self) -> ModelGeometry: ...

    @property
    def healthy(self) -> bool:
        """The worker runs, has not crashed and is not stalled (`liveness`): /health's
        200, and admission."""
        ...

    @property
    def liveness(self) -> StallWatch:
        """The stall rule, observed now (HTTP loop): `stalled`, `stalled_for()`,
        `reason()`."""
        ...

    def start(self) -> None:
        """Start serving (any thread, before the listener accepts)."""
        ...

    def attach(self, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> None:
        """On the HTTP event loop, before the first request: `metrics` is the server's
        registry, where the requests finished on this side are counted."""
        ...

    def submit(self, request: GenerationRequest) -> bool:
        """Hand a prepared request to the worker (HTTP loop); False when it cannot take
        it now (its ingress is full or it is not running)."""
        ...

    def cancel(self, request_id: int) -> None:
        """The reader dropped the response: stop generating it (HTTP loop)."""
        ...

    async def scrape(self) -> list | None:
        """The worker's metric families kept outside the server's registry (the engine
        process's, `metrics.engine_families`), or None when it counts in that registry.
        Answers within a bounded time (a stuck engine's part is the last one received)
        and sets the registry's `engine_metrics_stale` gauge (1: the engine's part was
        not refreshed for this scrape)."""
        ...

    def stop(self) -> None:
        """Stop the worker (its live requests fail) and release the model."""
        ...
