"""The Ray Serve ingress: Helios's HTTP API (OpenAI chat and completions, Responses,
Messages, and the rest) passed through to one replica, the body streamed unchanged.

Per request: read the body; for a generation POST with affinity on, build a RouteHint
(the longest recorded prefix of the prompt's page keys, the replica holding
`previous_response_id`); call the replica deployment (its router chooses); learn from
the replica that answered. A replica that fails is the specification's execution
failure: before any byte, a 500 error body in the API's shape; after the SSE headers,
one terminal error event (no [DONE], no message_stop), then the stream ends.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from helios_serve.http.errors import ExecutionFailed
from helios_serve.http.messages_errors import anthropic_body
from helios_serve.http.messages_shapes import sse
from helios_serve.http.responses import error_event
from helios_serve.ray.affinity import DEFAULT_MAX_PAGES, AffinityIndex, RouteHint
from helios_serve.ray.prompt import PromptRouting, RequestView

log = logging.getLogger("helios.ray")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses",
                              "/v1/messages"})
REPLICA_HEADER = "x-helios-replica"  # the Ray replica id that answered (for operators)
RESPONSE_IDS_KEPT = 100_000  # previous_response_id -> replica entries per ingress
_SNIFF_BYTES = 1 << 20  # at most this much of a Responses body is read for its id
_SEQUENCE = re.compile(rb'"sequence_number":\s*(\d+)')


@dataclass(frozen=True)
class RoutingOptions:
    """How the ingress routes (helios-serve-ray's options).

    Attributes:
        affinity: follow prompt prefixes and previous_response_id (False: load only).
        core, trust, accept, resource_key: the core the replicas serve, for its template
            and tokenizer (verified here as by every replica).
        max_pages: leading pages hashed per prompt.
    """

    affinity: bool
    core: str
    trust: tuple[str, ...]
    accept: str
    resource_key: bytes | None = None
    max_pages: int = DEFAULT_MAX_PAGES


def failure_body(path: str, message: str) -> dict[str, Any]:
    """The JSON error body of a failed replica in the API's shape (500 server_error)."""
    error = ExecutionFailed(message)
    return anthropic_body(error) if path == "/v1/messages" else error.body()


def failure_event(path: str, message: str, sequence: int) -> bytes:
    """The terminal SSE error event of a failed replica, as each API ends a stream on an
    execution failure after its headers were sent."""
    if path == "/v1/messages":
        return sse("error", failure_body(path, message))
    if path == "/v1/responses":  # the Responses stream's top-level `error` event
        return sse("error", {"type": "error", "sequence_number": sequence,
                             "code": "server_error", "message": message, "param": None})
    return error_event(failure_body(path, message))


def response_id(content_type: str, body: bytes) -> str | None:
    """The id of a Responses API object: a JSON body's `id`, or the first SSE event's
    `response.id` (response.created); None when `body` does not yet hold it."""
    try:
        if content_type.startswith("text/event-stream"):
            end = body.find(b"\n\n")
            if end < 0:
                return None
            for line in body[:end].split(b"\n"):
                if line.startswith(b"data:"):
                    return json.loads(line[5:])["response"]["id"]
            return None
        return json.loads(body)["id"]
    except (ValueError, KeyError, TypeError):
        return None


class HeliosIngress:
    """The ingress deployment's class (helios_serve.ray.app configures and binds it).

    Args:
        replicas: the replica deployment's handle.
        options: routing options.
    """

    def __init__(self, replicas: Any, options: RoutingOptions) -> None:
        self.replicas = replicas.options(stream=True)
        self.options = options
        self.prompts = (PromptRouting.from_core(options.core, options.trust, options.accept,
                                                options.resource_key)
                        if options.affinity else None)  # fmt: skip
        if self.prompts is not None:
            self.prompts.max_pages = options.max_pages
        self.index = AffinityIndex()
        self.stored: OrderedDict[str, str] = OrderedDict()  # response id -> replica id

    def hint(self, view: RequestView) -> RouteHint:
        preferred, pages = self.index.match(view.keys)
        pinned = self.stored.get(view.previous_response_id or "")
        return RouteHint(preferred, pages, pinned)

    def learn(self, view: RequestView, replica: str) -> None:
        self.index.record(view.keys, replica)

    def remember_response(self, rid: str, replica: str) -> None:
        self.stored[rid] = replica
        self.stored.move_to_end(rid)
        while len(self.stored) > RESPONSE_IDS_KEPT:
            self.stored.popitem(last=False)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        generation = request.method == "POST" and path in GENERATION_PATHS
        view = RequestView()
        hint = None
        if generation and self.prompts is not None:
            view = self.prompts.view(path, body)
            hint = self.hint(view)
        stream = self.replicas.forward.remote(
            request.method, path, request.url.query, list(request.headers.items()), body,
            hint=hint)  # fmt: skip
        try:
            head = await stream.__anext__()
        except (RayError, RayServeException, StopAsyncIteration) as exc:
            log.warning("replica failed before answering %s: %s", path, exc)
            return JSONResponse(failure_body(path, _failure(exc)), status_code=500)
        if generation and self.prompts is not None and head["status"] == 200:
            self.learn(view, head["replica"])
        headers = dict(head["headers"])
        headers[REPLICA_HEADER] = head["replica"]
        content_type = headers.get("content-type", "")
        return StreamingResponse(
            self._rest(stream, path, content_type, head["replica"],
                       sniff=generation and path == "/v1/responses" and head["status"] == 200),
            status_code=head["status"], headers=headers)  # fmt: skip

    async def _rest(self, stream: Any, path: str, content_type: str, replica: str, *,
                    sniff: bool) -> AsyncIterator[bytes]:  # fmt: skip
        seen = b""  # the start of a Responses body, until its id is known
        sequence = -1
        ended = False
        try:
            async for chunk in stream:
                if sniff:
                    seen += chunk
                    rid = response_id(content_type, seen)
                    if rid is not None:
                        self.remember_response(rid, replica)
                    if rid is not None or len(seen) > _SNIFF_BYTES:
                        sniff, seen = False, b""
                numbers = _SEQUENCE.findall(chunk)
                if numbers:
                    sequence = int(numbers[-1])
                yield chunk
            ended = True
        except (RayError, RayServeException) as exc:
            ended = True
            log.warning("replica %s failed while streaming %s: %s", replica, path, exc)
            if not content_type.startswith("text/event-stream"):
                raise  # a JSON body cut short: the connection drops, never a short 200 body
            yield failure_event(path, _failure(exc), sequence + 1)
        finally:
            if not ended:  # the client went away: cancel the replica's call, whose server
                stream.cancel()  # then drops the request (a dropped response cancels it)


def _failure(exc: BaseException) -> str:
    """The client's message for a failed replica (no internals beyond the class)."""
    return f"the replica serving this request failed ({type(exc).__name__})"
