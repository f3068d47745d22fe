"""helios_contract re-exports the whole schema, so no other package imports ``_gen``."""

from __future__ import annotations

import helios_contract
from helios_contract import schema


def test_every_schema_message_and_enum_is_exported():
    for module in (schema.contract_pb2, schema.frontend_pb2, schema.manifest_pb2,
                   schema.core_pb2):
        names = [*module.DESCRIPTOR.message_types_by_name, *module.DESCRIPTOR.enum_types_by_name]
        for name in names:
            assert getattr(helios_contract, name) is getattr(module, name), name
            assert name in helios_contract.__all__, name


def test_named_exports():
    for name in ("ServingContract", "ModelContract", "GraphContract", "ValueBinding",
                 "StateView", "StateAccess", "TunedBinding", "CacheContract", "DeploymentBody",
                 "ExecutableResource", "CoreBody", "LocationSet", "ModelIndex", "ProtectedIndex",
                 "ExecutionManifest", "Buffer", "Kernel", "GraphProgram", "Launch", "Argument",
                 "Operation", "ValueSource", "Indexing", "Access", "HistoryKind", "LengthSource",
                 "ToolParser", "ReasoningParser", "ImagePreparation", "ImageLayout",
                 "PreparedContract", "decode_message", "decode_json", "encode_json"):
        assert name in helios_contract.__all__, name
    assert helios_contract.Operation.Value("OPERATION_DECODE") == 6
    assert helios_contract.SUPPORTED_VERSIONS == (1, 2, 3)
    assert helios_contract.CURRENT_VERSION == 3


def test_error_hierarchy():
    from helios_contract import (
        ContractError,
        FieldError,
        MalformedMessageError,
        SpeculativeExtentError,
        StrictDecodeError,
        UnknownEnumError,
        UnknownFieldError,
    )
    for cls in (UnknownFieldError, UnknownEnumError, MalformedMessageError):
        assert issubclass(cls, StrictDecodeError)
        assert not issubclass(cls, ContractError)
    assert issubclass(SpeculativeExtentError, ContractError)
    assert issubclass(StrictDecodeError, FieldError) and issubclass(ContractError, ValueError)
