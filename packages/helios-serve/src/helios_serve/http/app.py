"""The Litestar application: thin handlers, resources in the lifespan, one error table.

Routes: POST /v1/chat/completions and /v1/completions (JSON and SSE), POST /v1/messages
and /v1/messages/count_tokens (Anthropic's, `messages_api`), GET /v1/models
and /v1/models/{id}, POST /tokenize and /detokenize and GET /tokenizer_info (vLLM's
shapes: what lm-eval's remote tokenizer reads), GET /version,
/health, /metrics, /openapi.json and /docs; the Responses API's routes are
`responses_api`'s. Handlers parse (`schema`), admit and
submit (`service`), and deliver (`delivery`); errors become OpenAI-style bodies with the
status and headers of `errors.ERROR_TABLE`. With an API key, /v1/* and the tokenize
routes need `Authorization: Bearer KEY` (`auth`); every request gets one access log
line (`access`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.background_tasks import BackgroundTask
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.params import FromPath
from litestar.response import Stream

from helios_serve.http import access, messages_api, openapi, responses_api
from helios_serve.http.auth import require_api_key
from helios_serve.http.delivery import ClientDisconnected, SseStream, collect
from helios_serve.http.errors import ApiError, InvalidRequest, ModelNotFound, error_body, kind_of
from helios_serve.http.responses import ChatShapes, CompletionShapes, ResponseContext, Shapes, usage
from helios_serve.http.schema import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    chat_input,
    completion_inputs,
    parse,
)
from helios_serve.http.service import ApiService, Generation
from helios_serve.responses.store import ResponseStore

log = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PROTECTED = [require_api_key]


def _service(request: Request) -> ApiService:
    return request.app.state.service


async def _watch_disconnect(request: Request) -> None:
    """Completes when the client closes the connection (read after the body)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _parse(service: ApiService, model, body: bytes):
    try:
        return parse(model, body)
    except InvalidRequest as exc:
        raise service.invalid(exc) from None


async def _deliver(request: Request, generation: Generation, shapes: Shapes,
                   stream: bool) -> Response:  # fmt: skip
    record = access.record_of(request)
    if stream:
        sse = SseStream(generation, shapes)

        async def close() -> None:  # (a plain function would run in a worker thread)
            sse.close()
            record.set_usage(usage(shapes.ctx, sse.records),
                             [r.finished.reason.value for r in sse.records if r.finished])

        return Stream(sse.events(), media_type="text/event-stream", headers=SSE_HEADERS,
                      background=BackgroundTask(close))  # fmt: skip
    disconnected = asyncio.ensure_future(_watch_disconnect(request))
    try:
        body = await collect(generation, shapes, disconnected)
    except ClientDisconnected:  # routine: the request is cancelled; nobody reads this
        record.finish = "cancelled"
        return Response(b"", status_code=499)
    finally:
        disconnected.cancel()
    record.set_usage(body["usage"], [c["finish_reason"] for c in body["choices"]])
    # The permit is held until the response has been sent (the reader released it).
    async def release() -> None:  # (a plain function would run in a worker thread)
        generation.release()

    return Response(body, status_code=200, background=BackgroundTask(release))


def _context(service: ApiService, generation: Generation, stream_options, **extra) -> ResponseContext:
    firsts, first = [], 0
    for p in generation.prepared:
        firsts.append(first)
        first += p.n
    include = bool(stream_options and stream_options.include_usage)
    return ResponseContext(
        id=generation.id,
        created=generation.created,
        model=generation.model,
        prompts=tuple(p.prompt_token_ids for p in generation.prepared),
        first_choice=tuple(firsts),
        choices=generation.choices,
        include_usage=include,
        continuous_usage=include and bool(stream_options.continuous_usage_stats),
        logprobs=generation.prepared[0].logprobs is not None,
        ingress_ns=generation.ingress_ns,
        enqueue_ns=generation.enqueue_ns,
        **extra,
    )


