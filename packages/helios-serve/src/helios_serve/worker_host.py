"""The model worker in this process: its one assembly from loaded parts, and its engine
handle.

    model (NativeModel, a test backend) + settings -> build_worker -> ModelWorker
    WorkerHost(worker): the `handle.EngineHandle` of a worker thread in this process

`build_worker` is the one place a worker is assembled: the Server builds its in-process
worker with it, the engine process (engine_process) its own.
"""

from __future__ import annotations

import asyncio

from helios_serve.clock import ObservationClock
from helios_serve.config import ServeSettings
from helios_serve.engine.plan import ModelGeometry
from helios_serve.events import GenerationRequest
from helios_serve.liveness import DEFAULT_STALL_TIMEOUT_S, StallWatch
from helios_serve.metrics import Metrics
from helios_serve.worker import ModelBackend, ModelWorker


def build_worker(model: ModelBackend, settings: ServeSettings, clock: ObservationClock,
                 metrics: Metrics) -> ModelWorker:  # fmt: skip
    """A model worker (scheduler and all) around a loaded model, counting into `metrics`
    (the backend's load counters too, where it has them: NativeModel; the scripted test
    backend has none). Not started.

    Args:
        model: the loaded model backend.
        settings: resolved settings (max_active, queue_capacity, speculation policy,
            stream interval).
        clock: the observation clock (origin at runtime startup).
        metrics: the registry the worker counts into.
    """
    counters = getattr(getattr(model, "backend", None), "counters", None)
    if counters is not None:
        metrics.watch_runtime(lambda: counters, model.frames)
    return ModelWorker(model, clock, metrics, max_active=settings.max_active,
                       queue_capacity=settings.queue_capacity,
                       history_drafting=settings.history_drafting,
                       history_proposer=settings.history_proposer,
                       width_policy=settings.width_policy,
                       stream_interval=settings.stream_interval)


class WorkerHost:
    """The engine handle (`handle.EngineHandle`) of a model worker thread in this
    process: its events reach the HTTP loop through each request's sink, and it counts
    into the server's registry itself (`scrape` has nothing more).

    Args:
        worker: the model worker (not started).
        stall_timeout_s: seconds with work and no turn of the worker's loop that make it
            stalled (`liveness.StallWatch`; helios-serve --engine-stall-timeout).
    """

    def __init__(self, worker: ModelWorker,
                 stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> None:  # fmt: skip
        self.worker = worker
        self._watch = StallWatch(stall_timeout_s)
        self._metrics: Metrics | None = None

    @property
    def geometry(self) -> ModelGeometry:
        return self.worker.geometry

    @property
    def healthy(self) -> bool:
        return (self.worker.crashed is None and self.worker.alive
                and not self.liveness.stalled)

    @property
    def liveness(self) -> StallWatch:
        self._watch.observe(self.worker.steps, self.worker.busy)
        return self._watch

    def start(self) -> None:
        self.worker.start()

    def attach(self, loop: asyncio.AbstractEventLoop, metrics: Metrics) -> None:
        """The worker posts to each request's sink on its loop; `metrics` is the
        registry it counts into already (kept for the staleness gauge)."""
        self._metrics = metrics

    def submit(self, request: GenerationRequest) -> bool:
        if not self.worker.submit(request):
            return False
        self._watch.observe(self.worker.steps, True)  # work arrived: the bound starts now
        return True

    def cancel(self, request_id: int) -> None:
        self.worker.cancel(request_id)

    async def scrape(self) -> list | None:
        """Nothing to fetch: the worker counts into the server's registry. Its gauges
        are stale while it is stalled (it publishes them from its loop)."""
        if self._metrics is not None:
            self._metrics.engine_metrics_stale.set(1 if self.liveness.stalled else 0)
        return None

    def stop(self) -> None:
        self.worker.stop()
