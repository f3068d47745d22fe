"""API errors, the one table from errors to HTTP statuses, and the
one place an OpenAI error body is written.

Handlers raise these; Litestar's exception handlers and the SSE terminal events both
read `ERROR_TABLE`, so a status never depends on error text (the specification,
admission paragraphs). `error.code` is a string where OpenAI has one
(`context_length_exceeded`, `rate_limit_exceeded`, `model_not_found`, ...), else null.
A rejection that can never succeed carries `x-should-retry: false` (the official
clients then raise at once instead of retrying); 429 carries `retry-after`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error with an OpenAI-style body.

    Attributes:
        message: human-readable text (never used to choose a status).
        param: the request field at fault, or None.
        code: OpenAI's error code string, or None (the class default when not given).
    """

    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, kind_of(self).type, self.param, self.code)

    def headers(self) -> dict[str, str]:
        return dict(kind_of(self).headers)


class InvalidRequest(ApiError):
    """Invalid request or failed preparation (template, tokenization, grammar)."""


class Unauthorized(ApiError):
    """A protected route without the server's API key."""

    code = "invalid_api_key"


class ModelNotFound(ApiError):
    """The request names a model this server does not serve."""

    code = "model_not_found"


class ResponseNotFound(ApiError):
    """A stored response id that was never stored, was deleted or was evicted."""


class IngressFull(ApiError):
    """queue_capacity + max_active requests are already admitted."""

    code = "rate_limit_exceeded"


class AdmissionRejected(ApiError):
    """The scheduler's admission queue was full (transient)."""


class CapacityExceeded(AdmissionRejected):
    """The request is outside the prepared capacities (context, page table, cache): it
    can never be admitted, so retrying cannot help.

    The message starts with `CONTEXT_WINDOW_PREFIX`: the status stays 503 (scheduler
    admission), and the words are what clients match to tell a context-window error
    from an outage (litellm's ContextWindowExceededError, Anthropic's own wording);
    docs/api.md, "Errors clients can act on".
    """

    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        if not message.startswith(CONTEXT_WINDOW_PREFIX):
            message = CONTEXT_WINDOW_PREFIX + message
        super().__init__(message, param=param, code=code)


CONTEXT_WINDOW_PREFIX = "prompt is too long: "


class ExecutionFailed(ApiError):
    """Model execution, device or output failure."""


class ShuttingDown(ApiError):
    """The server is draining."""


@dataclass(frozen=True)
class ErrorKind:
    """HTTP status, OpenAI error type and response headers of an error class."""

    status: int
    type: str
    headers: tuple[tuple[str, str], ...] = field(default=())


_NO_RETRY = (("x-should-retry", "false"),)

# error class -> kind. Subclasses resolve to their first listed ancestor; anything
# unlisted is a 500 server_error.
ERROR_TABLE: dict[type[ApiError], ErrorKind] = {
    InvalidRequest: ErrorKind(400, "invalid_request_error"),
    Unauthorized: ErrorKind(401, "invalid_request_error"),
    ModelNotFound: ErrorKind(404, "not_found_error"),
    ResponseNotFound: ErrorKind(404, "invalid_request_error"),  # OpenAI's type for it
    IngressFull: ErrorKind(429, "rate_limit_error", (("retry-after", "1"),)),
    ExecutionFailed: ErrorKind(500, "server_error"),
    CapacityExceeded: ErrorKind(503, "admission_rejected", _NO_RETRY),
    AdmissionRejected: ErrorKind(503, "admission_rejected"),
    ShuttingDown: ErrorKind(503, "service_unavailable"),
}
_SERVER_ERROR = ErrorKind(500, "server_error")


def kind_of(error: BaseException) -> ErrorKind:
    """The kind of an error, by class only."""
    for cls in type(error).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]  # type: ignore[index]
    return _SERVER_ERROR


def status_of(error: BaseException) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of an error, by class only."""
    kind = kind_of(error)
    return kind.status, kind.type


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The OpenAI error object: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
