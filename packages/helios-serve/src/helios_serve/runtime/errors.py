"""Startup failures of the native runtime; each message is one clear line."""


class RuntimeLoadError(RuntimeError):
    """The runtime cannot load this core with these options.

    Attributes:
        rule: the id of the broken rule when one applies (``lint-core`` reports the same
            rule for the same core), else "".
    """

    def __init__(self, message: str, rule: str = "") -> None:
        super().__init__(message)
        self.rule = rule


class UnknownBackend(RuntimeLoadError):
    """The requested backend does not exist."""


class UnsupportedContract(RuntimeLoadError):
    """The contract declares a field the backend does not execute (its capability table,
    ``helios_tools.capabilities``); the message names the field path and value."""
