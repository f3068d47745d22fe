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


class SpeculativeWidthError(RuntimeLoadError):
    """The speculative-width load option asks for a width the core does not capture
    (load-time selection may reduce the captured width, never raise it) or is negative;
    the message names the option value and the captured widths."""


class RankFailure(RuntimeError):
    """The tensor-parallel ranks can no longer run steps together: the step in flight is
    not committed and the model is unhealthy (the worker stops serving it)."""


class RankLost(RankFailure):
    """A rank failed or left (its thread raised, its process exited, a collective was
    abandoned)."""


class RankDisagreement(RankFailure):
    """The ranks' completion records of one step differ: the step is rejected on every
    rank (nothing of it is committed), and their device states may have diverged."""


class SpeculativeRejection(RuntimeError):
    """A rank's completion record of a SPECULATIVE step differs from rank 0's: the ranks
    do not agree on the cohort's validation, so the step is rejected on every rank (the
    specification, "Complete speculative generation": validation agreement suppresses
    commit on all ranks if a rank rejects the cohort). Exactly that step's requests fail
    (nothing of it reaches the scheduler); the ranks serve on, because a speculative step
    writes device state only for its own lanes' requests, which the failure releases."""