@post("/v1/chat/completions", status_code=200, guards=PROTECTED)
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions (JSON, or SSE with `stream: true`)."""
    service = _service(request)
    body = await request.body()
    ingress_ns = service.received()
    parsed = _parse(service, ChatCompletionRequest, body)
    service.check_model(parsed.model)
    try:
        chat = chat_input(parsed)
    except InvalidRequest as exc:
        raise service.invalid(exc) from None
    generation = await service.generate(service.preparer.chat, [chat], id_prefix="chatcmpl",
                                        ingress_ns=ingress_ns)  # fmt: skip
    prepared = generation.prepared[0]
    ctx = _context(service, generation, parsed.stream_options,
                   observe_ids=prepared.observe_ids,
                   observe_timestamps=prepared.observe_timestamps,
                   prompt_logprobs=prepared.prompt_logprobs is not None)  # fmt: skip
    return await _deliver(request, generation, ChatShapes(ctx, service.pieces),
                          bool(parsed.stream))  # fmt: skip


@post("/v1/completions", status_code=200, guards=PROTECTED)
async def completions(request: Request) -> Response:
    """OpenAI legacy completions: a prompt string, strings, token ids or id lists. With
    `echo` and `logprobs`, the prompt's log probabilities (scored prefill) open each
    choice's `logprobs`; `max_tokens` 0 with `echo` returns the prompt only."""
    service = _service(request)
    body = await request.body()
    ingress_ns = service.received()
    parsed = _parse(service, CompletionRequest, body)
    service.check_model(parsed.model)
    try:
        inputs = completion_inputs(parsed)
    except InvalidRequest as exc:
        raise service.invalid(exc) from None
    generation = await service.generate(service.preparer.completion, inputs, id_prefix="cmpl",
                                        ingress_ns=ingress_ns)  # fmt: skip
    ctx = _context(service, generation, parsed.stream_options, echo=bool(parsed.echo),
                   prompt_texts=tuple(p.prompt_text for p in generation.prepared),
                   echo_only=parsed.max_tokens == 0)  # fmt: skip
    return await _deliver(request, generation, CompletionShapes(ctx, service.pieces),
                          bool(parsed.stream))  # fmt: skip


def _model_card(service: ApiService, name: str) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": service.created,
        "owned_by": "helios",
        "max_model_len": service.engine.geometry.context_tokens,
    }


@get("/v1/models", guards=PROTECTED)
async def list_models(request: Request) -> dict[str, Any]:
    """The served model and its aliases."""
    service = _service(request)
    names = (service.settings.served_name, *service.settings.aliases)
    return {"object": "list", "data": [_model_card(service, n) for n in names]}


@get("/v1/models/{model_id:str}", guards=PROTECTED)
async def retrieve_model(request: Request, model_id: FromPath[str]) -> dict[str, Any]:
    """One served model (404 `model_not_found` for any other id)."""
    service = _service(request)
    if model_id not in service.model_names:
        raise ModelNotFound(f"model {model_id!r} is not served here", param="model")
    return _model_card(service, model_id)


@post("/tokenize", status_code=200, guards=PROTECTED)
async def tokenize(request: Request) -> dict[str, Any]:
    """vLLM's /tokenize: a prompt, or chat messages rendered with the template."""
    service = _service(request)
    parsed = _parse(service, TokenizeRequest, await request.body())
    service.check_model(parsed.model)
    if (parsed.prompt is None) == (parsed.messages is None):
        raise service.invalid(InvalidRequest("give exactly one of prompt and messages",
                                             param="prompt"))  # fmt: skip
    tok = service.preparer.tokenizer
    if parsed.prompt is not None:
        special = parsed.add_special_tokens is not False
        ids = tuple(tok.encode(parsed.prompt, add_special_tokens=special).ids)
    else:
        chat = ChatCompletionRequest.model_construct(
            messages=parsed.messages, tools=parsed.tools, model="",
            chat_template_kwargs=parsed.chat_template_kwargs,
            add_generation_prompt=parsed.add_generation_prompt,
            continue_final_message=parsed.continue_final_message,
        )  # fmt: skip
        try:
            chat_in = chat_input(chat)
        except InvalidRequest as exc:
            raise service.invalid(exc) from None
        _, ids = await service.prepare_only(service.preparer.encode_chat, chat_in)
    out: dict[str, Any] = {"count": len(ids), "max_model_len":
                           service.engine.geometry.context_tokens, "tokens": list(ids)}  # fmt: skip
    out["token_strs"] = ([tok.id_to_token(i) for i in ids]
                         if parsed.return_token_strs else None)  # fmt: skip
    return out


