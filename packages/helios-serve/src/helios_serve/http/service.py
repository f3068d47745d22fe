"""Admission and submission of one generation request (chat or legacy completions).

    permit (429) -> preparation slot -> frontend preparation (400; 503 when the request
    can never fit) -> submit to the model worker (503 when its channel is full)
    -> a `Generation` whose events the delivery layer turns into JSON or SSE

Everything here happens before any response byte, so every rejection is a status and
a JSON body (docs/api.md). Status codes come from the error table
(`errors.ERROR_TABLE`). The HTTP layer only admits and delivers: preparation is the
frontend's (`frontend.prepare.Preparer`), generation the worker's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from helios_serve.bootstrap import Bootstrap
from helios_serve.clock import ObservationClock
from helios_serve.config import ServeSettings
from helios_serve.events import EventSink, GenerationRequest
from helios_serve.frontend.errors import FrontendRequestError
from helios_serve.frontend.image_prompt import ImagePrompt
from helios_serve.frontend.images import ImageLimits
from helios_serve.frontend.prepare import CapacityExceeded as PrepCapacityExceeded
from helios_serve.frontend.prepare import PreparedRequest, Preparer
from helios_serve.frontend.vocab import TokenPieces
from helios_serve.handle import EngineHandle
from helios_serve.http.admission import Admission
from helios_serve.http.errors import (
    AdmissionRejected,
    CapacityExceeded,
    InvalidRequest,
    ModelNotFound,
    ShuttingDown,
)
from helios_serve.metrics import REJECT_INVALID, REJECT_SCHEDULER, Metrics

_request_ids = itertools.count(1)
T = TypeVar("T")


@dataclass
class Generation:
    """One admitted, submitted HTTP request: one GenerationRequest per prompt (legacy
    completions may carry several), all publishing to one sink.

    Attributes:
        id: the response id (`chatcmpl-...` or `cmpl-...`).
        requests: the submitted requests, in prompt order.
        sink: their shared event sink.
        release: releases the HTTP admission permit (idempotent); call it once the
            reader released the response.
        ingress_ns / enqueue_ns: observation-clock times (handler entry after JSON
            decoding; right before submission).
    """

    id: str
    created: int
    model: str
    requests: tuple[GenerationRequest, ...]
    sink: EventSink
    release: Callable[[], None]
    cancel: Callable[[], None]
    ingress_ns: int
    enqueue_ns: int

    @property
    def prepared(self) -> tuple[PreparedRequest, ...]:
        return tuple(r.prepared for r in self.requests)

    @property
    def choices(self) -> int:
        return sum(p.n for p in self.prepared)


class ApiService:
    """Admission, preparation and submission for one served model; HTTP event loop only.

    Args:
        bootstrap: the loaded core (frontend, template, defaults).
        engine: the model worker's handle (in this process or the engine process).
        settings: resolved settings.
        metrics: the server's metrics.
        clock: the observation clock.
    """

    def __init__(
        self,
        bootstrap: Bootstrap,
        engine: EngineHandle,
        settings: ServeSettings,
        metrics: Metrics,
        clock: ObservationClock,
    ) -> None:
        self.bootstrap = bootstrap
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.admission: Admission | None = None  # made on the event loop (lifespan)
        self.created = int(time.time())
        self.draining = False
        images = ImagePrompt(bootstrap.frontend.syntax, engine.geometry,
                             ImageLimits(max_images=settings.max_images_per_request,
                                         max_pixels=settings.max_image_pixels),
                             allow_urls=settings.allow_image_urls)
        self.preparer = Preparer(bootstrap.frontend, bootstrap.chat_template,
                                 bootstrap.template_variables, bootstrap.defaults,
                                 engine.geometry, images)  # fmt: skip
        self.pieces = TokenPieces(bootstrap.tokenizer)  # logprob token texts and bytes
        names = (settings.served_name, *settings.aliases)
        self.model_names = frozenset(n for n in names if n)

    def start(self) -> None:
        """On the event loop, before serving."""
        self.admission = Admission(
            self.settings.http_capacity, self.settings.frontend_workers, self.metrics
        )
        self.engine.attach(asyncio.get_running_loop(), self.metrics)

    async def render_metrics(self) -> tuple[bytes, str]:
        """The /metrics exposition (with the engine process's share when there is one),
        within a bounded time: the engine handle's scrape is bounded, and a stuck
        engine's share is its last one, marked helios_engine_metrics_stale."""
        engine = await self.engine.scrape()
        liveness = self.engine.liveness
        self.metrics.engine_stalled.set(1 if liveness.stalled else 0)
        self.metrics.engine_stalled_seconds.set(liveness.stalled_for())
        return self.metrics.render(engine)

    def close(self) -> None:
        if self.admission is not None:
            self.admission.close()

    def check_model(self, model: str | None) -> None:
        """Raises ModelNotFound (404) for a model this server does not serve."""
        if model is not None and model not in self.model_names:
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise ModelNotFound(
                f"model {model!r} is not served here; available: "
                f"{', '.join(sorted(self.model_names))}",
                param="model",
            )

    def received(self) -> int:
        """Count a request and stamp its ingress time (after JSON decoding).

        Raises:
            ShuttingDown: the server is draining.
        """
        self.metrics.requests_received.inc()
        if self.draining:
            raise ShuttingDown("the server is shutting down")
        return self.clock.now_ns()

    def invalid(self, exc: InvalidRequest) -> InvalidRequest:
        self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
        return exc

    async def prepare_only(self, fn: Callable[..., T], *args: object) -> T:
        """Run a preparation-only request (tokenize) under a permit and a slot."""
        assert self.admission is not None
        with await self.admission.acquire():
            return await self._prepared(fn, *args)

    async def generate(
        self, fn: Callable[[T], PreparedRequest], inputs: Sequence[T], *, id_prefix: str,
        ingress_ns: int,
    ) -> Generation:  # fmt: skip
        """Admit, prepare each input with `fn` and submit the requests.

        Raises:
            IngressFull (429), InvalidRequest (400), CapacityExceeded (503, no retry),
            AdmissionRejected (503: the worker's channel is full or it is not running;
            a worker that is not running or is stalled refuses at admission: no
            permit, not admitted).
        """
        assert self.admission is not None
        if not self.worker_running():
            self.metrics.requests_rejected.labels(REJECT_SCHEDULER).inc()
            raise AdmissionRejected(self.unhealthy_reason())
        with await self.admission.acquire() as permit:
            prepared = [await self._prepared(fn, x) for x in inputs]
            self._check_held(prepared)
            sink = EventSink(asyncio.get_running_loop(), choices=sum(p.n for p in prepared))
            enqueue_ns = self.clock.now_ns()  # immediately before submission
            requests, first = [], 0
            for p in prepared:
                requests.append(GenerationRequest.build(next(_request_ids), p, sink,
                                                        enqueue_ns, first))  # fmt: skip
                first += p.n
            for i, request in enumerate(requests):
                if not self.engine.submit(request):
                    for sent in requests[:i]:
                        self.engine.cancel(sent.request_id)
                    self.metrics.requests_rejected.labels(REJECT_SCHEDULER).inc()
                    if not self.worker_running():  # it stopped while this one was prepared
                        raise AdmissionRejected("the model worker is not running")
                    raise AdmissionRejected("the model queue is full; retry later")
            release = permit.hand_off()

        def cancel() -> None:
            for request in requests:
                self.engine.cancel(request.request_id)

        return Generation(
            id=f"{id_prefix}-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.settings.served_name,
            requests=tuple(requests),
            sink=sink,
            release=release,
            cancel=cancel,
            ingress_ns=ingress_ns,
            enqueue_ns=enqueue_ns,
        )

    def _check_held(self, prepared: list[PreparedRequest]) -> None:
        """Refuse a request whose choices (a prompt list's prompts times n) outnumber the
        running slots and the admission queue together: the worker would take the first
        prompts and refuse the rest as a full queue (a 503 to retry) even on an idle
        server, every time. (One prompt's n is checked at preparation, against the slots.)

        Raises:
            InvalidRequest: 400 naming `prompt`.
        """
        choices = sum(p.n for p in prepared)
        held = self.settings.max_active + self.settings.queue_capacity
        if choices > held:
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise InvalidRequest(
                f"{len(prepared)} prompts of n {prepared[0].n} make {choices} requests; this "
                f"server holds {held} at once ({self.settings.max_active} running, "
                f"{self.settings.queue_capacity} queued)", param="prompt")

    def worker_running(self) -> bool:
        """The model worker (or the engine process) runs: /health's 200, and admission."""
        return self.engine.healthy

    def unhealthy_reason(self) -> str:
        """/health's 503 detail: the stall (`liveness.StallWatch.reason`) or a worker
        that is not running."""
        return self.engine.liveness.reason() or "the model worker is not running"

    async def _prepared(self, fn: Callable[..., T], *args: object) -> T:
        assert self.admission is not None
        try:
            return await self.admission.prepare(fn, *args)
        except FrontendRequestError as exc:
            self.metrics.requests_rejected.labels(REJECT_INVALID).inc()
            raise InvalidRequest(exc.message, param=exc.field) from None
        except PrepCapacityExceeded as exc:
            self.metrics.requests_rejected.labels(REJECT_SCHEDULER).inc()
            raise CapacityExceeded(exc.error.detail, param=exc.param) from None
