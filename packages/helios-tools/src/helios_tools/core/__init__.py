"""The Helios core format: signed, memory-mappable files of a contract, a manifest and
verified resources (docs/architecture.md, "The core file").

Layout (``layout``): magic ``b"HELIOSC\\0"``, a little-endian u64 CoreBody length, the
CoreBody (format_version, signed PayloadEnvelope, unsigned LocationSet), then the stored
frames back to back.
"""

from helios_tools.core.errors import (
    ChunkDigestMismatch,
    CoreError,
    CoreFormatError,
    FrameError,
    LengthMismatch,
    NamespaceMismatch,
    ProtectedChunkError,
    ProtectedKeyRequired,
    ResourceNotFound,
    SignatureError,
    UntrustedKey,
)
from helios_tools.core.frames import CHUNK_NBYTES, MAX_WINDOW_NBYTES, ZSTD_LEVEL
from helios_tools.core.layout import FORMAT_LOGICAL, FORMAT_PAYLOAD, MAGIC
from helios_tools.core.reader import Core, authorize, open_core, open_core_unverified
from helios_tools.core.signing import (
    PAYLOAD_TYPE_DEPLOYMENT,
    PAYLOAD_TYPE_LOGICAL,
    generate_key,
    key_id_for,
    load_private_key,
    load_public_key,
    pae,
    write_key_pair,
)
from helios_tools.core.writer import CoreWriter, LogicalCoreWriter

__all__ = [
    "CHUNK_NBYTES",
    "FORMAT_LOGICAL",
    "FORMAT_PAYLOAD",
    "MAGIC",
    "MAX_WINDOW_NBYTES",
    "PAYLOAD_TYPE_DEPLOYMENT",
    "PAYLOAD_TYPE_LOGICAL",
    "ZSTD_LEVEL",
    "ChunkDigestMismatch",
    "Core",
    "CoreError",
    "CoreFormatError",
    "CoreWriter",
    "FrameError",
    "LengthMismatch",
    "LogicalCoreWriter",
    "NamespaceMismatch",
    "ProtectedChunkError",
    "ProtectedKeyRequired",
    "ResourceNotFound",
    "SignatureError",
    "UntrustedKey",
    "authorize",
    "generate_key",
    "key_id_for",
    "load_private_key",
    "load_public_key",
    "open_core",
    "open_core_unverified",
    "pae",
    "write_key_pair",
]
