"""API errors and the one table from errors to HTTP statuses (STYLE.md item 11).

Handlers raise these; Litestar's exception handlers and the SSE terminal events both
read `ERROR_TABLE`, so a status never depends on error text (model-contract.md,
admission paragraphs).
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error with an OpenAI-style body.

    Attributes:
        message: human-readable text (never used to choose a status).
        param: the request field at fault, or None.
    """

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        status, kind = status_of(self)
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": status}
        }


class InvalidRequest(ApiError):
    """Invalid request or failed preparation (template, tokenization, grammar)."""


class ModelNotFound(ApiError):
    """The request names a model this server does not serve."""


class IngressFull(ApiError):
    """queue_capacity + max_active requests are already admitted."""


class AdmissionRejected(ApiError):
    """The scheduler rejected the request (outside prepared capacities, queue full)."""


class ExecutionFailed(ApiError):
    """Model execution, device or output failure."""


class ShuttingDown(ApiError):
    """The server is draining."""


# error class -> (HTTP status, OpenAI error type). Subclasses resolve to their first
# listed ancestor; anything unlisted is a 500 server_error.
ERROR_TABLE: dict[type[ApiError], tuple[int, str]] = {
    InvalidRequest: (400, "invalid_request_error"),
    ModelNotFound: (404, "not_found_error"),
    IngressFull: (429, "rate_limit_error"),
    ExecutionFailed: (500, "server_error"),
    AdmissionRejected: (503, "admission_rejected"),
    ShuttingDown: (503, "service_unavailable"),
}


def status_of(error: BaseException) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) of an error, by class only."""
    for cls in type(error).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]  # type: ignore[index]
    return 500, "server_error"
