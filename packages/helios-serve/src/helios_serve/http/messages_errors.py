"""Anthropic error bodies: `{"type": "error", "error": {"type": ..., "message": ...}}`.

The status and headers of an error stay those of the one error table
(`errors.ERROR_TABLE`, the specification's admission statuses: 400, 401, 404, 429, 503,
500); only the body's shape and type names are Anthropic's. A request that can never fit
(503 `CapacityExceeded`) is an `invalid_request_error` saying "prompt is too long" as
Anthropic's own is; a transient admission rejection or a draining server is an
`overloaded_error`.
"""

from __future__ import annotations

from typing import Any

from helios_serve.http.errors import (
    AdmissionRejected,
    ApiError,
    CapacityExceeded,
    ExecutionFailed,
    IngressFull,
    InvalidRequest,
    ModelNotFound,
    ShuttingDown,
    Unauthorized,
)

# error class -> Anthropic error type; subclasses resolve to their first listed ancestor
ANTHROPIC_TYPES: dict[type[ApiError], str] = {
    InvalidRequest: "invalid_request_error",
    Unauthorized: "authentication_error",
    ModelNotFound: "not_found_error",
    IngressFull: "rate_limit_error",
    ExecutionFailed: "api_error",
    CapacityExceeded: "invalid_request_error",
    AdmissionRejected: "overloaded_error",
    ShuttingDown: "overloaded_error",
}

# HTTP status -> Anthropic error type, for errors raised outside the handlers (Litestar's)
STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 405: "invalid_request_error",
                413: "request_too_large", 429: "rate_limit_error"}  # fmt: skip


def anthropic_type(error: ApiError) -> str:
    for cls in type(error).__mro__:
        if cls in ANTHROPIC_TYPES:
            return ANTHROPIC_TYPES[cls]  # type: ignore[index]
    return "api_error"


def error_message(error: ApiError) -> str:
    """The message; an invalid request's names the field at fault (Anthropic's body has
    no `param`)."""
    if isinstance(error, InvalidRequest) and error.param \
            and not error.message.startswith(error.param) and f"'{error.param}'" not in error.message:
        return f"{error.param}: {error.message}"
    return error.message


def anthropic_body(error: ApiError) -> dict[str, Any]:
    return body(anthropic_type(error), error_message(error))


def body(kind: str, message: str) -> dict[str, Any]:
    """The Anthropic error object."""
    return {"type": "error", "error": {"type": kind, "message": message}}
