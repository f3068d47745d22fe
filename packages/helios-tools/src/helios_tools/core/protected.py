"""Authenticated AES-GCM chunks of logical-resource cores (ProtectedIndex version 4).

A resource's plaintext is cut into 4 MiB chunks; chunk i of n is stored as
``AESGCM(key).encrypt(nonce_i, plaintext_i, aad)`` (ciphertext followed by its 16-byte tag)
with ``nonce_i = nonce_prefix(7) || u32be(i) || u8(i == n - 1)`` and an AAD binding the
resource id and kind. Because the index and the final flag live in the nonce, a chunk
moved to another position, a dropped or duplicated chunk, a stream cut after a non-final
chunk, a stream extended past its final chunk, and a chunk of another resource all fail
authentication. The chunk count comes from the signed index.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from helios_tools.core.errors import LengthMismatch, ProtectedChunkError
from helios_tools.core.frames import CHUNK_NBYTES

__all__ = [
    "KEY_NBYTES",
    "NONCE_PREFIX_NBYTES",
    "TAG_NBYTES",
    "aad",
    "chunk_nonce",
    "encrypt_to",
    "iter_decrypt",
    "load_resource_key",
    "protected_chunk_count",
    "protected_stored_nbytes",
    "write_resource_key",
]

KEY_NBYTES = 32  # AES-256
TAG_NBYTES = 16
NONCE_PREFIX_NBYTES = 7


def load_resource_key(path: str | os.PathLike[str]) -> bytes:
    """Read an operator's AES-256 resource key file: 32 raw bytes, or 64 hex digits
    (surrounding whitespace allowed).

    Raises:
        OSError: The file cannot be read.
        ValueError: The file holds neither form.
    """
    data = Path(path).read_bytes()
    if len(data) == KEY_NBYTES:
        return data
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_NBYTES:
        raise ValueError(f"{path}: a resource key is {KEY_NBYTES} raw bytes or "
                         f"{2 * KEY_NBYTES} hex digits ({len(data)} bytes found)")
    return key


def write_resource_key(path: str | os.PathLike[str]) -> Path:
    """Write a new random AES-256 resource key: 32 raw bytes, mode 0600, never overwriting
    (the same as ``head -c 32 /dev/urandom > FILE``).

    Raises:
        FileExistsError: The file exists.
    """
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(KEY_NBYTES))
    os.chmod(path, 0o600)
    return path


def protected_chunk_count(decoded_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    """max(1, ceil(decoded / chunk)): an empty resource still has one (final) chunk."""
    return max(1, -(-decoded_nbytes // chunk_nbytes))


def protected_stored_nbytes(decoded_nbytes: int, chunk_nbytes: int = CHUNK_NBYTES) -> int:
    """Stored bytes: the plaintext plus one tag per chunk."""
    return decoded_nbytes + TAG_NBYTES * protected_chunk_count(decoded_nbytes, chunk_nbytes)


def chunk_nonce(prefix: bytes, index: int, final: bool) -> bytes:
    """12-byte nonce of chunk ``index``: prefix(7) || u32be(index) || u8(final)."""
    return bytes(prefix) + struct.pack(">IB", index, 1 if final else 0)


def aad(resource_id: str, kind: int) -> bytes:
    """Associated data binding the resource id and kind."""
    rid = resource_id.encode("utf-8")
    return b"helios.protected.v4\x00" + struct.pack("<I", len(rid)) + rid + struct.pack("<I", kind)


def _check_key(key: bytes) -> AESGCM:
    if len(key) != KEY_NBYTES:
        raise ValueError(f"the resource key must be {KEY_NBYTES} bytes (AES-256), got {len(key)}")
    return AESGCM(bytes(key))


def _plain_chunks(data: bytes | bytearray | memoryview | Iterable[bytes]) -> Iterator[bytes]:
    """Re-cut any input into 4 MiB plaintext chunks (the last may be short)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        mv = memoryview(data).cast("B")
        for start in range(0, len(mv), CHUNK_NBYTES):
            yield mv[start:start + CHUNK_NBYTES]
        return
    pending = bytearray()
    for piece in data:
        pending += piece
        while len(pending) >= CHUNK_NBYTES:
            yield bytes(pending[:CHUNK_NBYTES])
            del pending[:CHUNK_NBYTES]
    if pending:
        yield bytes(pending)


