"""The generated schema modules, one import point for other packages.

`contract_pb2` (ServingContract, ModelContract, GraphContract, ...), `manifest_pb2`
(ExecutionManifest, Buffer, Kernel, GraphProgram, ...), `core_pb2` (core carriers) and
`frontend_pb2` (FrontendContract). Code outside helios-contract imports these names from
here, never from the private `_gen` folder.
"""

from helios_contract._gen.helios.v1 import contract_pb2, core_pb2, frontend_pb2, manifest_pb2

__all__ = ["contract_pb2", "core_pb2", "frontend_pb2", "manifest_pb2"]