@post("/detokenize", status_code=200, guards=PROTECTED)
async def detokenize(request: Request) -> dict[str, Any]:
    """vLLM's /detokenize: token ids to text."""
    service = _service(request)
    parsed = _parse(service, DetokenizeRequest, await request.body())
    service.check_model(parsed.model)
    tok = service.preparer.tokenizer
    limit = tok.get_vocab_size(with_added_tokens=True)
    for i, tid in enumerate(parsed.tokens):
        if tid >= limit:
            raise service.invalid(InvalidRequest(
                f"token id {tid} is outside the vocabulary of {limit}", param=f"tokens[{i}]"))
    return {"prompt": tok.decode(parsed.tokens, skip_special_tokens=False)}


@get("/tokenizer_info", guards=PROTECTED)
async def tokenizer_info(request: Request) -> dict[str, Any]:
    """vLLM's /tokenizer_info: the special tokens, chat template and context extent
    (lm-eval's `local-completions` detects /tokenizer_info and /tokenize and tokenizes
    through them)."""
    service = _service(request)
    names = service.bootstrap.template_variables
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": names.get("eos_token"),
        "bos_token": names.get("bos_token"),
        "pad_token": names.get("pad_token"),
        "unk_token": names.get("unk_token"),
        "chat_template": service.bootstrap.chat_template,
        "model_max_length": service.engine.geometry.context_tokens,
    }


def _package_version() -> str:
    """The installed helios-serve distribution's version; "unknown" when the package runs
    from a source tree on PYTHONPATH without distribution metadata (the GPU machine)."""
    try:
        return metadata.version("helios-serve")
    except metadata.PackageNotFoundError:
        return "unknown"


@get("/version")
async def version() -> dict[str, str]:
    """The helios-serve version."""
    return {"version": _package_version()}


@get("/health")
async def health(request: Request) -> Response:
    """200 while the model worker runs and is not stalled (docs/api.md, "Engine
    liveness"), else 503 with the reason."""
    service = _service(request)
    if service.worker_running():
        return Response({"status": "ok"}, status_code=200)
    return Response({"status": "unhealthy", "detail": service.unhealthy_reason()},
                    status_code=503)


@get("/metrics", media_type=MediaType.TEXT)
async def metrics(request: Request) -> Response:
    """Prometheus text exposition."""
    data, content_type = await _service(request).render_metrics()
    # Litestar appends "; charset=utf-8" to a text/ media type itself
    media_type = "; ".join(p for p in content_type.split("; ") if not p.startswith("charset="))
    return Response(data, media_type=media_type, status_code=200)


def _api_error(_: Request, exc: ApiError) -> Response:
    return Response(exc.body(), status_code=kind_of(exc).status, headers=exc.headers())


def _http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return Response(error_body(str(exc.detail), kind), status_code=status)


def _internal_error(_: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return Response(error_body("internal server error", "server_error"), status_code=500)


def build_app(service: ApiService) -> Litestar:
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
        route_handlers=[chat_completions, completions, list_models, retrieve_model, tokenize,
                        detokenize, tokenizer_info, version, health, metrics, openapi.openapi_json,
                        openapi.docs_asset, *responses_api.ROUTES, *messages_api.ROUTES],
        lifespan=[lifespan],
        middleware=[access.middleware],
        before_send=[access.before_send],
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        logging_config=None,
        openapi_config=OpenAPIConfig(
            title="Helios", version=_package_version(), path="/docs",
            render_plugins=[openapi.swagger_plugin()],
            use_handler_docstrings=True,
        ),
    )  # fmt: skip
    app.state.service = service
    app.state.responses_store = ResponseStore(service.settings.responses_db)
    app.state.api_key = service.settings.api_key
    openapi.add_request_bodies(app, sorted(service.model_names))
    return app
