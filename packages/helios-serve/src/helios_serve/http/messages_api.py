"""Anthropic's Messages API: POST /v1/messages (JSON, or SSE with `stream: true`) and
POST /v1/messages/count_tokens.

A Messages request runs the chat path end to end: it is translated into the chat
request it means (`messages_schema`), admitted, prepared and submitted by the same
`ApiService.generate` with the same `Preparer.chat` (template, parsers, stops, grammar,
the capacity rule), and delivered by the same `collect` / `SseStream`; only the
presentation is Anthropic's (`messages_shapes`). Errors keep the one error table's
statuses and headers with Anthropic's body (`messages_errors`); with `--api-key` the
routes take `x-api-key: KEY` or `Authorization: Bearer KEY`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar import Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.response import Stream

from helios_serve.http import access
from helios_serve.http.auth import require_api_key_or_x_api_key
from helios_serve.http.delivery import ClientDisconnected, SseStream, collect
from helios_serve.http.errors import ApiError, InvalidRequest, kind_of
from helios_serve.http.messages_errors import STATUS_TYPES, anthropic_body, body
from helios_serve.http.messages_schema import (
    CountTokensRequest,
    MessagesRequest,
    conversation_input,
    messages_input,
    messages_param,
)
from helios_serve.http.messages_shapes import MessagesShapes
from helios_serve.http.responses import ResponseContext
from helios_serve.http.schema import parse
from helios_serve.http.service import ApiService, Generation

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
GUARDS = [require_api_key_or_x_api_key]


def _api_error(_: Request, exc: ApiError) -> Response:
    return Response(anthropic_body(exc), status_code=kind_of(exc).status, headers=exc.headers())


def _http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    kind = STATUS_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return Response(body(kind, str(exc.detail)), status_code=status)


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return Response(body("api_error", "internal server error"), status_code=500)


ERROR_HANDLERS: dict[Any, Any] = {
    ApiError: _api_error,
    HTTPException: _http_error,
    Exception: _internal_error,
}


def _messages_names(exc: ApiError, parsed) -> ApiError:
    """A chat-path rejection naming the Messages request's field (`messages_param`)."""
    exc.param = messages_param(parsed, exc.param)
    return exc


def _parse(service: ApiService, model, raw: bytes):
    try:
        return parse(model, raw)
    except InvalidRequest as exc:
        raise service.invalid(exc) from None


async def _watch_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _log_usage(record: access.AccessRecord, message: dict[str, Any] | None, reasons) -> None:
    if message is not None:
        u = message["usage"]
        record.set_usage({"prompt_tokens": u["input_tokens"] + u["cache_read_input_tokens"],
                          "completion_tokens": u["output_tokens"]}, reasons)  # fmt: skip


@post("/v1/messages", status_code=200, guards=GUARDS, exception_handlers=ERROR_HANDLERS)
async def create_message(request: Request) -> Response:
    """Anthropic Messages: a message (JSON), or its events (SSE with `stream: true`)."""
    service: ApiService = request.app.state.service
    raw = await request.body()
    ingress_ns = service.received()
    parsed = _parse(service, MessagesRequest, raw)
    service.check_model(parsed.model)
    try:
        # Observed ids name the stop string that ended the response (stop_sequence).
        chat = messages_input(parsed, observe_ids=bool(parsed.stop_sequences))
        generation = await service.generate(service.preparer.chat, [chat], id_prefix="msg",
                                            ingress_ns=ingress_ns)  # fmt: skip
    except InvalidRequest as exc:
        raise _messages_names(service.invalid(exc), parsed) from None
    except ApiError as exc:
        raise _messages_names(exc, parsed) from None
    prepared = generation.prepared[0]
    ctx = ResponseContext(
        id="msg_" + generation.id.partition("-")[2], created=generation.created,
        model=generation.model, prompts=(prepared.prompt_token_ids,), first_choice=(0,),
        choices=1, ingress_ns=generation.ingress_ns, enqueue_ns=generation.enqueue_ns,
    )  # fmt: skip
    shapes = MessagesShapes(ctx, prepared.stops.strings, service.preparer.tokenizer,
                            service.engine.geometry.eos_token_ids,
                            service.preparer.frontend.hidden_ids)  # fmt: skip
    return await _deliver(request, generation, shapes, bool(parsed.stream))


async def _deliver(request: Request, generation: Generation, shapes: MessagesShapes,
                   stream: bool) -> Response:  # fmt: skip
    record = access.record_of(request)
    if stream:
        sse = SseStream(generation, shapes)  # type: ignore[arg-type]

        async def close() -> None:  # (a plain function would run in a worker thread)
            sse.close()
            if sse.records[0].finished is not None:
                reason, _ = shapes.stop(sse.records)
                _log_usage(record, {"usage": shapes.usage(sse.records)}, [reason])

        return Stream(sse.events(), media_type="text/event-stream", headers=SSE_HEADERS,
                      background=BackgroundTask(close))  # fmt: skip
    disconnected = asyncio.ensure_future(_watch_disconnect(request))
    try:
        message = await collect(generation, shapes, disconnected)  # type: ignore[arg-type]
    except ClientDisconnected:  # routine: the request is cancelled; nobody reads this
        record.finish = "cancelled"
        return Response(b"", status_code=499)
    finally:
        disconnected.cancel()
    _log_usage(record, message, [message["stop_reason"]])

    async def release() -> None:  # the permit is held until the response has been sent
        generation.release()

    return Response(message, status_code=200, background=BackgroundTask(release))


@post("/v1/messages/count_tokens", status_code=200, guards=GUARDS,
      exception_handlers=ERROR_HANDLERS)  # fmt: skip
async def count_tokens(request: Request) -> dict[str, int]:
    """Anthropic's token count: the prompt a Messages request with these messages, system
    text and tools would send, in tokens (`{"input_tokens": N}`)."""
    service: ApiService = request.app.state.service
    parsed = _parse(service, CountTokensRequest, await request.body())
    service.check_model(parsed.model)
    try:
        chat = conversation_input(parsed)
        _, ids = await service.prepare_only(service.preparer.encode_chat, chat)
    except InvalidRequest as exc:
        raise _messages_names(service.invalid(exc), parsed) from None
    return {"input_tokens": len(ids)}


ROUTES = [create_message, count_tokens]
