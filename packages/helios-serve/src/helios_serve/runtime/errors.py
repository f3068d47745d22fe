"""Startup failures of the native runtime; each message is one clear line."""


class RuntimeLoadError(RuntimeError):
    """The runtime cannot load this core with these options."""


class UnknownBackend(RuntimeLoadError):
    """The requested backend does not exist."""


class MissingGraphVariant(RuntimeLoadError):
    """The contract selects a graph the execution manifest lacks (or the reverse)."""


class UnsupportedBinding(RuntimeLoadError):
    """A value binding names a source or indexing this runtime cannot pack."""
