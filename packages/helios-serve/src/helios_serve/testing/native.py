"""Load an open core's graphs without Bootstrap (tests and benchmarks of the runtime).

Serving goes Bootstrap.load -> NativeModel.load(bootstrap.prepared, ...); a test or a
benchmark holding a core object (a verified ``helios_tools`` Core, or an in-memory one
with ``contract``, ``manifest`` and ``read_resource``) validates it the same way here.
"""

from __future__ import annotations

from typing import Any

from helios_contract import PreparedContract

from helios_serve.runtime.native_model import NativeModel

__all__ = ["load_native"]


def load_native(core: Any, backend: str = "cpu", **options: Any) -> NativeModel:
    """``NativeModel.load`` of ``core``'s validated contract.

    Raises:
        ContractError: the core's contract or manifest breaks a rule.
        RuntimeLoadError: see ``NativeModel.load``.
    """
    prepared = PreparedContract.from_contract(core.contract, core.manifest)
    return NativeModel.load(prepared, core.read_resource, backend, **options)
