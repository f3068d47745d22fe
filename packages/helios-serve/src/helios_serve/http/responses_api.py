"""The OpenAI Responses API: POST /v1/responses (JSON and SSE), GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items.

A request is admitted, prepared and submitted exactly as a chat completion
(`ApiService.generate` with `Preparer.chat`, over the `ChatInput` that
`responses.conversation` builds), so admission statuses, parsers, stops, grammar and
the specification's rules are the chat path's. Events are presented by
`responses.presenter.ResponseBuilder`; SSE events are `event: TYPE` / `data: JSON`
pairs, without [DONE] (OpenAI's Responses stream). Before headers a rejection is a
status and an OpenAI error body; after them it is one terminal `response.failed`.

Stored responses (`store`, default true): a finished response (completed or
incomplete) is stored with its conversation items and its prompt and generated ids;
`previous_response_id` continues from them, and the next prompt starts with those exact
ids whenever its rendering extends them, so prefix reuse serves the previous turn's
pages and its end snapshot (usage.input_tokens_details.cached_tokens shows it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, delete, get, post
from litestar.background_tasks import BackgroundTask
from litestar.params import FromPath
from litestar.response import Stream

from helios_serve.events import Failed, Rejected
from helios_serve.http import access
from helios_serve.http.auth import require_api_key
from helios_serve.http.errors import InvalidRequest, ResponseNotFound, kind_of
from helios_serve.http.generation_events import (
    ClientDisconnected,
    GenerationEvents,
    terminal_error,
    watch_disconnect,
)
from helios_serve.http.schema import parse
from helios_serve.http.service import ApiService, Generation
from helios_serve.responses.conversation import chat_input
from helios_serve.responses.presenter import ResponseBuilder, StreamEvent
from helios_serve.responses.schema import (
    LOGPROBS_INCLUDE,
    ResponsesRequest,
    check_request,
    input_items,
    new_id,
)
from helios_serve.responses.store import ResponseStore, StoredResponse

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
PROTECTED = [require_api_key]
INPUT_ITEMS_LIMIT = 100  # OpenAI's bound on input_items' `limit`


def _service(request: Request) -> ApiService:
    return request.app.state.service


def _store(request: Request) -> ResponseStore:
    return request.app.state.responses_store


def _stored(request: Request, response_id: str, param: str | None = None) -> StoredResponse:
    stored = _store(request).get(response_id)
    if stored is None:
        raise ResponseNotFound(f"Response with id {response_id!r} not found.", param=param)
    return stored


def _sse(events: list[StreamEvent]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: "
        + json.dumps(e, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"
        for e in events
    )  # fmt: skip


def _skeleton(r: ResponsesRequest, response_id: str, generation: Generation) -> dict[str, Any]:
    """The response object's request-derived fields (effective sampling values)."""
    sampling = generation.prepared[0].sampling
    text = (r.text.model_dump(by_alias=True, exclude_none=True) if r.text is not None
            and r.text.format is not None else {"format": {"type": "text"}})  # fmt: skip
    choice: Any = r.tool_choice if r.tool_choice is not None else "auto"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": generation.model,
        "instructions": r.instructions,
        "tools": [t.model_dump() for t in r.tools or ()],
        "tool_choice": choice if isinstance(choice, str) else choice.model_dump(),
        "parallel_tool_calls": r.parallel_tool_calls is not False,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_output_tokens": r.max_output_tokens,
        "top_logprobs": r.top_logprobs,
        "previous_response_id": r.previous_response_id,
        "metadata": dict(r.metadata or {}),
        "store": r.store is not False,
        "text": text,
        "truncation": "disabled",
        "background": False,
        "service_tier": r.service_tier or "default",
        "user": r.user,
        "reasoning": None,
    }


