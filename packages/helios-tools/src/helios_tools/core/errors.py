"""Errors of the core format.

Every way a core can fail to open, authorize or read is a distinct subclass of
``CoreError`` whose message names the resource id and the file offset where it applies.
Misuse of the API (a writer called twice, a bad argument) raises ``ValueError`` or
``RuntimeError`` instead: those are programming errors, not bad input.
"""

from __future__ import annotations

__all__ = [
    "ChunkDigestMismatch",
    "CoreError",
    "CoreFormatError",
    "FrameError",
    "LengthMismatch",
    "NamespaceMismatch",
    "ProtectedChunkError",
    "ProtectedKeyRequired",
    "ResourceNotFound",
    "SignatureError",
    "UntrustedKey",
]


class CoreError(Exception):
    """Base of every rejection of a core's bytes.

    Attributes:
        resource_id: The resource concerned, or None for file-level errors.
        offset: Absolute file offset (bytes) where the problem lies, or None.
    """

    def __init__(self, message: str, *, resource_id: str | None = None,
                 offset: int | None = None) -> None:
        self.resource_id = resource_id
        self.offset = offset
        where = []
        if resource_id is not None:
            where.append(f"resource {resource_id!r}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class CoreFormatError(CoreError):
    """The file is not a well-formed core: magic, header length, body, locations, layout."""


class SignatureError(CoreError):
    """The envelope signature does not verify over the stored payload bytes."""


class UntrustedKey(CoreError):
    """The envelope's key id names none of the trusted keys."""


class NamespaceMismatch(CoreError):
    """The acceptance string differs from the signed publisher namespace."""


class ResourceNotFound(CoreError, KeyError):
    """No resource with this id is signed into the core."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class ChunkDigestMismatch(CoreError):
    """A 4 MiB chunk of stored bytes does not match its signed SHA-256."""


class FrameError(CoreError):
    """A stored frame is not exactly one acceptable zstd frame (magic, window, truncation,
    a second or skippable frame, trailing bytes, decoder error)."""


class LengthMismatch(CoreError):
    """A length disagrees with its signed value: stored frame length, the frame's declared
    content size, or the decoded length."""


class ProtectedChunkError(CoreError):
    """An AES-GCM chunk fails authentication (wrong key, reordered, dropped, duplicated,
    truncated, extended, or a misplaced final-chunk flag)."""


class ProtectedKeyRequired(CoreError):
    """A ProtectedIndex version 4 resource was read without the operator's AES key."""