def encrypt_to(f: BinaryIO, key: bytes, resource_id: str, kind: int,
               data: bytes | bytearray | memoryview | Iterable[bytes],
               decoded_nbytes: int | None) -> tuple[int, int, bytes, int]:
    """Write the AES-GCM chunk records of ``data`` to ``f``.

    Returns:
        (stored_nbytes, decoded_nbytes, nonce_prefix, chunk_count).

    Raises:
        ValueError: Bad key length, or decoded_nbytes missing/disagreeing with the data.
    """
    aes = _check_key(key)
    if isinstance(data, (bytes, bytearray, memoryview)):
        n = memoryview(data).nbytes
        if decoded_nbytes is not None and decoded_nbytes != n:
            raise ValueError(f"decoded_nbytes={decoded_nbytes} but the buffer holds {n} bytes")
        decoded_nbytes = n
    elif decoded_nbytes is None:
        raise ValueError("decoded_nbytes is required when data is an iterable")
    count = protected_chunk_count(decoded_nbytes)
    prefix = os.urandom(NONCE_PREFIX_NBYTES)
    associated = aad(resource_id, kind)
    stored = fed = 0
    chunks = _plain_chunks(data)
    for i in range(count):
        plain = next(chunks, b"")
        fed += len(plain)
        if fed > decoded_nbytes:
            raise ValueError(f"data exceeds decoded_nbytes={decoded_nbytes}")
        record = aes.encrypt(chunk_nonce(prefix, i, i == count - 1), bytes(plain), associated)
        f.write(record)
        stored += len(record)
    if fed != decoded_nbytes or next(chunks, None) is not None:
        raise ValueError(f"data does not hold decoded_nbytes={decoded_nbytes} bytes")
    return stored, decoded_nbytes, prefix, count


def iter_decrypt(view: memoryview, key: bytes, resource_id: str, kind: int,
                 decoded_nbytes: int, chunk_count: int, nonce_prefix: bytes,
                 offset: int = 0) -> Iterator[bytes]:
    """Authenticate and decrypt chunk records, yielding each chunk's plaintext.

    Args:
        view: The stored records of one resource.
        key: The operator's 32-byte AES key.
        resource_id, kind, decoded_nbytes, chunk_count, nonce_prefix: Authenticated
            metadata from the signed ProtectedIndex.
        offset: Absolute file offset of ``view[0]``, for messages.

    Raises:
        LengthMismatch: The stored length is not what the metadata implies.
        ProtectedChunkError: A chunk fails authentication.
    """
    aes = _check_key(key)
    expected = decoded_nbytes + TAG_NBYTES * chunk_count
    if len(view) != expected or chunk_count != protected_chunk_count(decoded_nbytes):
        raise LengthMismatch(f"{len(view)} stored bytes in {chunk_count} chunks; the signed "
                             f"decoded length {decoded_nbytes} needs {expected}",
                             resource_id=resource_id, offset=offset)
    associated = aad(resource_id, kind)
    record_nbytes = CHUNK_NBYTES + TAG_NBYTES
    for i in range(chunk_count):
        start = i * record_nbytes
        end = min(start + record_nbytes, len(view))
        try:
            plain = aes.decrypt(chunk_nonce(nonce_prefix, i, i == chunk_count - 1),
                                view[start:end], associated)
        except InvalidTag:
            raise ProtectedChunkError(f"AES-GCM chunk {i} of {chunk_count} fails "
                                      "authentication (wrong key, or the chunk was moved, "
                                      "dropped, duplicated, cut or extended)",
                                      resource_id=resource_id, offset=offset + start) from None
        yield plain
