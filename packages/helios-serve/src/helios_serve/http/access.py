"""One access log line per response (logger `helios_serve.access`, INFO), and request ids.

    POST /v1/chat/completions 200 prompt_tokens=23 completion_tokens=9 duration_ms=412.3 finish=stop request_id=5f0c...

Method, route, status, token usage, duration, finish reason(s) and the request id; never
prompt or output text. A streamed response is logged when its stream ends (its usage is
known then); a request that failed before generation logs `-` for the token fields.
Every response gets its line: a routed request's by the middleware, one that matched no
route (404, 405: Litestar answers it before any route middleware) by the `before_send`
hook when its body has been sent.

`x-request-id`: a client's id (1 to 128 visible ASCII characters) is kept, else one is
generated (32 hex digits); it is echoed on every response and written in the line.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from litestar import Request
from litestar.datastructures import MutableScopeHeaders
from litestar.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("helios_serve.access")

_SCOPE_KEY = "helios.access"


@dataclass
class AccessRecord:
    """What the handler learned about a request, for its log line."""

    request_id: str = ""
    status: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish: str | None = None
    start_s: float = field(default_factory=time.perf_counter)
    routed: bool = False  # the middleware runs: it writes the line

    def set_usage(self, usage: dict[str, Any], reasons: list[str]) -> None:
        self.prompt_tokens = usage["prompt_tokens"]
        self.completion_tokens = usage["completion_tokens"]
        self.finish = ",".join(reasons) if reasons else self.finish

    def line(self, method: str, path: str) -> str:
        def value(v: object) -> str:
            return "-" if v is None else str(v)

        duration_ms = (time.perf_counter() - self.start_s) * 1e3
        return (f"{method} {path} {self.status} prompt_tokens={value(self.prompt_tokens)} "
                f"completion_tokens={value(self.completion_tokens)} "
                f"duration_ms={duration_ms:.1f} finish={value(self.finish)} "
                f"request_id={self.request_id}")  # fmt: skip


_MAX_REQUEST_ID = 128


def request_id_of(scope: Scope) -> str:
    """The client's `x-request-id` when it is 1 to 128 visible ASCII characters (it goes
    into a header and a log line as it is), else a new one."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            if 0 < len(value) <= _MAX_REQUEST_ID and all(0x21 <= b <= 0x7E for b in value):
                return value.decode()
            break
    return uuid.uuid4().hex


def _new_record(scope: Scope) -> AccessRecord:
    record = AccessRecord(request_id=request_id_of(scope))
    scope[_SCOPE_KEY] = record  # type: ignore[literal-required]
    return record


def record_of(request: Request) -> AccessRecord:
    """The request's access record (made by the middleware)."""
    record = request.scope.get(_SCOPE_KEY)  # type: ignore[call-overload]
    if record is None:  # an app built without the middleware (tests of handlers)
        record = _new_record(request.scope)  # type: ignore[arg-type]
    return record


def middleware(app: ASGIApp) -> ASGIApp:
    """ASGI middleware writing the access line after the response is sent."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        record = scope.get(_SCOPE_KEY) or _new_record(scope)  # type: ignore[call-overload]
        record.routed = True  # this middleware writes the line (after background tasks)

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            await send(message)

        try:
            await app(scope, receive, capture)
        except asyncio.CancelledError:
            # uvicorn cancels the connections still open when the shutdown drain ends
            # (the specification: five seconds, then they are dropped): one line each;
            # `QuietCancelledConnections` keeps uvicorn from adding a traceback.
            record.finish = "dropped"
            log.warning("dropped an open %s %s at shutdown: the connection drain ended",
                        scope["method"], scope["path"])
            raise
        finally:
            log.info(record.line(scope["method"], scope["path"]))

    return wrapped


async def before_send(message: Message, scope: Scope) -> None:
    """Litestar's `before_send` hook: every response start carries `x-request-id`; a
    response to a request that matched no route (no middleware ran) gets its access line
    once its body has been sent."""
    if scope["type"] != "http":
        return
    record = scope.get(_SCOPE_KEY) or _new_record(scope)  # type: ignore[call-overload]
    if message["type"] == "http.response.start":
        MutableScopeHeaders.from_message(message)["x-request-id"] = record.request_id
        if not record.routed:
            record.status = message["status"]
    elif (message["type"] == "http.response.body" and not record.routed
          and not message.get("more_body", False)):
        log.info(record.line(scope["method"], scope["path"]))


class QuietCancelledConnections(logging.Filter):
    """A filter for the `uvicorn.error` logger: drops what it logs of connections cancelled
    at the end of the shutdown drain, which the access middleware already logged as one
    line each: the "Exception in ASGI application" record (a traceback) and the ERROR
    "Cancel N running task(s), timeout graceful shutdown exceeded" (the drain's documented
    end, not a failure)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError):
            return False
        return not (isinstance(record.msg, str)
                    and record.msg.endswith("timeout graceful shutdown exceeded"))
