"""Error types of helios-contract.

Two families, both carrying the dotted field path (``model.graphs[2].bindings[0].source``)
and the offending value:

- ``StrictDecodeError``: bytes or JSON that are not a message of the schema.
- ``ContractError``: a well-formed message that breaks a rule of the specification
  (the specification); raised by ``PreparedContract.from_contract``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BindingError",
    "BufferRoleError",
    "CapacityMismatchError",
    "ContractError",
    "DuplicateIdentifierError",
    "ExpertGeometryError",
    "ExtentError",
    "FieldError",
    "FrontendPairingError",
    "FrontendPolicyError",
    "FrontendSyntaxError",
    "LaunchError",
    "LengthSourceError",
    "MalformedMessageError",
    "MissingFieldError",
    "MissingGraphVariantError",
    "OperationMismatchError",
    "PendingTokenError",
    "RankLayoutError",
    "ResourceReferenceError",
    "SamplingDefaultsError",
    "SpeculativeExtentError",
    "StrictDecodeError",
    "TunedOverlapError",
    "TunedProducerError",
    "UnknownEnumError",
    "UnknownFieldError",
    "UnknownIdentifierError",
    "UnspecifiedSelectorError",
    "UnsupportedFeatureError",
    "UnsupportedVersionError",
    "ViewBoundsError",
    "VocabularyRangeError",
]

_NO_VALUE = object()


class FieldError(ValueError):
    """Base of every error that names a field path and an offending value.

    Attributes:
        path: Dotted field path from the decoded root message ("" for the root itself).
        value: The offending value (an int, string, or a short description).
        detail: Human-readable reason, without the path.
        rule: Stable id of the broken rule (``"graph.missing"``) when the error was raised
            from a ``helios_contract.findings.Finding``; "" otherwise.
    """

    rule: str = ""

    def __init__(self, path: str, value: Any = _NO_VALUE, detail: str = "") -> None:
        self.path = path
        self.value = None if value is _NO_VALUE else value
        self.detail = detail
        where = path or "<root>"
        shown = "" if value is _NO_VALUE else f" = {value!r}"
        super().__init__(f"{where}{shown}: {detail}" if detail else f"{where}{shown}")


# --- strict decoding -------------------------------------------------------------------------


class StrictDecodeError(FieldError):
    """Input is not exactly a message of the schema."""


class UnknownFieldError(StrictDecodeError):
    """A binary field number or JSON key the schema does not define (value: number or key)."""


class UnknownEnumError(StrictDecodeError):
    """An enum number or JSON enum name outside the schema's enum."""


class MalformedMessageError(StrictDecodeError):
    """Truncated or corrupt wire bytes, invalid JSON, or a JSON value of the wrong type."""


# --- contract rules --------------------------------------------------------------------------


class ContractError(FieldError):
    """A decoded contract breaks a rule of the specification."""


class UnsupportedVersionError(ContractError):
    """ModelContract.version outside {1, 2, 3}, or a field newer than the declared version."""


class MissingFieldError(ContractError):
    """A required message or list is absent or empty."""


class UnspecifiedSelectorError(ContractError):
    """An enum selector left at its UNSPECIFIED zero value."""


class UnknownIdentifierError(ContractError):
    """A name that does not resolve (manifest buffer, graph, transport, region, plane)."""


class DuplicateIdentifierError(ContractError):
    """A name declared twice where names must be unique."""


class MissingGraphVariantError(UnknownIdentifierError):
    """The contract selects a graph variant the execution manifest lacks."""


class OperationMismatchError(ContractError):
    """A graph's operation disagrees with the execution manifest."""


class CapacityMismatchError(ContractError):
    """A graph's captured capacities disagree with the execution manifest or serving extents."""


class ExpertGeometryError(ContractError):
    """An expert geometry that is inconsistent, or expert launches that disagree with it
    or lack it."""


class ExtentError(ContractError):
    """A zero, negative or inconsistent extent (pages, tokens, rows, windows)."""


class VocabularyRangeError(ContractError):
    """Token ids or histogram/mask geometry outside the declared vocabulary ranges."""


class SpeculativeExtentError(ExtentError):
    """B, D, W, P, lane limit or confidence width of a speculative program are inconsistent."""


class LengthSourceError(ContractError):
    """A speculative program does not bind exactly one length source matching length_source."""


class BindingError(ContractError):
    """A value binding whose fields contradict its source (e.g. image output on a token source)."""


class PendingTokenError(ContractError):
    """Pending-token ownership is missing, doubled, or its state view is not accessed."""


class BufferRoleError(ContractError):
    """A buffer used in a way its manifest role forbids."""


class ViewBoundsError(ContractError):
    """A state view, page-table view or transport lies (partly) outside its buffer."""


class TunedProducerError(ContractError):
    """A tuned binding's producer is not in the tuning catalog or not the manifest's producer."""


class TunedOverlapError(ContractError):
    """A tuned buffer overlaps request inputs, writable graph state or cache storage."""


class SamplingDefaultsError(ContractError):
    """Sampling defaults outside their valid ranges."""


class FrontendPairingError(ContractError):
    """Frontend parser selectors that the specification forbids together (or requires paired)."""


class FrontendSyntaxError(ContractError):
    """Frontend syntax data missing or inconsistent with the selected parsers."""


class FrontendPolicyError(ContractError):
    """Frontend data that would select scheduling, cache, packing or completion behavior."""


class LaunchError(ContractError):
    """A launch record that disagrees with its kernel (arguments, geometry, views)."""


class RankLayoutError(ContractError):
    """Tensor-parallel ranks disagree: a split weight's per-rank resources do not match
    the manifest's rank count."""


class UnsupportedFeatureError(ContractError):
    """A valid contract field that the selected runtime backend cannot execute (its
    capability table, ``helios_contract.capabilities``, does not list it)."""


class ResourceReferenceError(ContractError):
    """A manifest or contract reference to a resource the core's DeploymentBody lacks, or
    holds with the wrong kind or decoded size (checked against the core's resource list)."""
