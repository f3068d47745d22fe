"""The engine handle: what the HTTP layer and the Server hold of the model worker.

Two implementations, one interface (vLLM's `EngineCoreClient` pattern): the worker in
this process (`worker_host.WorkerHost`, a thread) and the worker in the engine process
(`engine_client.EngineClient`, behind a socket). The holder never asks which one it has.

    Server:   start() -> [serving] -> stop()
    HTTP loop (ApiService): attach(loop, metrics) -> submit / cancel / healthy / scrape
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from helios_serve.engine.plan import ModelGeometry
from helios_serve.events import GenerationRequest
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
        """The worker runs and has not crashed: /health's 200, and admission."""
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
        process's, `metrics.engine_families`), or None when it counts in that registry."""
        ...

    def stop(self) -> None:
        """Stop the worker (its live requests fail) and release the model."""
        ...