@post("/v1/responses", status_code=200, guards=PROTECTED)
async def create_response(request: Request) -> Response:
    """OpenAI Responses: create a response (JSON, or SSE with `stream: true`)."""
    service = _service(request)
    body = await request.body()
    ingress_ns = service.received()
    try:
        parsed = parse(ResponsesRequest, body)
        service.check_model(parsed.model)
        check_request(parsed)
        items = input_items(parsed.input)
    except InvalidRequest as exc:
        raise service.invalid(exc) from None
    store = _store(request)
    prefix: tuple[int, ...] = ()
    if parsed.previous_response_id is not None:
        previous = _stored(request, parsed.previous_response_id, "previous_response_id")
        items = previous.items + previous.response["output"] + items
        prefix = previous.token_ids
    logprobs = None
    if LOGPROBS_INCLUDE in (parsed.include or ()):
        if service.engine.geometry.top_logprobs is None:
            raise service.invalid(InvalidRequest(
                f"include {LOGPROBS_INCLUDE!r}: this model records no logprobs (its core "
                "was exported without a logprobs record)", param="include"))
        logprobs = parsed.top_logprobs or 0
    chat = chat_input(parsed, items, prefix, logprobs)
    generation = await service.generate(service.preparer.chat, [chat], id_prefix="resp",
                                        ingress_ns=ingress_ns)  # fmt: skip
    response_id = new_id("resp")
    builder = ResponseBuilder(_skeleton(parsed, response_id, generation),
                              service.pieces if logprobs is not None else None)  # fmt: skip
    prompt_ids = generation.prepared[0].prompt_token_ids

    def finish() -> None:
        """Store a finished response; log its usage (never its contents)."""
        finished = builder.finished
        if finished is None:
            return
        if parsed.store is not False:
            store.put(StoredResponse(response_id, builder.response(), items,
                                     prompt_ids + tuple(builder.output_ids)))  # fmt: skip
        access.record_of(request).set_usage(
            {"prompt_tokens": finished.prompt_tokens,
             "completion_tokens": finished.completion_tokens},
            [finished.reason.value])  # fmt: skip

    events = GenerationEvents(generation)
    if parsed.stream:
        return Stream(_stream(events, builder, finish), media_type="text/event-stream",
                      headers=SSE_HEADERS, background=BackgroundTask(_closer(events)))  # fmt: skip
    disconnected = asyncio.ensure_future(watch_disconnect(request))
    try:
        async for batch in events.batches(disconnected):
            for event in batch:
                if isinstance(event, Rejected | Failed):
                    raise terminal_error(event)
                builder.feed(event)
    except ClientDisconnected:  # routine: the request is cancelled; nobody reads this
        access.record_of(request).finish = "cancelled"
        events.close()
        return Response(b"", status_code=499)
    except BaseException:
        events.close()
        raise
    finally:
        disconnected.cancel()
    finish()
    # The permit is held until the response has been sent (the reader released it).
    return Response(builder.response(), status_code=200,
                    background=BackgroundTask(_closer(events)))  # fmt: skip


def _closer(events: GenerationEvents):
    async def close() -> None:  # (a plain function would run in a worker thread)
        events.close()

    return close


async def _stream(events: GenerationEvents, builder: ResponseBuilder,
                  finish) -> AsyncIterator[bytes]:  # fmt: skip
    try:
        yield _sse(builder.start())
        async for batch in events.batches():
            out: list[StreamEvent] = []
            for event in batch:
                if isinstance(event, Rejected | Failed):
                    error = terminal_error(event)
                    out.append(builder.fail(error.code or kind_of(error).type, error.message))
                else:
                    out.extend(builder.feed(event))
            if builder.finished is not None:
                finish()
            if out:  # (an empty chunk would end a chunked HTTP body)
                yield _sse(out)
    finally:
        events.close()


@get("/v1/responses/{response_id:str}", guards=PROTECTED)
async def retrieve_response(request: Request, response_id: FromPath[str]) -> dict[str, Any]:
    """A stored response (404 for an unknown, deleted or evicted id)."""
    return _stored(request, response_id).response


@delete("/v1/responses/{response_id:str}", status_code=200, guards=PROTECTED)
async def delete_response(request: Request, response_id: FromPath[str]) -> dict[str, Any]:
    """Delete a stored response (404 for an unknown, deleted or evicted id)."""
    if not _store(request).delete(response_id):
        raise ResponseNotFound(f"Response with id {response_id!r} not found.")
    return {"id": response_id, "object": "response", "deleted": True}


@get("/v1/responses/{response_id:str}/input_items", guards=PROTECTED)
async def list_input_items(request: Request, response_id: FromPath[str]) -> dict[str, Any]:
    """A stored response's input items (the conversation's, previous turns included):
    `limit` 1..100 (20), `order` asc or desc (desc), `after` an item id."""
    stored = _stored(request, response_id)
    query = request.query_params
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = 0
    if not 1 <= limit <= INPUT_ITEMS_LIMIT:
        raise InvalidRequest(f"limit must be an integer in 1..{INPUT_ITEMS_LIMIT}",
                             param="limit")  # fmt: skip
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    items = stored.items if order == "asc" else stored.items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequest(f"after: no input item {after!r} in this response",
                                 param="after")  # fmt: skip
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit}  # fmt: skip


ROUTES = [create_response, retrieve_response, delete_response, list_input_items]
