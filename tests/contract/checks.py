"""Assertion helpers for contract tests: exact error class, exact field path."""

from __future__ import annotations

import pytest
from helios_contract import ContractError, PreparedContract


def rejects(cls: type[ContractError], path: str, serving, manifest=None) -> ContractError:
    """Assert ``from_contract`` raises exactly ``cls`` naming ``path``; return the error."""
    with pytest.raises(ContractError) as info:
        PreparedContract.from_contract(serving, manifest)
    error = info.value
    assert type(error) is cls, f"expected {cls.__name__}, got {type(error).__name__}: {error}"
    assert error.path == path, f"expected path {path!r}, got {error.path!r}: {error}"
    assert path in str(error)
    return error


def accepts(serving, manifest=None) -> PreparedContract:
    """Assert the contract (and manifest) validate; return the prepared contract."""
    return PreparedContract.from_contract(serving, manifest)
