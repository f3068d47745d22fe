"""Frontend errors: startup misconfiguration versus invalid requests."""

from __future__ import annotations


class FrontendConfigError(ValueError):
    """The prepared frontend contract cannot be served (fails startup).

    Attributes:
        rule: the broken rule's id (``helios_contract.Finding.rule``; lint-core reports
            the same), or "" for a selector this frontend does not implement.
    """

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


class FrontendRequestError(ValueError):
    """A request's frontend fields are invalid (the HTTP layer answers 400).

    Attributes:
        field: the request field at fault, e.g. "stop" or "response_format".
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class StopValidationError(FrontendRequestError):
    """`stop`, `stop_token_ids` or `stop_token_sequences` violates a limit."""


class GrammarError(FrontendRequestError):
    """A structured-output or tool-choice grammar cannot be built."""
