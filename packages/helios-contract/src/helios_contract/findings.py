"""Findings: every rule of the contract is written once, as a generator of findings.

A rule is a function that yields one ``Finding`` per violation it sees (and nothing for a
valid input). Each consumer takes what it needs from the same generators:

- ``PreparedContract.from_contract`` (startup) raises the first finding as its
  ``ContractError`` subclass (``Finding.to_error``), so startup stops at the first
  broken rule;
- ``helios-tools lint-core`` lists every finding.

So a rule cannot drift between startup and lint, and lint-core passing means startup
cannot fail for a structural reason. How to add a rule: docs/contract-rules.md.

Rule ids are stable, dotted and name one fact (``graph.missing``,
``cache.view_columns``); lint's output and the ``rule`` attribute of the raised error
carry them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from helios_contract.errors import _NO_VALUE, ContractError

__all__ = ["Finding", "raise_first"]


def _text(value: Any) -> str:
    return "" if value is _NO_VALUE or value is None else str(value)


@dataclass(frozen=True)
class Finding:
    """One violation of one rule.

    Attributes:
        rule: Stable rule id, e.g. ``"graph.missing"``.
        path: Where: a field path from the ``ServingContract`` root
            (``model.graphs[1].name``), a manifest path (``manifest.buffers[3]``) or a
            core path (``resources["weights"]``).
        value: The offending value, as text ("" when there is none).
        detail: Why it fails, in words (without the path).
        error: The ``ContractError`` subclass startup raises for it.
        raw: The offending value itself (what the raised error's ``value`` holds).
    """

    rule: str
    path: str
    value: str
    detail: str
    error: type[ContractError] = field(default=ContractError, compare=False, repr=False)
    raw: Any = field(default=_NO_VALUE, compare=False, repr=False)

    @classmethod
    def of(cls, rule: str, error: type[ContractError], path: str, value: Any = _NO_VALUE,
           detail: str = "") -> Finding:
        """A finding of ``rule`` raised at startup as ``error(path, value, detail)``."""
        return cls(rule, path, _text(value), detail, error, value)

    def to_error(self) -> ContractError:
        """The exception startup raises for this finding (``.rule`` is set)."""
        error = self.error(self.path, self.raw, self.detail)
        error.rule = self.rule
        return error

    def to_dict(self) -> dict[str, str]:
        """``{rule, path, value, detail}`` as text (lint-core's JSON output)."""
        return {k: v for k, v in asdict(self).items() if k in ("rule", "path", "value", "detail")}

    def __str__(self) -> str:
        shown = f" = {self.value}" if self.value else ""
        return f"{self.rule}: {self.path or '<root>'}{shown}: {self.detail}"


def raise_first(findings: Iterable[Finding]) -> None:
    """Raise the first finding as its ``ContractError`` (nothing when there is none).

    Generators are lazy: rules after the first violation are not evaluated.
    """
    for finding in findings:
        raise finding.to_error()
