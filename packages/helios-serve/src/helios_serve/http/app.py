"""The Litestar application: thin handlers, resources in the lifespan, one error table.

Routes: POST /v1/chat/completions (JSON and SSE), GET /v1/models, GET /health,
GET /metrics. Handlers delegate to `ChatService`; errors become OpenAI-style bodies with
the status from `errors.ERROR_TABLE`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.response import Stream

from helios_serve.http.chat import ChatService, ClientDisconnected
from helios_serve.http.errors import ApiError, status_of

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _service(request: Request) -> ChatService:
    return request.app.state.service


async def _watch_disconnect(request: Request) -> None:
    """Completes when the client closes the connection (read after the body)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Response:
    service = _service(request)
    body = await request.body()
    disconnected = asyncio.ensure_future(_watch_disconnect(request))
    try:
        result = await service.chat(body, disconnected)
    except ClientDisconnected:  # routine: the request is cancelled; nobody reads this
        return Response(b"", status_code=499)
    finally:
        disconnected.cancel()
    if isinstance(result, tuple):  # non-streaming
        content, permit = result
        # The permit is held until the response has been sent (the reader released it).
        return Response(content, status_code=200, background=BackgroundTask(permit.release))
    return Stream(
        result.events(),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
        background=BackgroundTask(result.close),
    )


@get("/v1/models")
async def list_models(request: Request) -> dict:
    service = _service(request)
    names = (service.settings.served_name, *service.settings.aliases)
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": service.created,
                "owned_by": "helios",
                "max_model_len": service.worker.geometry.context_tokens,
            }
            for name in names
        ],
    }


@get("/health")
async def health(request: Request) -> Response:
    service = _service(request)
    if service.worker.alive and service.worker.crashed is None:
        return Response({"status": "ok"}, status_code=200)
    return Response(
        {"status": "unhealthy", "detail": "the model worker is not running"}, status_code=503
    )


@get("/metrics", media_type=MediaType.TEXT)
async def metrics(request: Request) -> Response:
    data, content_type = _service(request).metrics.render()
    return Response(data, media_type=content_type, status_code=200)


def _api_error(_: Request, exc: ApiError) -> Response:
    status, _kind = status_of(exc)
    return Response(exc.body(), status_code=status)


def _http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return Response(
        {"error": {"message": str(exc.detail), "type": kind, "param": None, "code": status}},
        status_code=status,
    )


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return Response(
        {
            "error": {
                "message": "internal server error",
                "type": "server_error",
                "param": None,
                "code": 500,
            }
        },
        status_code=500,
    )


def build_app(service: ChatService) -> Litestar:
    """The ASGI application serving `service`."""

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.draining = True
            service.close()

    app = Litestar(
        route_handlers=[chat_completions, list_models, health, metrics],
        lifespan=[lifespan],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        logging_config=None,
        openapi_config=None,
    )
    app.state.service = service
    return app
